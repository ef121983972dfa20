/* See schedpolicy.h. */
#include "scheduling/schedpolicy.h"

void nvc_sched_sanitize(struct nvc_sched_view *v, uint64_t now)
{
    v->capped = v->capped != 0;
    v->weight = v->weight < 1 ? 1 : v->weight > NVC_WEIGHT_MAX ? NVC_WEIGHT_MAX : v->weight;
    v->cap = 100; /* another's cap is enforced by its own shim: its weight bounds what it asks */
    v->share_permille = v->share_permille > 1000 ? 1000 : v->share_permille;
    v->klass = v->klass > NVC_CLASS_LATENCY_CRITICAL ? NVC_CLASS_NONE : v->klass;
    v->mps = v->mps != 0;
    v->backlog_permille = v->backlog_permille > 1000 ? 1000 : v->backlog_permille;
    v->steady_permille = v->steady_permille > 1000 ? 1000 : v->steady_permille;
    if (v->seen_ns > now + NVC_SCHED_FUTURE_NS || v->busy_until_ns > now + NVC_SCHED_FUTURE_NS)
        v->seen_ns = v->busy_until_ns = 0;
}

int nvc_sched_busy(const struct nvc_sched_view *v, uint64_t now)
{
    return now < v->busy_until_ns;
}

int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now)
{
    return !v->capped && (now < v->seen_ns + NVC_SCHED_ACTIVE_NS || nvc_sched_busy(v, now));
}

int nvc_sched_urgent(const struct nvc_sched_view *v, uint64_t now)
{
    return v->klass == NVC_CLASS_LATENCY_CRITICAL && !v->capped &&
           (now < v->seen_ns + NVC_SCHED_URGENT_NS || nvc_sched_busy(v, now));
}

/* Whether `o` takes part in self's weighing: latency-critical tenants among themselves, the others among
 * themselves; MPS clients in neither (they do not take time slices). */
static int same_tier(const struct nvc_sched_view *self, const struct nvc_sched_view *o)
{
    return !o->mps && (self->klass == NVC_CLASS_LATENCY_CRITICAL) == (o->klass == NVC_CLASS_LATENCY_CRITICAL);
}

/* Whether `o` could hold self back: in self's weighing, active, and keeping the GPU busy (backlogged). */
static int could_hold(const struct nvc_sched_view *self, const struct nvc_sched_view *o, uint64_t now)
{
    return same_tier(self, o) && nvc_sched_active(o, now) && o->backlog_permille >= NVC_SCHED_BACKLOGGED_PERMILLE;
}

uint32_t nvc_sched_entitled(const struct nvc_sched_view *who, uint64_t total_weight)
{
    uint64_t w = who->weight ? who->weight : 1, total = total_weight > w ? total_weight : w;
    uint64_t permille = w * 1000 / total, cap = who->cap && who->cap < 100 ? who->cap * 10ull : 1000;
    return (uint32_t)(permille < cap ? permille : cap);
}

/* who's entitlement as a part of the useful work (‰) */
static uint32_t part(const struct nvc_sched_view *who, uint64_t total_weight, uint64_t useful)
{
    return (uint32_t)(nvc_sched_entitled(who, total_weight) * useful / 1000);
}

enum nvc_sched_decision nvc_sched_decide(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n,
                                         uint64_t now)
{
    if (self->klass != NVC_CLASS_LATENCY_CRITICAL)
        for (int i = 0; i < n; i++)
            if (!others[i].mps && nvc_sched_urgent(&others[i], now))
                return NVC_SCHED_WAIT; /* a latency-critical tenant is serving */
    uint64_t total = self->weight ? self->weight : 1, useful = self->share_permille;
    for (int i = 0; i < n; i++)
        if (same_tier(self, &others[i]) && nvc_sched_active(&others[i], now)) {
            total += others[i].weight ? others[i].weight : 1;
            useful += others[i].share_permille;
        }
    useful = useful < NVC_SCHED_USEFUL_FLOOR ? NVC_SCHED_USEFUL_FLOOR : useful > 1000 ? 1000 : useful;
    int held_by_any = 0; /* an active peer that keeps the GPU busy: it may want more at any moment */
    for (int i = 0; i < n; i++)
        held_by_any |= could_hold(self, &others[i], now);
    if (!held_by_any)
        return NVC_SCHED_RUN_FREE;
    if (self->share_permille <= part(self, total, useful) + NVC_SCHED_SLACK_PERMILLE)
        return NVC_SCHED_RUN_WITHIN;
    for (int i = 0; i < n; i++) {
        const struct nvc_sched_view *o = &others[i];
        if (could_hold(self, o, now) && nvc_sched_busy(o, now) &&
            o->share_permille + NVC_SCHED_SLACK_PERMILLE < part(o, total, useful))
            return NVC_SCHED_WAIT; /* it wants more, keeps the GPU busy and competes for it right now */
    }
    return NVC_SCHED_RUN;
}

int nvc_sched_duty_holds(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n, uint64_t now)
{
    for (int i = 0; i < n; i++)
        if (others[i].mps && others[i].weight > self->weight && nvc_sched_active(&others[i], now) &&
            others[i].backlog_permille >= NVC_SCHED_BACKLOGGED_PERMILLE)
            return 1;
    return 0;
}

uint32_t nvc_sched_backlog_after(uint32_t permille, int backlogged)
{
    return permille - permille / 8 + (backlogged ? 125u : 0u);
}

uint32_t nvc_sched_steady_after(uint32_t permille, int pending)
{
    uint32_t next = permille - permille / 32 + (pending ? 1000u / 32 : 0u);
    return next > 1000 ? 1000 : next;
}

unsigned nvc_sched_duty(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n, uint64_t now)
{
    if (self->mps || self->klass == NVC_CLASS_LATENCY_CRITICAL || (self->cap && self->cap < 100) ||
        self->backlog_permille < NVC_SCHED_BACKLOGGED_PERMILLE)
        return 0; /* a tenant whose host does not keep its own work queued runs free within its share */
    const struct nvc_sched_view *peer = NULL;
    for (int i = 0; i < n; i++)
        if (same_tier(self, &others[i]) && nvc_sched_active(&others[i], now)) {
            if (peer)
                return 0; /* more than a pair: their slices need not line up */
            peer = &others[i];
        }
    uint64_t w = self->weight ? self->weight : 1;
    if (!peer || peer->weight <= w || peer->steady_permille < NVC_SCHED_STEADY_PERMILLE)
        return 0;
    uint64_t total = w + peer->weight, useful = (uint64_t)self->share_permille + peer->share_permille;
    useful = useful < NVC_SCHED_USEFUL_FLOOR ? NVC_SCHED_USEFUL_FLOOR : useful > 1000 ? 1000 : useful;
    uint64_t due = part(self, total, useful), share = self->share_permille;
    uint64_t duty = 200 * w / total + (due > share ? 2 * (due - share) / 10 : 0);
    return duty >= 100 ? 0 : (unsigned)duty;
}

uint32_t nvc_sched_sharing(const struct nvc_sched_view *others, int n, uint64_t now)
{
    uint32_t sharing = 1;
    for (int i = 0; i < n; i++)
        sharing += (uint32_t)nvc_sched_busy(&others[i], now);
    return sharing;
}

void nvc_sched_note(struct nvc_sched_history *h, uint64_t now, uint32_t sharing)
{
    uint32_t last = (h->n - 1) % NVC_SCHED_HISTORY;
    if (h->n && (h->sharing[last] == sharing || now < h->at[last]))
        return;
    h->at[h->n % NVC_SCHED_HISTORY] = now;
    h->sharing[h->n % NVC_SCHED_HISTORY] = sharing ? sharing : 1;
    h->n++;
}

uint64_t nvc_sched_charge(const struct nvc_sched_history *h, uint64_t from, uint64_t to)
{
    if (to <= from)
        return 0;
    if (!h->n)
        return to - from;
    uint64_t charge = 0, end = to;
    uint32_t kept = h->n < NVC_SCHED_HISTORY ? h->n : NVC_SCHED_HISTORY;
    for (uint32_t k = 0; k < kept && end > from; k++) { /* newest first */
        uint32_t i = (h->n - 1 - k) % NVC_SCHED_HISTORY;
        uint64_t start = h->at[i] > from && k + 1 < kept ? h->at[i] : from;
        if (start < end) {
            charge += (end - start) / h->sharing[i];
            end = start;
        }
    }
    return charge;
}

uint64_t nvc_sched_decay(uint64_t acc, uint64_t elapsed_ns)
{
    if (elapsed_ns >= 100 * NVC_SCHED_WINDOW_NS)
        return 0;
    return (uint64_t)((unsigned __int128)acc * NVC_SCHED_WINDOW_NS / (NVC_SCHED_WINDOW_NS + elapsed_ns));
}

uint32_t nvc_sched_share(uint64_t acc)
{
    uint64_t permille = acc / (NVC_SCHED_WINDOW_NS / 1000);
    return (uint32_t)(permille > 1000 ? 1000 : permille);
}

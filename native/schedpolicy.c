/* See schedpolicy.h. */
#include "schedpolicy.h"

void nvc_sched_sanitize(struct nvc_sched_view *v, uint64_t now)
{
    v->running = v->running != 0;
    v->capped = v->capped != 0;
    v->weight = v->weight < 1 ? 1 : v->weight > NVC_WEIGHT_MAX ? NVC_WEIGHT_MAX : v->weight;
    v->owed_ns = 0;
    if (v->seen_ns > now + NVC_SCHED_FUTURE_NS || v->busy_until_ns > now + NVC_SCHED_FUTURE_NS) {
        v->seen_ns = v->busy_until_ns = 0;
        v->running = 0;
    }
}

int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now)
{
    if (v->capped)
        return 0;
    return now < v->seen_ns + NVC_SCHED_ACTIVE_NS || now < v->busy_until_ns;
}

static int before(uint64_t vtime_a, uint64_t id_a, uint64_t vtime_b, uint64_t id_b)
{
    return vtime_a < vtime_b || (vtime_a == vtime_b && id_a < id_b);
}

enum nvc_sched_decision nvc_sched_decide(const struct nvc_sched_view *self, const struct nvc_sched_view *others,
                                         int n, uint64_t now)
{
    if (self->owed_ns >= nvc_sched_margin(self, others, n, now))
        return NVC_SCHED_RUN;         /* the guarantee, whatever the others claim */
    int any = 0, occupied = 0, lowest = 1, outranked = 0;
    uint64_t min_vtime = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        const struct nvc_sched_view *o = &others[i];
        if (now + NVC_SCHED_HANDOVER_NS < o->busy_until_ns)
            occupied = 1;             /* its work is still on the GPU, capped or not: let it drain */
        if (!nvc_sched_active(o, now))
            continue;
        any = 1;
        if (o->vtime < min_vtime)
            min_vtime = o->vtime;
        if (before(o->vtime, o->id, self->vtime, self->id)) {
            lowest = 0;
            outranked |= o->running;
        }
        if (o->running)
            occupied = 1;
    }
    if (!any)
        return occupied && !self->running ? NVC_SCHED_WAIT : NVC_SCHED_RUN;
    if (self->running && outranked)
        return NVC_SCHED_WAIT;        /* two took the turn at once (each found itself alone): one yields */
    if (self->running)
        return self->vtime <= nvc_sched_vtime_add(min_vtime, (int64_t)NVC_SCHED_SLICE_NS, self->weight)
                   ? NVC_SCHED_RUN : NVC_SCHED_WAIT;
    return !occupied && lowest ? NVC_SCHED_RUN : NVC_SCHED_WAIT;
}

uint64_t nvc_sched_catch_up(uint64_t vtime, const struct nvc_sched_view *others, int n, uint64_t now)
{
    uint64_t min_vtime = UINT64_MAX;
    for (int i = 0; i < n; i++)
        if (nvc_sched_active(&others[i], now) && others[i].vtime < min_vtime)
            min_vtime = others[i].vtime;
    return min_vtime != UINT64_MAX && min_vtime > vtime ? min_vtime : vtime;
}

uint64_t nvc_sched_vtime_add(uint64_t vtime, int64_t ns, uint32_t weight)
{
    uint64_t w = weight ? weight : 1, mag = ns < 0 ? 0 - (uint64_t)ns : (uint64_t)ns, d;
    if (__builtin_mul_overflow(mag / w, NVC_WEIGHT_UNIT, &d) ||
        __builtin_add_overflow(d, mag % w * NVC_WEIGHT_UNIT / w, &d))
        d = UINT64_MAX;
    if (ns < 0)
        return vtime > d ? vtime - d : 0;
    return vtime + d < vtime ? UINT64_MAX : vtime + d;
}

int64_t nvc_sched_settle(uint64_t *settled, const struct nvc_sched_view *self, const struct nvc_sched_view *others,
                         int n, uint64_t now)
{
    uint64_t from = *settled;
    if (self->running) {              /* held the turn: pays until its queued work ends */
        uint64_t to = self->busy_until_ns > now ? self->busy_until_ns : now;
        if (to <= from)
            return 0;
        *settled = to;
        return from ? -(int64_t)(to - from > INT64_MAX ? INT64_MAX : to - from) : 0;
    }
    if (now <= from)
        return 0;                     /* its own work still ran then: it was waiting for nothing */
    *settled = now;
    if (!from)
        return 0;
    int64_t elapsed = (int64_t)(now - from < NVC_SCHED_ACTIVE_NS ? now - from : NVC_SCHED_ACTIVE_NS);
    int64_t own = self->weight ? self->weight : 1, theirs = 0;
    for (int i = 0; i < n; i++)
        if (nvc_sched_active(&others[i], now))
            theirs += others[i].weight ? others[i].weight : 1;
    if (!theirs)
        theirs = own;
    if (self->cap && self->cap < 100 && (int64_t)self->cap * theirs < own * (100 - (int64_t)self->cap)) {
        own = self->cap;              /* its cap's part of the time: cap / (100 - cap) */
        theirs = 100 - (int64_t)self->cap;
    }
    return elapsed * own * (int64_t)NVC_SCHED_OWED_PERMILLE / (theirs * 1000);
}

int64_t nvc_sched_margin(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n,
                         uint64_t now)
{
    int64_t own = self->weight ? self->weight : 1, lightest = 0;
    for (int i = 0; i < n; i++) {
        int64_t w = others[i].weight ? others[i].weight : 1;
        if (nvc_sched_active(&others[i], now) && (!lightest || w < lightest))
            lightest = w;
    }
    return 2 * (int64_t)NVC_SCHED_SLICE_NS * (lightest ? lightest + own : 1) / (lightest ? lightest : 1);
}

int64_t nvc_sched_owed(int64_t owed, int64_t delta, int64_t max)
{
    int64_t sum;
    if (__builtin_add_overflow(owed < 0 ? 0 : owed, delta, &sum))
        sum = delta < 0 ? 0 : max;
    return sum < 0 ? 0 : sum > max ? max : sum;
}

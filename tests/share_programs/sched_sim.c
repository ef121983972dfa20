/* sched_sim: the shim's scheduler decision (native/schedpolicy.c) driving simulated tenants on a fake
 * clock and a simulated GPU that time-slices between the tenants with work queued (each one's oldest
 * kernel advances at 1/n of the GPU's speed while n tenants have work, as a GPU's time-slicing between
 * contexts averages out). Deterministic test program for tests/test_share_native.py; nothing here is
 * a GPU result.
 *
 *   sched_sim MS TENANT...    TENANT = WEIGHT:CAP:KERNEL_US:BUSY_FROM_MS:BUSY_UNTIL_MS[:HOST_US|:LIE][:SERVE]
 *                             SERVE = serve=PERIOD_US,TOKENS,LAUNCHES
 *
 * Each tenant launches kernels of KERNEL_US while busy, its host spending HOST_US (default 0) before
 * each launch, keeping at most 2 ms of its work queued (as the shim does), asking nvc_sched_decide
 * before each launch. WEIGHT 0 is a process without the shim: it launches freely and publishes nothing
 * (no control). With SERVE it is a service: a request arrives every PERIOD_US while it is busy, and
 * each (oldest first) is TOKENS tokens of LAUNCHES kernels, HOST_US of host work before each launch,
 * the host waiting for the token's kernels to complete before the next token (a batch-1 decode loop:
 * launch-bound, the GPU idle between its tiny kernels); it prints "latency I <p50 us> <p99 us>
 * <requests done>", each request's latency taken from its arrival.
 *
 * Its own cap (percent, 100 = none) is enforced as the shim's region.c does: slices of cap % of every
 * 50 ms of wall time, extended while the scheduler holds it; work past a slice's end is charged to the
 * next. It measures each kernel's elapsed time from when its stream could start it to its end and
 * charges it with nvc_sched_charge (over how many it saw sharing the GPU at each decision and
 * measurement) into its decaying share account, as sched.c does. Kernels under 25 µs, while another
 * tenant is active, are measured as launch.c measures them: in groups of up to 100 µs of expected work
 * or 64 launches, one closed at the next launch after an idle gap of 100 µs (its end then), measured
 * at the tenant's next launch or wait once all of it ran, and charged nvc_sched_charged with their
 * work. Each launch publishes nvc_sched_busy_until of nvc_sched_drains_at; a queue seen drained
 * publishes now. A tenant with a LIE launches nothing while busy and publishes, every step, one claim:
 * "busy" (work queued for almost NVC_SCHED_FUTURE_NS, a share of 0) or "garbage" (random values);
 * the others read every view through nvc_sched_sanitize and take its weight as WEIGHT (the granted
 * one, whatever it claims). Prints per tenant "tenant I <GPU share in ‰ in the first half> <in the
 * second half> <its longest wait in ms>" of the MS simulated milliseconds, and "gpu <busy ‰>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedpolicy.h"

#define MAX_T 8
#define MAX_Q 64
#define STEP_NS 10000ull               /* the tenants' wait step (the shim sleeps 50-200 us) */
#define MAX_INFLIGHT_NS 2000000ull
#define SLICE_PERIOD_NS 50000000ull
#define SAMPLE_NS 100000ull               /* how often a process with work queued looks at the others */
#define MAX_REQ 65536
#define GROUP_NS 100000ull                /* launch.c's groups of short kernels while another tenant is active: */
#define GROUP_MAX 64u                     /* up to 100 us of expected work or 64 launches, one pair of events */
#define MAX_G 16

enum lie { HONEST, BUSY, GARBAGE };
static const char *const lies[] = {"", "busy", "garbage"};

static struct tenant {
    struct nvc_sched_view v;
    unsigned weight, cap;
    enum lie lie;
    uint64_t kernel_ns, host_ns, from_ns, until_ns, host_ready, slice_end;
    uint64_t queue[MAX_Q];             /* its kernels' remaining GPU time, oldest first */
    int in_group[MAX_Q];               /* the group each belongs to, + 1 (0: measured alone) */
    struct group {                     /* short kernels measured together, as launch.c does */
        uint64_t start, end, closed_at, last, est, work;   /* closed_at 0: still taking launches */
        unsigned count, left;          /* its launches, and those not done on the GPU */
    } g[MAX_G];
    unsigned g_open, g_oldest, g_next; /* g_open: the open group + 1 (0: none); the ring's ends */
    uint64_t unsettled;                /* estimates of its work launched and not yet measured */
    int others_active;                 /* another tenant active: launch.c's groups are short */
    uint64_t drains;                   /* when its launched work should drain (sched.c's drains_of) */
    uint64_t began;                    /* when its oldest kernel could start */
    uint64_t estimate;                 /* a kernel's elapsed time as last measured (the shim's estimate) */
    int qn;
    int64_t credit;
    uint64_t acc, acc_at, waiting_since, longest_wait;
    struct nvc_sched_history seen_sharing;
    uint64_t gpu[2];
    uint64_t period_ns;                /* a service: a request every period_ns (0: not a service) */
    unsigned tokens, launches, token, launched;   /* its request's size; where the oldest one is */
    uint64_t arrived, done;            /* requests arrived and done so far */
    uint64_t latency[MAX_REQ];         /* each done request's, from its arrival */
} t[MAX_T];
static int nt;

static uint64_t random64(void)
{
    static uint64_t x = 88172645463325252ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

static void lie(struct tenant *x, uint64_t now)
{
    if (x->lie == BUSY)
        x->v = (struct nvc_sched_view){.id = x->v.id, .seen_ns = now, .busy_until_ns = now + NVC_SCHED_FUTURE_NS - 1,
                                       .weight = NVC_WEIGHT_MAX};
    else
        x->v = (struct nvc_sched_view){.id = x->v.id, .seen_ns = random64(), .busy_until_ns = random64(),
                                       .capped = (uint32_t)random64(), .weight = (uint32_t)random64(),
                                       .share_permille = (uint32_t)random64()};
}

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* A service's request work: whether it has a launch to make now (a request is waiting and its
 * current token still has launches to go), noting a token or request its drained queue completed. */
static int serving(struct tenant *x, uint64_t now)
{
    while (x->from_ns + x->arrived * x->period_ns <= now && x->from_ns + x->arrived * x->period_ns < x->until_ns)
        x->arrived++;
    if (x->launched == x->launches) {      /* the token's launches are out: its host waits for them */
        if (x->qn)
            return 0;
        x->launched = 0;
        if (++x->token == x->tokens) {
            x->token = 0;
            if (x->done < MAX_REQ)
                x->latency[x->done] = now - (x->from_ns + x->done * x->period_ns);
            x->done++;
        }
        x->host_ready = now + x->host_ns;  /* reading the token back, choosing the next */
    }
    return x->done < x->arrived;
}

/* Its oldest kernel could start at `at`: a group's start event runs then. */
static void head_began(struct tenant *x, uint64_t at)
{
    x->began = at;
    if (x->qn && x->in_group[0] && !x->g[x->in_group[0] - 1].start)
        x->g[x->in_group[0] - 1].start = at;
}

/* Records the open group's end event now (launch.c's close_locked). */
static void close_group(struct tenant *x, uint64_t now)
{
    if (x->g_open)
        x->g[x->g_open - 1].closed_at = now;
    x->g_open = 0;
}

/* launch.c's harvest: the groups whose end event has run, oldest first, measured and charged (as
 * sched.c charges them: nvc_sched_charged), at a launch or while it waits; a queue seen drained is
 * published so. */
static void harvest(struct tenant *x, uint64_t now)
{
    int settled = 0;
    while (x->g_oldest != x->g_next) {
        struct group *g = &x->g[x->g_oldest % MAX_G];
        if (!g->closed_at || g->left)
            break;
        uint64_t end = g->end > g->closed_at ? g->end : g->closed_at;
        uint64_t mine = nvc_sched_charge(&x->seen_sharing, g->start, end);
        x->acc = nvc_sched_decay(x->acc, now > x->acc_at ? now - x->acc_at : 0) +
                 nvc_sched_charged(end - g->start, mine, end - g->start, g->work);
        x->acc_at = now;
        x->unsettled -= g->est;
        x->g_oldest++;
        settled = 1;
    }
    if (settled && !x->qn && !x->g_open)
        x->v.busy_until_ns = x->drains = now;   /* drained */
}

static uint64_t inflight(const struct tenant *x)
{
    uint64_t sum = 0;
    for (int i = 0; i < x->qn; i++)
        sum += x->queue[i];
    return sum;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    uint64_t end_ns = strtoull(argv[1], NULL, 10) * 1000000ull, half = end_ns / 2, gpu_busy = 0;
    for (int i = 2; i < argc && nt < MAX_T; i++, nt++) {
        unsigned long long w, cap, us, from, until, period = 0;
        unsigned tokens = 0, launches = 0;
        char how[16] = "";
        const char *serve = strstr(argv[i], ":serve=");
        if (sscanf(argv[i], "%llu:%llu:%llu:%llu:%llu:%15[^:]", &w, &cap, &us, &from, &until, how) < 5 ||
            (serve && (sscanf(serve, ":serve=%llu,%u,%u", &period, &tokens, &launches) != 3 || !period || !tokens ||
                       !launches)))
            return 2;
        if (!strncmp(how, "serve=", 6))
            how[0] = '\0';
        t[nt] = (struct tenant){.v = {.id = (uint64_t)nt + 1, .weight = (uint32_t)w, .cap = (uint32_t)cap},
                                .weight = (unsigned)w, .cap = (unsigned)cap, .kernel_ns = us * 1000,
                                .from_ns = from * 1000000, .until_ns = until * 1000000,
                                .period_ns = period * 1000, .tokens = tokens, .launches = launches};
        for (enum lie l = HONEST; l <= GARBAGE; l++)
            if (!strcmp(how, lies[l]))
                t[nt].lie = l;
        if (!t[nt].lie && how[0])
            t[nt].host_ns = strtoull(how, NULL, 10) * 1000;
    }
    uint64_t now, refill = 0;
    struct nvc_sched_view others[MAX_T], seen[MAX_T];
    for (now = 0; now < end_ns; now += STEP_NS) {
        for (int j = 0; j < nt; j++) {             /* what each tenant's file says now, read as sched.c reads it */
            seen[j] = t[j].weight ? t[j].v : (struct nvc_sched_view){.id = t[j].v.id};   /* no shim: no file */
            nvc_sched_sanitize(&seen[j], now);
            seen[j].weight = t[j].weight;
        }
        /* the GPU: one step shared by the tenants with work queued */
        int sharing = 0;
        for (int i = 0; i < nt; i++)
            sharing += t[i].qn > 0;
        gpu_busy += sharing ? STEP_NS : 0;
        for (int i = 0; i < nt && sharing; i++) {
            struct tenant *x = &t[i];
            if (!x->qn)
                continue;
            uint64_t slice = STEP_NS / sharing;
            x->gpu[now >= half] += slice;
            x->queue[0] = x->queue[0] > slice ? x->queue[0] - slice : 0;
            if (x->queue[0])
                continue;
            int n = 0;                              /* done: measured and charged as sched.c does */
            for (int j = 0; j < nt; j++)
                if (j != i)
                    others[n++] = seen[j];
            nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            int in_group = x->in_group[0];
            if (in_group) {                         /* its group is measured when it has all run */
                struct group *g = &x->g[in_group - 1];
                g->left--;
                g->end = now + STEP_NS;
            } else {
                x->estimate = now + STEP_NS - x->began;
                x->acc = nvc_sched_decay(x->acc, now + STEP_NS - x->acc_at) +
                         nvc_sched_charge(&x->seen_sharing, x->began, now + STEP_NS);
                x->acc_at = now + STEP_NS;
                x->unsettled -= x->estimate < x->unsettled ? x->estimate : x->unsettled;
            }
            x->qn--;
            memmove(x->queue, x->queue + 1, (size_t)x->qn * sizeof x->queue[0]);
            memmove(x->in_group, x->in_group + 1, (size_t)x->qn * sizeof x->in_group[0]);
            head_began(x, now + STEP_NS);
            if (!x->qn && !in_group)
                x->v.busy_until_ns = x->drains = now + STEP_NS;   /* drained */
        }
        for (int i = 0; i < nt; i++) {              /* the shims' credit refill, never above 0 */
            t[i].credit += (int64_t)((now - refill) * t[i].cap / 100);
            if (t[i].credit > 0)
                t[i].credit = 0;
        }
        refill = now;
        for (int i = 0; i < nt; i++) {
            struct tenant *x = &t[i];
            if (x->period_ns ? !serving(x, now) : now < x->from_ns || now >= x->until_ns) {
                x->waiting_since = 0;
                continue;                           /* idle, or a service waiting for its token */
            }
            if (x->lie) {
                lie(x, now);
                continue;
            }
            int n = 0;
            for (int j = 0; j < nt; j++)
                if (j != i)
                    others[n++] = seen[j];
            if (x->qn && now % SAMPLE_NS == 0)    /* the shim looks while it waits for room in its queue */
                nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            x->others_active = 0;
            for (int j = 0; j < n; j++)
                x->others_active |= nvc_sched_active(&others[j], now) || nvc_sched_busy(&others[j], now);
            if (now < x->host_ready || x->qn == MAX_Q || (x->qn && inflight(x) + x->kernel_ns > MAX_INFLIGHT_NS))
                continue;                           /* its host is busy, or its queue full */
            harvest(x, now);
            if (x->cap < 100 && now >= x->slice_end) {   /* outside its slice */
                if (x->qn)
                    continue;                       /* its last slice's work drains first */
                if (x->began > x->slice_end) {      /* and what ran past the slice is charged */
                    x->credit -= (int64_t)(x->began - x->slice_end);
                    x->slice_end = x->began;
                }
                if (x->credit < 0) {
                    x->v.capped = 1;
                    continue;
                }
                x->slice_end = now + SLICE_PERIOD_NS * x->cap / 100;
                x->credit -= (int64_t)(SLICE_PERIOD_NS * x->cap / 100);
            }
            x->v.capped = 0;
            x->v.seen_ns = now;
            nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            x->v.share_permille = nvc_sched_share(nvc_sched_decay(x->acc, now > x->acc_at ? now - x->acc_at : 0));
            if (x->weight && nvc_sched_decide(&x->v, others, n, now) == NVC_SCHED_WAIT) {
                if (!x->waiting_since)
                    x->waiting_since = now;
                close_group(x, now);                /* what it waits for must be able to complete */
                if (x->cap < 100)
                    x->slice_end += STEP_NS;        /* its slice waits too */
                continue;
            }
            if (x->waiting_since && now - x->waiting_since > x->longest_wait)
                x->longest_wait = now - x->waiting_since;
            x->waiting_since = 0;
            uint64_t est = x->estimate ? x->estimate : x->kernel_ns;
            int grouped = x->kernel_ns < GROUP_NS / 4 && x->others_active;
            struct group *g = x->g_open ? &x->g[x->g_open - 1] : NULL;
            if (g && (!grouped || now - g->last > GROUP_NS)) {   /* an idle gap is not its work */
                close_group(x, now);
                g = NULL;
            }
            if (grouped && !g && x->g_next - x->g_oldest < MAX_G) {
                g = &x->g[x->g_next % MAX_G];
                *g = (struct group){0};
                x->g_open = x->g_next++ % MAX_G + 1;
            }
            x->in_group[x->qn] = grouped && g ? (int)x->g_open : 0;
            x->queue[x->qn++] = x->kernel_ns;
            if (x->qn == 1)
                head_began(x, now);
            if (x->in_group[x->qn - 1]) {
                est = x->kernel_ns;                 /* a short kernel's cost, as measured alone at first */
                g->count++;
                g->left++;
                g->est += est;
                g->work += x->kernel_ns;
                g->last = now;
                if (g->count >= GROUP_MAX || g->est >= GROUP_NS)
                    close_group(x, now);            /* right after its launch */
            }
            x->drains = nvc_sched_drains_at(x->drains, now, est);
            x->v.busy_until_ns = nvc_sched_busy_until(x->drains, now);
            x->unsettled += est;
            x->host_ready = now + x->host_ns;
            x->launched++;
        }
    }
    for (int i = 0; i < nt; i++) {
        if (t[i].waiting_since && now - t[i].waiting_since > t[i].longest_wait)
            t[i].longest_wait = now - t[i].waiting_since;   /* still waiting at the end */
        printf("tenant %d %llu %llu %llu\n", i, (unsigned long long)(t[i].gpu[0] * 1000 / half),
               (unsigned long long)(t[i].gpu[1] * 1000 / (end_ns - half)),
               (unsigned long long)(t[i].longest_wait / 1000000));
    }
    for (int i = 0; i < nt; i++) {
        uint64_t n = t[i].done < MAX_REQ ? t[i].done : MAX_REQ;
        if (!t[i].period_ns)
            continue;
        qsort(t[i].latency, n, sizeof t[i].latency[0], by_value);
        printf("latency %d %llu %llu %llu\n", i, (unsigned long long)(n ? t[i].latency[n / 2] / 1000 : 0),
               (unsigned long long)(n ? t[i].latency[n * 99 / 100] / 1000 : 0), (unsigned long long)t[i].done);
    }
    printf("gpu %llu\n", (unsigned long long)(gpu_busy * 1000 / end_ns));
    return 0;
}

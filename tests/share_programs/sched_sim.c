/* sched_sim: the shim's scheduler decision (native/schedpolicy.c) driving simulated tenants on a fake
 * clock and a simulated GPU that runs one kernel at a time in submission order. Deterministic test
 * program for tests/test_share_native.py; nothing here is a GPU result.
 *
 *   sched_sim MS TENANT...    TENANT = WEIGHT:CAP:KERNEL_US:BUSY_FROM_MS:BUSY_UNTIL_MS[:LIE]
 *
 * Each tenant launches kernels of KERNEL_US while busy, keeping at most 2 ms of its work queued (as the
 * shim does), asking nvc_sched_decide before each launch, its own cap (percent, 100 = none) enforced
 * as the shim's region.c does: slices of cap % of every 50 ms of wall time, paused while another
 * tenant holds the turn; work past a slice's end is charged to the next. It keeps the guarantee's
 * account as sched.c does. A tenant with a LIE launches nothing while busy and publishes, every
 * step, one claim: "hold" (it holds the turn), "queue" (work queued for almost NVC_SCHED_FUTURE_NS),
 * "zero" (busy at vtime 0) or "garbage" (random values); the others read every view through
 * nvc_sched_sanitize and take its weight as WEIGHT (the granted one, whatever it claims). Prints per
 * tenant "tenant I <GPU share in ‰ in the first half> <in the second half> <its longest wait for the
 * turn in ms>" of the MS simulated milliseconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedpolicy.h"

#define MAX_T 8
#define STEP_NS 10000ull               /* the tenants' wait step (the shim sleeps 50-200 us) */
#define MAX_INFLIGHT_NS 2000000ull
#define SLICE_PERIOD_NS 50000000ull

struct kernel { int tenant; uint64_t dur, submitted; };

enum lie { HONEST, HOLD, QUEUE, ZERO, GARBAGE };
static const char *const lies[] = {"", "hold", "queue", "zero", "garbage"};

static struct tenant {
    struct nvc_sched_view v;
    unsigned weight, cap;
    enum lie lie;
    uint64_t kernel_ns, from_ns, until_ns, inflight_ns, last_end, slice_end;
    int64_t credit;
    uint64_t owed_at, waiting_since, longest_wait;
    uint64_t busy[2];
} t[MAX_T];
static int nt;
static struct kernel queue[4096];
static int qhead, qtail;

static uint64_t random64(void)
{
    static uint64_t x = 88172645463325252ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

/* What a lying tenant publishes at now. */
static void lie(struct tenant *x, uint64_t now)
{
    struct nvc_sched_view v = {.id = x->v.id, .vtime = UINT64_MAX / 2, .weight = NVC_WEIGHT_MAX};
    if (x->lie == HOLD) {
        v.running = 1;
        v.seen_ns = now;
    } else if (x->lie == QUEUE) {
        v.busy_until_ns = now + NVC_SCHED_FUTURE_NS - 1;
    } else if (x->lie == ZERO) {
        v.vtime = 0;
        v.seen_ns = now;
    } else {
        v = (struct nvc_sched_view){.id = x->v.id, .vtime = random64(), .seen_ns = random64(),
                                    .busy_until_ns = random64(),
                                    .running = (uint32_t)random64(), .capped = (uint32_t)random64(),
                                    .weight = (uint32_t)random64(), .owed_ns = (int64_t)random64()};
    }
    x->v = v;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    uint64_t end_ns = strtoull(argv[1], NULL, 10) * 1000000ull, half = end_ns / 2;
    for (int i = 2; i < argc && nt < MAX_T; i++, nt++) {
        unsigned long long w, cap, us, from, until;
        char how[16] = "";
        if (sscanf(argv[i], "%llu:%llu:%llu:%llu:%llu:%15s", &w, &cap, &us, &from, &until, how) < 5)
            return 2;
        t[nt] = (struct tenant){.v = {.id = (uint64_t)nt + 1, .weight = (uint32_t)w, .cap = (uint32_t)cap},
                                .weight = (unsigned)w, .cap = (unsigned)cap, .kernel_ns = us * 1000,
                                .from_ns = from * 1000000, .until_ns = until * 1000000};
        for (enum lie l = HONEST; l <= GARBAGE; l++)
            if (!strcmp(how, lies[l]))
                t[nt].lie = l;
    }
    uint64_t gpu_free_at = 0, now = 0, refill = 0;
    struct nvc_sched_view others[MAX_T];
    for (now = 0; now < end_ns; now += STEP_NS) {
        /* the GPU: completes the kernel at the head when its time is up, starts the next */
        while (qhead != qtail && gpu_free_at <= now) {
            struct kernel *k = &queue[qhead % 4096];
            uint64_t start = gpu_free_at > k->submitted ? gpu_free_at : k->submitted;
            uint64_t done = start + k->dur;
            if (done > now)
                break;
            struct tenant *x = &t[k->tenant];
            /* what the shim measures: from when its stream could start it to completion */
            uint64_t began = k->submitted > x->last_end ? k->submitted : x->last_end;
            uint64_t measured = done - began;
            /* the estimate was k->dur */
            x->v.vtime = nvc_sched_vtime_add(x->v.vtime, (int64_t)(measured - k->dur), x->weight);
            x->inflight_ns -= k->dur;
            x->last_end = done;
            for (uint64_t a = start; a < done; a += 1000)      /* GPU time by half, at 1 us */
                x->busy[a >= half] += a + 1000 <= done ? 1000 : done - a;
            gpu_free_at = done;
            qhead++;
        }
        if (qhead == qtail && gpu_free_at < now)
            gpu_free_at = now;
        for (int i = 0; i < nt; i++) {                          /* the shims' credit refill, never above 0 */
            t[i].credit += (int64_t)((now - refill) * t[i].cap / 100);
            if (t[i].credit > 0)
                t[i].credit = 0;
        }
        refill = now;
        for (int i = 0; i < nt; i++)
            if (t[i].lie && now >= t[i].from_ns && now < t[i].until_ns)
                lie(&t[i], now);
        struct nvc_sched_view seen[MAX_T];        /* decisions of one step are simultaneous, as processes' are */
        for (int j = 0; j < nt; j++) {             /* read as sched.c reads another tenant's file */
            seen[j] = t[j].v;
            nvc_sched_sanitize(&seen[j], now);
            seen[j].weight = t[j].weight;
        }
        for (int i = 0; i < nt; i++) {
            struct tenant *x = &t[i];
            if (now < x->from_ns || now >= x->until_ns || x->lie) {
                x->waiting_since = 0;
                continue;                                       /* idle, or only lying */
            }
            if (x->inflight_ns + x->kernel_ns > MAX_INFLIGHT_NS && x->inflight_ns)
                continue;                                       /* its queue is full: waits, still seen */
            int n = 0;
            for (int j = 0; j < nt; j++)
                if (j != i)
                    others[n++] = seen[j];
            if (x->cap < 100 && now >= x->slice_end) {         /* outside its slice */
                if (x->inflight_ns)
                    continue;                                   /* its last slice's work drains first */
                if (x->last_end > x->slice_end) {               /* and what ran past the slice is charged */
                    x->credit -= (int64_t)(x->last_end - x->slice_end);
                    x->slice_end = x->last_end;
                }
                if (x->credit < 0) {
                    x->v.capped = 1;
                    x->v.running = 0;
                    x->owed_at = x->owed_at > now ? x->owed_at : now;   /* held back by its own cap: owed nothing */
                    continue;
                }
                x->slice_end = now + SLICE_PERIOD_NS * x->cap / 100;
                x->credit -= (int64_t)(SLICE_PERIOD_NS * x->cap / 100);
            }
            if (!nvc_sched_active(&x->v, now) || x->v.capped)
                x->v.vtime = nvc_sched_catch_up(x->v.vtime, others, n, now);
            x->v.capped = 0;
            x->v.seen_ns = now;
            x->v.owed_ns = nvc_sched_owed(x->v.owed_ns, nvc_sched_settle(&x->owed_at, &x->v, others, n, now),
                                          nvc_sched_margin(&x->v, others, n, now));
            if (nvc_sched_decide(&x->v, others, n, now) == NVC_SCHED_WAIT) {
                x->v.running = 0;
                if (!x->waiting_since)
                    x->waiting_since = now;
                if (x->cap < 100)
                    x->slice_end += STEP_NS;                    /* its slice waits for the turn too */
                continue;
            }
            x->v.running = 1;
            if (x->waiting_since && now - x->waiting_since > x->longest_wait)
                x->longest_wait = now - x->waiting_since;
            x->waiting_since = 0;
            queue[qtail++ % 4096] = (struct kernel){i, x->kernel_ns, now};
            x->inflight_ns += x->kernel_ns;
            x->v.vtime = nvc_sched_vtime_add(x->v.vtime, (int64_t)x->kernel_ns, x->weight);
            uint64_t base = x->v.busy_until_ns > now ? x->v.busy_until_ns : now;
            x->v.busy_until_ns = base + x->kernel_ns;
        }
        for (int i = 0; i < nt; i++)                             /* seen every step while queued work waits */
            if (!t[i].lie && now >= t[i].from_ns && now < t[i].until_ns && t[i].inflight_ns && !t[i].v.capped)
                t[i].v.seen_ns = now;
    }
    for (int i = 0; i < nt; i++) {
        if (t[i].waiting_since && now - t[i].waiting_since > t[i].longest_wait)
            t[i].longest_wait = now - t[i].waiting_since;     /* still waiting at the end */
        printf("tenant %d %llu %llu %llu\n", i, (unsigned long long)(t[i].busy[0] * 1000 / half),
               (unsigned long long)(t[i].busy[1] * 1000 / (end_ns - half)),
               (unsigned long long)(t[i].longest_wait / 1000000));
    }
    return 0;
}

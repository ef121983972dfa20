/* sched_sim: the shim's scheduler decision (native/shim/scheduling/schedpolicy.c) driving simulated tenants on a fake
 * clock and a simulated GPU that time-slices between the tenants with work queued (each one's oldest
 * kernel advances at 1/n of the GPU's speed while n tenants have work, as a GPU's time-slicing between
 * contexts averages out). Deterministic test program for tests/test_share_native.py; nothing here is
 * a GPU result.
 *
 *   sched_sim MS TENANT...    TENANT = WEIGHT:CAP:KERNEL_US:BUSY_FROM_MS:BUSY_UNTIL_MS[@ON_MS/PERIOD_MS][:HOST_US[s]|:LIE]
 *
 * Each tenant launches kernels of KERNEL_US while busy (with @ON_MS/PERIOD_MS, in bursts: the first ON_MS of
 * every PERIOD_MS from BUSY_FROM_MS), its host spending HOST_US (default 0) before
 * each launch, keeping at most 2 ms of its work queued (the shim's bound for a tenant over its share; one
 * within it may queue 20 ms, which this clock does not model), asking nvc_sched_decide
 * before each launch; with HOST_USs its host waits for each kernel's end before its HOST_US (one
 * kernel in flight: a decode loop that needs each token before the next). Its own cap (percent,
 * 100 = none) is enforced as the shim's region.c does:
 * slices of cap % of every 50 ms of wall time, extended while the scheduler holds it; work past a
 * slice's end is charged to the next. It measures each kernel's elapsed time from when its stream
 * could start it to its end and charges it with nvc_sched_charge (over how many it saw sharing the GPU at each decision and measurement) into its decaying share account, as
 * sched.c does, and publishes when its queued work should have drained from that measured time, and its
 * backlog: at most every millisecond, as its host reaches a launch, whether the work it had queued at its
 * last look is still queued, or it had more than a millisecond of work queued at once since (launches.c's
 * look_at_backlog). A tenant with a LIE launches nothing while busy and publishes, every step, one claim:
 * "busy" (work queued for almost NVC_SCHED_FUTURE_NS, always backlogged and steady, a share of 0) or "garbage" (random values);
 * the others read every view through nvc_sched_sanitize and take its weight as WEIGHT (the granted
 * one, whatever it claims). A tenant without a cap whose nvc_sched_duty gives it a duty cycle takes that
 * as its cap (duty.c), no holds meanwhile, and what ran before its duty came or after it went is no slice's
 * overrun; its looks publish its steadiness too. Prints per tenant "tenant I <GPU share in ‰ in the first
 * half> <in the second half> <its longest wait in ms> <kernels done> <their mean time from launch to end in
 * us> <slices started under a duty>" of the MS simulated milliseconds, and "gpu <busy ‰>". With SCHED_SIM_NONE=1 in the environment nothing
 * is held (no sharing control: the GPU's time-slicing alone); with SCHED_SIM_SLICE_US=N the GPU runs
 * one tenant at a time, each for N us or until its queue is empty, in turn (a kernel launched while
 * another's slice runs waits for it: its elapsed time grows, its work does not), and with
 * SCHED_SIM_SWITCH_US=N it does nothing for N us at each switch from one tenant to another (saving one
 * context, loading the other: the GPU is busy, no one's work advances). SCHED_SIM_CLASSES=C,C,...
 * gives the tenants their latency classes in order (base/config.h enum nvc_class: 0 none, 1 batch,
 * 2 latency-critical), each the granted one the others read; a queue of at most 2 ms is also the budget
 * a tenant yielding to a latency-critical one keeps (NVC_SCHED_URGENT_BUDGET_NS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduling/schedpolicy.h"

#define MAX_T 8
#define MAX_Q 64
#define STEP_NS 10000ull /* the tenants' wait step (the shim sleeps 50-200 us) */
#define MAX_INFLIGHT_NS 2000000ull
#define SLICE_PERIOD_NS 50000000ull
#define SAMPLE_NS 100000ull /* how often a process with work queued looks at the others */

enum lie { HONEST, BUSY, GARBAGE };
static const char *const lies[] = {"", "busy", "garbage"};

static struct tenant {
    struct nvc_sched_view v;
    unsigned weight, cap, duty; /* duty: its duty cycle in force (schedpolicy.h nvc_sched_duty), 0 for none */
    int fresh;                  /* its duty came or went since its last slice: what ran meanwhile is no overrun */
    uint64_t duty_slices;       /* slices it started under a duty */
    enum lie lie;
    unsigned klass;
    uint64_t kernel_ns, host_ns, from_ns, until_ns, host_ready, slice_end;
    uint64_t on_ns, period_ns; /* bursts: busy the first on_ns of every period_ns of its busy time (0: all of it) */
    uint64_t queue[MAX_Q];     /* its kernels' remaining GPU time, oldest first */
    uint64_t began;            /* when its oldest kernel could start */
    uint64_t estimate;         /* a kernel's elapsed time as last measured (the shim's estimate) */
    int qn, sync;              /* sync: its host waits for its kernel (HOST_USs) */
    int64_t credit;
    uint64_t acc, acc_at, waiting_since, longest_wait;
    struct nvc_sched_history seen_sharing;
    uint64_t gpu[2];
    uint64_t launched[MAX_Q]; /* when each queued kernel was launched */
    uint64_t done, turnaround;
    uint64_t look_at, look_until; /* its last look at its backlog, and the kernels done when its event completes */
    uint64_t peak;                /* the most work it had queued at once since that look */
    int looked, at_launch;        /* at_launch: its host is in a launch call, which waits until it may go */
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
        x->v = (struct nvc_sched_view){.id = x->v.id,
                                       .seen_ns = now,
                                       .busy_until_ns = now + NVC_SCHED_FUTURE_NS - 1,
                                       .weight = NVC_WEIGHT_MAX,
                                       .backlog_permille = 1000,
                                       .steady_permille = 1000};
    else
        x->v = (struct nvc_sched_view){.id = x->v.id,
                                       .seen_ns = random64(),
                                       .busy_until_ns = random64(),
                                       .capped = (uint32_t)random64(),
                                       .weight = (uint32_t)random64(),
                                       .share_permille = (uint32_t)random64(),
                                       .backlog_permille = (uint32_t)random64(),
                                       .steady_permille = (uint32_t)random64()};
}

static uint64_t inflight(const struct tenant *x)
{
    uint64_t sum = 0;
    for (int i = 0; i < x->qn; i++) sum += x->queue[i];
    return sum;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    const char *none = getenv("SCHED_SIM_NONE"), *sliced = getenv("SCHED_SIM_SLICE_US");
    const char *classes = getenv("SCHED_SIM_CLASSES");
    int control = !none || strcmp(none, "1"), current = 0;
    const char *switching = getenv("SCHED_SIM_SWITCH_US");
    uint64_t slice_ns = sliced ? strtoull(sliced, NULL, 10) * 1000 : 0, slice_left = 0;
    uint64_t switch_ns = switching ? strtoull(switching, NULL, 10) * 1000 : 0, switch_left = 0;
    uint64_t end_ns = strtoull(argv[1], NULL, 10) * 1000000ull, half = end_ns / 2, gpu_busy = 0;
    for (int i = 2; i < argc && nt < MAX_T; i++, nt++) {
        unsigned long long w, cap, us, from, until, on = 0, period = 0;
        char how[16] = "";
        int at = 0;
        if (sscanf(argv[i], "%llu:%llu:%llu:%llu:%llu%n", &w, &cap, &us, &from, &until, &at) < 5) return 2;
        const char *rest = argv[i] + at;
        if (*rest == '@' && sscanf(rest, "@%llu/%llu%n", &on, &period, &at) == 2 && period) rest += at;
        if (*rest == ':') sscanf(rest + 1, "%15s", how);
        t[nt] = (struct tenant){.v = {.id = (uint64_t)nt + 1, .weight = (uint32_t)w, .cap = (uint32_t)cap},
                                .weight = (unsigned)w,
                                .cap = (unsigned)cap,
                                .kernel_ns = us * 1000,
                                .from_ns = from * 1000000,
                                .until_ns = until * 1000000,
                                .on_ns = on * 1000000,
                                .period_ns = period * 1000000};
        for (enum lie l = HONEST; l <= GARBAGE; l++)
            if (!strcmp(how, lies[l])) t[nt].lie = l;
        if (!t[nt].lie && how[0]) {
            char *end;
            t[nt].host_ns = strtoull(how, &end, 10) * 1000;
            t[nt].sync = *end == 's';
        }
    }
    for (int i = 0; classes && *classes && i < nt; i++) {
        char *end;
        t[i].klass = t[i].v.klass = (unsigned)strtoul(classes, &end, 10);
        classes = *end == ',' ? end + 1 : end;
    }
    uint64_t now, refill = 0;
    struct nvc_sched_view others[MAX_T], seen[MAX_T];
    for (now = 0; now < end_ns; now += STEP_NS) {
        for (int j = 0; j < nt; j++) { /* what each tenant's file says now, read as sched.c reads it */
            seen[j] = t[j].v;
            nvc_sched_sanitize(&seen[j], now);
            seen[j].weight = t[j].weight;
            seen[j].klass = t[j].klass;
        }
        /* the GPU: one step shared by the tenants with work queued, or all of it to the one whose time
         * slice it is */
        int sharing = 0;
        for (int i = 0; i < nt; i++) sharing += t[i].qn > 0;
        gpu_busy += sharing ? STEP_NS : 0;
        if (slice_ns && sharing && (!t[current].qn || slice_left < STEP_NS)) {
            int was = current;
            do current = (current + 1) % nt;
            while (!t[current].qn);
            slice_left = slice_ns;
            switch_left = current != was ? switch_ns : 0; /* the GPU saves one context and loads the other */
        }
        slice_left -= slice_ns && sharing ? STEP_NS : 0;
        int switching_now = switch_left >= STEP_NS;
        switch_left -= switching_now ? STEP_NS : 0;
        for (int i = 0; i < nt && sharing && !switching_now; i++) {
            struct tenant *x = &t[i];
            if (!x->qn || (slice_ns && i != current)) continue;
            uint64_t slice = slice_ns ? STEP_NS : STEP_NS / sharing;
            x->gpu[now >= half] += slice;
            x->queue[0] = x->queue[0] > slice ? x->queue[0] - slice : 0;
            if (x->queue[0]) continue;
            int n = 0; /* done: measured and charged as sched.c does */
            for (int j = 0; j < nt; j++)
                if (j != i) others[n++] = seen[j];
            x->estimate = now + STEP_NS - x->began;
            nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            uint64_t charge = nvc_sched_charge(&x->seen_sharing, x->began, now + STEP_NS); /* its work where known */
            x->acc =
                nvc_sched_decay(x->acc, now + STEP_NS - x->acc_at) + (charge < x->kernel_ns ? charge : x->kernel_ns);
            x->acc_at = now + STEP_NS;
            x->began = now + STEP_NS;
            x->done++;
            x->turnaround += now + STEP_NS - x->launched[0];
            memmove(x->launched, x->launched + 1, (size_t)(x->qn - 1) * sizeof x->launched[0]);
            memmove(x->queue, x->queue + 1, (size_t)--x->qn * sizeof x->queue[0]);
            if (!x->qn) x->v.busy_until_ns = now + STEP_NS; /* drained */
            if (!x->qn && x->sync)
                x->host_ready = now + STEP_NS + x->host_ns; /* its host had waited for this kernel */
            else if (x->v.busy_until_ns < now + 2 * x->qn * x->estimate)
                x->v.busy_until_ns = now + 2 * x->qn * x->estimate;
        }
        for (int i = 0; i < nt; i++) { /* the shims' credit refill, never above 0 */
            t[i].credit += (int64_t)((now - refill) * (t[i].duty ? t[i].duty : t[i].cap) / 100);
            if (t[i].credit > 0) t[i].credit = 0;
        }
        refill = now;
        for (int i = 0; i < nt; i++) {
            struct tenant *x = &t[i];
            if (now < x->from_ns || now >= x->until_ns ||
                (x->period_ns && (now - x->from_ns) % x->period_ns >= x->on_ns)) {
                x->waiting_since = 0;
                continue; /* idle */
            }
            if (x->lie) {
                lie(x, now);
                continue;
            }
            int n = 0;
            for (int j = 0; j < nt; j++)
                if (j != i) others[n++] = seen[j];
            if (x->qn && now % SAMPLE_NS == 0) /* the shim looks while it waits for room in its queue */
                nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            if (now >= x->host_ready && !(x->qn && x->sync) && !x->at_launch) {
                x->at_launch = 1; /* its host calls a launch: a look at its backlog first, at most every 1 ms */
                if (now - x->look_at >= NVC_SCHED_BACKLOG_LOOK_NS) {
                    int backlogged = (x->looked && x->done < x->look_until) || x->peak >= NVC_SCHED_BACKLOG_LOOK_NS;
                    int pending = x->looked && x->done < x->look_until;
                    x->v.backlog_permille = nvc_sched_backlog_after(x->v.backlog_permille, backlogged);
                    x->v.steady_permille = nvc_sched_steady_after(x->v.steady_permille, pending);
                    x->peak = inflight(x);
                    x->look_until = x->done + (uint64_t)x->qn; /* the event completes behind the work queued now */
                    x->look_at = now;
                    x->looked = 1;
                }
            }
            if (now < x->host_ready || x->qn == MAX_Q ||
                (x->qn && (x->sync || inflight(x) + x->kernel_ns > MAX_INFLIGHT_NS)))
                continue; /* its host is busy or waits, or its queue full */
            x->v.share_permille = nvc_sched_share(nvc_sched_decay(x->acc, now > x->acc_at ? now - x->acc_at : 0));
            unsigned duty = control && x->cap >= 100 ? nvc_sched_duty(&x->v, others, n, now) : 0;
            x->fresh |= !x->duty != !duty; /* duty.c: only a capped launch's work is a slice's overrun */
            x->duty = duty;
            unsigned cap = duty ? duty : x->cap;            /* the cap in force */
            if (cap < 100 && now >= x->slice_end) {         /* outside its slice */
                if (x->qn) continue;                        /* its last slice's work drains first */
                if (x->began > x->slice_end && !x->fresh) { /* and what ran past the slice is charged */
                    x->credit -= (int64_t)(x->began - x->slice_end);
                    x->slice_end = x->began;
                }
                if (x->credit < 0) {
                    x->v.capped = 1;
                    continue;
                }
                x->slice_end = now + SLICE_PERIOD_NS * cap / 100;
                x->fresh = 0;
                x->duty_slices += duty != 0;
                x->credit -= (int64_t)(SLICE_PERIOD_NS * cap / 100);
            }
            x->v.capped = 0;
            x->v.seen_ns = now;
            nvc_sched_note(&x->seen_sharing, now, nvc_sched_sharing(others, n, now));
            if (control && !duty && nvc_sched_decide(&x->v, others, n, now) == NVC_SCHED_WAIT) {
                if (!x->waiting_since) x->waiting_since = now;
                if (x->cap < 100) x->slice_end += STEP_NS; /* its slice waits too */
                continue;
            }
            if (x->waiting_since && now - x->waiting_since > x->longest_wait) x->longest_wait = now - x->waiting_since;
            x->waiting_since = 0;
            if (!x->qn) x->began = now;
            x->launched[x->qn] = now;
            x->queue[x->qn++] = x->kernel_ns;
            x->at_launch = 0;
            if (inflight(x) > x->peak) x->peak = inflight(x);
            x->host_ready = x->sync ? UINT64_MAX : now + x->host_ns; /* a waiting host: until the kernel ends */
            uint64_t base = x->v.busy_until_ns > now ? x->v.busy_until_ns : now;
            x->v.busy_until_ns = base + 2 * (x->estimate ? x->estimate : x->kernel_ns);
        }
    }
    for (int i = 0; i < nt; i++) {
        if (t[i].waiting_since && now - t[i].waiting_since > t[i].longest_wait)
            t[i].longest_wait = now - t[i].waiting_since; /* still waiting at the end */
        printf("tenant %d %llu %llu %llu %llu %llu %llu\n", i, (unsigned long long)(t[i].gpu[0] * 1000 / half),
               (unsigned long long)(t[i].gpu[1] * 1000 / (end_ns - half)),
               (unsigned long long)(t[i].longest_wait / 1000000), (unsigned long long)t[i].done,
               (unsigned long long)(t[i].done ? t[i].turnaround / t[i].done / 1000 : 0),
               (unsigned long long)t[i].duty_slices);
    }
    printf("gpu %llu\n", (unsigned long long)(gpu_busy * 1000 / end_ns));
    return 0;
}

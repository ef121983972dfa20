/* Compute share: the launch queue, where a throttled launch waits for its turn and is measured and charged.
 * A cap (percent < 100) is a share of wall time, sliced (region.c): the container's processes launch freely
 * during their slice; outside it they queue behind a closed gate (gate.c), up to the next slice's length, or
 * wait where streams cannot be gated. Each launch is bracketed by CUDA events, and when they complete the
 * launch's end on the GPU is reconstructed (it started when it was launched, when this process's previous
 * work ended or when its gate opened, whichever is latest, and ran its measured time), so work that ran past
 * its slice's end is charged too. Weights (sched.c) divide measured GPU time, weighted by the fraction of
 * the device's SMs a grid can occupy, each moment divided among the containers that had work on the GPU
 * then; a weight's duty cycle (duty.c) is a cap while it holds. At most MAX_INFLIGHT_NS of estimated work may
 * be queued ahead of measurement, so a burst of asynchronous launches cannot run far past a slice or a share. */
#define _GNU_SOURCE
#include "accounting/launches.h"
#include <pthread.h>
#include <string.h>
#include "accounting/freerun.h"
#include "accounting/launchend.h"
#include "accounting/launchlog.h"
#include "base/config.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "process/devices.h"
#include "process/init.h"
#include "scheduling/duty.h"
#include "scheduling/events.h"
#include "scheduling/gate.h"
#include "scheduling/kernels.h"
#include "scheduling/sched.h"
#include "scheduling/schedpolicy.h"

#define MAX_PENDING 512
#define MAX_WAIT_STEP_NS 10000000ll /* re-check at least every 10 ms */
#define MAX_INFLIGHT_NS 2000000ll   /* queued GPU work allowed ahead of measurement */
#define WITHIN_SHARE_NS 20000000ll  /* the same for an uncapped tenant within its share: nothing holds it */
#define SCHED_WAIT_STEP_NS 100000ll /* re-ask the scheduler every 100 us */
#define HARVEST_EVERY_NS 50000ll    /* a launch's look for completed work, at most this often (below) */

struct pending { /* one launch, or a group of short ones on one stream */
    CUevent start, end;
    CUcontext ctx;
    CUstream stream;
    int ptsz, d;
    struct nvc_sched_entry *sched;
    unsigned percent;
    int count;                     /* launches in it */
    double factors;                /* their grid factors, summed */
    int64_t estimate;              /* what the scheduler was charged at launch time */
    int64_t queued_ns, work_ns;    /* its expected duration (what it adds to the queue), unslowed (to the backlog) */
    const void *key;               /* the kernel (or graph) of a launch measured alone */
    uint64_t launched_ns, last_ns; /* its first and last launch */
    int recorded, settled;         /* end event recorded (unrecorded, it queries as done); measured, waiting */
    uint32_t gate;                 /* the generation of the gate it was queued behind; 0: none */
};

/* Launches not yet measured, oldest first: a ring, so settling the oldest and queueing the newest
 * cost the same however many microsecond kernels are queued (a training step's launch rate is
 * bounded by what each launch costs on the CPU). */
static struct pending ring[MAX_PENDING];
static unsigned head, tail;
#define AT(i) (&ring[(i) % MAX_PENDING])
/* Each device's launches not yet measured: queued, of unknown cost, their estimated GPU time, and those
 * behind the newest gate (generation behind_gen): the rest, earlier gates' work included, must complete
 * before the next slice starts, so that what of it ran past a slice is charged. work: their GPU time as when
 * nothing slows them; peak: the most of it queued at once since the last look at the backlog. */
static struct {
    int queued, unknown, behind;
    int64_t inflight, work, peak;
    uint32_t behind_gen;
} queue_of[NVC_MAX_DEVICES];
/* Short kernels share one pair of events, up to GROUP_NS of expected work or GROUP_MAX launches: two
 * event records per launch cost a launch-bound loop (a training step's) as much as the launches, and
 * settling a group as much again. A cap judges its slices by when each piece of work ended, and weighted
 * tenants divide a group's time by who shared the GPU during it: their groups stay short. An uncapped
 * weight that no one can hold (no decision depends on its share) has ten times longer ones (a ResNet-50
 * trainer beside a decode loop, on the H100, did 65-69 % of its rate alone with short ones). */
static int long_groups[NVC_MAX_DEVICES];
#define GROUP_NS(dev) (long_groups[dev] ? 1000000ll : 100000ll)
#define GROUP_MAX(dev) (long_groups[dev] ? 256 : 64)
static unsigned open_at[NVC_MAX_DEVICES]; /* the group still taking launches */
static int has_open[NVC_MAX_DEVICES];
static int64_t estimate_ns[NVC_MAX_DEVICES]; /* running estimate of one full-device launch */
static int decided_of[NVC_MAX_DEVICES];      /* the scheduler's last word (enum nvc_sched_decision) */
static unsigned in_force[NVC_MAX_DEVICES];   /* the cap in force at the last launch: its own, or a duty's */
#define CAP(d) (in_force[(d)->region_index] ? in_force[(d)->region_index] : (d)->compute)

static uint64_t gpu_done_ns[NVC_MAX_DEVICES]; /* when this process's measured work ended on the GPU */
static struct {
    CUevent ev;
    CUcontext ctx;
} last_end[NVC_MAX_DEVICES]; /* the end event of the last launch settled */
static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;

/* Replaces a completed launch's estimate by its measured cost and tells a cap when the work ended.
 * Caller holds launch_mu. */
static void settle_locked(struct pending *p)
{
    float ms = 0;
    int64_t cost = p->estimate, work = 0;
    double factor = p->count > 0 ? p->factors / p->count : 0;
    if (p->count > 0 && nvc_cuda.cuEventElapsedTime(&ms, p->start, p->end) == CUDA_SUCCESS && ms >= 0) {
        int64_t full = (int64_t)((double)ms * 1e6);
        cost = (int64_t)((double)full * factor);
        if (p->count == 1) {
            /* running estimate of a full-device launch, weight 1/4 to the newest */
            int64_t per_full = factor > 0 ? (int64_t)((double)cost / factor) : full;
            estimate_ns[p->d] = estimate_ns[p->d] ? (3 * estimate_ns[p->d] + per_full) / 4 : per_full;
        }
        struct nvc_kernel_cost *own = p->key ? nvc_kernel_slot(p->key) : NULL;
        if (own) {
            nvc_kernel_measured(own, full);
            work = (int64_t)((double)own->work_ns * factor);
        }
        float since = 0; /* since the previous end event, where the two are comparable */
        int64_t between = p->launched_ns < gpu_done_ns[p->d] && last_end[p->d].ev && last_end[p->d].ctx == p->ctx &&
                                  nvc_cuda.cuEventElapsedTime(&since, last_end[p->d].ev, p->end) == CUDA_SUCCESS &&
                                  since >= 0
                              ? (int64_t)((double)since * 1e6)
                              : -1;
        uint64_t opened = between < 0 && p->gate ? nvc_gate_opened_ns(p->d, p->gate) : 0;
        gpu_done_ns[p->d] =
            nvc_launch_end_ns(gpu_done_ns[p->d], p->launched_ns, opened, (uint64_t)full, between, nvc_now_ns());
        if (p->percent < 100)
            nvc_region_done(p->d, gpu_done_ns[p->d]);
    }
    nvc_region_account_launch(p->d, (uint64_t)(cost > 0 ? cost : 0), 0);
    if (p->sched && p->count > 0 && cost > 0 && ms > 0) {
        uint64_t elapsed = (uint64_t)((double)ms * 1e6);
        uint64_t ended = gpu_done_ns[p->d] > elapsed ? gpu_done_ns[p->d] : elapsed;
        nvc_sched_measured(p->sched, nvc_now_ns(), ended - elapsed, ended, (uint64_t)cost, (uint64_t)work);
    }
    queue_of[p->d].queued--;
    queue_of[p->d].behind -= p->gate && p->gate == queue_of[p->d].behind_gen;
    queue_of[p->d].unknown -= p->count > 0 && p->queued_ns == 0;
    queue_of[p->d].inflight -= p->queued_ns;
    queue_of[p->d].work -= p->work_ns;
    nvc_event_put(p->start, p->ctx);
    if (last_end[p->d].ev)
        nvc_event_put(last_end[p->d].ev, last_end[p->d].ctx);
    last_end[p->d].ev = p->end;
    last_end[p->d].ctx = p->ctx;
    p->settled = 1;
}

/* Settles this context's completed launches in launch order, stopping at its first one still
 * running (a context's work completes in order; across streams a later one just waits for the next
 * harvest): one event query, however many are queued. Another context's older launches are left for
 * its own thread. Caller holds launch_mu. */
static void harvest_locked(CUcontext ctx)
{
    struct nvc_sched_entry *settled[NVC_MAX_DEVICES] = {0};
    for (unsigned i = head; i != tail; i++) {
        struct pending *p = AT(i);
        if (p->settled || p->ctx != ctx)
            continue;
        if (!p->recorded || nvc_cuda.cuEventQuery(p->end) != CUDA_SUCCESS)
            break;
        settle_locked(p);
        settled[p->d] = p->sched;
        if (i == head)
            head++;
    }
    while (head != tail && AT(head)->settled)
        head++;
    for (int d = 0; d < NVC_MAX_DEVICES; d++)
        if (settled[d])
            nvc_sched_queued(settled[d], nvc_now_ns(), queue_of[d].queued ? queue_of[d].inflight : 0);
}

/* Adds launches (or takes back a failed one) to a pending entry. Caller holds launch_mu. */
static void add_locked(struct pending *p, int count, double factor, int64_t estimate, int64_t queued, int64_t work)
{
    int was = p->count > 0 && p->queued_ns == 0;
    p->count += count;
    p->factors += factor;
    p->estimate += estimate;
    p->queued_ns += queued;
    queue_of[p->d].unknown += (p->count > 0 && p->queued_ns == 0) - was;
    queue_of[p->d].inflight += queued;
    p->work_ns += work;
    queue_of[p->d].work += work;
    if (queue_of[p->d].work > queue_of[p->d].peak)
        queue_of[p->d].peak = queue_of[p->d].work;
}

/* Records the end of the device's open group, so that it can complete and be measured. Only the
 * group's own context can (its stream may be that context's NULL stream). Caller holds launch_mu. */
static void close_locked(int dev, CUcontext ctx)
{
    struct pending *p = AT(open_at[dev]);
    if (!has_open[dev] || p->ctx != ctx)
        return;
    nvc_event_record(p->end, p->stream, p->ptsz);
    p->recorded = 1;
    has_open[dev] = 0;
}

struct slot {    /* where enqueue_launch put a launch */
    int pending; /* it has a pending entry, at ring index at */
    unsigned at;
    int alone; /* measured alone: its entry closes right after it */
    int64_t estimate, queued, work;
};

/* This device's launches still queued that are not behind gate generation closed (0: none is
 * closed). Caller holds launch_mu. */
static int undrained_locked(int dev, uint32_t closed)
{
    return queue_of[dev].queued - (closed && closed == queue_of[dev].behind_gen ? queue_of[dev].behind : 0);
}

/* The gate thread's condition for a slice (gate.h): all not behind the closed gate (closed, never 0
 * here) is settled. */
static int drained_before_gate(int dev, uint32_t closed, unsigned *percent)
{
    *percent = nvc_duty_in_force(dev, *percent, nvc_now_ns());
    if (pthread_mutex_trylock(&launch_mu))
        return 0; /* a launch holds it, maybe blocked in the driver: never wait */
    CUcontext seen = NULL;
    for (unsigned i = head; i != tail && undrained_locked(dev, closed); i++) {
        struct pending *p = AT(i);
        if (!p->settled && p->gate != closed && p->d == dev && p->ctx != seen)
            harvest_locked(seen = p->ctx);
    }
    int drained = !undrained_locked(dev, closed);
    pthread_mutex_unlock(&launch_mu);
    return drained;
}

/* Gates the launch's stream (0: cannot); the open group goes first, so as to complete while closed. */
static uint32_t gate_stream(struct nvc_device *d, const struct nvc_launch *l, CUcontext ctx)
{
    pthread_mutex_lock(&launch_mu);
    if (has_open[d->region_index] && !AT(open_at[d->region_index])->gate)
        close_locked(d->region_index, ctx);
    pthread_mutex_unlock(&launch_mu);
    return nvc_gate_stream(d->region_index, CAP(d), ctx, l->stream, l->ptsz, drained_before_gate);
}

/* The device's queue as a launch finds it, its context's completed launches settled first: the
 * estimated work queued ahead of measurement (-1: some of unknown cost), whether work not behind the
 * closed gate is still queued, and the running estimate of one full-device launch. */
struct queue_view {
    int64_t inflight;
    int undrained;
    int64_t unit;
    int fresh; /* its context's completed launches were settled just now */
};

/* A launch-bound loop launches every few microseconds while its oldest group runs for up to a millisecond: a
 * query at each launch costs it a driver call and finds that group running. An uncapped launch's first look
 * harvests only HARVEST_EVERY_NS after the last (its scheduler's word does not depend on it), and looks again,
 * fresh, where the queue's bound would hold it; a cap's slices start when its work is done: always fresh. */
static uint64_t harvest_at[NVC_MAX_DEVICES];

static struct queue_view look_at_queue(int dev, CUcontext ctx, int fresh)
{
    pthread_mutex_lock(&launch_mu);
    uint64_t now = nvc_now_ns();
    fresh |= now >= harvest_at[dev];
    if (fresh) {
        harvest_locked(ctx);
        harvest_at[dev] = now + HARVEST_EVERY_NS;
    }
    struct queue_view q = {queue_of[dev].unknown ? -1 : queue_of[dev].inflight,
                           undrained_locked(dev, nvc_gate_closed(dev)), estimate_ns[dev], fresh};
    pthread_mutex_unlock(&launch_mu);
    return q;
}

/* The estimated work the queue may hold ahead of measurement: MAX_INFLIGHT_NS, more for an uncapped
 * tenant within its share; inside a cap's slice what fits in the rest of it (PyTorch runs ahead of the
 * GPU, and a queue kept short leaves gaps between its small kernels); behind a gate the next slice. */
static int64_t queue_room(const struct nvc_device *d, int64_t wait, int gating, uint64_t now)
{
    int dev = d->region_index;
    int64_t room =
        d->sched && CAP(d) >= 100 && decided_of[dev] >= NVC_SCHED_RUN_WITHIN ? WITHIN_SHARE_NS : MAX_INFLIGHT_NS;
    if (CAP(d) < 100 && !wait && nvc_region_slice_end(dev) > now + (uint64_t)room)
        room = (int64_t)(nvc_region_slice_end(dev) - now);
    if (gating)
        room = (int64_t)nvc_region_slice_length(CAP(d));
    if (d->sched && nvc_sched_yields(d->sched) && room > NVC_SCHED_URGENT_BUDGET_NS)
        room = NVC_SCHED_URGENT_BUDGET_NS; /* ahead of a latency-critical tenant's next kernel */
    return room;
}

/* One launch's wait for its turn: the gate generation its stream was put behind (0: none), and where
 * a cap's slice held for the scheduler began waiting and would have ended. */
struct turn {
    uint32_t gate;
    uint64_t from, end;
};

/* Looks once at whether the launch may go now (1), or else how long to wait (*step) and why
 * (*reason): the queue's room, the cap's slice (outside it, a cap without a weight, or a duty, gates the
 * stream where it can), the scheduler's leave (a cap's slice waits for it too, extended by the wait; a
 * duty's slices are instead of it). */
static int may_launch(struct nvc_device *d, const struct nvc_launch *l, CUcontext ctx, const struct queue_view *q,
                      uint64_t now, struct turn *t, int64_t *step, enum nvc_wait_reason *reason)
{
    int dev = d->region_index;
    unsigned cap = CAP(d);
    int duty = cap < d->compute, gating;
    int64_t wait = cap < 100 ? nvc_region_slice(dev, cap, now, !q->undrained) : 0;
    if (cap < 100 && !wait)
        nvc_gate_open(dev);
    /* outside the slice a cap without a weight to weigh (time slices') queues behind a gate, up to the next
     * slice's length */
    gating = wait > 0 && (duty || !(d->weight && d->sched));
    int decision = 1; /* nvc_sched_ready's: enum nvc_sched_decision */
    if (q->inflight < 0 || q->inflight > queue_room(d, wait, gating, now)) {
        *step = q->unit / 4; /* let the queue drain */
        if (d->sched)
            nvc_sched_observe(d->sched, now);
    } else if (wait > 0 && !(gating && (t->gate = gate_stream(d, l, ctx)))) {
        *step = wait;
        *reason = NVC_WAIT_SLICE;
        if (d->sched)
            nvc_sched_ready(d->sched, now, 1);
    } else if (d->sched && !(decision = nvc_sched_ready(d->sched, now, t->gate != 0)) && !t->gate && !duty) {
        *step = SCHED_WAIT_STEP_NS; /* over its share while another wants more: the cap's slice waits too */
        *reason = NVC_WAIT_SHARE;
        decided_of[dev] = NVC_SCHED_WAIT;
        nvc_launch_tally.decided[NVC_SCHED_WAIT]++;
        if (d->compute < 100) {
            if (!t->from) {
                t->from = now;
                t->end = nvc_region_slice_end(dev);
            }
            nvc_region_slice_extend(dev, t->end + (now - t->from) + (uint64_t)*step);
        }
    } else {
        nvc_launch_tally.decided[decision] += d->sched != NULL;
        decided_of[dev] = decision;
        long_groups[dev] = d->sched && cap >= 100 && (decision == NVC_SCHED_RUN_FREE || !nvc_sched_contended(d->sched));
        return 1;
    }
    return 0;
}

/* Sleeps step (bounded), the device's open group closed first so that what the launch waits for can
 * complete; counts the time slept (since now) for reason and returns it. */
static uint64_t pause_launch(int dev, CUcontext ctx, int64_t step, uint64_t now, enum nvc_wait_reason reason)
{
    pthread_mutex_lock(&launch_mu);
    close_locked(dev, ctx);
    pthread_mutex_unlock(&launch_mu);
    step = step > MAX_WAIT_STEP_NS ? MAX_WAIT_STEP_NS : step < 50000 ? 50000 : step;
    nvc_sleep_ns(step);
    uint64_t slept = nvc_now_ns() - now;
    __atomic_add_fetch(&nvc_launch_tally.waited_for[reason], slept, __ATOMIC_RELAXED);
    return slept;
}

/* Waits until the launch may go; returns the time it waited and the gate its stream was put behind. */
static uint64_t wait_for_turn(struct nvc_device *d, const struct nvc_launch *l, CUcontext ctx, uint32_t *gate)
{
    struct turn t = {0, 0, 0};
    uint64_t waited = 0;
    for (int fresh = CAP(d) < 100;; fresh = 1) {
        struct queue_view q = look_at_queue(d->region_index, ctx, fresh);
        uint64_t now = nvc_now_ns();
        int64_t step = 0;
        enum nvc_wait_reason reason = NVC_WAIT_QUEUE;
        if (may_launch(d, l, ctx, &q, now, &t, &step, &reason))
            break;
        if (q.fresh || reason != NVC_WAIT_QUEUE)
            waited += pause_launch(d->region_index, ctx, step, now, reason);
    }
    *gate = t.gate;
    return waited;
}

/* Whether a launch may join the device's open group g: not measured alone, on the group's context,
 * stream and gate, the group not full and not idle since its last launch (an idle gap is not its work). */
static int joins_group(const struct pending *g, int dev, const struct nvc_launch *l, CUcontext ctx, uint32_t gate,
                       int alone, uint64_t now)
{
    return !alone && g->ctx == ctx && g->stream == l->stream && g->ptsz == l->ptsz && g->gate == gate &&
           g->count < GROUP_MAX(dev) && g->queued_ns < GROUP_NS(dev) && now - g->last_ns <= (uint64_t)GROUP_NS(dev);
}

/* A new pending entry at the ring's tail (its index in *at), its start event recorded on the launch's
 * stream; it becomes the device's open group unless measured alone. NULL where the ring is full or no
 * event is left. Caller holds launch_mu. */
static struct pending *new_entry_locked(struct nvc_device *d, const struct nvc_launch *l, CUcontext ctx, uint32_t gate,
                                        int alone, uint64_t now, unsigned *at)
{
    int dev = d->region_index;
    if (tail - head >= MAX_PENDING)
        return NULL;
    CUevent start = nvc_event_get(ctx), end = start ? nvc_event_get(ctx) : NULL;
    if (!end) {
        if (start)
            nvc_event_put(start, ctx);
        return NULL;
    }
    nvc_event_record(start, l->stream, l->ptsz);
    *AT(tail) = (struct pending){.start = start,
                                 .end = end,
                                 .ctx = ctx,
                                 .stream = l->stream,
                                 .ptsz = l->ptsz,
                                 .d = dev,
                                 .sched = d->sched,
                                 .percent = CAP(d),
                                 .launched_ns = now,
                                 .gate = gate};
    queue_of[dev].queued++;
    if (gate && gate != queue_of[dev].behind_gen) {
        queue_of[dev].behind_gen = gate;
        queue_of[dev].behind = 0;
    }
    queue_of[dev].behind += gate != 0;
    if (!alone) {
        open_at[dev] = tail;
        has_open[dev] = 1;
    }
    *at = tail;
    nvc_launch_tally.entries++;
    return AT(tail++);
}

/* Puts the launch in a pending entry: the device's open group where it fits, else a new one; the
 * scheduler is told of the work it queues. */
static void enqueue_launch(struct nvc_device *d, const struct nvc_launch *l, CUcontext ctx, uint32_t gate,
                           struct slot *slot)
{
    int dev = d->region_index;
    pthread_mutex_lock(&launch_mu);
    int64_t estimate = (int64_t)((double)estimate_ns[dev] * l->factor);
    struct nvc_kernel_cost *own = nvc_kernel_slot(l->key);
    int64_t queued = own && own->ns ? own->ns : estimate, work = own && own->least_ns ? own->least_ns : queued;
    uint64_t now = nvc_now_ns();
    if (d->sched)
        nvc_sched_launched(d->sched, now, queue_of[dev].inflight + queued);
    /* a kernel of unknown or long duration is measured alone; short ones join the open group */
    struct pending *g = has_open[dev] ? AT(open_at[dev]) : NULL;
    int alone = !own || !own->ns || own->ns >= GROUP_NS(dev) / 4;
    if (g && !joins_group(g, dev, l, ctx, gate, alone, now)) {
        close_locked(dev, ctx);
        alone |= has_open[dev]; /* another context's group stays open: this one goes alone */
        g = NULL;
    }
    *slot = (struct slot){0, 0, alone, estimate, queued, work};
    unsigned at = open_at[dev];
    if (!g)
        g = new_entry_locked(d, l, ctx, gate, alone, now, &at);
    nvc_launch_tally.launches++;
    if (g) {
        add_locked(g, 1, l->factor, estimate, queued, work);
        g->key = g->count == 1 ? l->key : NULL;
        g->last_ns = now;
        slot->pending = 1;
        slot->at = at;
    }
    pthread_mutex_unlock(&launch_mu);
}

/* A look at the tenant's backlog (schedpolicy.h: what lets a weight hold the others, time-sliced or MPS), at
 * most every NVC_SCHED_BACKLOG_LOOK_NS as it launches: one event per device, recorded on the launching
 * stream at each look; still pending at the next look, the work queued before it had not run yet. A host
 * that queues its work faster and then waits for it finds every look's event done: where its launches are
 * measured, more than that much work queued at once since the last look counts too, as its kernels take
 * alone (the others' time slices stretch a decode loop's kernels past that). Skipped while another thread
 * launches, and on a stream being captured into a graph (the event would land in the graph). */
static struct {
    CUevent ev;
    CUcontext ctx;
    uint64_t at;
} look_of[NVC_MAX_DEVICES];

static int look_at_backlog(struct nvc_device *d, struct nvc_sched_entry *e, const struct nvc_launch *l, CUcontext ctx,
                           uint64_t now)
{
    int dev = d->region_index;
    if (now - __atomic_load_n(&look_of[dev].at, __ATOMIC_RELAXED) < NVC_SCHED_BACKLOG_LOOK_NS ||
        nvc_stream_capturing(l->stream, l->ptsz) || pthread_mutex_trylock(&launch_mu))
        return -1;
    if (look_of[dev].ev && look_of[dev].ctx != ctx) {
        nvc_event_put(look_of[dev].ev, look_of[dev].ctx);
        look_of[dev].ev = NULL;
    }
    int pending = look_of[dev].ev && nvc_cuda.cuEventQuery(look_of[dev].ev) == CUDA_ERROR_NOT_READY;
    int64_t ran_free = nvc_freerun_launched(); /* as the queue's peak: its host may have waited since */
    int64_t most = queue_of[dev].peak > ran_free ? queue_of[dev].peak : ran_free;
    int deep = most >= (int64_t)NVC_SCHED_BACKLOG_LOOK_NS, backlogged = pending || deep;
    nvc_launch_tally.looks++;
    nvc_launch_tally.pending += (uint64_t)pending;
    nvc_launch_tally.deep += (uint64_t)deep;
    queue_of[dev].peak = queue_of[dev].work;
    if (!look_of[dev].ev) {
        look_of[dev].ev = nvc_event_get(ctx);
        look_of[dev].ctx = ctx;
    }
    if (look_of[dev].ev)
        nvc_event_record(look_of[dev].ev, l->stream, l->ptsz);
    __atomic_store_n(&look_of[dev].at, now, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&launch_mu);
    nvc_sched_backlog(e, now, backlogged, pending);
    nvc_sched_ran(e, now, (uint64_t)ran_free);
    return backlogged;
}

/* After a launch on d through the whole path: launches let go free (freerun.c) where the scheduler found the
 * tenant within its share or no one to hold it, and the look found no backlog (looked: 0). While they go free,
 * the open group is closed: nothing else would, and its work is measured when it completes. */
static void let_go_free(struct nvc_device *d, CUcontext ctx, int looked)
{
    int dev = d->region_index;
    int may = decided_of[dev] >= NVC_SCHED_RUN_WITHIN && CAP(d) >= 100 && !nvc_sched_yields(d->sched) && !looked;
    if (!nvc_freerun_after(dev, may ? d->sched : NULL, nvc_now_ns()))
        return;
    pthread_mutex_lock(&launch_mu);
    close_locked(dev, ctx);
    pthread_mutex_unlock(&launch_mu);
}

/* The throttled path: wait for the slice and the turn, then launch between two events. An MPS client only
 * looks at its backlog, and launches freely unless its duty cycle holds now. */
CUresult nvc_launch_throttled(const struct nvc_launch *l, nvc_launch_fn fn, const void *args)
{
    CUcontext ctx = NULL;
    struct nvc_device *d = l->dev;
    if (d && d->mps && d->compute >= 100) { /* no duty cycle: a look now and then, nothing else */
        uint64_t now = nvc_now_ns();
        if (now - __atomic_load_n(&look_of[d->region_index].at, __ATOMIC_RELAXED) >= NVC_SCHED_BACKLOG_LOOK_NS &&
            nvc_cuda.cuCtxGetCurrent && nvc_cuda.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && nvc_cuda.cuEventQuery &&
            nvc_cuda.cuEventRecord)
            look_at_backlog(d, d->mps, l, ctx, now);
        return fn(args);
    }
    if (!d || (d->compute >= 100 && !d->sched) || !nvc_cuda.cuCtxGetCurrent ||
        nvc_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !nvc_cuda.cuEventQuery || !nvc_cuda.cuEventElapsedTime ||
        !nvc_cuda.cuEventRecord)
        return fn(args);
    if (d->mps) { /* a duty cycle: in force only while a heavier client is backlogged */
        uint64_t now = nvc_now_ns();
        look_at_backlog(d, d->mps, l, ctx, now);
        if (!nvc_sched_on_duty(d->mps, now))
            return fn(args);
    }
    if (d->compute >= 100 && nvc_sched_unhindered(d->sched, nvc_now_ns()))
        return fn(args); /* latency-critical: no turn to wait for, nothing to measure */
    int looked = d->sched ? look_at_backlog(d, d->sched, l, ctx, nvc_now_ns()) : -1;
    in_force[d->region_index] = nvc_duty_cap(d->region_index, d->sched, d->compute, d->weight, nvc_now_ns());
    nvc_depth++;
    uint32_t gate = 0; /* the cap's slice (or a gate), the scheduler's leave, room in the queue, then an entry */
    uint64_t waited = wait_for_turn(d, l, ctx, &gate);
    if (waited)
        nvc_region_account_launch(d->region_index, 0, waited);
    struct slot slot;
    enqueue_launch(d, l, ctx, gate, &slot);
    CUresult rc = fn(args);
    if (slot.pending) {
        pthread_mutex_lock(&launch_mu);
        struct pending *p = AT(slot.at);
        if (slot.at - head < tail - head && !p->settled) { /* still queued (another thread may have settled it) */
            if (rc != CUDA_SUCCESS)
                add_locked(p, -1, -l->factor, -slot.estimate, -slot.queued, -slot.work); /* nothing ran */
            if (slot.alone && !p->recorded) {
                nvc_event_record(p->end, p->stream, p->ptsz);
                p->recorded = 1;
            } else if (has_open[p->d] && open_at[p->d] == slot.at &&
                       (p->queued_ns >= GROUP_NS(p->d) || p->count >= GROUP_MAX(p->d))) {
                close_locked(p->d, ctx);
            }
        }
        pthread_mutex_unlock(&launch_mu);
    }
    if (d->sched)
        let_go_free(d, ctx, looked);
    nvc_depth--;
    return rc;
}

void nvc_launches_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&launch_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD) {
        head = tail = 0; /* the parent's events mean nothing in the child */
        memset(has_open, 0, sizeof has_open);
        nvc_events_forget();
        memset(gpu_done_ns, 0, sizeof gpu_done_ns);
        memset(last_end, 0, sizeof last_end);
        memset(queue_of, 0, sizeof queue_of);
        memset(decided_of, 0, sizeof decided_of);
        nvc_freerun_forget();
        memset(long_groups, 0, sizeof long_groups);
        memset(look_of, 0, sizeof look_of);
        memset(harvest_at, 0, sizeof harvest_at);
        memset(&nvc_launch_tally, 0, sizeof nvc_launch_tally);
    }
    pthread_mutex_unlock(&launch_mu);
}

/* The weighted, work-conserving GPU-time scheduler's decision, as a pure function of what every
 * tenant (container) publishes in its scheduler file: no clock, no I/O, so tests drive it on a fake
 * clock (tests/share_programs/sched_sim.c). sched.c publishes and reads the files; launch.c asks
 * before every throttled launch. */
#ifndef NVC_SCHEDPOLICY_H
#define NVC_SCHEDPOLICY_H

#include <stdint.h>

#define NVC_SCHED_ACTIVE_NS 5000000ull    /* a tenant not seen launching for 5 ms is idle */
#define NVC_SCHED_SLICE_NS 20000000ull    /* a turn runs 20 ms of GPU time past the next tenant's vtime */
#define NVC_SCHED_HANDOVER_NS 300000ull   /* the next tenant queues its work this long before the last drains */
#define NVC_WEIGHT_UNIT 1000ull           /* vtime = GPU ns x NVC_WEIGHT_UNIT / weight */

/* What one tenant publishes about one device. */
struct nvc_sched_view {
    uint64_t id;                 /* tie-break, unique per tenant (its file's inode) */
    uint64_t vtime;              /* weighted GPU time consumed */
    uint64_t seen_ns;            /* last launch attempt (CLOCK_MONOTONIC) */
    uint64_t busy_until_ns;      /* when its queued work should have drained */
    uint32_t running;            /* holds the turn */
    uint32_t capped;             /* waiting for its own cap's credit: others must not wait for it */
    uint32_t weight;             /* 1..1000 (0 counts as 1) */
};

enum nvc_sched_decision { NVC_SCHED_WAIT = 0, NVC_SCHED_RUN = 1 };

/* Busy (wants the GPU or still has work queued) and not held back by its own cap. */
int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now);

/* May `self` launch now? Alone (no other active tenant) always, once work another left queued has
 * drained (a capped tenant's last kernels, say). Otherwise one tenant holds the turn at a time: the
 * holder keeps it until its vtime passes the lowest other active one by NVC_SCHED_SLICE_NS of its own
 * GPU time (turns of tens of milliseconds, so hand-overs cost little); a waiting tenant takes it once
 * no other holds it or has more than NVC_SCHED_HANDOVER_NS of work left to drain (the GPU does not
 * idle while the turn changes hands) and its (vtime, id) is the lowest of the active ones; of two
 * holders at once (both found themselves alone) the one with the higher (vtime, id) yields. Each busy
 * tenant thus gets GPU time in proportion to its weight, and an idle one's share goes to the others. */
enum nvc_sched_decision nvc_sched_decide(const struct nvc_sched_view *self, const struct nvc_sched_view *others,
                                         int n, uint64_t now);

/* The vtime a tenant becoming busy again starts from: not below the lowest active other's, so that
 * idling banks no GPU time (it would otherwise take the GPU for as long as it idled). */
uint64_t nvc_sched_catch_up(uint64_t vtime, const struct nvc_sched_view *others, int n, uint64_t now);

#endif

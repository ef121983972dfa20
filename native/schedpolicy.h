/* The weighted, work-conserving GPU-time scheduler's decision, as a pure function of what every
 * tenant (container) publishes in its scheduler file: no clock, no I/O, so tests drive it on a fake
 * clock (tests/share_programs/sched_sim.c). sched.c publishes and reads the files; launch.c asks
 * before every throttled launch. Every other tenant's view is untrusted (it writes its own file):
 * nvc_sched_sanitize makes garbage harmless, and the guarantee (nvc_sched_settle, nvc_sched_margin,
 * nvc_sched_owed) gives a tenant its weight's share of the GPU whatever the others claim. */
#ifndef NVC_SCHEDPOLICY_H
#define NVC_SCHEDPOLICY_H

#include <stdint.h>

#define NVC_SCHED_ACTIVE_NS 5000000ull    /* a tenant not seen launching for 5 ms is idle */
#define NVC_SCHED_SLICE_NS 20000000ull    /* a turn runs 20 ms of GPU time past the next tenant's vtime */
#define NVC_SCHED_HANDOVER_NS 300000ull   /* the next tenant queues its work this long before the last drains */
#define NVC_SCHED_FUTURE_NS 10000000000ull /* a peer's timestamp further ahead than this is garbage */
#define NVC_SCHED_OWED_PERMILLE 950ull    /* the guarantee counts 95 % of a tenant's part of the others' time */
#define NVC_WEIGHT_UNIT 1000ull           /* vtime = GPU ns x NVC_WEIGHT_UNIT / weight */
#define NVC_WEIGHT_MAX 1000u

/* What one tenant publishes about one device. */
struct nvc_sched_view {
    uint64_t id;                 /* tie-break, unique per tenant (its file's inode) */
    uint64_t vtime;              /* weighted GPU time consumed */
    uint64_t seen_ns;            /* last launch attempt (CLOCK_MONOTONIC) */
    uint64_t busy_until_ns;      /* when its queued work should have drained */
    uint32_t running;            /* holds the turn */
    uint32_t capped;             /* waiting for its own cap's credit: others must not wait for it */
    uint32_t weight;             /* 1..NVC_WEIGHT_MAX: its own, or for another tenant the one granted to it */
    uint32_t cap;                /* own view only: its cap, percent (100 = none) */
    int64_t owed_ns;             /* own view only: GPU time owed to it under the guarantee */
};

enum nvc_sched_decision { NVC_SCHED_WAIT = 0, NVC_SCHED_RUN = 1 };

/* Another tenant's view as read from its file, made safe to decide on: flags 0 or 1, the weight in
 * 1..NVC_WEIGHT_MAX, and a view with a timestamp absurdly far ahead of now counts as idle. */
void nvc_sched_sanitize(struct nvc_sched_view *v, uint64_t now);

/* Busy (wants the GPU or still has work queued) and not held back by its own cap. */
int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now);

/* May `self` launch now? First the guarantee: owed the margin (nvc_sched_margin) of GPU time, it
 * runs whatever the others claim. Alone (no other active tenant) always, once work another left queued has
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

/* vtime plus (or minus) ns of GPU time at this weight, saturating: a tenant that caught up with
 * another's vtime (any value: that tenant wrote it) never wraps around to the lowest. */
uint64_t nvc_sched_vtime_add(uint64_t vtime, int64_t ns, uint32_t weight);

/* The guarantee, an account of time kept by each tenant for itself: while it waits for the turn it is
 * owed NVC_SCHED_OWED_PERMILLE of its weight's part of the time the others take (its weight over the
 * sum of the active others' granted weights; 1 when none is active; no more than its cap allows),
 * while it holds the turn it pays the time it holds it, up to where its queued work ends on the GPU
 * (launches are asynchronous: one decision can queue milliseconds). Those 5 % are the guarantee's
 * slack: two honest tenants of whom one leaves more gaps between its kernels in its turns than the
 * other are still served in turns, and a tenant that never gets the turn still gets 95 % of its
 * entitlement. This settles the account from *settled (the time it is settled up to; 0: never) to
 * now as the view says the time was spent (running: holding the turn), moves *settled and returns
 * what `self` is owed more (or less). A wait counts at most NVC_SCHED_ACTIVE_NS (the tenant asks
 * again every fraction of a millisecond: a longer gap was idle). In a fair rotation the account
 * drains in the tenant's own turn whatever either side does between its kernels; a peer's claims
 * lower what it is owed no more than a busy peer of that granted weight would. */
int64_t nvc_sched_settle(uint64_t *settled, const struct nvc_sched_view *self, const struct nvc_sched_view *others,
                         int n, uint64_t now);

/* The guarantee's margin: twice the longest turn `self` can have in a fair rotation (NVC_SCHED_SLICE_NS
 * past the lightest active other's vtime, which it may start that other's slice behind), so that a fair
 * rotation never needs the guarantee, while against a tenant that keeps the turn it waits at most the
 * margin times the active others' weights over its own before it runs, and then gets its entitlement. */
int64_t nvc_sched_margin(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n,
                         uint64_t now);

/* owed + delta kept within 0 and max (the margin when accruing): a tenant banks no more than the
 * margin, and owes nothing for the turns it got when no one else wanted the GPU. */
int64_t nvc_sched_owed(int64_t owed, int64_t delta, int64_t max);

#endif

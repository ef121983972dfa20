/* The weighted, work-conserving GPU-time scheduler's decision, as a pure function of what every
 * tenant (container) publishes in its scheduler file: no clock, no I/O, so tests drive it on a fake
 * clock (tests/share_programs/sched_sim.c). sched.c publishes and reads the files; launch.c asks
 * before every throttled launch.
 *
 * Tenants are never serialised: the GPU time-slices the contexts that have work queued, so several
 * tenants launching at once keep it busy (one's host-side gaps are filled by another's kernels). The
 * scheduler only holds back a tenant that is over its weight's share while another tenant that is
 * under its own share has work on the GPU and keeps it queued (backlogged: below); everyone else
 * launches freely. A tenant's share is its
 * measured GPU time divided by the number of tenants that had work on the GPU with it (the GPU's
 * time-slicing splits it that way), decaying over NVC_SCHED_WINDOW_NS.
 *
 * Every other tenant's view is untrusted (it writes its own file): nvc_sched_sanitize makes garbage
 * harmless, and since a tenant waits only while it is over its own entitlement (its weight over the
 * active tenants' granted weights), no claim of another can push it below that. */
#ifndef NVC_SCHEDPOLICY_H
#define NVC_SCHEDPOLICY_H

#include <stdint.h>
#include "base/config.h"

#define NVC_SCHED_ACTIVE_NS 5000000ull     /* a tenant not seen launching for 5 ms, with nothing queued, is idle */
#define NVC_SCHED_FUTURE_NS 10000000000ull /* a peer's timestamp further ahead than this is garbage */
#define NVC_SCHED_WINDOW_NS 100000000ull   /* a share is measured over the last ~200 ms (decaying) */
#define NVC_SCHED_SLACK_PERMILLE 10u       /* over or under an entitlement by more than a point */
/* The active tenants' shares summed (the GPU's useful work: kernels' unslowed run times, without the
 * gaps between kernels or the switches between contexts) is taken as no less than 70 %. Real training and
 * inference pairs sum to about that (docs/performance.md); a floor above it raises every entitlement
 * above what the GPU can give, and the lightest tenant is held too late. A peer claiming no share lowers
 * another's entitlement to no less than 70 % of its weight's part, about what an honest busy peer leaves. */
#define NVC_SCHED_USEFUL_FLOOR 700u
#define NVC_WEIGHT_MAX 1000u
/* Latency classes (base/config.h enum nvc_class). A latency-critical tenant that launched within the last
 * NVC_SCHED_URGENT_NS, or has work queued, holds every other tenant of the device: they launch nothing new
 * until it has been idle that long (its requests' kernels run on a GPU that holds at most the others'
 * already-queued work, bounded by NVC_SCHED_URGENT_BUDGET_NS), and between its requests they have the GPU
 * (work-conserving). It does not wait for them. Weights apply among the latency-critical tenants, and
 * among the others. */
#define NVC_SCHED_URGENT_NS 2000000ull
#define NVC_SCHED_URGENT_BUDGET_NS 2000000ll

/* What one tenant publishes about one device. */
struct nvc_sched_view {
    uint64_t id;               /* unique per tenant (its file's inode) */
    uint64_t seen_ns;          /* last launch attempt (CLOCK_MONOTONIC) */
    uint64_t busy_until_ns;    /* when its queued work should have drained */
    uint32_t capped;           /* waiting for its own cap's credit: others must not wait for it */
    uint32_t weight;           /* 1..NVC_WEIGHT_MAX: its own, or for another tenant the one granted to it */
    uint32_t cap;              /* own view only: its cap, percent (100 = none) */
    uint32_t share_permille;   /* its share of the GPU (nvc_sched_share); another's is its claim */
    uint32_t klass;            /* enum nvc_class: its own, or for another tenant the one granted to it */
    uint32_t mps;              /* a client of the device's MPS daemon: out of the time slices (its own claim) */
    uint32_t backlog_permille; /* the part of its recent looks that found its work queued (‰) */
    uint32_t steady_permille;  /* the part of its recent looks whose previous look's work had not run yet (‰) */
};

/* RUN_WITHIN: its share is within its entitlement (nothing would hold it for a while: its queue may run
 * further ahead); RUN: over it, but no one wants more now; RUN_FREE: no active peer of its tier keeps the
 * GPU busy, so nothing can hold it and no decision depends on its share: it runs as if alone. */
enum nvc_sched_decision { NVC_SCHED_WAIT = 0, NVC_SCHED_RUN = 1, NVC_SCHED_RUN_WITHIN = 2, NVC_SCHED_RUN_FREE = 3 };

/* Another tenant's view as read from its file, made safe to decide on: capped 0 or 1, the weight in
 * 1..NVC_WEIGHT_MAX, the share at most 1000 ‰, a class it does not know NONE, and a view with a timestamp
 * absurdly far ahead of now counts as idle. */
void nvc_sched_sanitize(struct nvc_sched_view *v, uint64_t now);

/* Wants the GPU (launched lately or still has work queued) and is not held back by its own cap. */
int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now);

/* A latency-critical tenant with work now, or launching within NVC_SCHED_URGENT_NS: the others hold. */
int nvc_sched_urgent(const struct nvc_sched_view *v, uint64_t now);

/* Has work on the GPU now: it competes with this tenant's kernels for the GPU's time slices. */
int nvc_sched_busy(const struct nvc_sched_view *v, uint64_t now);

/* What `who` is entitled to, in ‰ of the GPU: its weight over `total_weight` (the active tenants',
 * its own included), no more than its cap. */
uint32_t nvc_sched_entitled(const struct nvc_sched_view *who, uint64_t total_weight);

/* May `self` launch now? Yes while its share is within its entitlement (plus the slack), or while no
 * other active tenant that is under its own entitlement has work on the GPU and is backlogged (as an MPS
 * client's backlog below: at half or more of its recent looks the work it had queued a millisecond
 * before was still queued): an idle tenant's share, or one a tenant cannot use (its host is the
 * bottleneck), goes to the others at once. A tenant that waits for its work every token or request (a
 * decode loop) is never backlogged: holding the others for it would leave the GPU idle between its
 * launches, and under time slices it would have to hold them for all of its busy time, so a weight
 * gives it nothing over no control (a latency class does). Entitlements are
 * parts of the GPU's useful work, the active tenants' shares summed (switching between contexts costs
 * the GPU some of its time), taken as no less than NVC_SCHED_USEFUL_FLOOR: a peer claiming no share
 * at all lowers another's entitlement by no more than that. */
enum nvc_sched_decision nvc_sched_decide(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n,
                                         uint64_t now);

/* MPS clients (nvc/plan/mps.py): MPS shares the SMs, so weights do not divide time there, and a weight
 * below the heaviest is a duty cycle (the shim's compute cap) that holds only while another MPS client of a
 * greater weight on the device is active and keeps work queued: at least half of its recent looks (one
 * every NVC_SCHED_BACKLOG_LOOK_NS at most, as it launches) found the work queued at its previous look still
 * there, more than a millisecond of work ahead of its host (a trainer's host runs that far ahead). A heavier
 * client that waits for its work every token or request, with less than that queued (a decode loop), or
 * that leaves the GPU idle between its launches, or is idle, holds no one: the lighter one runs free beside
 * it (work-conserving). The backlog is a peer's own claim: a lying peer holds a lighter one to the duty
 * cycle the granted weights give it, no further. */
#define NVC_SCHED_BACKLOG_LOOK_NS 1000000ull
#define NVC_SCHED_BACKLOGGED_PERMILLE 500u
int nvc_sched_duty_holds(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n, uint64_t now);
/* The part of the looks (‰) that found work queued, decaying, after one more look. */
uint32_t nvc_sched_backlog_after(uint32_t permille, int backlogged);

/* A weight beside one steadily busy heavier tenant, time-sliced: a duty cycle. Holding a lighter tenant
 * a launch at a time leaves a little of its work between the heavier one's all the time, so the GPU
 * switches between the two contexts throughout and the pair does less than with no control at all
 * (docs/performance.md, two transformer trainers 1:3 on an H200). A cap's slices put the lighter one's
 * work together, and the heavier has the GPU alone in between. So a tenant of weight w whose one active
 * peer of its tier is heavier (W) and steady (NVC_SCHED_STEADY_PERMILLE or more of its looks found the
 * work of its previous look, a millisecond before, still queued: its host runs ahead of the GPU) takes the
 * duty 2w / (w + W) in percent of wall time: the part of the time a split of the pair's overlap by weight
 * gives it. The duty rises by two points for each point its share is short of its entitlement (its work
 * may need more time than the other's), and holds only while that peer is active. Only a backlogged tenant
 * takes one (its own looks found work queued, as a heavier one's must to hold it): one whose host bounds
 * it (a loop of small kernels waited for) uses less than its share and runs free, as the holds let it. A heavier tenant with
 * host gaps is not steady: the gaps are the lighter one's to fill, which the holds of nvc_sched_decide
 * allow and a duty would not. Returns the duty in percent, 0 where none holds (then nvc_sched_decide
 * rules). The peer's steadiness is its own claim: a lying peer holds the lighter to the duty its granted
 * weight gives, which is no less than its entitlement of the time. */
#define NVC_SCHED_STEADY_PERMILLE 900u
/* The part of the looks (‰) whose previous look's work was still queued (pending), after one more look:
 * decaying by a 32nd a look, so over some 30 ms of launches (a look a millisecond at most); a training
 * step's host may wait for its work once a step (a loss read back) and stay steady. */
uint32_t nvc_sched_steady_after(uint32_t permille, int pending);
unsigned nvc_sched_duty(const struct nvc_sched_view *self, const struct nvc_sched_view *others, int n, uint64_t now);

/* How many tenants have work on the GPU now, this one included (it is asking because it has or is
 * about to queue work): the GPU time-slices between them. */
uint32_t nvc_sched_sharing(const struct nvc_sched_view *others, int n, uint64_t now);

/* How many tenants shared the GPU when, as this process saw it (at every decision and measurement):
 * the changes, newest last, in a ring. */
#define NVC_SCHED_HISTORY 64
struct nvc_sched_history {
    uint64_t at[NVC_SCHED_HISTORY];
    uint32_t sharing[NVC_SCHED_HISTORY];
    uint32_t n; /* changes noted so far */
};
void nvc_sched_note(struct nvc_sched_history *h, uint64_t now, uint32_t sharing);

/* The part of a kernel's elapsed time [from, to) that was this tenant's: the elapsed time holds the
 * time slices of the others that had work on the GPU too, so each moment counts 1 / the number sharing
 * it then (the history's oldest figure before what it remembers). */
uint64_t nvc_sched_charge(const struct nvc_sched_history *h, uint64_t from, uint64_t to);

/* The decaying account a share is read from: `acc` (charged ns) after `elapsed` ns keeps
 * NVC_SCHED_WINDOW_NS / (NVC_SCHED_WINDOW_NS + elapsed) of itself, so a steady rate r of charged time
 * settles at r x NVC_SCHED_WINDOW_NS; nvc_sched_share turns it into ‰ of the GPU. */
uint64_t nvc_sched_decay(uint64_t acc, uint64_t elapsed_ns);
uint32_t nvc_sched_share(uint64_t acc);

#endif

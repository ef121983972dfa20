/* Where this process's throttled launches waited, and what the scheduler and the looks at the backlog said
 * (launches.c counts, launchlog.c logs it at exit with NVC_SHARE_LOG=2): a workload slower under a cap or a
 * weight than its share says whether the slice, the queue bound or other containers' shares held it. */
#ifndef NVC_LAUNCHLOG_H
#define NVC_LAUNCHLOG_H

#include <stdint.h>
#include "scheduling/schedpolicy.h"

enum nvc_wait_reason { NVC_WAIT_QUEUE, NVC_WAIT_SLICE, NVC_WAIT_SHARE, NVC_WAIT_REASONS };

extern struct nvc_launch_tally {
    uint64_t waited_for[NVC_WAIT_REASONS];    /* ns slept, by reason */
    uint64_t entries, launches;               /* event pairs, throttled launches */
    uint64_t free;                            /* launches let go straight to the driver (freerun.h) */
    uint64_t decided[NVC_SCHED_RUN_FREE + 1]; /* the scheduler's decisions (enum nvc_sched_decision) */
    uint64_t looks, pending, deep; /* looks at the backlog; those that found earlier work queued, or much queued */
    /* calls of the throttled path (timed with NVC_SHARE_LOG=2 only), their whole time, the driver's launches' in it */
    uint64_t calls, path_ns, driver_ns;
} nvc_launch_tally;

#endif

/* The exit log of where this process's throttled launches waited (launchlog.h). */
#include "accounting/launchlog.h"
#include "base/ground.h"
#include "base/region.h"
#include "scheduling/duty.h"

struct nvc_launch_tally nvc_launch_tally;

__attribute__((destructor)) static void log_waits(void)
{
    const struct nvc_launch_tally *t = &nvc_launch_tally;
    if (t->launches)
        nvc_log(2,
                "compute: %llu throttled launches, %llu event pairs; waited %.1f ms for the slice, %.1f ms for queue "
                "room, %.1f ms for other containers' shares; %llu slices started, %.1f ms charged past their ends",
                (unsigned long long)t->launches, (unsigned long long)t->entries, t->waited_for[NVC_WAIT_SLICE] / 1e6,
                t->waited_for[NVC_WAIT_QUEUE] / 1e6, t->waited_for[NVC_WAIT_SHARE] / 1e6,
                (unsigned long long)nvc_region_slices_started, nvc_region_overrun_charged_ns / 1e6);
    if (t->looks)
        nvc_log(2,
                "scheduler: %llu waits, %llu runs over the share, %llu within it, %llu free (%llu launches ran free "
                "after them); %llu looks at the backlog, %llu found earlier work queued, %llu more than %.1f ms "
                "queued at once",
                (unsigned long long)t->decided[NVC_SCHED_WAIT], (unsigned long long)t->decided[NVC_SCHED_RUN],
                (unsigned long long)t->decided[NVC_SCHED_RUN_WITHIN],
                (unsigned long long)t->decided[NVC_SCHED_RUN_FREE], (unsigned long long)t->free,
                (unsigned long long)t->looks, (unsigned long long)t->pending, (unsigned long long)t->deep,
                NVC_SCHED_BACKLOG_LOOK_NS / 1e6);
    if (t->calls) {
        uint64_t waited = t->waited_for[NVC_WAIT_QUEUE] + t->waited_for[NVC_WAIT_SLICE] + t->waited_for[NVC_WAIT_SHARE];
        uint64_t own = t->path_ns > t->driver_ns + waited ? t->path_ns - t->driver_ns - waited : 0;
        nvc_log(2,
                "compute: the throttled path's own time %.2f us a call, the driver's launch in it %.2f us (%llu calls)",
                own / 1e3 / t->calls, t->driver_ns / 1e3 / t->calls, (unsigned long long)t->calls);
    }
    if (nvc_duty_engaged)
        nvc_log(2, "scheduler: a duty cycle beside a steady heavier tenant came into force %llu times",
                (unsigned long long)nvc_duty_engaged);
}

/* Launches that run free. A weight within its share, or that no one can hold (the scheduler's `within` and
 * `free`), with no latency-critical tenant on the device, waits for nothing now; yet the launch queue's path
 * (the context and device lookups, the queue, the events) cost a launch about a microsecond on the H100, a
 * host-bound ResNet-50 training step 10 % of its rate, a launch-bound decode service its latency. So once
 * the scheduler said so and the look at the backlog that came with it found no more than a millisecond of
 * the tenant's work queued (launches.c), its launches go straight to the driver until the next look is
 * due, for no more than FREE_WORK_NS of their kernels' least times (a kernel never measured takes the
 * queue's path): then one launch takes the whole path again, looks and asks. A host-bound loop launches far
 * less GPU work than that in the time; the look counts what ran free as queued at once, so one that queues
 * more than a millisecond of work between looks (a training step's burst before it waits) is found
 * backlogged and measured from then on. Only while this process has launched on one device: which device
 * a launch is on takes the driver's lookup. What runs free is not measured: the look charges its share the
 * kernels' least times (their work, as a measured launch whose work is known is charged), and the tenant is
 * published busy for as long as it may launch so. */
#include "accounting/freerun.h"
#include "accounting/launchlog.h"
#include "base/ground.h"
#include "scheduling/kernels.h"
#include "scheduling/sched.h"
#include "scheduling/schedpolicy.h"

#define FREE_WORK_NS 10000000ll /* half what a tenant within its share may queue measured (launches.c) */

static uint64_t until;               /* launches go free until then; 0: not now */
static int64_t left;                 /* the work they may still launch so */
static int64_t launched;             /* the work launched free since the last look */
static uint32_t launched_on, in_use; /* the devices this process has launched on (bits), how many */

int nvc_launches_free(const void *key)
{
    uint64_t end = __atomic_load_n(&until, __ATOMIC_RELAXED);
    if (!end || nvc_now_ns() >= end)
        return 0;
    int64_t work = nvc_kernel_least(key);
    if (!work)
        return 0;
    if (__atomic_sub_fetch(&left, work, __ATOMIC_RELAXED) < 0) {
        __atomic_store_n(&until, 0, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_add_fetch(&launched, work, __ATOMIC_RELAXED);
    __atomic_add_fetch(&nvc_launch_tally.free, 1, __ATOMIC_RELAXED);
    return 1;
}

int nvc_freerun_after(int dev, struct nvc_sched_entry *free_of, uint64_t now)
{
    uint32_t bit = 1u << dev;
    if (!(__atomic_fetch_or(&launched_on, bit, __ATOMIC_RELAXED) & bit))
        __atomic_add_fetch(&in_use, 1, __ATOMIC_RELAXED);
    if (free_of && __atomic_load_n(&in_use, __ATOMIC_RELAXED) == 1) {
        nvc_sched_launched(free_of, now, NVC_SCHED_BACKLOG_LOOK_NS); /* published busy meanwhile */
        __atomic_store_n(&left, FREE_WORK_NS, __ATOMIC_RELAXED);
        __atomic_store_n(&until, now + NVC_SCHED_BACKLOG_LOOK_NS, __ATOMIC_RELAXED);
    }
    return now < __atomic_load_n(&until, __ATOMIC_RELAXED);
}

int64_t nvc_freerun_launched(void)
{
    return __atomic_exchange_n(&launched, 0, __ATOMIC_RELAXED);
}

void nvc_freerun_forget(void)
{
    until = 0;
    left = launched = 0;
    launched_on = in_use = 0;
}

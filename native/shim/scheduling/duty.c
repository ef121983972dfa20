/* See duty.h. */
#include "scheduling/duty.h"
#include <string.h>
#include "base/region.h"
#include "scheduling/sched.h"

#define DUTY_LOOK_NS 1000000ull

static struct {
    struct nvc_sched_entry *e; /* the device's weighted entry, where its cap is a duty's; NULL otherwise */
    uint64_t at;               /* the last look */
    unsigned percent;          /* what it found: 0 for no duty */
} duty_of[NVC_REGION_DEVICES];
uint64_t nvc_duty_engaged;

unsigned nvc_duty_cap(int dev, struct nvc_sched_entry *e, unsigned compute, unsigned weight, uint64_t now)
{
    if (dev < 0 || dev >= NVC_REGION_DEVICES)
        return compute;
    if (compute < 100 || !weight || !e) {
        __atomic_store_n(&duty_of[dev].e, NULL, __ATOMIC_RELEASE);
        return compute;
    }
    __atomic_store_n(&duty_of[dev].e, e, __ATOMIC_RELEASE);
    uint64_t at = __atomic_load_n(&duty_of[dev].at, __ATOMIC_ACQUIRE);
    unsigned was = __atomic_load_n(&duty_of[dev].percent, __ATOMIC_ACQUIRE);
    if (at && now >= at && now - at < DUTY_LOOK_NS)
        return was ? was : 100;
    if (!__atomic_compare_exchange_n(&duty_of[dev].at, &at, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return was ? was : 100; /* another thread looks now */
    unsigned duty = nvc_sched_duty_now(e, now);
    __atomic_store_n(&duty_of[dev].percent, duty, __ATOMIC_RELEASE);
    if (was && !duty)
        nvc_region_slice_off(dev, now);
    if (duty && !was)
        __atomic_add_fetch(&nvc_duty_engaged, 1, __ATOMIC_RELAXED);
    return duty ? duty : 100;
}

unsigned nvc_duty_in_force(int dev, unsigned closed_at, uint64_t now)
{
    struct nvc_sched_entry *e =
        dev >= 0 && dev < NVC_REGION_DEVICES ? __atomic_load_n(&duty_of[dev].e, __ATOMIC_ACQUIRE) : NULL;
    return e ? nvc_duty_cap(dev, e, 100, 1, now) : closed_at;
}

/* No lock to take: the child looks afresh, and counts its own. */
void nvc_duty_fork(enum nvc_fork_phase phase)
{
    if (phase != NVC_FORK_CHILD)
        return;
    memset(duty_of, 0, sizeof duty_of);
    nvc_duty_engaged = 0;
}

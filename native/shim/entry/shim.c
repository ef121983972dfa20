/* The top of libnvc-share: fork handling, and MPS's client variables set as the library loads.
 * Every file with a mutex has a fork hook; fork takes them
 * all, in one lock order, once the limits are in force in this process (before that no mutex guards
 * anything the child could inherit half-written). The handlers are registered when the library is
 * loaded, so that init.c, which every wrapper calls, need not know the files above it. */
#include <pthread.h>
#include "accounting/graphmem.h"
#include "accounting/launches.h"
#include "accounting/memory.h"
#include "accounting/pools.h"
#include "base/ground.h"
#include "base/region.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"
#include "scheduling/duty.h"
#include "scheduling/gate.h"
#include "scheduling/sched.h"

/* Whether this fork took the mutexes: decided once, at prepare, by the thread that forks (the child
 * runs as a copy of that thread), so a process activated during the fork unlocks nothing it did not
 * lock. */
static __thread int guarded;

/* Lock order: reload, devices, memory (pools, allocation records, graphs), launches, gates, duty cycles, scheduler, region. */
static void fork_all(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE)
        guarded = nvc_init_activated();
    if (!guarded)
        return;
    if (phase == NVC_FORK_PREPARE) {
        nvc_reload_fork(phase);
        nvc_devices_fork(phase);
        nvc_pools_fork(phase);
        nvc_memory_fork(phase);
        nvc_graph_fork(phase);
        nvc_launches_fork(phase);
        nvc_gate_fork(phase);
        nvc_duty_fork(phase);
        nvc_sched_fork(phase);
        nvc_region_fork(phase);
    } else {
        nvc_region_fork(phase);
        nvc_sched_fork(phase);
        nvc_duty_fork(phase);
        nvc_gate_fork(phase);
        nvc_launches_fork(phase);
        nvc_graph_fork(phase);
        nvc_memory_fork(phase);
        nvc_pools_fork(phase);
        nvc_devices_fork(phase);
        nvc_reload_fork(phase);
    }
}
static void atfork_prepare(void)
{
    fork_all(NVC_FORK_PREPARE);
}
static void atfork_parent(void)
{
    fork_all(NVC_FORK_PARENT);
}
static void atfork_child(void)
{
    fork_all(NVC_FORK_CHILD);
}

__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    nvc_mps_env(); /* before main: the driver reads CUDA_MPS_* at cuInit, whichever path reaches it */
}

/* Stream-ordered pools (pools.c): each pool is charged what it reserves on the device (what the
 * device really holds for it), re-read from the driver after every pool operation. */
#ifndef NVC_POOLS_H
#define NVC_POOLS_H

#include <stdint.h>
#include "base/ground.h"
#include "base/real.h"
#include "process/devices.h"

/* What the driver says the pool reserves and uses; -1 when it gives no pool statistics. */
int nvc_pool_usage(CUmemoryPool pool, uint64_t *reserved, uint64_t *used);
struct nvc_device *nvc_pool_device(CUmemoryPool pool); /* NULL: a pool the shim does not know */
void nvc_pool_created(CUmemoryPool pool, struct nvc_device *d);
/* After an allocation from the pool of device d (granted: it succeeded): the pool's charge is brought
 * up to date, and a granted allocation counted until it is released. */
void nvc_pool_allocated(CUmemoryPool pool, struct nvc_device *d, int granted);
void nvc_pool_released(CUmemoryPool pool);        /* one of its allocations was freed */
void nvc_pool_sync(CUmemoryPool pool);            /* its charge = what it reserves now */
void nvc_pool_destroyed(CUmemoryPool pool);       /* refunded once its last allocation is freed */
void nvc_pools_sync_device(struct nvc_device *d); /* every pool of device d */
void nvc_pools_fork(enum nvc_fork_phase phase);

#endif

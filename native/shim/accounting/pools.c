/* Stream-ordered pools: a pool is charged by what it reserves (what the device really holds), not by
 * its allocations, re-read from the driver after every pool operation and before every out-of-memory
 * decision. A pool destroyed while allocations are live keeps its reserve until the last is freed. */
#define _GNU_SOURCE
#include "accounting/pools.h"
#include <pthread.h>
#include <string.h>
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "process/devices.h"

struct pool_state {
    CUmemoryPool pool;
    struct nvc_device *dev;
    uint64_t charged;     /* bytes of this pool charged to our slot */
    uint64_t outstanding; /* live allocations, for a pool destroyed while in use */
    int destroyed;
};
#define MAX_POOLS 256
static struct pool_state pools[MAX_POOLS];
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

int nvc_pool_usage(CUmemoryPool pool, uint64_t *reserved, uint64_t *used)
{
    cuuint64_t r = 0, u = 0;
    if (!nvc_cuda.cuMemPoolGetAttribute ||
        nvc_cuda.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &r) != CUDA_SUCCESS ||
        nvc_cuda.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u) != CUDA_SUCCESS)
        return -1;
    *reserved = r;
    *used = u;
    return 0;
}

static struct pool_state *pool_find_locked(CUmemoryPool pool)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool == pool)
            return &pools[i];
    return NULL;
}

static struct pool_state *pool_get_locked(CUmemoryPool pool, struct nvc_device *dev)
{
    struct pool_state *ps = pool_find_locked(pool);
    if (!ps && dev)
        for (int i = 0; i < MAX_POOLS; i++)
            if (!pools[i].pool) {
                ps = &pools[i];
                memset(ps, 0, sizeof *ps);
                ps->pool = pool;
                ps->dev = dev;
                break;
            }
    return ps;
}

/* Makes the pool's charge equal to what the driver says it reserves. Caller holds pool_mu. */
static void pool_sync_locked(struct pool_state *ps)
{
    uint64_t reserved, used;
    if (ps->destroyed || nvc_pool_usage(ps->pool, &reserved, &used))
        return;
    if (reserved > ps->charged)
        nvc_region_charge(ps->dev->region_index, reserved - ps->charged, 0);
    else if (reserved < ps->charged)
        nvc_region_uncharge(ps->dev->region_index, ps->charged - reserved);
    ps->charged = reserved;
}

void nvc_pools_sync_device(struct nvc_device *d)
{
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool && pools[i].dev == d)
            pool_sync_locked(&pools[i]);
    pthread_mutex_unlock(&pool_mu);
}

struct nvc_device *nvc_pool_device(CUmemoryPool pool)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    struct nvc_device *d = ps ? ps->dev : NULL;
    pthread_mutex_unlock(&pool_mu);
    return d;
}

void nvc_pool_created(CUmemoryPool pool, struct nvc_device *d)
{
    pthread_mutex_lock(&pool_mu);
    pool_get_locked(pool, d);
    pthread_mutex_unlock(&pool_mu);
}

void nvc_pool_allocated(CUmemoryPool pool, struct nvc_device *d, int granted)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_get_locked(pool, d);
    if (ps) {
        pool_sync_locked(ps);
        if (granted)
            ps->outstanding++;
    }
    pthread_mutex_unlock(&pool_mu);
}

void nvc_pool_released(CUmemoryPool pool)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    if (ps) {
        if (ps->outstanding)
            ps->outstanding--;
        if (ps->destroyed && ps->outstanding == 0) {
            nvc_region_uncharge(ps->dev->region_index, ps->charged);
            memset(ps, 0, sizeof *ps);
        } else {
            pool_sync_locked(ps);
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

void nvc_pool_sync(CUmemoryPool pool)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    if (ps)
        pool_sync_locked(ps);
    pthread_mutex_unlock(&pool_mu);
}

void nvc_pool_destroyed(CUmemoryPool pool)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    if (ps) {
        if (ps->outstanding == 0) {
            nvc_region_uncharge(ps->dev->region_index, ps->charged);
            memset(ps, 0, sizeof *ps);
        } else {
            ps->destroyed = 1;
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

void nvc_pools_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&pool_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD) /* the child holds none of the parent's pools (CUDA state does not survive fork) */
        memset(pools, 0, sizeof pools);
    pthread_mutex_unlock(&pool_mu);
}

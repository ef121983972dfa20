/* Memory accounting: every device-allocating path is charged to this process's slot in the
 * container's region before the driver is asked, and refunded when freed; over budget is always
 * CUDA_ERROR_OUT_OF_MEMORY. The entry points are alloc.c's, allocasync.c's and graphnodes.c's; the
 * records of what they granted are here (graph memory's in graphmem.c, pools' in pools.c). */
#define _GNU_SOURCE
#include "accounting/memory.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "accounting/graphmem.h"
#include "accounting/pools.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "process/devices.h"
#include "process/init.h"

/* ---- allocation records: (kind, key) -> device and bytes ---- */

struct rec {
    uint64_t key;
    uint8_t kind; /* 0 = empty, 0xff = tombstone */
    int16_t dev;  /* region device index */
    uint64_t bytes;
    CUmemoryPool pool; /* NVC_MEM_POOLPTR */
};

static struct rec *recs;
static size_t rec_cap, rec_fill;
static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t rec_hash(uint64_t key, uint8_t kind)
{
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17);
}

static int rec_insert_raw(struct rec *table, size_t cap, const struct rec *r)
{
    for (size_t i = rec_hash(r->key, r->kind) & (cap - 1), n = 0; n < cap; i = (i + 1) & (cap - 1), n++)
        if (table[i].kind == 0 || table[i].kind == 0xff) {
            table[i] = *r;
            return 0;
        }
    return -1;
}

void nvc_mem_record(enum nvc_mem_kind kind, uint64_t key, int dev, uint64_t bytes, CUmemoryPool pool)
{
    struct rec r = {.key = key, .kind = (uint8_t)kind, .dev = (int16_t)dev, .bytes = bytes, .pool = pool};
    pthread_mutex_lock(&rec_mu);
    if ((rec_fill + 1) * 2 > rec_cap) {
        size_t cap = rec_cap ? rec_cap * 2 : 4096;
        struct rec *table = calloc(cap, sizeof *table);
        if (table) {
            size_t live = 0;
            for (size_t i = 0; i < rec_cap; i++)
                if (recs[i].kind && recs[i].kind != 0xff) {
                    rec_insert_raw(table, cap, &recs[i]);
                    live++;
                }
            free(recs);
            recs = table;
            rec_cap = cap;
            rec_fill = live;
        }
    }
    if (recs && rec_insert_raw(recs, rec_cap, &r) == 0)
        rec_fill++;
    pthread_mutex_unlock(&rec_mu);
}

static int rec_take(enum nvc_mem_kind kind, uint64_t key, struct rec *out)
{
    int found = 0;
    pthread_mutex_lock(&rec_mu);
    if (recs)
        for (size_t i = rec_hash(key, (uint8_t)kind) & (rec_cap - 1), n = 0; n < rec_cap && recs[i].kind;
             i = (i + 1) & (rec_cap - 1), n++)
            if (recs[i].kind == kind && recs[i].key == key) {
                *out = recs[i];
                recs[i].kind = 0xff;
                found = 1;
                break;
            }
    pthread_mutex_unlock(&rec_mu);
    return found;
}

void nvc_mem_release(enum nvc_mem_kind kind, uint64_t key)
{
    struct rec r;
    if (!rec_take(kind, key, &r) && !(kind == NVC_MEM_PTR && rec_take(NVC_MEM_POOLPTR, key, &r)))
        return; /* not ours (allocated before the shim knew it): pass through */
    if (r.kind == NVC_MEM_POOLPTR)
        nvc_pool_released(r.pool);
    else
        nvc_region_uncharge(r.dev, r.bytes);
}

void nvc_mem_freed(CUdeviceptr dptr, CUstream stream, int ptsz)
{
    if (!nvc_graph_free_ptr(dptr, stream, ptsz))
        nvc_mem_release(NVC_MEM_PTR, dptr);
}

/* ---- charging ---- */

int nvc_mem_charge(struct nvc_device *d, uint64_t bytes)
{
    if (nvc_region_charge(d->region_index, bytes, d->memory_limit) == 0)
        return 0;
    /* The out-of-memory decision: first bring every pool and the graph reserve of the device up to
     * date (a trim or a synchronisation may have returned memory), then ask again. */
    nvc_pools_sync_device(d);
    nvc_graph_reserve_sync(d);
    if (nvc_region_charge(d->region_index, bytes, d->memory_limit) == 0)
        return 0;
    nvc_log(2, "out of memory: %llu bytes over the limit of %llu", (unsigned long long)bytes,
            (unsigned long long)d->memory_limit);
    return -1;
}

/* ---- context overhead: charged once per process and device, at its first context ---- */

static uint8_t ctx_charged[64];

void nvc_mem_charge_context(CUdevice dev)
{
    if (!nvc_cfg.context_overhead || dev < 0 || dev >= 64 ||
        __atomic_exchange_n(&ctx_charged[dev], 1, __ATOMIC_ACQ_REL))
        return;
    struct nvc_device *d = nvc_device_by_ordinal(dev);
    if (d)
        nvc_region_charge(d->region_index, nvc_cfg.context_overhead, 0);
}

/* ---- memory info: total = min(limit, physical), free = total - container usage, never wrapping ---- */

void nvc_memory_clamp(struct nvc_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (!d->memory_limit)
        return;
    uint64_t total = d->memory_limit < *total_bytes ? d->memory_limit : *total_bytes;
    uint64_t used = nvc_region_used(d->region_index);
    uint64_t free_virtual = used < total ? total - used : 0;
    *free_bytes = free_virtual < *free_bytes ? free_virtual : *free_bytes;
    *total_bytes = total;
}

void nvc_memory_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&rec_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD) {
        /* The child holds none of the parent's allocations (CUDA state does not survive fork). */
        if (recs)
            memset(recs, 0, rec_cap * sizeof *recs);
        rec_fill = 0;
        memset(ctx_charged, 0, sizeof ctx_charged);
    }
    pthread_mutex_unlock(&rec_mu);
}

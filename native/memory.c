/* Memory: every device-allocating path is charged to this process's slot in the container's region
 * before the driver is asked, and refunded when freed; over budget is always CUDA_ERROR_OUT_OF_MEMORY.
 * Stream-ordered pools are charged by what they reserve (what the device really holds), re-read from
 * the driver after every pool operation and before every out-of-memory decision. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "devices.h"
#include "ground.h"
#include "init.h"
#include "memory.h"
#include "real.h"
#include "region.h"

/* ---- allocation records: (kind, key) -> device and bytes ---- */

enum kind { K_PTR = 1, K_HANDLE, K_ARRAY, K_MIPMAP, K_POOLPTR };

struct rec {
    uint64_t key;
    uint8_t kind;                    /* 0 = empty, 0xff = tombstone */
    int16_t dev;                     /* region device index */
    uint64_t bytes;
    CUmemoryPool pool;               /* K_POOLPTR */
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

static void rec_put(enum kind kind, uint64_t key, int dev, uint64_t bytes, CUmemoryPool pool)
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

static int rec_take(enum kind kind, uint64_t key, struct rec *out)
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

/* ---- pools ---- */

struct pool_state {
    CUmemoryPool pool;
    struct nvc_device *dev;
    uint64_t charged;                /* bytes of this pool charged to our slot */
    uint64_t outstanding;            /* live allocations, for a pool destroyed while in use */
    int destroyed;
};
#define MAX_POOLS 256
static struct pool_state pools[MAX_POOLS];
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

static int pool_reserved(CUmemoryPool pool, uint64_t *reserved, uint64_t *used)
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
    if (ps->destroyed || pool_reserved(ps->pool, &reserved, &used))
        return;
    if (reserved > ps->charged)
        nvc_region_charge(ps->dev->region_index, reserved - ps->charged, 0);
    else if (reserved < ps->charged)
        nvc_region_uncharge(ps->dev->region_index, ps->charged - reserved);
    ps->charged = reserved;
}

static void sync_device_pools(struct nvc_device *d)
{
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].pool && pools[i].dev == d)
            pool_sync_locked(&pools[i]);
    pthread_mutex_unlock(&pool_mu);
}

/* ---- charging ---- */

int nvc_mem_charge(struct nvc_device *d, uint64_t bytes)
{
    if (nvc_region_charge(d->region_index, bytes, d->memory_limit) == 0)
        return 0;
    /* The out-of-memory decision: first bring every pool and the graph reserve of the device up to
     * date (a trim or a synchronisation may have returned memory), then ask again. */
    sync_device_pools(d);
    nvc_graph_reserve_sync(d);
    if (nvc_region_charge(d->region_index, bytes, d->memory_limit) == 0)
        return 0;
    nvc_log(2, "out of memory: %llu bytes over the limit of %llu", (unsigned long long)bytes,
            (unsigned long long)d->memory_limit);
    return -1;
}

static void uncharge(int region_dev, uint64_t bytes) { nvc_region_uncharge(region_dev, bytes); }

NVC_API CUresult cuInit(unsigned int flags)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuInit)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!nvc_depth && nvc_init() == NVC_CLOSED)
        return CUDA_ERROR_NOT_INITIALIZED;
    return nvc_cuda.cuInit(flags);
}

static CUresult alloc_plain(CUdeviceptr *dptr, size_t bytes, int managed, unsigned flags)
{
    CUresult rc_;
    struct nvc_device *d = nvc_device_current(NULL);
    if (!d || !dptr)
        return managed ? NVC_REAL(cuMemAllocManaged, dptr, bytes, flags) : NVC_REAL(cuMemAlloc_v2, dptr, bytes);
    if (nvc_mem_charge(d, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = managed ? NVC_REAL(cuMemAllocManaged, dptr, bytes, flags) : NVC_REAL(cuMemAlloc_v2, dptr, bytes);
    if (rc_ == CUDA_SUCCESS)
        rec_put(K_PTR, *dptr, d->region_index, bytes, NULL);
    else
        uncharge(d->region_index, bytes);
    return rc_;
}

NVC_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    NVC_PROLOGUE(cuMemAlloc_v2, dptr, size)
    return alloc_plain(dptr, size, 0, 0);
}

/* Managed memory can all end up resident on the device: charged in full to the current device. */
NVC_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    NVC_PROLOGUE(cuMemAllocManaged, dptr, size, flags)
    return alloc_plain(dptr, size, 1, flags);
}

/* The pitch is only known afterwards: charge width x height, then the real pitch x height. */
NVC_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                    unsigned int elsize)
{
    NVC_PROLOGUE(cuMemAllocPitch_v2, dptr, pitch, width, height, elsize)
    CUresult rc_;
    struct nvc_device *d = nvc_device_current(NULL);
    uint64_t first = (uint64_t)width * height;
    if (!d || !dptr || !pitch || (height && first / height != width))
        return NVC_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elsize);
    if (nvc_mem_charge(d, first))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = NVC_REAL(cuMemAllocPitch_v2, dptr, pitch, width, height, elsize);
    if (rc_ != CUDA_SUCCESS) {
        uncharge(d->region_index, first);
        return rc_;
    }
    uint64_t real_bytes = (uint64_t)*pitch * height;
    if (real_bytes > first && nvc_mem_charge(d, real_bytes - first)) {
        uncharge(d->region_index, first);
        (void)NVC_REAL(cuMemFree_v2, *dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (real_bytes < first)
        uncharge(d->region_index, first - real_bytes);
    rec_put(K_PTR, *dptr, d->region_index, real_bytes, NULL);
    return CUDA_SUCCESS;
}

static void release_pool_ptr(const struct rec *r)
{
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(r->pool);
    if (ps) {
        if (ps->outstanding)
            ps->outstanding--;
        if (ps->destroyed && ps->outstanding == 0) {
            uncharge(ps->dev->region_index, ps->charged);
            memset(ps, 0, sizeof *ps);
        } else {
            pool_sync_locked(ps);
        }
    }
    pthread_mutex_unlock(&pool_mu);
}

static void release_record(enum kind kind, uint64_t key)
{
    struct rec r;
    if (!rec_take(kind, key, &r) && !(kind == K_PTR && rec_take(K_POOLPTR, key, &r)))
        return;                      /* not ours (allocated before the shim knew it): pass through */
    if (r.kind == K_POOLPTR)
        release_pool_ptr(&r);
    else
        uncharge(r.dev, r.bytes);
}

NVC_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NVC_PROLOGUE(cuMemFree_v2, dptr)
    CUresult rc_ = NVC_REAL(cuMemFree_v2, dptr);
    if (rc_ == CUDA_SUCCESS && !nvc_graph_free_ptr(dptr, NULL, -1))
        release_record(K_PTR, dptr);
    return rc_;
}

/* VMM (PyTorch expandable segments, NCCL): physical memory is the handle, charged until released. */
NVC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    NVC_PROLOGUE(cuMemCreate, handle, size, prop, flags)
    CUresult rc_;
    struct nvc_device *d = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                               ? nvc_device_by_ordinal(prop->location.id) : NULL;
    if (!d || !handle)
        return NVC_REAL(cuMemCreate, handle, size, prop, flags);
    if (nvc_mem_charge(d, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = NVC_REAL(cuMemCreate, handle, size, prop, flags);
    if (rc_ == CUDA_SUCCESS)
        rec_put(K_HANDLE, *handle, d->region_index, size, NULL);
    else
        uncharge(d->region_index, size);
    return rc_;
}

NVC_WRAP_THEN(cuMemRelease, (CUmemGenericAllocationHandle handle), release_record(K_HANDLE, handle), handle)

/* ---- stream-ordered allocation ---- */

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream, int ptsz)
{
    CUresult rc_;
    CUdevice ordinal = -1;
    struct nvc_device *d = NULL;
    CUmemoryPool account_pool = pool;
    if (pool) {
        pthread_mutex_lock(&pool_mu);
        struct pool_state *ps = pool_find_locked(pool);
        d = ps ? ps->dev : NULL;
        pthread_mutex_unlock(&pool_mu);
    }
    if (!d)
        d = nvc_device_current(&ordinal);
    if (!account_pool && ordinal >= 0 &&
        !(nvc_cuda.cuDeviceGetMemPool && nvc_cuda.cuDeviceGetMemPool(&account_pool, ordinal) == CUDA_SUCCESS) &&
        !(nvc_cuda.cuDeviceGetDefaultMemPool &&
          nvc_cuda.cuDeviceGetDefaultMemPool(&account_pool, ordinal) == CUDA_SUCCESS))
        account_pool = NULL;
#define CALL_ASYNC()                                                                                       \
    (pool ? (ptsz ? NVC_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, stream)                           \
                  : NVC_REAL(cuMemAllocFromPoolAsync, dptr, size, pool, stream))                               \
          : (ptsz ? NVC_REAL(cuMemAllocAsync_ptsz, dptr, size, stream) : NVC_REAL(cuMemAllocAsync, dptr, size, stream)))
    uint64_t reserved, used;
    if (!d || !dptr)
        return CALL_ASYNC();
    CUgraph captured = nvc_capture_graph(stream, ptsz);
    if (captured) {
        /* Under stream capture this adds a memory allocation node to the graph being captured: charged
         * now, like one added by cuGraphAddMemAllocNode (graphmem.c owns it from here). */
        if (nvc_mem_charge(d, size))
            return CUDA_ERROR_OUT_OF_MEMORY;
        rc_ = CALL_ASYNC();
        if (rc_ == CUDA_SUCCESS)
            nvc_graph_record_alloc(captured, NULL, *dptr, d->region_index, size);
        else
            uncharge(d->region_index, size);
        return rc_;
    }
    if (!account_pool || pool_reserved(account_pool, &reserved, &used)) {
        /* No pool statistics: charge the request itself. */
        if (nvc_mem_charge(d, size))
            return CUDA_ERROR_OUT_OF_MEMORY;
        rc_ = CALL_ASYNC();
        if (rc_ == CUDA_SUCCESS)
            rec_put(K_PTR, *dptr, d->region_index, size, NULL);
        else
            uncharge(d->region_index, size);
        return rc_;
    }
    uint64_t spare = reserved > used ? reserved - used : 0;
    uint64_t grow = size > spare ? size - spare : 0;   /* what the pool must reserve anew */
    if (grow && nvc_mem_charge(d, grow))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = CALL_ASYNC();
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_get_locked(account_pool, d);
    if (ps) {
        pool_sync_locked(ps);
        if (rc_ == CUDA_SUCCESS)
            ps->outstanding++;
    }
    pthread_mutex_unlock(&pool_mu);
    if (grow)
        uncharge(d->region_index, grow);   /* the pool's own charge now holds it */
    if (rc_ == CUDA_SUCCESS)
        rec_put(K_POOLPTR, *dptr, d->region_index, 0, account_pool);
    return rc_;
#undef CALL_ASYNC
}

NVC_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    NVC_PROLOGUE(cuMemAllocAsync, dptr, size, stream)
    return alloc_async(dptr, size, NULL, stream, 0);
}

NVC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    NVC_PROLOGUE(cuMemAllocAsync_ptsz, dptr, size, stream)
    return alloc_async(dptr, size, NULL, stream, 1);
}

NVC_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)
{
    NVC_PROLOGUE(cuMemAllocFromPoolAsync, dptr, size, pool, stream)
    if (!pool)
        return nvc_cuda.cuMemAllocFromPoolAsync(dptr, size, pool, stream);
    return alloc_async(dptr, size, pool, stream, 0);
}

NVC_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)
{
    NVC_PROLOGUE(cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, stream)
    if (!pool)
        return nvc_cuda.cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, stream);
    return alloc_async(dptr, size, pool, stream, 1);
}

NVC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    NVC_PROLOGUE(cuMemFreeAsync, dptr, stream)
    CUresult rc_ = NVC_REAL(cuMemFreeAsync, dptr, stream);
    if (rc_ == CUDA_SUCCESS && !nvc_graph_free_ptr(dptr, stream, 0))
        release_record(K_PTR, dptr);
    return rc_;
}

NVC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    NVC_PROLOGUE(cuMemFreeAsync_ptsz, dptr, stream)
    CUresult rc_ = NVC_REAL(cuMemFreeAsync_ptsz, dptr, stream);
    if (rc_ == CUDA_SUCCESS && !nvc_graph_free_ptr(dptr, stream, 1))
        release_record(K_PTR, dptr);
    return rc_;
}

NVC_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    NVC_PROLOGUE(cuMemPoolCreate, pool, props)
    CUresult rc_ = NVC_REAL(cuMemPoolCreate, pool, props);
    if (rc_ == CUDA_SUCCESS && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        struct nvc_device *d = nvc_device_by_ordinal(props->location.id);
        pthread_mutex_lock(&pool_mu);
        if (d)
            pool_get_locked(*pool, d);
        pthread_mutex_unlock(&pool_mu);
    }
    return rc_;
}

NVC_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    NVC_PROLOGUE(cuMemPoolTrimTo, pool, keep)
    CUresult rc_ = NVC_REAL(cuMemPoolTrimTo, pool, keep);
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    if (ps)
        pool_sync_locked(ps);
    pthread_mutex_unlock(&pool_mu);
    return rc_;
}

/* A pool destroyed while allocations are live keeps its reserve until the last one is freed. */
NVC_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    NVC_PROLOGUE(cuMemPoolDestroy, pool)
    pthread_mutex_lock(&pool_mu);
    struct pool_state *ps = pool_find_locked(pool);
    if (ps)
        pool_sync_locked(ps);
    pthread_mutex_unlock(&pool_mu);
    CUresult rc_ = NVC_REAL(cuMemPoolDestroy, pool);
    pthread_mutex_lock(&pool_mu);
    ps = rc_ == CUDA_SUCCESS ? pool_find_locked(pool) : NULL;
    if (ps) {
        if (ps->outstanding == 0) {
            uncharge(ps->dev->region_index, ps->charged);
            memset(ps, 0, sizeof *ps);
        } else {
            ps->destroyed = 1;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    return rc_;
}

NVC_API CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    NVC_PROLOGUE(cuDeviceGraphMemTrim, dev)
    CUresult rc_ = NVC_REAL(cuDeviceGraphMemTrim, dev);
    struct nvc_device *d = nvc_device_by_ordinal(dev);
    if (d)
        nvc_graph_reserve_sync(d);
    return rc_;
}

/* ---- arrays: element size x channels x extents (0 counts as 1), summed over mipmap levels ---- */

static uint64_t element_bytes(int format, unsigned channels)
{
    unsigned size;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: size = 2; break;
    default: size = 4; break;
    }
    return (uint64_t)size * (channels ? channels : 1);
}

static uint64_t extent_bytes(size_t w, size_t h, size_t d, uint64_t element)
{
    return element * (w ? w : 1) * (h ? h : 1) * (d ? d : 1);
}

static CUresult array_common(void **out, uint64_t bytes, enum kind kind, CUresult (*create)(const void *, void **),
                             const void *ctx)
{
    CUresult rc_;
    struct nvc_device *d = nvc_device_current(NULL);
    if (!d || !out) {
        nvc_depth++;
        rc_ = create(ctx, out);
        nvc_depth--;
        return rc_;
    }
    if (nvc_mem_charge(d, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    nvc_depth++;
    rc_ = create(ctx, out);
    nvc_depth--;
    if (rc_ == CUDA_SUCCESS)
        rec_put(kind, (uint64_t)(uintptr_t)*out, d->region_index, bytes, NULL);
    else
        uncharge(d->region_index, bytes);
    return rc_;
}

struct array_args {
    const void *desc;
    unsigned levels;
};

static CUresult create_2d(const void *a, void **out)
{
    return nvc_cuda.cuArrayCreate_v2((CUarray *)out, ((const struct array_args *)a)->desc);
}

static CUresult create_3d(const void *a, void **out)
{
    return nvc_cuda.cuArray3DCreate_v2((CUarray *)out, ((const struct array_args *)a)->desc);
}

static CUresult create_mipmap(const void *a, void **out)
{
    const struct array_args *args = a;
    return nvc_cuda.cuMipmappedArrayCreate((CUmipmappedArray *)out, args->desc, args->levels);
}

NVC_API CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    NVC_PROLOGUE(cuArrayCreate_v2, array, desc)
    if (!desc)
        return nvc_cuda.cuArrayCreate_v2(array, desc);
    struct array_args args = {desc, 0};
    uint64_t bytes = extent_bytes(desc->Width, desc->Height, 0, element_bytes(desc->Format, desc->NumChannels));
    return array_common((void **)array, bytes, K_ARRAY, create_2d, &args);
}

NVC_API CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    NVC_PROLOGUE(cuArray3DCreate_v2, array, desc)
    if (!desc)
        return nvc_cuda.cuArray3DCreate_v2(array, desc);
    struct array_args args = {desc, 0};
    uint64_t bytes = extent_bytes(desc->Width, desc->Height, desc->Depth,
                                  element_bytes(desc->Format, desc->NumChannels));
    return array_common((void **)array, bytes, K_ARRAY, create_3d, &args);
}

NVC_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                        unsigned int levels)
{
    NVC_PROLOGUE(cuMipmappedArrayCreate, array, desc, levels)
    if (!desc)
        return nvc_cuda.cuMipmappedArrayCreate(array, desc, levels);
    struct array_args args = {desc, levels};
    uint64_t element = element_bytes(desc->Format, desc->NumChannels), bytes = 0;
    size_t w = desc->Width, h = desc->Height, dep = desc->Depth;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        if (l > 0) {                 /* each level halves every non-zero extent, down to 1 */
            w = w > 1 ? w / 2 : w;
            h = h > 1 ? h / 2 : h;
            dep = dep > 1 ? dep / 2 : dep;
        }
        bytes += extent_bytes(w, h, dep, element);
    }
    return array_common((void **)array, bytes, K_MIPMAP, create_mipmap, &args);
}

NVC_WRAP_THEN(cuArrayDestroy, (CUarray array), release_record(K_ARRAY, (uint64_t)(uintptr_t)array), array)
NVC_WRAP_THEN(cuMipmappedArrayDestroy, (CUmipmappedArray array),
              release_record(K_MIPMAP, (uint64_t)(uintptr_t)array), array)

/* ---- context overhead: charged once per process and device, at its first context ---- */

static uint8_t ctx_charged[64];

static void charge_context(CUdevice dev)
{
    if (!nvc_cfg.context_overhead || dev < 0 || dev >= 64 || __atomic_exchange_n(&ctx_charged[dev], 1, __ATOMIC_ACQ_REL))
        return;
    struct nvc_device *d = nvc_device_by_ordinal(dev);
    if (d)
        nvc_region_charge(d->region_index, nvc_cfg.context_overhead, 0);
}

NVC_WRAP_THEN(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), charge_context(dev), pctx, dev)
NVC_WRAP_THEN(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), charge_context(dev), pctx, flags,
              dev)
NVC_WRAP_THEN(cuCtxCreate_v3, (CUcontext *pctx, void *params, int nparams, unsigned int flags, CUdevice dev),
              charge_context(dev), pctx, params, nparams, flags, dev)
NVC_WRAP_THEN(cuCtxCreate_v4, (CUcontext *pctx, void *params, unsigned int flags, CUdevice dev),
              charge_context(dev), pctx, params, flags, dev)

/* ---- memory info: total = min(limit, physical), free = total - container usage, never wrapping ---- */

static void clamp(struct nvc_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (!d->memory_limit)
        return;
    uint64_t total = d->memory_limit < *total_bytes ? d->memory_limit : *total_bytes;
    uint64_t used = nvc_region_used(d->region_index);
    uint64_t free_virtual = used < total ? total - used : 0;
    *free_bytes = free_virtual < *free_bytes ? free_virtual : *free_bytes;
    *total_bytes = total;
}

NVC_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    NVC_PROLOGUE(cuMemGetInfo_v2, free_bytes, total_bytes)
    CUresult rc_ = NVC_REAL(cuMemGetInfo_v2, free_bytes, total_bytes);
    struct nvc_device *d;
    if (rc_ == CUDA_SUCCESS && free_bytes && total_bytes && (d = nvc_device_current(NULL))) {
        sync_device_pools(d);        /* a synchronisation may have released pool memory */
        uint64_t f = *free_bytes, t = *total_bytes;
        clamp(d, &f, &t);
        *free_bytes = (size_t)f;
        *total_bytes = (size_t)t;
    }
    return rc_;
}

NVC_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NVC_PROLOGUE(cuDeviceTotalMem_v2, bytes, dev)
    CUresult rc_ = NVC_REAL(cuDeviceTotalMem_v2, bytes, dev);
    struct nvc_device *d;
    if (rc_ == CUDA_SUCCESS && bytes && (d = nvc_device_by_ordinal(dev)) && d->memory_limit &&
        d->memory_limit < *bytes)
        *bytes = (size_t)d->memory_limit;
    return rc_;
}

/* Used by nvml.c: the same numbers for an NVML handle. */
void nvc_memory_clamp(struct nvc_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    clamp(d, free_bytes, total_bytes);
}

void nvc_memory_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&pool_mu);
        pthread_mutex_lock(&rec_mu);
        nvc_graph_fork(phase);
        return;
    }
    nvc_graph_fork(phase);
    if (phase == NVC_FORK_CHILD) {
        /* The child holds none of the parent's allocations (CUDA state does not survive fork). */
        if (recs)
            memset(recs, 0, rec_cap * sizeof *recs);
        rec_fill = 0;
        memset(pools, 0, sizeof pools);
        memset(ctx_charged, 0, sizeof ctx_charged);
    }
    pthread_mutex_unlock(&rec_mu);
    pthread_mutex_unlock(&pool_mu);
}

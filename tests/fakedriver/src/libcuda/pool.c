/* The fake libcuda's stream-ordered allocation: memory pools, their reserves and attributes. Test
 * double only. */
#include "internal.h"

static struct obj *g_pools; /* every pool, the devices' default pools too */

/* Trims every pool of the device to its release threshold, as the driver does at synchronization. */
void fake_trim_pools(int dev)
{
    for (struct obj *p = g_pools; p; p = p->pool_next) {
        uint64_t keep = max_u64(p->used, p->threshold);
        if (p->dev == dev && p->reserved > keep) {
            fake_uncharge(dev, p->reserved - keep);
            p->reserved = keep;
        }
    }
}

/* Forgets a destroyed pool once nothing is allocated from it. */
static void pool_drop(struct obj *pool)
{
    struct obj **pp = &g_pools;
    while (*pp != pool) pp = &(*pp)->pool_next;
    *pp = pool->pool_next;
    fake_obj_free(pool);
}

/* Returns a pool allocation to its pool (the pool keeps the bytes reserved until trimmed). */
void fake_pool_free_mem(struct obj *mem)
{
    struct obj *pool = mem->parent;
    pool->used -= mem->size;
    fake_obj_free(mem);
    if (pool->destroyed && pool->used == 0) {
        fake_uncharge(pool->dev, pool->reserved);
        pool_drop(pool);
    }
}

static struct obj *pool_new(int dev)
{
    struct obj *p = fake_obj_new(K_POOL, 0);
    if (!p) return NULL;
    p->dev = dev;
    p->reuse[CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = 1;
    p->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC] = 1;
    p->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES] = 1;
    p->pool_next = g_pools;
    g_pools = p;
    return p;
}

static struct obj *default_pool(int dev)
{
    struct fdev *d = &fake_dev[dev];
    if (!d->default_pool && (d->default_pool = pool_new(dev))) d->default_pool->is_default = 1;
    return d->default_pool;
}

/* Serves from the pool's reserve, growing it (and the device charge) only by what is missing. */
static CUresult pool_alloc(struct obj *pool, uint64_t bytes, CUdeviceptr *dptr)
{
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t spare = pool->reserved - pool->used;
    uint64_t grow = bytes > spare ? bytes - spare : 0;
    CUdeviceptr va;
    CUresult r = fake_reserve_va(bytes, 0, &va);
    if (r == CUDA_SUCCESS && grow) r = fake_charge(pool->dev, grow);
    if (r != CUDA_SUCCESS) return r;
    struct obj *o = fake_obj_new(K_MEM, va);
    if (!o) {
        fake_uncharge(pool->dev, grow);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    o->dev = pool->dev;
    o->size = bytes;
    o->parent = pool;
    pool->reserved += grow;
    pool->used += bytes;
    pool->reserved_high = max_u64(pool->reserved_high, pool->reserved);
    pool->used_high = max_u64(pool->used_high, pool->used);
    *dptr = va;
    return CUDA_SUCCESS;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct fctx *c;
    uint64_t *done;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    struct obj *p = NULL, *captured = r == CUDA_SUCCESS ? fake_capture_of(stream) : NULL;
    if (captured) { /* under capture: a memory allocation node, nothing allocated now */
        CUDA_MEM_ALLOC_NODE_PARAMS params = {.poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                                           .location = {CU_MEM_LOCATION_TYPE_DEVICE, c->dev}},
                                             .bytesize = bytesize};
        CUgraphNode node;
        r = fake_gmem_node(captured, &node, &params);
        if (r == CUDA_SUCCESS) *dptr = params.dptr;
        unlock();
        return r;
    }
    if (r == CUDA_SUCCESS) {
        p = pool ? fake_handle_find(K_POOL, pool) : default_pool(c->dev);
        if (!p || p->destroyed) r = pool ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) r = pool_alloc(p, bytesize, dptr);
    unlock();
    return r;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    return alloc_from_pool(dptr, bytesize, NULL, stream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    return alloc_from_pool(dptr, bytesize, NULL, stream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    return pool ? alloc_from_pool(dptr, bytesize, pool, stream) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    lock();
    struct fctx *c;
    uint64_t *done;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    struct obj *captured = r == CUDA_SUCCESS ? fake_capture_of(stream) : NULL;
    if (captured) { /* under capture: a memory free node */
        CUgraphNode node;
        r = fake_gfree_node(captured, &node, dptr);
    } else {
        r = fake_mem_free(r, dptr);
    }
    unlock();
    return r;
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return cuMemFreeAsync(dptr, stream); }

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device_location(&props->location);
    struct obj *p = NULL;
    if (r == CUDA_SUCCESS && !(p = pool_new(props->location.id))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) *pool = (CUmemoryPool)p;
    unlock();
    return r;
}

/* After the init check, the pool behind handle unless it is destroyed. */
static CUresult find_pool(CUmemoryPool pool, struct obj **out)
{
    CUresult r = fake_find(K_POOL, (uintptr_t)pool, CUDA_ERROR_INVALID_VALUE, out);
    return r == CUDA_SUCCESS && (*out)->destroyed ? CUDA_ERROR_INVALID_VALUE : r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    lock();
    struct obj *p;
    CUresult r = find_pool(pool, &p);
    if (r == CUDA_SUCCESS) {
        uint64_t target = max_u64(p->used, keep);
        if (p->reserved > target) {
            fake_uncharge(p->dev, p->reserved - target);
            p->reserved = target;
        }
    }
    unlock();
    return r;
}

/* Destroying a pool with live allocations is deferred until the last of them is freed. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    lock();
    struct obj *p;
    CUresult r = find_pool(pool, &p);
    if (r == CUDA_SUCCESS && p->is_default) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        fake_uncharge(p->dev, p->reserved - p->used);
        p->reserved = p->used;
        p->destroyed = 1;
        if (p->used == 0) pool_drop(p);
    }
    unlock();
    return r;
}

static int is_reuse_attribute(CUmemPool_attribute attr)
{
    return attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
           attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
           attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

static CUresult pool_set(struct obj *p, CUmemPool_attribute attr, void *value)
{
    if (is_reuse_attribute(attr)) {
        p->reuse[attr] = *(int *)value != 0;
        return CUDA_SUCCESS;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)value; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: /* only resets to the current value are allowed */
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0) return CUDA_ERROR_INVALID_VALUE;
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            p->reserved_high = p->reserved;
        else
            p->used_high = p->used;
        return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult pool_get(struct obj *p, CUmemPool_attribute attr, void *value)
{
    if (is_reuse_attribute(attr)) {
        *(int *)value = p->reuse[attr];
        return CUDA_SUCCESS;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value,
                               CUresult (*access)(struct obj *p, CUmemPool_attribute attr, void *value))
{
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *p;
    CUresult r = find_pool(pool, &p);
    if (r == CUDA_SUCCESS) r = access(p, attr, value);
    unlock();
    return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, pool_set);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, pool_get);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    struct obj *p = NULL;
    if (r == CUDA_SUCCESS && !(p = default_pool(dev))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) *pool = (CUmemoryPool)p;
    unlock();
    return r;
}

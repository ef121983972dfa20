/* The stream-ordered entry points: cuMemAllocAsync and cuMemAllocFromPoolAsync (and _ptsz) are
 * charged by the growth of their pool's reserve (pools.c), or the request itself when the driver gives
 * no pool statistics, or as a graph memory node under stream capture (graphmem.c); frees, trims and
 * pool destruction bring the pool's charge back to what it reserves. */
#define _GNU_SOURCE
#include <stdint.h>
#include "accounting/graphmem.h"
#include "accounting/memory.h"
#include "accounting/pools.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "entry/wrap.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream, int ptsz)
{
    CUresult rc_;
    CUdevice ordinal = -1;
    struct nvc_device *d = NULL;
    CUmemoryPool account_pool = pool;
    if (pool)
        d = nvc_pool_device(pool);
    if (!d)
        d = nvc_device_current(&ordinal);
    if (!account_pool && ordinal >= 0 &&
        !(nvc_cuda.cuDeviceGetMemPool && nvc_cuda.cuDeviceGetMemPool(&account_pool, ordinal) == CUDA_SUCCESS) &&
        !(nvc_cuda.cuDeviceGetDefaultMemPool &&
          nvc_cuda.cuDeviceGetDefaultMemPool(&account_pool, ordinal) == CUDA_SUCCESS))
        account_pool = NULL;
#define CALL_ASYNC() \
    (pool ? (ptsz ? NVC_REAL(cuMemAllocFromPoolAsync_ptsz, dptr, size, pool, stream) \
                  : NVC_REAL(cuMemAllocFromPoolAsync, dptr, size, pool, stream)) \
          : (ptsz ? NVC_REAL(cuMemAllocAsync_ptsz, dptr, size, stream) \
                  : NVC_REAL(cuMemAllocAsync, dptr, size, stream)))
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
            nvc_region_uncharge(d->region_index, size);
        return rc_;
    }
    if (!account_pool || nvc_pool_usage(account_pool, &reserved, &used)) {
        /* No pool statistics: charge the request itself. */
        if (nvc_mem_charge(d, size))
            return CUDA_ERROR_OUT_OF_MEMORY;
        rc_ = CALL_ASYNC();
        if (rc_ == CUDA_SUCCESS)
            nvc_mem_record(NVC_MEM_PTR, *dptr, d->region_index, size, NULL);
        else
            nvc_region_uncharge(d->region_index, size);
        return rc_;
    }
    uint64_t spare = reserved > used ? reserved - used : 0;
    uint64_t grow = size > spare ? size - spare : 0; /* what the pool must reserve anew */
    if (grow && nvc_mem_charge(d, grow))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = CALL_ASYNC();
    nvc_pool_allocated(account_pool, d, rc_ == CUDA_SUCCESS);
    if (grow)
        nvc_region_uncharge(d->region_index, grow); /* the pool's own charge now holds it */
    if (rc_ == CUDA_SUCCESS)
        nvc_mem_record(NVC_MEM_POOLPTR, *dptr, d->region_index, 0, account_pool);
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

NVC_WRAP_THEN(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), nvc_mem_freed(dptr, stream, 0), dptr, stream)
NVC_WRAP_THEN(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), nvc_mem_freed(dptr, stream, 1), dptr, stream)

NVC_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    NVC_PROLOGUE(cuMemPoolCreate, pool, props)
    CUresult rc_ = NVC_REAL(cuMemPoolCreate, pool, props);
    if (rc_ == CUDA_SUCCESS && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        struct nvc_device *d = nvc_device_by_ordinal(props->location.id);
        if (d)
            nvc_pool_created(*pool, d);
    }
    return rc_;
}

NVC_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    NVC_PROLOGUE(cuMemPoolTrimTo, pool, keep)
    CUresult rc_ = NVC_REAL(cuMemPoolTrimTo, pool, keep);
    nvc_pool_sync(pool);
    return rc_;
}

/* A pool destroyed while allocations are live keeps its reserve until the last one is freed. */
NVC_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    NVC_PROLOGUE(cuMemPoolDestroy, pool)
    nvc_pool_sync(pool);
    CUresult rc_ = NVC_REAL(cuMemPoolDestroy, pool);
    if (rc_ == CUDA_SUCCESS)
        nvc_pool_destroyed(pool);
    return rc_;
}

/* The plain allocation entry points: every device-allocating call outside stream order (cuMemAlloc,
 * managed and pitched memory, VMM handles, arrays) is charged before the driver is asked and refunded
 * when freed (memory.c); contexts are charged their overhead; memory queries report the container's
 * view. cuInit is here too: with on_error=fail-closed it is the first call that fails. */
#define _GNU_SOURCE
#include <stdint.h>
#include "accounting/memory.h"
#include "accounting/pools.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "entry/wrap.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"

NVC_API CUresult cuInit(unsigned int flags)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuInit)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!nvc_depth && nvc_ready() == NVC_CLOSED)
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
        nvc_mem_record(NVC_MEM_PTR, *dptr, d->region_index, bytes, NULL);
    else
        nvc_region_uncharge(d->region_index, bytes);
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
NVC_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elsize)
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
        nvc_region_uncharge(d->region_index, first);
        return rc_;
    }
    uint64_t real_bytes = (uint64_t)*pitch * height;
    if (real_bytes > first && nvc_mem_charge(d, real_bytes - first)) {
        nvc_region_uncharge(d->region_index, first);
        (void)NVC_REAL(cuMemFree_v2, *dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (real_bytes < first)
        nvc_region_uncharge(d->region_index, first - real_bytes);
    nvc_mem_record(NVC_MEM_PTR, *dptr, d->region_index, real_bytes, NULL);
    return CUDA_SUCCESS;
}

NVC_WRAP_THEN(cuMemFree_v2, (CUdeviceptr dptr), nvc_mem_freed(dptr, NULL, -1), dptr)

/* VMM (PyTorch expandable segments, NCCL): physical memory is the handle, charged until released. */
NVC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    NVC_PROLOGUE(cuMemCreate, handle, size, prop, flags)
    CUresult rc_;
    struct nvc_device *d =
        prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? nvc_device_by_ordinal(prop->location.id) : NULL;
    if (!d || !handle)
        return NVC_REAL(cuMemCreate, handle, size, prop, flags);
    if (nvc_mem_charge(d, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc_ = NVC_REAL(cuMemCreate, handle, size, prop, flags);
    if (rc_ == CUDA_SUCCESS)
        nvc_mem_record(NVC_MEM_HANDLE, *handle, d->region_index, size, NULL);
    else
        nvc_region_uncharge(d->region_index, size);
    return rc_;
}

NVC_WRAP_THEN(cuMemRelease, (CUmemGenericAllocationHandle handle), nvc_mem_release(NVC_MEM_HANDLE, handle), handle)

/* ---- arrays: element size x channels x extents (0 counts as 1), summed over mipmap levels ---- */

static uint64_t element_bytes(int format, unsigned channels)
{
    unsigned size;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: size = 2; break;
    default: size = 4; break;
    }
    return (uint64_t)size * (channels ? channels : 1);
}

static uint64_t extent_bytes(size_t w, size_t h, size_t d, uint64_t element)
{
    return element * (w ? w : 1) * (h ? h : 1) * (d ? d : 1);
}

static CUresult array_common(void **out, uint64_t bytes, enum nvc_mem_kind kind,
                             CUresult (*create)(const void *, void **), const void *ctx)
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
        nvc_mem_record(kind, (uint64_t)(uintptr_t)*out, d->region_index, bytes, NULL);
    else
        nvc_region_uncharge(d->region_index, bytes);
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
    return array_common((void **)array, bytes, NVC_MEM_ARRAY, create_2d, &args);
}

NVC_API CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    NVC_PROLOGUE(cuArray3DCreate_v2, array, desc)
    if (!desc)
        return nvc_cuda.cuArray3DCreate_v2(array, desc);
    struct array_args args = {desc, 0};
    uint64_t bytes =
        extent_bytes(desc->Width, desc->Height, desc->Depth, element_bytes(desc->Format, desc->NumChannels));
    return array_common((void **)array, bytes, NVC_MEM_ARRAY, create_3d, &args);
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
        if (l > 0) { /* each level halves every non-zero extent, down to 1 */
            w = w > 1 ? w / 2 : w;
            h = h > 1 ? h / 2 : h;
            dep = dep > 1 ? dep / 2 : dep;
        }
        bytes += extent_bytes(w, h, dep, element);
    }
    return array_common((void **)array, bytes, NVC_MEM_MIPMAP, create_mipmap, &args);
}

NVC_WRAP_THEN(cuArrayDestroy, (CUarray array), nvc_mem_release(NVC_MEM_ARRAY, (uint64_t)(uintptr_t)array), array)
NVC_WRAP_THEN(cuMipmappedArrayDestroy, (CUmipmappedArray array),
              nvc_mem_release(NVC_MEM_MIPMAP, (uint64_t)(uintptr_t)array), array)

/* ---- context overhead: charged once per process and device, at its first context (memory.c) ---- */

NVC_WRAP_THEN(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), nvc_mem_charge_context(dev), pctx, dev)
NVC_WRAP_THEN(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev), nvc_mem_charge_context(dev), pctx,
              flags, dev)
NVC_WRAP_THEN(cuCtxCreate_v3, (CUcontext * pctx, void *params, int nparams, unsigned int flags, CUdevice dev),
              nvc_mem_charge_context(dev), pctx, params, nparams, flags, dev)
NVC_WRAP_THEN(cuCtxCreate_v4, (CUcontext * pctx, void *params, unsigned int flags, CUdevice dev),
              nvc_mem_charge_context(dev), pctx, params, flags, dev)

/* ---- memory info: total = min(limit, physical), free = total - container usage, never wrapping ---- */

NVC_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    NVC_PROLOGUE(cuMemGetInfo_v2, free_bytes, total_bytes)
    CUresult rc_ = NVC_REAL(cuMemGetInfo_v2, free_bytes, total_bytes);
    struct nvc_device *d;
    if (rc_ == CUDA_SUCCESS && free_bytes && total_bytes && (d = nvc_device_current(NULL))) {
        nvc_pools_sync_device(d); /* a synchronisation may have released pool memory */
        uint64_t f = *free_bytes, t = *total_bytes;
        nvc_memory_clamp(d, &f, &t);
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
    if (rc_ == CUDA_SUCCESS && bytes && (d = nvc_device_by_ordinal(dev)) && d->memory_limit && d->memory_limit < *bytes)
        *bytes = (size_t)d->memory_limit;
    return rc_;
}

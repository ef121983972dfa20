/* The fake libcuda's memory: plain allocations, virtual memory management and arrays, each charged to
 * its device. Test double only. */
#include "internal.h"

/* ---------------------------------------------------------------- plain allocations */

/* Charges bytes to the current context's device and hands out a fresh fake address. */
static CUresult mem_alloc(uint64_t bytes, CUdeviceptr *dptr)
{
    lock();
    struct fctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS && bytes == 0) r = CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr va;
    if (r == CUDA_SUCCESS) r = fake_reserve_va(bytes, 0, &va);
    if (r == CUDA_SUCCESS) r = fake_charge(c->dev, bytes);
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && !(o = fake_obj_new(K_MEM, va))) {
        fake_uncharge(c->dev, bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        o->ctx = c;
        o->dev = c->dev;
        o->size = bytes;
        *dptr = va;
    }
    unlock();
    return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return dptr ? mem_alloc(bytesize, dptr) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elementsize)
{
    if (!dptr || !pitch || width == 0 || height == 0 || (elementsize != 4 && elementsize != 8 && elementsize != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t row = (width + PITCH_ALIGN - 1) & ~(PITCH_ALIGN - 1), bytes;
    if (row < width || __builtin_mul_overflow(row, (uint64_t)height, &bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = mem_alloc(bytes, dptr);
    if (r == CUDA_SUCCESS) *pitch = (size_t)row;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) return CUDA_ERROR_INVALID_VALUE;
    return mem_alloc(bytesize, dptr);
}

/* Frees the allocation at dptr once the caller's context or stream checked out (r). Called under the
 * lock. */
CUresult fake_mem_free(CUresult r, CUdeviceptr dptr)
{
    struct obj *mem;
    if (r == CUDA_SUCCESS && !fake_obj_find(K_MEM, dptr) && fake_obj_find(K_GMEM, dptr))
        return fake_gmem_free(dptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) r = fake_find(K_MEM, dptr, CUDA_ERROR_INVALID_VALUE, &mem);
    if (r == CUDA_SUCCESS && mem->parent) {
        fake_pool_free_mem(mem);
    } else if (r == CUDA_SUCCESS) {
        fake_uncharge(mem->dev, mem->size);
        fake_obj_free(mem);
    }
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    lock();
    struct fctx *c;
    CUresult r = fake_mem_free(fake_current_ctx(&c), dptr);
    unlock();
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct fctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) {
        const struct fdev *d = &fake_dev[c->dev];
        uint64_t total = d->gpu->memory_total, taken = d->used + d->ctx_bytes;
        *total_bytes = (size_t)total;
        *free_bytes = (size_t)(taken < total ? total - taken : 0);
    }
    unlock();
    return r;
}

/* ---------------------------------------------------------------- virtual memory management */

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
    if (!granularity || !prop ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device_location(&prop->location);
    unlock();
    if (r == CUDA_SUCCESS) *granularity = GRANULARITY;
    return r;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    if (!handle || !prop || flags != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || size == 0 ||
        size % GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device_location(&prop->location);
    if (r == CUDA_SUCCESS) r = fake_charge(prop->location.id, size);
    if (r == CUDA_SUCCESS) {
        struct obj *o = fake_obj_new(K_VMM, 0);
        if (!o) {
            fake_uncharge(prop->location.id, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            o->dev = prop->location.id;
            o->size = size;
            *handle = o->key;
        }
    }
    unlock();
    return r;
}

/* After the init check, the VMM allocation behind handle if it is not released yet, else `missing`. */
static CUresult find_vmm(CUmemGenericAllocationHandle handle, CUresult missing, struct obj **out)
{
    CUresult r = fake_find(K_VMM, handle, missing, out);
    return r == CUDA_SUCCESS && (*out)->flags ? missing : r;
}

/* A released handle's memory goes back once its last mapping is gone. */
static void vmm_drop_if_unused(struct obj *h)
{
    if (h->flags && h->maps == 0) {
        fake_uncharge(h->dev, h->size);
        fake_obj_free(h);
    }
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    lock();
    struct obj *h;
    CUresult r = find_vmm(handle, CUDA_ERROR_INVALID_VALUE, &h);
    if (r == CUDA_SUCCESS) {
        h->flags = 1;
        vmm_drop_if_unused(h);
    }
    unlock();
    return r;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    (void)addr; /* a hint; the real driver may ignore it too */
    if (!ptr || size == 0 || size % GRANULARITY != 0 || flags != 0 || (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_init();
    CUdeviceptr va = 0;
    if (r == CUDA_SUCCESS) r = fake_reserve_va(size, alignment, &va);
    if (r == CUDA_SUCCESS) {
        struct obj *o = fake_obj_new(K_VA, va);
        if (!o) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            o->size = size;
            *ptr = va;
        }
    }
    unlock();
    return r;
}

/* The mapping holding address p, if any. */
static struct obj *mapping_at(uint64_t p)
{
    for (struct obj *o = fake_all; o; o = o->next)
        if (o->kind == K_MAP && p >= o->key && p - o->key < o->size) return o;
    return NULL;
}

static int range_has_mapping(uint64_t start, uint64_t size)
{
    for (struct obj *o = fake_all; o; o = o->next)
        if (o->kind == K_MAP && o->key < start + size && start < o->key + o->size) return 1;
    return 0;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    lock();
    struct obj *va;
    CUresult r = fake_find(K_VA, ptr, CUDA_ERROR_INVALID_VALUE, &va);
    if (r == CUDA_SUCCESS && (va->size != size || range_has_mapping(ptr, size))) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) fake_obj_free(va);
    unlock();
    return r;
}

static int inside_reservation(uint64_t start, uint64_t size)
{
    for (struct obj *o = fake_all; o; o = o->next)
        if (o->kind == K_VA && start >= o->key && size <= o->size && start - o->key <= o->size - size) return 1;
    return 0;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    if (flags != 0 || size == 0 || size % GRANULARITY != 0 || offset % GRANULARITY != 0 || ptr % GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *h;
    CUresult r = find_vmm(handle, CUDA_ERROR_INVALID_HANDLE, &h);
    if (r == CUDA_SUCCESS &&
        (offset > h->size || size > h->size - offset || !inside_reservation(ptr, size) || range_has_mapping(ptr, size)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        struct obj *m = fake_obj_new(K_MAP, ptr);
        if (!m) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->size = size;
            m->parent = h;
            m->dev = h->dev;
            h->maps++;
        }
    }
    unlock();
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_init();
    int found = 0;
    for (struct obj *o = fake_all; r == CUDA_SUCCESS && o; o = o->next) /* whole mappings only */
        if (o->kind == K_MAP && o->key < ptr + size && ptr < o->key + o->size) {
            if (o->key < ptr || o->key + o->size > ptr + size) r = CUDA_ERROR_INVALID_VALUE;
            found = 1;
        }
    if (r == CUDA_SUCCESS && !found) r = CUDA_ERROR_INVALID_VALUE;
    for (struct obj *o = fake_all, *next; r == CUDA_SUCCESS && o; o = next) {
        next = o->next;
        if (o->kind == K_MAP && o->key >= ptr && o->key < ptr + size) {
            struct obj *h = o->parent;
            h->maps--;
            if (next == h && h->flags && h->maps == 0) next = h->next;
            fake_obj_free(o);
            vmm_drop_if_unused(h);
        }
    }
    unlock();
    return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_init();
    for (size_t i = 0; r == CUDA_SUCCESS && i < count; i++) {
        r = fake_check_device_location(&desc[i].location);
        if (r == CUDA_SUCCESS && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            r = CUDA_ERROR_INVALID_VALUE;
    }
    for (uint64_t p = ptr; r == CUDA_SUCCESS && p < ptr + size;) { /* the range must be fully mapped */
        struct obj *m = mapping_at(p);
        if (!m)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            p = m->key + m->size;
    }
    unlock();
    return r;
}

/* ---------------------------------------------------------------- arrays */

static unsigned format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    }
    return 0;
}

/* Bytes of one level: width x height x depth (0 meaning 1) x channels x element size. */
static CUresult array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, uint64_t *out)
{
    unsigned es = format_bytes(f);
    if (w == 0 || (d != 0 && h == 0) || es == 0 || (ch != 1 && ch != 2 && ch != 4)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t n = (uint64_t)es * ch;
    if (__builtin_mul_overflow(n, (uint64_t)w, &n) || __builtin_mul_overflow(n, (uint64_t)(h ? h : 1), &n) ||
        __builtin_mul_overflow(n, (uint64_t)(d ? d : 1), &n))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = n;
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    uint64_t bytes;
    if (!array || !desc) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, &bytes);
    return r == CUDA_SUCCESS ? fake_create_owned(K_ARRAY, bytes, 0, (void **)array) : r;
}

CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    uint64_t bytes;
    if (!array || !desc) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, &bytes);
    return r == CUDA_SUCCESS ? fake_create_owned(K_ARRAY, bytes, 0, (void **)array) : r;
}

CUresult cuArrayDestroy(CUarray array) { return fake_destroy(K_ARRAY, array, CUDA_ERROR_INVALID_HANDLE); }

/* A mipmap level halves each non-zero extent, down to 1; levels beyond the 1x1x1 level are invalid. */
CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    if (!array || !desc || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t bytes;
        if (l > 0 && w == 1 && h <= 1 && d <= 1) return CUDA_ERROR_INVALID_VALUE;
        if (l > 0) {
            w = w > 1 ? w / 2 : 1;
            h = h > 1 ? h / 2 : h;
            d = d > 1 ? d / 2 : d;
        }
        CUresult r = array_bytes(w, h, d, desc->Format, desc->NumChannels, &bytes);
        if (r != CUDA_SUCCESS) return r;
        if (__builtin_add_overflow(total, bytes, &total)) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return fake_create_owned(K_MIPMAP, total, 0, (void **)array);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    return fake_destroy(K_MIPMAP, array, CUDA_ERROR_INVALID_HANDLE);
}

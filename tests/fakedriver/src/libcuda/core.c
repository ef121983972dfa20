/* The fake libcuda's ground: its state, the table of tracked objects (looked up by kind and key, so a
 * stale or foreign handle is never dereferenced), the devices' memory accounting and the checks every
 * call starts with. Test double only. */
#include "internal.h"

pthread_mutex_t fake_mutex = PTHREAD_MUTEX_INITIALIZER;
int fake_init_done;
CUresult fake_init_result = CUDA_ERROR_NOT_INITIALIZED;
struct fdev fake_dev[FAKE_GPU_COUNT];
int fake_ndev;
uint64_t fake_ctx_reserve_mib;
uint64_t fake_kernel_ns;
struct obj *fake_all;
static uint64_t g_next_va = VA_BASE;
static struct obj *g_hash[HASH_BUCKETS];

/* ---------------------------------------------------------------- object table */

static size_t bucket(enum kind k, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)k << 56)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 48) % HASH_BUCKETS;
}

struct obj *fake_obj_new(enum kind k, uint64_t key)
{
    struct obj *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    o->kind = k;
    o->key = key ? key : (uint64_t)(uintptr_t)o;
    size_t b = bucket(k, o->key);
    o->hnext = g_hash[b];
    g_hash[b] = o;
    o->next = fake_all;
    if (fake_all) fake_all->prev = o;
    fake_all = o;
    return o;
}

struct obj *fake_obj_find(enum kind k, uint64_t key)
{
    for (struct obj *o = g_hash[bucket(k, key)]; o; o = o->hnext)
        if (o->kind == k && o->key == key) return o;
    return NULL;
}

struct obj *fake_handle_find(enum kind k, const void *handle)
{
    return handle ? fake_obj_find(k, (uint64_t)(uintptr_t)handle) : NULL;
}

void fake_obj_free(struct obj *o)
{
    struct obj **pp = &g_hash[bucket(o->kind, o->key)];
    while (*pp != o) pp = &(*pp)->hnext;
    *pp = o->hnext;
    if (o->prev)
        o->prev->next = o->next;
    else
        fake_all = o->next;
    if (o->next) o->next->prev = o->prev;
    free(o->name);
    free(o->gallocs);
    free(o->gfrees);
    free(o);
}

/* ---------------------------------------------------------------- devices and memory accounting */

uint64_t fake_ctx_reserve(const struct fdev *d)
{
    if (fake_ctx_reserve_mib != UINT64_MAX) return fake_ctx_reserve_mib * MIB;
    uint64_t sixteenth = d->gpu->memory_total / 16;
    return sixteenth < 512 * MIB ? sixteenth : 512 * MIB;
}

CUresult fake_charge(int dev, uint64_t bytes)
{
    struct fdev *d = &fake_dev[dev];
    uint64_t total = d->gpu->memory_total;
    uint64_t taken = d->used + d->ctx_bytes;
    if (taken > total || bytes > total - taken) return CUDA_ERROR_OUT_OF_MEMORY;
    d->used += bytes;
    return CUDA_SUCCESS;
}

void fake_uncharge(int dev, uint64_t bytes) { fake_dev[dev].used -= bytes; }

CUresult fake_reserve_va(uint64_t size, uint64_t alignment, CUdeviceptr *out)
{
    uint64_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    uint64_t start = (g_next_va + align - 1) & ~(align - 1);
    uint64_t span = (size + GRANULARITY - 1) & ~(GRANULARITY - 1);
    if (start < g_next_va || span < size || start + span + GRANULARITY < start) return CUDA_ERROR_OUT_OF_MEMORY;
    g_next_va = start + span + GRANULARITY; /* a guard granule between ranges */
    *out = start;
    return CUDA_SUCCESS;
}

CUresult fake_check_init(void) { return fake_init_done ? fake_init_result : CUDA_ERROR_NOT_INITIALIZED; }

CUresult fake_check_device(CUdevice dev)
{
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    return dev >= 0 && dev < fake_ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult fake_check_device_location(const CUmemLocation *loc)
{
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    return loc->id >= 0 && loc->id < fake_ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* After the init check, the object of kind k with this key (a handle's own address; a device address
 * for K_MEM and K_VA; the handle value for K_VMM), or `missing`: the error the real driver gives for an
 * unknown one of that kind. Called under the lock. */
CUresult fake_find(enum kind k, uint64_t key, CUresult missing, struct obj **out)
{
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    *out = fake_obj_find(k, key);
    return *out ? CUDA_SUCCESS : missing;
}

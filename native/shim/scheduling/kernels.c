/* Each kernel's own running duration: a training step mixes millisecond GEMMs with microsecond
 * element-wise kernels, and one device-wide average would count the queue as full with a few of
 * them (the GPU then idles between the small ones while the launching thread sleeps). */
#include "scheduling/kernels.h"
#include <stddef.h>

#define KERNEL_SLOTS 4096
static struct nvc_kernel_cost kernel_ns[KERNEL_SLOTS];

#define PROBES 8

static unsigned home(const void *key)
{
    return (unsigned)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 52);
}

struct nvc_kernel_cost *nvc_kernel_slot(const void *key)
{
    for (unsigned i = 0, h = home(key); i < PROBES; i++) {
        struct nvc_kernel_cost *k = &kernel_ns[(h + i) % KERNEL_SLOTS];
        const void *there = __atomic_load_n(&k->key, __ATOMIC_ACQUIRE);
        if (there == key || !there) {
            __atomic_store_n(&k->key, key, __ATOMIC_RELEASE);
            return k;
        }
    }
    return NULL; /* a full neighbourhood: the device-wide estimate serves */
}

void nvc_kernel_measured(struct nvc_kernel_cost *k, int64_t elapsed_ns)
{
    int64_t full = elapsed_ns > 0 ? elapsed_ns : 1; /* 0 is "not measured yet" */
    __atomic_store_n(&k->ns, k->ns ? (k->ns + full) / 2 : full, __ATOMIC_RELAXED);
    __atomic_store_n(&k->work_ns, !k->work_ns || full < k->work_ns ? full : k->work_ns + (full - k->work_ns) / 256,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&k->least_ns, !k->least_ns || full < k->least_ns ? full : k->least_ns, __ATOMIC_RELAXED);
}

int64_t nvc_kernel_least(const void *key)
{
    for (unsigned i = 0, h = home(key); i < PROBES; i++) {
        const struct nvc_kernel_cost *k = &kernel_ns[(h + i) % KERNEL_SLOTS];
        const void *there = __atomic_load_n(&k->key, __ATOMIC_ACQUIRE);
        if (there == key)
            return __atomic_load_n(&k->least_ns, __ATOMIC_RELAXED);
        if (!there)
            return 0;
    }
    return 0;
}

const void *nvc_kernel_key(const void *f, unsigned gx, unsigned gy, unsigned gz)
{
    return (const void *)((uintptr_t)f ^ ((uintptr_t)((uint64_t)gx * gy * gz % 65521u) << 48));
}

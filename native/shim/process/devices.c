/* The per-process device table: a device's limits (by UUID rule, NVML index rule or default), its
 * entry in the shared region and its scheduler entry, filled on first use and kept for the process. */
#define _GNU_SOURCE
#include "process/devices.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "base/config.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "process/init.h"
#include "scheduling/sched.h"

#define MAX_ORDINALS 64
static struct nvc_device by_ordinal[MAX_ORDINALS];
static struct {
    char key[NVC_UUID_KEY_LEN];
    struct nvc_device dev;
} by_key[MAX_ORDINALS];
static int nkeys;
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;

/* NVML index of a UUID, for index-keyed limits: the index space is NVML's (what nvidia-smi shows),
 * not the CUDA ordinal, which CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER renumber. */
static int nvml_index_of(const char *key)
{
    if (!nvc_config_has_index_rules(&nvc_cfg))
        return -1;
    static int nvml_ready = -1;
    if (nvml_ready < 0)
        nvml_ready = nvc_load_nvml() && nvc_nvml.nvmlInit_v2 && nvc_nvml.nvmlInit_v2() == NVML_SUCCESS &&
                     nvc_nvml.nvmlDeviceGetHandleByUUID && nvc_nvml.nvmlDeviceGetIndex;
    if (!nvml_ready) {
        nvc_log(0, "NVML unavailable: per-index limits cannot be matched to device %s", key);
        return -1;
    }
    static const char *const prefixes[] = {"GPU-", "MIG-"};
    for (int i = 0; i < 2; i++) {
        char uuid[64];
        nvmlDevice_t h;
        unsigned index;
        snprintf(uuid, sizeof uuid, "%s%s", prefixes[i], key);
        if (nvc_nvml.nvmlDeviceGetHandleByUUID(uuid, &h) == NVML_SUCCESS &&
            nvc_nvml.nvmlDeviceGetIndex(h, &index) == NVML_SUCCESS)
            return (int)index;
    }
    return -1;
}

/* The limits of device d in nvc_cfg (its latency class too), put in force: read without the lock by the allocation and launch
 * paths, which see the old or the new value of each; sm_count: the device's SMs, 0 when not known here.
 * Caller holds dev_mu. */
static int apply_limits(struct nvc_device *d, unsigned sm_count)
{
    uint64_t memory = nvc_config_memory(&nvc_cfg, d->key, d->nvml_index);
    unsigned compute = nvc_config_compute(&nvc_cfg, d->key, d->nvml_index);
    unsigned weight = nvc_config_weight(&nvc_cfg, d->key, d->nvml_index);
    unsigned klass = nvc_config_class(&nvc_cfg, d->key, d->nvml_index);
    __atomic_store_n(&d->memory_limit, memory, __ATOMIC_RELEASE);
    __atomic_store_n(&d->compute, compute, __ATOMIC_RELEASE);
    __atomic_store_n(&d->weight, weight, __ATOMIC_RELEASE);
    int mps = 0; /* a client of the device's MPS daemon (its limits file sets MPS's variables) */
    for (int i = 0; i < NVC_MPS_VARS; i++)
        mps |= nvc_cfg.mps_env[i][0] != '\0';
    struct nvc_sched_entry *sched =
        compute < 100 || weight || klass ? nvc_sched_device(d->key, weight ? weight : 1, compute, klass, mps) : NULL;
    __atomic_store_n(&d->sched, mps ? NULL : sched, __ATOMIC_RELEASE);
    __atomic_store_n(&d->mps, mps && weight ? sched : NULL, __ATOMIC_RELEASE);
    return nvc_region_device(d->key, memory, compute, sm_count);
}

static void fill_device(struct nvc_device *d, const char *key, int nvml_index, unsigned sm_count)
{
    snprintf(d->key, sizeof d->key, "%s", key);
    d->nvml_index = nvml_index;
    d->sm_count = sm_count ? sm_count : 1;
    d->region_index = apply_limits(d, sm_count);
    if (d->region_index < 0) {
        nvc_fail("shared region device table is full");
        return;
    }
    __atomic_store_n(&d->valid, 1, __ATOMIC_RELEASE);
}

void nvc_devices_reconfigure(const struct nvc_config *cfg)
{
    pthread_mutex_lock(&dev_mu);
    nvc_cfg = *cfg;
    for (int i = 0; i < MAX_ORDINALS; i++)
        if (by_ordinal[i].valid)
            apply_limits(&by_ordinal[i], 0);
    for (int i = 0; i < nkeys; i++)
        apply_limits(&by_key[i].dev, 0);
    pthread_mutex_unlock(&dev_mu);
}

struct nvc_device *nvc_device_by_ordinal(CUdevice ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORDINALS)
        return NULL;
    struct nvc_device *d = &by_ordinal[ordinal];
    if (__atomic_load_n(&d->valid, __ATOMIC_ACQUIRE))
        return d;
    pthread_mutex_lock(&dev_mu);
    if (!d->valid) {
        CUuuid u;
        CUresult rc = nvc_cuda.cuDeviceGetUuid_v2 ? nvc_cuda.cuDeviceGetUuid_v2(&u, ordinal)
                      : nvc_cuda.cuDeviceGetUuid  ? nvc_cuda.cuDeviceGetUuid(&u, ordinal)
                                                  : CUDA_ERROR_NOT_FOUND;
        if (rc == CUDA_SUCCESS) {
            const unsigned char *b = (const unsigned char *)u.bytes;
            char key[NVC_UUID_KEY_LEN];
            snprintf(key, sizeof key, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                     b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
            int sm = 0;
            if (nvc_cuda.cuDeviceGetAttribute)
                nvc_cuda.cuDeviceGetAttribute(&sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal);
            d->ordinal = ordinal;
            fill_device(d, key, nvml_index_of(key), sm > 0 ? (unsigned)sm : 0);
        }
    }
    pthread_mutex_unlock(&dev_mu);
    return d->valid ? d : NULL;
}

struct nvc_device *nvc_device_current(CUdevice *ordinal)
{
    CUdevice dev;
    if (!nvc_cuda.cuCtxGetDevice || nvc_cuda.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    if (ordinal)
        *ordinal = dev;
    return nvc_device_by_ordinal(dev);
}

struct nvc_device *nvc_device_by_key(const char *key, int nvml_index)
{
    struct nvc_device *found = NULL;
    pthread_mutex_lock(&dev_mu);
    for (int i = 0; i < nkeys && !found; i++)
        if (!strcmp(by_key[i].key, key))
            found = &by_key[i].dev;
    if (!found && nkeys < MAX_ORDINALS) {
        snprintf(by_key[nkeys].key, sizeof by_key[nkeys].key, "%s", key);
        by_key[nkeys].dev.ordinal = -1;
        fill_device(&by_key[nkeys].dev, key, nvml_index, 0);
        if (by_key[nkeys].dev.valid)
            found = &by_key[nkeys++].dev;
    }
    pthread_mutex_unlock(&dev_mu);
    return found;
}

void nvc_devices_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE)
        pthread_mutex_lock(&dev_mu);
    else
        pthread_mutex_unlock(&dev_mu);
}

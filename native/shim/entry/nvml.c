/* NVML: memory queries report the container's view (total = min(limit, physical), used = the
 * container's charges, free never below zero). Everything else passes through untouched, so
 * NVML-only tools keep working even where the shim cannot initialise. */
#include "accounting/memory.h"
#include "base/config.h"
#include "base/real.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"

static struct nvc_device *device_for(nvmlDevice_t dev)
{
    char uuid[96], key[NVC_UUID_KEY_LEN];
    unsigned index;
    if (nvc_ready() != NVC_ACTIVE || !nvc_mem_limited || !nvc_nvml.nvmlDeviceGetUUID ||
        nvc_nvml.nvmlDeviceGetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS)
        return NULL;
    nvc_uuid_key(uuid, key);
    int idx = nvc_nvml.nvmlDeviceGetIndex && nvc_nvml.nvmlDeviceGetIndex(dev, &index) == NVML_SUCCESS ? (int)index : -1;
    struct nvc_device *d = nvc_device_by_key(key, idx);
    return d && d->memory_limit ? d : NULL;
}

NVC_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    if (!nvc_load_nvml() || !nvc_nvml.nvmlDeviceGetMemoryInfo)
        return 999; /* NVML_ERROR_UNKNOWN: no real NVML behind us */
    nvmlReturn_t rc = nvc_nvml.nvmlDeviceGetMemoryInfo(dev, mem);
    struct nvc_device *d;
    if (rc == NVML_SUCCESS && mem && (d = device_for(dev))) {
        uint64_t free_bytes = mem->free, total = mem->total;
        nvc_memory_clamp(d, &free_bytes, &total);
        mem->total = total;
        mem->free = free_bytes;
        mem->used = total - free_bytes;
    }
    return rc;
}

NVC_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    if (!nvc_load_nvml() || !nvc_nvml.nvmlDeviceGetMemoryInfo_v2)
        return 999;
    nvmlReturn_t rc = nvc_nvml.nvmlDeviceGetMemoryInfo_v2(dev, mem);
    struct nvc_device *d;
    if (rc == NVML_SUCCESS && mem && (d = device_for(dev))) {
        uint64_t free_bytes = mem->free, total = mem->total;
        nvc_memory_clamp(d, &free_bytes, &total);
        uint64_t reserved = mem->reserved < total ? mem->reserved : total;
        mem->total = total;
        mem->reserved = reserved;
        mem->free = free_bytes > total - reserved ? total - reserved : free_bytes;
        mem->used = total - reserved - mem->free;
    }
    return rc;
}

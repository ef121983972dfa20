/* Memory accounting (memory.c): what this process has charged, by allocation; the out-of-memory
 * decision; the container's view of a device's memory. */
#ifndef NVC_MEMORY_H
#define NVC_MEMORY_H

#include <stdint.h>
#include "base/ground.h"
#include "base/real.h"
#include "process/devices.h"

/* What an allocation record is keyed by: pointer, VMM handle, array, mipmapped array, or a pointer
 * from a stream-ordered pool (charged through its pool, pools.c). */
enum nvc_mem_kind { NVC_MEM_PTR = 1, NVC_MEM_HANDLE, NVC_MEM_ARRAY, NVC_MEM_MIPMAP, NVC_MEM_POOLPTR };

/* Charges bytes to device d before the driver grants them: 0, or -1 = over the limit (after bringing
 * pools and the graph reserve up to date). */
int nvc_mem_charge(struct nvc_device *d, uint64_t bytes);
/* Remembers a granted allocation (bytes charged to region device dev; pool: its pool, NVC_MEM_POOLPTR). */
void nvc_mem_record(enum nvc_mem_kind kind, uint64_t key, int dev, uint64_t bytes, CUmemoryPool pool);
/* The allocation is freed: refunded once; one the shim never recorded passes through. */
void nvc_mem_release(enum nvc_mem_kind kind, uint64_t key);
/* A pointer was freed (stream-ordered on stream when ptsz >= 0, 1 for its _ptsz form): graph memory's
 * (graphmem.c) or an allocation record's. */
void nvc_mem_freed(CUdeviceptr dptr, CUstream stream, int ptsz);
/* context_overhead, once per process and device, at its first context. */
void nvc_mem_charge_context(CUdevice dev);
/* The container's view of a device's memory: total = its limit, free = what is left of it. */
void nvc_memory_clamp(struct nvc_device *d, uint64_t *free_bytes, uint64_t *total_bytes);
void nvc_memory_fork(enum nvc_fork_phase phase);

#endif

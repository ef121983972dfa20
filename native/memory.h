/* Memory accounting (memory.c, graphmem.c): charging before the driver grants, graph memory,
 * the memory wrappers' common prologue, and the clamp NVML's memory answers get. */
#ifndef NVC_MEMORY_H
#define NVC_MEMORY_H

#include <stdint.h>
#include "devices.h"
#include "ground.h"
#include "init.h"
#include "real.h"

void nvc_memory_fork(enum nvc_fork_phase phase);
/* The container's view of a device's memory: total = its limit, free = what is left of it. */
void nvc_memory_clamp(struct nvc_device *d, uint64_t *free_bytes, uint64_t *total_bytes);

/* Charges bytes to device d before the driver grants them: 0, or -1 = over the limit (after bringing
 * pools and the graph reserve up to date). */
int nvc_mem_charge(struct nvc_device *d, uint64_t bytes);
/* graphmem.c: graph memory nodes (node creation, stream capture, launches, frees, destruction). */
int nvc_graph_free_ptr(CUdeviceptr dptr, CUstream stream, int ptsz);   /* 1: it was graph memory */
CUgraph nvc_capture_graph(CUstream stream, int ptsz);                 /* NULL unless capturing */
void nvc_graph_record_alloc(CUgraph graph, CUgraphNode node, CUdeviceptr dptr, int region_dev, uint64_t bytes);
void nvc_graph_launched(CUgraphExec exec);
void nvc_graph_reserve_sync(struct nvc_device *d);
void nvc_graph_fork(enum nvc_fork_phase phase);

/* Common prologue of the memory wrappers: real entry point present, shim state, re-entrancy. */
enum nvc_path { NVC_PASS, NVC_ACCOUNT, NVC_PATH_CLOSED };
static inline enum nvc_path nvc_path_for(void *real)
{
    if (!real)
        return NVC_PATH_CLOSED;
    if (nvc_depth)
        return NVC_PASS;
    switch (nvc_init()) {
    case NVC_ACTIVE: return nvc_mem_limited ? NVC_ACCOUNT : NVC_PASS;
    case NVC_CLOSED: return NVC_PATH_CLOSED;
    default: return NVC_PASS;
    }
}

#define NVC_PROLOGUE(fn, ...)                                               \
    nvc_load_cuda();                                                        \
    enum nvc_path path_ = nvc_path_for((void *)nvc_cuda.fn);                \
    if (path_ == NVC_PATH_CLOSED)                                           \
        return CUDA_ERROR_NOT_INITIALIZED;                                  \
    if (path_ == NVC_PASS)                                                  \
        return nvc_cuda.fn(__VA_ARGS__);

/* The real call with the depth guard held; needs a CUresult rc_ in scope. */
#define NVC_REAL(fn, ...) (nvc_depth++, rc_ = nvc_cuda.fn(__VA_ARGS__), nvc_depth--, rc_)

/* A wrapper that calls the driver and, when it succeeded, does `then` (bookkeeping only). */
#define NVC_WRAP_THEN(fn, params, then, ...)                                \
    NVC_API CUresult fn params                                              \
    {                                                                       \
        NVC_PROLOGUE(fn, __VA_ARGS__)                                       \
        CUresult rc_ = NVC_REAL(fn, __VA_ARGS__);                           \
        if (rc_ == CUDA_SUCCESS) {                                          \
            then;                                                           \
        }                                                                   \
        return rc_;                                                         \
    }

#endif

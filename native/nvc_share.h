/* Internal interface of libnvc-share: the real driver entry points, configuration, the shared
 * region, logging. Each intercepted family lives in its own file; this header is what they share. */
#ifndef NVC_SHARE_H
#define NVC_SHARE_H

#include <stdint.h>
#include <stddef.h>
#include "cuda_abi.h"

#define NVC_API __attribute__((visibility("default")))
#define NVC_MAX_DEVICES 16
#define NVC_UUID_KEY_LEN 37          /* 36 hex-and-dash characters + NUL, prefix (GPU-/MIG-) dropped */
#define NVC_FIXED_DIR "/var/run/nvc-share"

/* ---- CUDA entry points the shim wraps (exported under the same names) ---- */
#define NVC_CUDA_WRAPPED(X) \
    X(cuInit, (unsigned int flags)) \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int version, cuuint64_t flags)) \
    X(cuGetProcAddress_v2, (const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)) \
    X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
    X(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v3, (CUcontext *pctx, void *params, int nparams, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v4, (CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)) \
    X(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t size)) \
    X(cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elsize)) \
    X(cuMemAllocManaged, (CUdeviceptr *dptr, size_t size, unsigned int flags)) \
    X(cuMemFree_v2, (CUdeviceptr dptr)) \
    X(cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, \
                    unsigned long long flags)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle)) \
    X(cuMemAllocAsync, (CUdeviceptr *dptr, size_t size, CUstream stream)) \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t size, CUstream stream)) \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)) \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)) \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream)) \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream)) \
    X(cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *props)) \
    X(cuMemPoolDestroy, (CUmemoryPool pool)) \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep)) \
    X(cuArrayCreate_v2, (CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)) \
    X(cuArray3DCreate_v2, (CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)) \
    X(cuArrayDestroy, (CUarray array)) \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray array)) \
    X(cuDeviceGraphMemTrim, (CUdevice dev)) \
    X(cuGraphAddMemAllocNode, (CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, \
                               CUDA_MEM_ALLOC_NODE_PARAMS *params)) \
    X(cuGraphAddMemFreeNode, (CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, \
                              CUdeviceptr dptr)) \
    X(cuGraphAddNode, (CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, \
                       CUgraphNodeParams *params)) \
    X(cuGraphAddNode_v2, (CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edges, \
                          size_t ndeps, CUgraphNodeParams *params)) \
    X(cuGraphNodeSetParams, (CUgraphNode node, CUgraphNodeParams *params)) \
    X(cuGraphExecNodeSetParams, (CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *params)) \
    X(cuGraphInstantiate, (CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t size)) \
    X(cuGraphInstantiate_v2, (CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, \
                              size_t size)) \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *exec, CUgraph graph, unsigned long long flags)) \
    X(cuGraphInstantiateWithParams, (CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)) \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *exec, CUgraph graph, \
                                          CUDA_GRAPH_INSTANTIATE_PARAMS *params)) \
    X(cuGraphExecUpdate, (CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, int *result)) \
    X(cuGraphExecUpdate_v2, (CUgraphExec exec, CUgraph graph, void *result_info)) \
    X(cuGraphExecDestroy, (CUgraphExec exec)) \
    X(cuGraphDestroyNode, (CUgraphNode node)) \
    X(cuGraphDestroy, (CUgraph graph)) \
    X(cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes)) \
    X(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(cuLaunchKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                       unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params, \
                       void **extra)) \
    X(cuLaunchKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                            unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, \
                            void **params, void **extra)) \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)) \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)) \
    X(cuLaunchCooperativeKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
                                  CUstream stream, void **params)) \
    X(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
                                       CUstream stream, void **params)) \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream)) \
    X(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream))

/* ---- CUDA entry points only called, never wrapped ---- */
#define NVC_CUDA_CALLED(X) \
    X(cuCtxGetDevice, (CUdevice *dev)) \
    X(cuCtxGetCurrent, (CUcontext *ctx)) \
    X(cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev)) \
    X(cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev)) \
    X(cuDeviceGetAttribute, (int *value, int attrib, CUdevice dev)) \
    X(cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev)) \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *pool, CUdevice dev)) \
    X(cuMemPoolGetAttribute, (CUmemoryPool pool, int attr, void *value)) \
    X(cuDeviceGetGraphMemAttribute, (CUdevice dev, int attr, void *value)) \
    X(cuStreamGetCaptureInfo_v2, (CUstream stream, int *status, cuuint64_t *id, CUgraph *graph, \
                                  const CUgraphNode **deps, size_t *ndeps)) \
    X(cuStreamGetCaptureInfo_v2_ptsz, (CUstream stream, int *status, cuuint64_t *id, CUgraph *graph, \
                                       const CUgraphNode **deps, size_t *ndeps)) \
    X(cuEventCreate, (CUevent *event, unsigned int flags)) \
    X(cuEventRecord, (CUevent event, CUstream stream)) \
    X(cuEventRecord_ptsz, (CUevent event, CUstream stream)) \
    X(cuEventQuery, (CUevent event)) \
    X(cuEventElapsedTime, (float *ms, CUevent start, CUevent end)) \
    X(cuEventDestroy_v2, (CUevent event))

#define NVC_NVML_WRAPPED(X) \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t dev, nvmlMemory_t *mem)) \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t dev, nvmlMemory_v2_t *mem))

#define NVC_NVML_CALLED(X) \
    X(nvmlInit_v2, (void)) \
    X(nvmlDeviceGetUUID, (nvmlDevice_t dev, char *uuid, unsigned int len)) \
    X(nvmlDeviceGetIndex, (nvmlDevice_t dev, unsigned int *index)) \
    X(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *dev))

#define NVC_DECLARE_PTR(name, params) CUresult (*name) params;
struct nvc_real_cuda {
    NVC_CUDA_WRAPPED(NVC_DECLARE_PTR)
    NVC_CUDA_CALLED(NVC_DECLARE_PTR)
};
struct nvc_real_nvml {
    NVC_NVML_WRAPPED(NVC_DECLARE_PTR)
    NVC_NVML_CALLED(NVC_DECLARE_PTR)
};
#undef NVC_DECLARE_PTR

#define NVC_DECLARE_WRAPPER(name, params) NVC_API CUresult name params;
NVC_CUDA_WRAPPED(NVC_DECLARE_WRAPPER)
NVC_NVML_WRAPPED(NVC_DECLARE_WRAPPER)
#undef NVC_DECLARE_WRAPPER

extern struct nvc_real_cuda nvc_cuda;
extern struct nvc_real_nvml nvc_nvml;

/* resolve.c: load the real tables (idempotent, thread-safe); 0 when the library is absent. */
int nvc_load_cuda(void);
int nvc_load_nvml(void);
void *nvc_real_dlsym(void *handle, const char *name);

/* ---- configuration (config.c) ---- */
enum nvc_on_error { NVC_PASS_THROUGH = 0, NVC_FAIL_CLOSED = 1 };

struct nvc_limit_rule {
    char key[NVC_UUID_KEY_LEN];      /* UUID key (prefix dropped), or "" when by index */
    int index;                       /* NVML index, or -1 when by UUID */
    uint64_t memory;                 /* bytes; 0 = not given */
    unsigned compute;                /* percent 1..100; 0 = not given */
    unsigned weight;                 /* 1..1000; 0 = not given */
};

struct nvc_config {
    int enabled;                     /* 0: kill switch, everything passes through */
    int from_file;                   /* limits came from the read-only limits file */
    enum nvc_on_error on_error;
    uint64_t memory_default;         /* 0 = unlimited */
    unsigned compute_default;        /* 100 = unthrottled */
    unsigned weight_default;         /* 0 = not weighted */
    uint64_t context_overhead;       /* bytes charged per process per device with a context */
    int nrules;
    struct nvc_limit_rule rules[2 * NVC_MAX_DEVICES];
    char dir[256];                   /* per-container directory holding the region */
    uint64_t hash;                   /* FNV-1a of the canonical limits, stored in the region */
};

int nvc_parse_size(const char *text, uint64_t *out);
int nvc_parse_percent(const char *text, int allow_zero, unsigned *out);
/* Parse limits-file text; on error writes a message naming the line into err and returns -1. */
int nvc_parse_limits_text(const char *text, struct nvc_config *cfg, char *err, size_t errlen);
int nvc_config_from_env(char *const *envp, struct nvc_config *cfg, char *err, size_t errlen);
void nvc_config_finish(struct nvc_config *cfg);
/* Limits for one device: key = UUID key, index = NVML index or -1 when unknown. */
uint64_t nvc_config_memory(const struct nvc_config *cfg, const char *key, int index);
unsigned nvc_config_compute(const struct nvc_config *cfg, const char *key, int index);
unsigned nvc_config_weight(const struct nvc_config *cfg, const char *key, int index);
int nvc_config_has_index_rules(const struct nvc_config *cfg);
void nvc_uuid_key(const char *uuid, char key[NVC_UUID_KEY_LEN]);

/* ---- shim state (shim.c) ---- */
enum nvc_state { NVC_OFF = 0, NVC_ACTIVE = 1, NVC_CLOSED = 2 };
extern struct nvc_config nvc_cfg;
extern int nvc_mem_limited;          /* some device has a memory limit */
extern int nvc_compute_limited;      /* some device has a compute share below 100 or a weight */
enum nvc_state nvc_init(void);       /* idempotent */
void nvc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nvc_fail(const char *what);     /* loud one-time failure line; switches to on_error mode */
uint64_t nvc_now_ns(void);

/* Per-device information of this process, found by CUDA ordinal or NVML handle. */
struct nvc_device {
    int valid;
    int region_index;                /* index in the region's device table */
    uint64_t memory_limit;           /* 0 = unlimited */
    unsigned compute;                /* percent; 100 = unthrottled */
    unsigned weight;                 /* share of the GPU among busy containers; 0 = not weighted */
    unsigned sm_count;
    struct nvc_sched_entry *sched;   /* this container's scheduler entry, NULL when not scheduled */
    int ordinal;                     /* CUDA ordinal; -1 when found by NVML handle */
};
struct nvc_device *nvc_device_by_ordinal(CUdevice dev);
struct nvc_device *nvc_device_current(CUdevice *ordinal);
struct nvc_device *nvc_device_by_key(const char *key, int nvml_index);

/* ---- shared region (region.c) ---- */
int nvc_region_open(const char *dir, const struct nvc_config *cfg);
int nvc_region_device(const char *key, uint64_t memory_limit, unsigned compute, unsigned sm_count);
/* Charge bytes to this process on region device d; fails (returns -1) when over limit. */
int nvc_region_charge(int d, uint64_t bytes, uint64_t limit);
void nvc_region_uncharge(int d, uint64_t bytes);
uint64_t nvc_region_used(int d);        /* container total on device d, dead processes reaped */
/* Fork handling, one per file with a mutex: phase 0 = prepare (lock), 1 = parent (unlock),
 * 2 = child (unlock and forget what belongs to the parent). Called in a fixed lock order. */
enum nvc_fork_phase { NVC_FORK_PREPARE = 0, NVC_FORK_PARENT = 1, NVC_FORK_CHILD = 2 };
void nvc_devices_fork(enum nvc_fork_phase phase);
void nvc_memory_fork(enum nvc_fork_phase phase);
void nvc_launch_fork(enum nvc_fork_phase phase);
void nvc_region_fork(enum nvc_fork_phase phase);
/* Compute share bucket on region device d (launch.c drives it). */
int64_t nvc_region_credit(int d, unsigned percent, uint64_t now, int64_t debit);
void nvc_region_account_launch(int d, uint64_t busy_ns, uint64_t waited_ns);

/* ---- weighted scheduling between containers (sched.c, decisions in schedpolicy.c) ---- */
struct nvc_sched_entry;
/* Opens this container's scheduler file and its peers' directory (fixed paths in a container,
 * NVC_SHARE_SCHED_DIR/NVC_SHARE_TENANT otherwise); 0 when there is none (no cross-container
 * scheduling: the cap alone applies). */
int nvc_sched_open(const struct nvc_config *cfg);
struct nvc_sched_entry *nvc_sched_device(const char *key, unsigned weight, unsigned cap);
/* Before a launch: 1 = may launch now, 0 = wait for the turn. capped: held back by its own cap. */
int nvc_sched_ready(struct nvc_sched_entry *e, uint64_t now, int capped);
void nvc_sched_launched(struct nvc_sched_entry *e, uint64_t now, int64_t estimate_ns);
void nvc_sched_measured(struct nvc_sched_entry *e, uint64_t now, int64_t correction_ns, uint64_t cost_ns);
void nvc_sched_drained(struct nvc_sched_entry *e, uint64_t now);   /* none of its launches queued */
void nvc_sched_fork(enum nvc_fork_phase phase);

/* Re-entrancy guard: a driver that calls its own exported entry points must not be charged twice. */
extern __thread int nvc_depth __attribute__((tls_model("initial-exec")));

/* ---- memory accounting shared by memory.c and graphmem.c ---- */
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

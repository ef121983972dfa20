/* The real driver entry points: the CUDA and NVML functions the shim wraps (exported under the
 * same names) or only calls, their tables, and their loading (resolve.c). */
#ifndef NVC_REAL_H
#define NVC_REAL_H

#include <stddef.h>
#include <stdint.h>
#include "cuda_abi.h"

#define NVC_API __attribute__((visibility("default")))

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

#endif

/* The real driver entry points: which of the CUDA and NVML functions (declared, with their types,
 * in cuda_abi.h and nvml_abi.h) the shim wraps (exported under the same names) or only calls, their
 * tables, and their loading (real.c). */
#ifndef NVC_REAL_H
#define NVC_REAL_H

#include <stddef.h>
#include <stdint.h>
#include "base/cuda_abi.h"
#include "base/nvml_abi.h"

#define NVC_API __attribute__((visibility("default")))
/* The dlsym path runs inside AddressSanitizer's start-up where the shim is preloaded behind its runtime
 * (make sanitize): before ASan maps its shadow memory, so it is not instrumented. Nothing in a normal build. */
#define NVC_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

/* ---- CUDA entry points the shim wraps (exported under the same names) ---- */
#define NVC_CUDA_WRAPPED(X) \
    X(cuInit) \
    X(cuGetProcAddress) \
    X(cuGetProcAddress_v2) \
    X(cuDevicePrimaryCtxRetain) \
    X(cuCtxCreate_v2) \
    X(cuCtxCreate_v3) \
    X(cuCtxCreate_v4) \
    X(cuMemAlloc_v2) \
    X(cuMemAllocPitch_v2) \
    X(cuMemAllocManaged) \
    X(cuMemFree_v2) \
    X(cuMemCreate) \
    X(cuMemRelease) \
    X(cuMemAllocAsync) \
    X(cuMemAllocAsync_ptsz) \
    X(cuMemAllocFromPoolAsync) \
    X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFreeAsync) \
    X(cuMemFreeAsync_ptsz) \
    X(cuMemPoolCreate) \
    X(cuMemPoolDestroy) \
    X(cuMemPoolTrimTo) \
    X(cuArrayCreate_v2) \
    X(cuArray3DCreate_v2) \
    X(cuArrayDestroy) \
    X(cuMipmappedArrayCreate) \
    X(cuMipmappedArrayDestroy) \
    X(cuDeviceGraphMemTrim) \
    X(cuGraphAddMemAllocNode) \
    X(cuGraphAddMemFreeNode) \
    X(cuGraphAddNode) \
    X(cuGraphAddNode_v2) \
    X(cuGraphNodeSetParams) \
    X(cuGraphExecNodeSetParams) \
    X(cuGraphInstantiate) \
    X(cuGraphInstantiate_v2) \
    X(cuGraphInstantiateWithFlags) \
    X(cuGraphInstantiateWithParams) \
    X(cuGraphInstantiateWithParams_ptsz) \
    X(cuGraphExecUpdate) \
    X(cuGraphExecUpdate_v2) \
    X(cuGraphExecDestroy) \
    X(cuGraphDestroyNode) \
    X(cuGraphDestroy) \
    X(cuMemGetInfo_v2) \
    X(cuDeviceTotalMem_v2) \
    X(cuLaunchKernel) \
    X(cuLaunchKernel_ptsz) \
    X(cuLaunchKernelEx) \
    X(cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel) \
    X(cuLaunchCooperativeKernel_ptsz) \
    X(cuGraphLaunch) \
    X(cuGraphLaunch_ptsz)

/* ---- CUDA entry points only called, never wrapped ---- */
#define NVC_CUDA_CALLED(X) \
    X(cuCtxGetDevice) \
    X(cuCtxGetCurrent) \
    X(cuCtxSetCurrent) \
    X(cuDeviceGetUuid) \
    X(cuDeviceGetUuid_v2) \
    X(cuDeviceGetAttribute) \
    X(cuDeviceGetMemPool) \
    X(cuDeviceGetDefaultMemPool) \
    X(cuMemPoolGetAttribute) \
    X(cuDeviceGetGraphMemAttribute) \
    X(cuStreamGetCaptureInfo_v2) \
    X(cuStreamGetCaptureInfo_v2_ptsz) \
    X(cuEventCreate) \
    X(cuEventRecord) \
    X(cuEventRecord_ptsz) \
    X(cuEventQuery) \
    X(cuEventElapsedTime) \
    X(cuEventDestroy_v2) \
    X(cuStreamWaitValue32) \
    X(cuStreamWaitValue32_v2) \
    X(cuMemHostRegister_v2) \
    X(cuMemHostGetDevicePointer_v2)

#define NVC_NVML_WRAPPED(X) \
    X(nvmlDeviceGetMemoryInfo) \
    X(nvmlDeviceGetMemoryInfo_v2)

#define NVC_NVML_CALLED(X) \
    X(nvmlInit_v2) \
    X(nvmlDeviceGetUUID) \
    X(nvmlDeviceGetIndex) \
    X(nvmlDeviceGetHandleByUUID)

#define NVC_DECLARE_PTR(name) __typeof__(name) *name;
struct nvc_real_cuda {
    NVC_CUDA_WRAPPED(NVC_DECLARE_PTR)
    NVC_CUDA_CALLED(NVC_DECLARE_PTR)
};
struct nvc_real_nvml {
    NVC_NVML_WRAPPED(NVC_DECLARE_PTR)
    NVC_NVML_CALLED(NVC_DECLARE_PTR)
};
#undef NVC_DECLARE_PTR

#define NVC_DECLARE_WRAPPER(name) NVC_API __typeof__(name) name;
NVC_CUDA_WRAPPED(NVC_DECLARE_WRAPPER)
NVC_NVML_WRAPPED(NVC_DECLARE_WRAPPER)
#undef NVC_DECLARE_WRAPPER

extern struct nvc_real_cuda nvc_cuda;
extern struct nvc_real_nvml nvc_nvml;

/* real.c: load the real tables (idempotent, thread-safe); 0 when the library is absent. The _if_loaded
 * forms fill them only when the application has the library in the process already. */
int nvc_load_cuda(void);
int nvc_load_nvml(void);
int nvc_cuda_if_loaded(void);
int nvc_nvml_if_loaded(void);
void *nvc_real_dlsym(void *handle, const char *name);

#endif

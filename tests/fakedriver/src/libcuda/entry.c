/* The fake libcuda's error strings, cuGetProcAddress with the real driver's versioned and
 * per-thread-stream resolution, and the tests' introspection call. Test double only. */
#include "internal.h"

/* ---------------------------------------------------------------- errors */

static const struct {
    CUresult code;
    const char *name, *text;
} ERRORS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED",
     "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **str, int want_name)
{
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (ERRORS[i].code == error) {
            *str = want_name ? ERRORS[i].name : ERRORS[i].text;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **str) { return error_lookup(error, str, 0); }
CUresult cuGetErrorName(CUresult error, const char **str) { return error_lookup(error, str, 1); }

/* ---------------------------------------------------------------- cuGetProcAddress */

/* Base name -> the entry point for each ABI version, as the real driver resolves it: the entry with the
 * highest version not above the caller's cudaVersion; its _ptsz twin for per-thread default streams. */
static const struct proc {
    const char *name;
    int version;
    void *fn, *per_thread;
} PROCS[] = {
/* One entry a line, as a table: clang-format would run the macro calls together. */
/* clang-format off */
#define P(name, version, fn) { name, version, (void *)fn, NULL },
#define PT(name, version, fn) { name, version, (void *)fn, (void *)fn##_ptsz },
    P("cuInit", 2000, cuInit)
    P("cuDriverGetVersion", 2020, cuDriverGetVersion)
    P("cuDeviceGetCount", 2000, cuDeviceGetCount)
    P("cuDeviceGet", 2000, cuDeviceGet)
    P("cuDeviceGetName", 2000, cuDeviceGetName)
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid)
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2)
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId)
    P("cuDeviceTotalMem", 2000, cuDeviceTotalMem)
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2)
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute)
    P("cuDeviceComputeCapability", 2000, cuDeviceComputeCapability)
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain)
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease)
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2)
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset)
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2)
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState)
    P("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags)
    P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2)
    P("cuCtxCreate", 2000, cuCtxCreate)
    P("cuCtxCreate", 3020, cuCtxCreate_v2)
    P("cuCtxCreate", 11040, cuCtxCreate_v3)
    P("cuCtxCreate", 12050, cuCtxCreate_v4)
    P("cuCtxDestroy", 2000, cuCtxDestroy)
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2)
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent)
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent)
    P("cuCtxGetDevice", 2000, cuCtxGetDevice)
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent)
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2)
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent)
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2)
    P("cuCtxSynchronize", 2000, cuCtxSynchronize)
    P("cuMemAlloc", 3020, cuMemAlloc_v2)
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2)
    P("cuMemAllocManaged", 6000, cuMemAllocManaged)
    P("cuMemFree", 3020, cuMemFree_v2)
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2)
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity)
    P("cuMemCreate", 10020, cuMemCreate)
    P("cuMemRelease", 10020, cuMemRelease)
    P("cuMemAddressReserve", 10020, cuMemAddressReserve)
    P("cuMemAddressFree", 10020, cuMemAddressFree)
    P("cuMemMap", 10020, cuMemMap)
    P("cuMemUnmap", 10020, cuMemUnmap)
    P("cuMemSetAccess", 10020, cuMemSetAccess)
    PT("cuMemAllocAsync", 11020, cuMemAllocAsync)
    PT("cuMemFreeAsync", 11020, cuMemFreeAsync)
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync)
    P("cuMemPoolCreate", 11020, cuMemPoolCreate)
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy)
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo)
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute)
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute)
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool)
    P("cuArrayCreate", 3020, cuArrayCreate_v2)
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2)
    P("cuArrayDestroy", 2000, cuArrayDestroy)
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate)
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy)
    P("cuMemHostRegister", 6050, cuMemHostRegister_v2)
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2)
    P("cuStreamWaitValue32", 8000, cuStreamWaitValue32)
    P("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2)
    P("cuModuleLoad", 2000, cuModuleLoad)
    P("cuModuleLoadData", 2000, cuModuleLoadData)
    P("cuModuleGetFunction", 2000, cuModuleGetFunction)
    P("cuModuleUnload", 2000, cuModuleUnload)
    PT("cuLaunchKernel", 4000, cuLaunchKernel)
    PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx)
    PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel)
    P("cuGraphCreate", 10000, cuGraphCreate)
    P("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode)
    P("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2)
    P("cuGraphInstantiate", 10000, cuGraphInstantiate)
    P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2)
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags)
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags)
    PT("cuGraphLaunch", 10000, cuGraphLaunch)
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy)
    P("cuGraphDestroy", 10000, cuGraphDestroy)
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode)
    P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode)
    P("cuGraphAddNode", 12020, cuGraphAddNode)
    P("cuGraphAddNode", 12030, cuGraphAddNode_v2)
    P("cuGraphNodeSetParams", 12020, cuGraphNodeSetParams)
    P("cuGraphExecNodeSetParams", 12020, cuGraphExecNodeSetParams)
    PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams)
    P("cuGraphExecUpdate", 12000, cuGraphExecUpdate_v2)
    P("cuGraphDestroyNode", 10000, cuGraphDestroyNode)
    P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute)
    P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim)
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2)
    P("cuStreamEndCapture", 10000, cuStreamEndCapture)
    PT("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2)
    P("cuStreamCreate", 2000, cuStreamCreate)
    P("cuStreamDestroy", 2000, cuStreamDestroy)
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2)
    PT("cuStreamSynchronize", 2000, cuStreamSynchronize)
    PT("cuStreamQuery", 2000, cuStreamQuery)
    P("cuEventCreate", 2000, cuEventCreate)
    PT("cuEventRecord", 2000, cuEventRecord)
    P("cuEventSynchronize", 2000, cuEventSynchronize)
    P("cuEventQuery", 2000, cuEventQuery)
    P("cuEventElapsedTime", 2000, cuEventElapsedTime)
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2)
    P("cuEventDestroy", 2000, cuEventDestroy)
    P("cuEventDestroy", 4000, cuEventDestroy_v2)
    P("cuGetErrorString", 6000, cuGetErrorString)
    P("cuGetErrorName", 6000, cuGetErrorName)
    P("cuGetProcAddress", 11030, cuGetProcAddress)
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2)
#undef P
#undef PT
    /* clang-format on */
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    const struct proc *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof(PROCS) / sizeof(PROCS[0]); i++) {
        if (strcmp(PROCS[i].name, symbol) != 0) continue;
        known = 1;
        if (PROCS[i].version <= cuda_version && (!best || PROCS[i].version > best->version)) best = &PROCS[i];
    }
    *pfn = NULL;
    if (status)
        *status = best    ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!best) return CUDA_ERROR_NOT_FOUND;
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->per_thread ? best->per_thread : best->fn;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}

/* ---------------------------------------------------------------- introspection */

int fakeCudaDeviceStats(int ordinal, unsigned long long *launches, unsigned long long *busy_ns,
                        unsigned long long *used_bytes)
{
    lock();
    int ok = fake_check_device(ordinal) == CUDA_SUCCESS;
    if (ok) {
        *launches = fake_dev[ordinal].launches;
        *busy_ns = fake_dev[ordinal].busy_ns;
        *used_bytes = fake_dev[ordinal].used + fake_dev[ordinal].ctx_bytes;
    }
    unlock();
    return ok ? 0 : -1;
}

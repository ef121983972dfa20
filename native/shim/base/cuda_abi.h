/* The slice of the CUDA driver C ABI that nvc-py touches, declared once from the public
 * documentation (there is no CUDA toolkit on the build and test machines): the entry points
 * libnvc-share wraps or calls (real.h picks which), and those the fake driver in tests/fakedriver
 * implements for the tests' programs. Enum values and struct layouts match NVIDIA's headers: the
 * shim passes these structures through to the real driver unchanged. */
#ifndef NVC_CUDA_ABI_H
#define NVC_CUDA_ABI_H

#include <stddef.h>

typedef enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_UNKNOWN = 999,
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;

typedef struct {
    char bytes[16];
} CUuuid;

typedef enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_TCC_DRIVER = 35,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD = 84,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
} CUdevice_attribute;

typedef enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

typedef struct {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Virtual memory management. */
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READ = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };

typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct {
    int allocType;   /* CUmemAllocationType */
    int handleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

enum { CU_MEM_ATTACH_GLOBAL = 0x1, CU_MEM_ATTACH_HOST = 0x2 };
enum { CU_EVENT_DEFAULT = 0x0, CU_EVENT_DISABLE_TIMING = 0x2 };

/* Launch. */
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS;

/* Graph memory nodes, generic node parameters (CUDA 12.2+), stream capture. */
typedef enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
} CUgraphNodeType;

typedef enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
} CUgraphMem_attribute;

typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;

#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_WAIT_VALUE_GEQ 0x0 /* until (int32_t)(*addr - value) >= 0: cyclic */
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02

enum { CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1 };

typedef enum {
    CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE = 0,
    CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE = 1,
} CUgraphChildGraphNodeOwnership;

typedef enum { CU_GRAPH_EXEC_UPDATE_SUCCESS = 0, CU_GRAPH_EXEC_UPDATE_ERROR = 1 } CUgraphExecUpdateResult;

typedef struct {
    CUmemPoolProps poolProps; /* in: location; handleTypes must be 0 */
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;  /* in */
    CUdeviceptr dptr; /* out: the allocation's address, fixed for the graph's lifetime */
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
        struct {
            CUdeviceptr dptr;
        } free;
        struct {
            CUgraph graph;
            CUgraphChildGraphNodeOwnership ownership;
        } graph;
    };
    long long reserved2;
} CUgraphNodeParams;

typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUgraphExecUpdateResultInfo_st CUgraphExecUpdateResultInfo;

typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out; /* CUgraphInstantiateResult */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* Entry-point lookup. */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* Every entry point, once: X(name, parameter list); all return CUresult. The fake driver implements
 * all but cuDeviceGetMemPool and the pre-12.0 cuGraphExecUpdate (the shim's only). Legacy variants
 * taking 32-bit sizes or pointers (cuMemAlloc without _v2, cuArrayCreate, ...) are left out: nothing
 * built since CUDA 3.2 calls them. cuDeviceTotalMem stays (the fake reports a clamped size). */
#define CUDA_ABI_ENTRY_POINTS(X) \
    X(cuInit, (unsigned int flags)) \
    X(cuDriverGetVersion, (int *version)) \
    X(cuDeviceGetCount, (int *count)) \
    X(cuDeviceGet, (CUdevice * device, int ordinal)) \
    X(cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev)) \
    X(cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev)) \
    X(cuDeviceGetPCIBusId, (char *busid, int len, CUdevice dev)) \
    X(cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev)) \
    X(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev)) \
    X(cuDeviceGetAttribute, (int *value, CUdevice_attribute attrib, CUdevice dev)) \
    X(cuDeviceComputeCapability, (int *major, int *minor, CUdevice dev)) \
    X(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(cuDevicePrimaryCtxReset, (CUdevice dev)) \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev)) \
    X(cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active)) \
    X(cuDevicePrimaryCtxSetFlags, (CUdevice dev, unsigned int flags)) \
    X(cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags)) \
    X(cuCtxCreate, (CUcontext * pctx, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v3, (CUcontext * pctx, void *affinity_params, int num_params, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v4, (CUcontext * pctx, void *create_params, unsigned int flags, CUdevice dev)) \
    X(cuCtxDestroy, (CUcontext ctx)) \
    X(cuCtxDestroy_v2, (CUcontext ctx)) \
    X(cuCtxSetCurrent, (CUcontext ctx)) \
    X(cuCtxGetCurrent, (CUcontext * pctx)) \
    X(cuCtxGetDevice, (CUdevice * device)) \
    X(cuCtxPushCurrent, (CUcontext ctx)) \
    X(cuCtxPushCurrent_v2, (CUcontext ctx)) \
    X(cuCtxPopCurrent, (CUcontext * pctx)) \
    X(cuCtxPopCurrent_v2, (CUcontext * pctx)) \
    X(cuCtxSynchronize, (void)) \
    X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize)) \
    X(cuMemAllocPitch_v2, (CUdeviceptr * dptr, size_t * pitch, size_t width, size_t height, unsigned int elementsize)) \
    X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags)) \
    X(cuMemFree_v2, (CUdeviceptr dptr)) \
    X(cuMemGetInfo_v2, (size_t * free_bytes, size_t * total_bytes)) \
    X(cuMemGetAllocationGranularity, (size_t * granularity, const CUmemAllocationProp *prop, int option)) \
    X(cuMemCreate, \
      (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle)) \
    X(cuMemAddressReserve, \
      (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
    X(cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
    X(cuMemMap, \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(cuMemUnmap, (CUdeviceptr ptr, size_t size)) \
    X(cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)) \
    X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream stream)) \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream stream)) \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream)) \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream)) \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)) \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)) \
    X(cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps *props)) \
    X(cuMemPoolDestroy, (CUmemoryPool pool)) \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep)) \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev)) \
    X(cuDeviceGetMemPool, (CUmemoryPool * pool, CUdevice dev)) \
    X(cuArrayCreate_v2, (CUarray * array, const CUDA_ARRAY_DESCRIPTOR *desc)) \
    X(cuArray3DCreate_v2, (CUarray * array, const CUDA_ARRAY3D_DESCRIPTOR *desc)) \
    X(cuArrayDestroy, (CUarray array)) \
    X(cuMipmappedArrayCreate, (CUmipmappedArray * array, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray array)) \
    X(cuModuleLoad, (CUmodule * module, const char *fname)) \
    X(cuModuleLoadData, (CUmodule * module, const void *image)) \
    X(cuModuleGetFunction, (CUfunction * func, CUmodule module, const char *name)) \
    X(cuModuleUnload, (CUmodule module)) \
    X(cuLaunchKernel, \
      (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
       unsigned int bz, unsigned int shmem, CUstream stream, void **params, void **extra)) \
    X(cuLaunchKernel_ptsz, \
      (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
       unsigned int bz, unsigned int shmem, CUstream stream, void **params, void **extra)) \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)) \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)) \
    X(cuLaunchCooperativeKernel, \
      (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
       unsigned int bz, unsigned int shmem, CUstream stream, void **params)) \
    X(cuLaunchCooperativeKernel_ptsz, \
      (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
       unsigned int bz, unsigned int shmem, CUstream stream, void **params)) \
    X(cuGraphCreate, (CUgraph * graph, unsigned int flags)) \
    X(cuGraphAddKernelNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, \
                             const CUDA_KERNEL_NODE_PARAMS *params)) \
    X(cuGraphAddKernelNode_v2, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, \
                                const CUDA_KERNEL_NODE_PARAMS *params)) \
    X(cuGraphInstantiate, (CUgraphExec * exec, CUgraph graph, CUgraphNode * error_node, char *log, size_t log_size)) \
    X(cuGraphInstantiate_v2, \
      (CUgraphExec * exec, CUgraph graph, CUgraphNode * error_node, char *log, size_t log_size)) \
    X(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags)) \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream)) \
    X(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream)) \
    X(cuGraphExecDestroy, (CUgraphExec exec)) \
    X(cuGraphDestroy, (CUgraph graph)) \
    X(cuGraphAddMemAllocNode, \
      (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *params)) \
    X(cuGraphAddMemFreeNode, \
      (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, CUdeviceptr dptr)) \
    X(cuGraphAddNode, \
      (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps, CUgraphNodeParams *params)) \
    X(cuGraphAddNode_v2, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, const CUgraphEdgeData *edges, \
                          size_t ndeps, CUgraphNodeParams *params)) \
    X(cuGraphNodeSetParams, (CUgraphNode node, CUgraphNodeParams * params)) \
    X(cuGraphExecNodeSetParams, (CUgraphExec exec, CUgraphNode node, CUgraphNodeParams * params)) \
    X(cuGraphInstantiateWithParams, (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS * params)) \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS * params)) \
    X(cuGraphExecUpdate, \
      (CUgraphExec exec, CUgraph graph, CUgraphNode * error_node, CUgraphExecUpdateResult * result)) \
    X(cuGraphExecUpdate_v2, (CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo * info)) \
    X(cuGraphDestroyNode, (CUgraphNode node)) \
    X(cuDeviceGetGraphMemAttribute, (CUdevice dev, CUgraphMem_attribute attr, void *value)) \
    X(cuDeviceGraphMemTrim, (CUdevice dev)) \
    X(cuStreamBeginCapture_v2, (CUstream stream, int mode)) \
    X(cuStreamEndCapture, (CUstream stream, CUgraph * graph)) \
    X(cuStreamGetCaptureInfo_v2, (CUstream stream, CUstreamCaptureStatus * status, cuuint64_t * id, CUgraph * graph, \
                                  const CUgraphNode **deps, size_t *ndeps)) \
    X(cuStreamGetCaptureInfo_v2_ptsz, (CUstream stream, CUstreamCaptureStatus * status, cuuint64_t * id, \
                                       CUgraph * graph, const CUgraphNode **deps, size_t *ndeps)) \
    X(cuStreamCreate, (CUstream * stream, unsigned int flags)) \
    X(cuStreamDestroy, (CUstream stream)) \
    X(cuStreamDestroy_v2, (CUstream stream)) \
    X(cuStreamSynchronize, (CUstream stream)) \
    X(cuStreamSynchronize_ptsz, (CUstream stream)) \
    X(cuStreamQuery, (CUstream stream)) \
    X(cuStreamQuery_ptsz, (CUstream stream)) \
    X(cuStreamWaitValue32, (CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags)) \
    X(cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags)) \
    X(cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int flags)) \
    X(cuMemHostGetDevicePointer_v2, (CUdeviceptr * dptr, void *p, unsigned int flags)) \
    X(cuEventCreate, (CUevent * event, unsigned int flags)) \
    X(cuEventRecord, (CUevent event, CUstream stream)) \
    X(cuEventRecord_ptsz, (CUevent event, CUstream stream)) \
    X(cuEventSynchronize, (CUevent event)) \
    X(cuEventQuery, (CUevent event)) \
    X(cuEventElapsedTime, (float *ms, CUevent start, CUevent end)) \
    X(cuEventElapsedTime_v2, (float *ms, CUevent start, CUevent end)) \
    X(cuEventDestroy, (CUevent event)) \
    X(cuEventDestroy_v2, (CUevent event)) \
    X(cuGetErrorString, (CUresult error, const char **str)) \
    X(cuGetErrorName, (CUresult error, const char **str)) \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)) \
    X(cuGetProcAddress_v2, \
      (const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, CUdriverProcAddressQueryResult *status))

#define CUDA_ABI_DECLARE(name, params) CUresult name params;
CUDA_ABI_ENTRY_POINTS(CUDA_ABI_DECLARE)
#undef CUDA_ABI_DECLARE

#endif

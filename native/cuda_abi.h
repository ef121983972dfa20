/* The slice of the CUDA driver and NVML C ABIs that libnvc-share intercepts, declared from the
 * public documentation so the shim builds with only a C compiler. Values and layouts must match
 * NVIDIA's headers: the shim passes these structures through to the real driver unchanged. */
#ifndef NVC_CUDA_ABI_H
#define NVC_CUDA_ABI_H

#include <stddef.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_FOUND 500

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct { char bytes[16]; } CUuuid;

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_EVENT_DEFAULT 0x0
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_GRAPH_NODE_TYPE_GRAPH 4
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define CU_GRAPH_NODE_TYPE_MEM_FREE 11
#define CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE 1
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1

/* CUarray_format values that matter for the element size; anything else is counted as 4 bytes. */
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8 0x08
#define CU_AD_FORMAT_SIGNED_INT16 0x09
#define CU_AD_FORMAT_SIGNED_INT32 0x0a
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20

typedef struct {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    int type;
    int id;
} CUmemLocation;

typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* Graph memory nodes (CUDA 11.4+) and the generic node parameters (12.2+). */
typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;                /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
    int type;                        /* CU_GRAPH_NODE_TYPE_* */
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_MEM_ALLOC_NODE_PARAMS alloc;
        struct { CUdeviceptr dptr; } free;
        struct { CUgraph graph; int ownership; } graph;
    };
    long long reserved2;
} CUgraphNodeParams;

typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* NVML */
typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#endif

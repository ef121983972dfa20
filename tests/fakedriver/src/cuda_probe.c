/* cuda_probe: drives libcuda.so.1 the way an application does (dlopen + dlsym), one operation per
 * argument group, one output line per operation, so tests can script the driver from Python.
 * Test double tooling: it runs against the fake libcuda, or a real one (possibly behind a shim).
 *
 *   init | count | dev I | ctx I | release I | ctxcreate I | ctxdestroy | meminfo | sync
 *   alloc BYTES | managed BYTES | pitch W H ELEM | free SLOT
 *   vmm BYTES | vmmfree SLOT
 *   async BYTES | freeasync SLOT | pool | threshold BYTES
 *   array W H FMT CH | array3d W H D FMT CH | mipmap W H D FMT CH LEVELS | arrayfree SLOT
 *   procaddr NAME VERSION FLAGS
 *   launch N GRID BLOCK | coop GRID BLOCK | graph NODES LAUNCHES | events N | stats I | queries (the fake's count
 *     of cuEventQuery calls so far)
 *   steps N GRID BLOCK HOST_US (launch, wait, host work) | burst N K HOST_US (K launches each followed by
 *     host work, then one wait: a framework's step) | sburst N K HOST_US (burst's on two created streams, each
 *     K's last on the second, one wait at the end) | gatewait K HOLD_US (the NULL stream waits for a
 *     host word, K kernels and an event behind it; the word written HOLD_US later: prints the wait
 *     call's µs, the event's query before the write, and µs from the write to the event)
 *   gnode HOW BYTES (a graph with one memory allocation node, made by HOW: memalloc = cuGraphAddMemAllocNode,
 *     addnode / addnode2 = cuGraphAddNode / _v2, capture = cuMemAllocAsync under stream capture)
 *   ginst SLOT HOW (flags | autofree | params) | glaunch SLOT | gexecdestroy SLOT | gdestroy SLOT |
 *   gdestroynode SLOT | gfreenode SLOT HOW (memfree | addnode | capture: a second graph freeing the
 *   allocation, instantiated, launched and destroyed) | gmemfree SLOT | gfreeasync SLOT |
 *   gset SLOT BYTES | gexecset SLOT BYTES | gupdate SLOT FROM | gtrim | greserve
 *
 * Lines start with the operation and the CUresult name; allocations add the slot they were stored in
 * (-1 when they failed). A SLOT that was never handed out stands for an address no one allocated. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_cuda.h"

#define FN(name, params) static __typeof__(name) *p_##name;
CUDA_ABI_ENTRY_POINTS(FN)
#undef FN

static int (*p_stats)(int, unsigned long long *, unsigned long long *, unsigned long long *);
static unsigned long long (*p_queries)(void);

enum slot_kind { S_FREE, S_MEM, S_VMM, S_ARRAY, S_MIPMAP, S_GRAPH };
static struct slot {
    enum slot_kind kind;
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle;
    void *array;
    CUgraph graph; /* S_GRAPH: a graph with one allocation node at ptr */
    CUgraphNode node;
    CUgraphExec exec;
} slots[4096];
static int nslots;
static CUmodule module;
static CUcontext created[16];
static int ncreated;

static const char *ename(CUresult r)
{
    static char buf[32];
    const char *s = NULL;
    if (p_cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    snprintf(buf, sizeof(buf), "CUresult(%d)", (int)r);
    return buf;
}

static int put(struct slot s)
{
    if (nslots == (int)(sizeof(slots) / sizeof(slots[0]))) return -1;
    slots[nslots] = s;
    return nslots++;
}

static struct slot *get(const char *arg, enum slot_kind kind)
{
    int i = atoi(arg);
    return i >= 0 && i < nslots && slots[i].kind == kind ? &slots[i] : NULL;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The host's own work between launches: the CPU busy for us microseconds. */
static void host_work(double us)
{
    for (double until = now_us() + us; now_us() < until;)
        ;
}

static unsigned long long num(const char *s) { return strtoull(s, NULL, 0); }

static void alloc_line(const char *op, CUresult r, struct slot s)
{
    printf("%s %s %d\n", op, ename(r), r == CUDA_SUCCESS ? put(s) : -1);
}

static CUresult load_function(CUfunction *f)
{
    static const char image[] = "fake image";
    CUresult r = module ? CUDA_SUCCESS : p_cuModuleLoadData(&module, image);
    return r == CUDA_SUCCESS ? p_cuModuleGetFunction(f, module, "kernel") : r;
}

static CUresult vmm_map(size_t bytes, struct slot *s)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUdevice dev;
    size_t gran;
    CUresult r = p_cuCtxGetDevice(&dev);
    prop.location.id = dev;
    if (r == CUDA_SUCCESS) r = p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS) return r;
    s->size = (bytes + gran - 1) / gran * gran;
    if ((r = p_cuMemCreate(&s->handle, s->size, &prop, 0)) != CUDA_SUCCESS) return r;
    if ((r = p_cuMemAddressReserve(&s->ptr, s->size, 0, 0, 0)) != CUDA_SUCCESS) return r;
    if ((r = p_cuMemMap(s->ptr, s->size, 0, s->handle, 0)) != CUDA_SUCCESS) return r;
    CUmemAccessDesc access = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return p_cuMemSetAccess(s->ptr, s->size, &access, 1);
}

static CUresult pool_attr(CUmemPool_attribute attr, cuuint64_t *value)
{
    CUdevice dev;
    CUmemoryPool pool;
    CUresult r = p_cuCtxGetDevice(&dev);
    if (r == CUDA_SUCCESS) r = p_cuDeviceGetDefaultMemPool(&pool, dev);
    return r == CUDA_SUCCESS ? p_cuMemPoolGetAttribute(pool, attr, value) : r;
}

/* A graph holding one memory node (allocation of bytes, or free of dptr), made the way `how` says. */
static CUresult memory_graph(const char *how, size_t bytes, CUdeviceptr dptr, struct slot *s)
{
    CUdevice dev;
    CUresult r = p_cuCtxGetDevice(&dev);
    CUgraphNodeParams p = {.type = bytes ? CU_GRAPH_NODE_TYPE_MEM_ALLOC : CU_GRAPH_NODE_TYPE_MEM_FREE};
    if (bytes)
        p.alloc = (CUDA_MEM_ALLOC_NODE_PARAMS){
            .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}},
            .bytesize = bytes};
    else
        p.free.dptr = dptr;
    if (r == CUDA_SUCCESS && !strcmp(how, "capture")) {
        CUstream stream;
        r = p_cuStreamCreate(&stream, 0);
        if (r == CUDA_SUCCESS) r = p_cuStreamBeginCapture_v2(stream, 0);
        if (r == CUDA_SUCCESS)
            r = bytes ? p_cuMemAllocAsync(&p.alloc.dptr, bytes, stream) : p_cuMemFreeAsync(dptr, stream);
        CUresult end = r == CUDA_SUCCESS ? p_cuStreamEndCapture(stream, &s->graph) : CUDA_SUCCESS;
        if (r == CUDA_SUCCESS) r = end;
    } else if (r == CUDA_SUCCESS) {
        r = p_cuGraphCreate(&s->graph, 0);
        if (r != CUDA_SUCCESS) return r;
        if (!strcmp(how, "memalloc"))
            r = bytes ? p_cuGraphAddMemAllocNode(&s->node, s->graph, NULL, 0, &p.alloc)
                      : p_cuGraphAddMemFreeNode(&s->node, s->graph, NULL, 0, dptr);
        else if (!strcmp(how, "addnode"))
            r = p_cuGraphAddNode(&s->node, s->graph, NULL, 0, &p);
        else if (!strcmp(how, "addnode2"))
            r = p_cuGraphAddNode_v2(&s->node, s->graph, NULL, NULL, 0, &p);
        else
            r = CUDA_ERROR_INVALID_VALUE;
    }
    s->ptr = bytes ? p.alloc.dptr : dptr;
    s->size = bytes;
    return r;
}

static CUresult instantiate(const char *how, struct slot *s)
{
    if (!strcmp(how, "params")) {
        CUDA_GRAPH_INSTANTIATE_PARAMS ip = {0};
        return p_cuGraphInstantiateWithParams(&s->exec, s->graph, &ip);
    }
    return p_cuGraphInstantiateWithFlags(
        &s->exec, s->graph, !strcmp(how, "autofree") ? CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH : 0);
}

static int graph_ops(char **argv, int argc)
{
    const char *op = argv[0];
    CUresult r;
    if (!strcmp(op, "gnode") && argc > 2) {
        struct slot s = {.kind = S_GRAPH};
        r = memory_graph(argv[1], num(argv[2]), 0, &s);
        alloc_line(op, r, s);
        return 3;
    }
    if (!strcmp(op, "gtrim") || !strcmp(op, "greserve")) {
        CUdevice dev;
        cuuint64_t reserved = 0;
        r = p_cuCtxGetDevice(&dev);
        if (r == CUDA_SUCCESS)
            r = op[1] == 't' ? p_cuDeviceGraphMemTrim(dev)
                             : p_cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
        printf("%s %s %llu\n", op, ename(r), reserved);
        return 1;
    }
    if (argc < 2) return 0;
    struct slot *s = get(argv[1], S_GRAPH);
    if (!s) {
        fprintf(stderr, "cuda_probe: %s: slot %s holds no graph\n", op, argv[1]);
        exit(2);
    }
    int used = 2;
    if (!strcmp(op, "ginst") && argc > 2) {
        r = instantiate(argv[2], s);
        used = 3;
    } else if (!strcmp(op, "glaunch")) {
        r = p_cuGraphLaunch(s->exec, NULL);
        if (r == CUDA_SUCCESS) r = p_cuCtxSynchronize();
    } else if (!strcmp(op, "gexecdestroy")) {
        r = p_cuGraphExecDestroy(s->exec);
    } else if (!strcmp(op, "gdestroy")) {
        r = p_cuGraphDestroy(s->graph);
    } else if (!strcmp(op, "gdestroynode")) {
        r = p_cuGraphDestroyNode(s->node);
    } else if (!strcmp(op, "gmemfree")) {
        r = p_cuMemFree_v2(s->ptr);
    } else if (!strcmp(op, "gfreeasync")) {
        r = p_cuMemFreeAsync(s->ptr, NULL);
        if (r == CUDA_SUCCESS) r = p_cuCtxSynchronize();
    } else if (!strcmp(op, "gfreenode") && argc > 2) {
        struct slot f = {.kind = S_GRAPH};
        r = memory_graph(argv[2], 0, s->ptr, &f);
        if (r == CUDA_SUCCESS) r = instantiate("flags", &f);
        if (r == CUDA_SUCCESS) r = p_cuGraphLaunch(f.exec, NULL);
        if (r == CUDA_SUCCESS) r = p_cuCtxSynchronize();
        if (r == CUDA_SUCCESS) r = p_cuGraphExecDestroy(f.exec);
        if (r == CUDA_SUCCESS) r = p_cuGraphDestroy(f.graph);
        used = 3;
    } else if ((!strcmp(op, "gset") || !strcmp(op, "gexecset")) && argc > 2) {
        CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC};
        p.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.alloc.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
        p.alloc.bytesize = num(argv[2]);
        r = op[1] == 's' ? p_cuGraphNodeSetParams(s->node, &p) : p_cuGraphExecNodeSetParams(s->exec, s->node, &p);
        used = 3;
    } else if (!strcmp(op, "gupdate") && argc > 2) {
        struct slot *from = get(argv[2], S_GRAPH);
        r = from ? p_cuGraphExecUpdate_v2(s->exec, from->graph, NULL) : CUDA_ERROR_INVALID_VALUE;
        used = 3;
    } else {
        return 0;
    }
    printf("%s %s\n", op, ename(r));
    return used;
}

/* Runs the operation at argv[0]; returns how many arguments it used, or 0 when it is unknown. */
static int run(char **argv, int argc)
{
    const char *op = argv[0];
    CUresult r;
#define NEED(n) \
    do { \
        if (argc < (n) + 1) { \
            fprintf(stderr, "cuda_probe: %s needs %d arguments\n", op, n); \
            exit(2); \
        } \
    } while (0)
    if (!strcmp(op, "init")) {
        printf("init %s\n", ename(p_cuInit(0)));
        return 1;
    }
    if (!strcmp(op, "count")) {
        int n = 0;
        r = p_cuDeviceGetCount(&n);
        printf("count %s %d\n", ename(r), n);
        return 1;
    }
    if (!strcmp(op, "dev")) {
        NEED(1);
        int i = atoi(argv[1]), major = 0, minor = 0, sms = 0;
        char name[256] = "", bus[32] = "", hex[33] = "";
        CUuuid uuid = {{0}};
        size_t total = 0;
        r = p_cuDeviceGetName(name, sizeof(name), i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetUuid_v2(&uuid, i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetPCIBusId(bus, sizeof(bus), i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceTotalMem_v2(&total, i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, i);
        for (int k = 0; k < 16; k++) sprintf(hex + 2 * k, "%02x", (unsigned char)uuid.bytes[k]);
        printf("dev %s uuid=%s pci=%s total=%zu cc=%d.%d sms=%d name=%s\n", ename(r), hex, bus, total, major, minor,
               sms, name);
        return 2;
    }
    if (!strcmp(op, "ctx")) {
        NEED(1);
        CUcontext c;
        r = p_cuDevicePrimaryCtxRetain(&c, atoi(argv[1]));
        if (r == CUDA_SUCCESS) r = p_cuCtxSetCurrent(c);
        if (r == CUDA_SUCCESS) module = NULL; /* a module is its context's: the next launch loads one in this one */
        printf("ctx %s\n", ename(r));
        return 2;
    }
    if (!strcmp(op, "release")) {
        NEED(1);
        printf("release %s\n", ename(p_cuDevicePrimaryCtxRelease_v2(atoi(argv[1]))));
        return 2;
    }
    if (!strcmp(op, "ctxcreate")) {
        NEED(1);
        CUcontext c = NULL;
        r = ncreated < 16 ? p_cuCtxCreate_v2(&c, 0, atoi(argv[1])) : CUDA_ERROR_INVALID_VALUE;
        if (r == CUDA_SUCCESS) created[ncreated++] = c;
        printf("ctxcreate %s\n", ename(r));
        return 2;
    }
    if (!strcmp(op, "ctxdestroy")) {
        r = ncreated ? p_cuCtxDestroy_v2(created[--ncreated]) : CUDA_ERROR_INVALID_CONTEXT;
        printf("ctxdestroy %s\n", ename(r));
        return 1;
    }
    if (!strcmp(op, "meminfo")) {
        size_t free_b = 0, total = 0;
        r = p_cuMemGetInfo_v2(&free_b, &total);
        printf("meminfo %s %zu %zu\n", ename(r), free_b, total);
        return 1;
    }
    if (!strcmp(op, "sync")) {
        double t0 = now_us();
        r = p_cuCtxSynchronize();
        printf("sync %s %.0f\n", ename(r), now_us() - t0);
        return 1;
    }
    if (!strcmp(op, "alloc") || !strcmp(op, "managed")) {
        NEED(1);
        struct slot s = {.kind = S_MEM, .size = num(argv[1])};
        r = op[0] == 'a' ? p_cuMemAlloc_v2(&s.ptr, s.size) : p_cuMemAllocManaged(&s.ptr, s.size, CU_MEM_ATTACH_GLOBAL);
        alloc_line(op, r, s);
        return 2;
    }
    if (!strcmp(op, "pitch")) {
        NEED(3);
        struct slot s = {.kind = S_MEM};
        size_t pitch = 0;
        r = p_cuMemAllocPitch_v2(&s.ptr, &pitch, num(argv[1]), num(argv[2]), (unsigned)num(argv[3]));
        printf("pitch %s %zu %d\n", ename(r), pitch, r == CUDA_SUCCESS ? put(s) : -1);
        return 4;
    }
    if (!strcmp(op, "free") || !strcmp(op, "freeasync")) {
        NEED(1);
        struct slot *s = get(argv[1], S_MEM);
        CUdeviceptr p = s ? s->ptr : 0xdead0000ull;
        r = op[4] ? p_cuMemFreeAsync(p, NULL) : p_cuMemFree_v2(p);
        if (r == CUDA_SUCCESS && s) s->kind = S_FREE;
        printf("%s %s\n", op, ename(r));
        return 2;
    }
    if (!strcmp(op, "vmm")) {
        NEED(1);
        struct slot s = {.kind = S_VMM};
        alloc_line(op, vmm_map(num(argv[1]), &s), s);
        return 2;
    }
    if (!strcmp(op, "vmmfree")) {
        NEED(1);
        struct slot *s = get(argv[1], S_VMM);
        r = s ? p_cuMemUnmap(s->ptr, s->size) : CUDA_ERROR_INVALID_VALUE;
        if (r == CUDA_SUCCESS) r = p_cuMemRelease(s->handle);
        if (r == CUDA_SUCCESS) r = p_cuMemAddressFree(s->ptr, s->size);
        if (r == CUDA_SUCCESS) s->kind = S_FREE;
        printf("vmmfree %s\n", ename(r));
        return 2;
    }
    if (!strcmp(op, "async")) {
        NEED(1);
        struct slot s = {.kind = S_MEM, .size = num(argv[1])};
        alloc_line(op, p_cuMemAllocAsync(&s.ptr, s.size, NULL), s);
        return 2;
    }
    if (!strcmp(op, "pool")) {
        cuuint64_t reserved = 0, used = 0, high = 0;
        r = pool_attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
        if (r == CUDA_SUCCESS) r = pool_attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        if (r == CUDA_SUCCESS) r = pool_attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high);
        printf("pool %s reserved=%llu used=%llu reserved_high=%llu\n", ename(r), reserved, used, high);
        return 1;
    }
    if (!strcmp(op, "threshold")) {
        NEED(1);
        CUdevice dev;
        CUmemoryPool pool;
        cuuint64_t value = num(argv[1]);
        r = p_cuCtxGetDevice(&dev);
        if (r == CUDA_SUCCESS) r = p_cuDeviceGetDefaultMemPool(&pool, dev);
        if (r == CUDA_SUCCESS) r = p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value);
        printf("threshold %s\n", ename(r));
        return 2;
    }
    if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap")) {
        int three = op[5] == '3', mip = op[0] == 'm', used = three ? 6 : mip ? 7 : 5;
        NEED(used - 1);
        CUDA_ARRAY3D_DESCRIPTOR d3 = {num(argv[1]),
                                      num(argv[2]),
                                      three || mip ? num(argv[3]) : 0,
                                      (CUarray_format)num(argv[used - 2 - mip]),
                                      (unsigned)num(argv[used - 1 - mip]),
                                      0};
        struct slot s = {.kind = mip ? S_MIPMAP : S_ARRAY};
        if (mip) {
            r = p_cuMipmappedArrayCreate((CUmipmappedArray *)&s.array, &d3, (unsigned)num(argv[6]));
        } else if (three) {
            r = p_cuArray3DCreate_v2((CUarray *)&s.array, &d3);
        } else {
            CUDA_ARRAY_DESCRIPTOR d2 = {d3.Width, d3.Height, d3.Format, d3.NumChannels};
            r = p_cuArrayCreate_v2((CUarray *)&s.array, &d2);
        }
        alloc_line(op, r, s);
        return used;
    }
    if (!strcmp(op, "arrayfree")) {
        NEED(1);
        struct slot *s = get(argv[1], S_ARRAY);
        struct slot *m = s ? NULL : get(argv[1], S_MIPMAP);
        r = s ? p_cuArrayDestroy(s->array) : m ? p_cuMipmappedArrayDestroy(m->array) : CUDA_ERROR_INVALID_HANDLE;
        if (r == CUDA_SUCCESS) (s ? s : m)->kind = S_FREE;
        printf("arrayfree %s\n", ename(r));
        return 2;
    }
    if (!strcmp(op, "procaddr")) {
        NEED(3);
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
        Dl_info info = {0};
        r = p_cuGetProcAddress_v2(argv[1], &fn, (int)num(argv[2]), num(argv[3]), &status);
        printf("procaddr %s %d %s\n", ename(r), (int)status,
               fn && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "-");
        return 4;
    }
    if (!strcmp(op, "launch") || !strcmp(op, "coop")) {
        int coop = op[0] == 'c', n = coop ? 1 : atoi(argv[1]);
        NEED(coop ? 2 : 3);
        unsigned grid = (unsigned)num(argv[coop ? 1 : 2]), block = (unsigned)num(argv[coop ? 2 : 3]);
        CUfunction f;
        double t0 = now_us();
        r = load_function(&f);
        for (int i = 0; i < n && r == CUDA_SUCCESS; i++)
            r = coop ? p_cuLaunchCooperativeKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL)
                     : p_cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL);
        printf("%s %s %.0f\n", op, ename(r), now_us() - t0);
        return coop ? 3 : 4;
    }
    if (!strcmp(op, "steps")) { /* a training-like loop: a kernel, wait for it, host work */
        NEED(4);
        int n = atoi(argv[1]);
        unsigned grid = (unsigned)num(argv[2]), block = (unsigned)num(argv[3]);
        double host_us = (double)num(argv[4]), t0 = now_us();
        CUfunction f;
        r = load_function(&f);
        for (int i = 0; i < n && r == CUDA_SUCCESS; i++) {
            r = p_cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, NULL, NULL);
            if (r == CUDA_SUCCESS) r = p_cuCtxSynchronize();
            host_work(host_us);
        }
        printf("steps %s %.0f\n", ename(r), now_us() - t0);
        return 5;
    }
    if (!strcmp(op, "burst") || !strcmp(op, "sburst")) { /* a framework's step: K launches, host work, a wait */
        NEED(3);
        int n = atoi(argv[1]), k = atoi(argv[2]), two = op[0] == 's';
        double host_us = (double)num(argv[3]), t0 = now_us();
        CUfunction f;
        CUstream st[2] = {NULL, NULL}; /* burst: the NULL stream */
        r = load_function(&f);
        for (int i = 0; i < 2 * two && r == CUDA_SUCCESS; i++) r = p_cuStreamCreate(&st[i], 0);
        for (int i = 0; i < n && r == CUDA_SUCCESS; i++) {
            for (int j = 0; j < k && r == CUDA_SUCCESS; j++) {
                r = p_cuLaunchKernel(f, 264, 1, 1, 128, 1, 1, 0, st[j == k - 1], NULL, NULL);
                host_work(host_us);
            }
            if (r == CUDA_SUCCESS && (!two || i == n - 1)) r = p_cuCtxSynchronize();
        }
        printf("%s %s %.0f\n", op, ename(r), now_us() - t0);
        return 4;
    }
    if (!strcmp(op, "graph")) {
        NEED(2);
        int nodes = atoi(argv[1]), launches = atoi(argv[2]);
        CUfunction f;
        CUgraph g = NULL;
        CUgraphExec e = NULL;
        CUgraphNode prev = NULL, node;
        r = load_function(&f);
        if (r == CUDA_SUCCESS) r = p_cuGraphCreate(&g, 0);
        for (int i = 0; i < nodes && r == CUDA_SUCCESS; i++) {
            CUDA_KERNEL_NODE_PARAMS kp = {f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL};
            r = p_cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &kp);
            prev = node;
        }
        if (r == CUDA_SUCCESS) r = p_cuGraphInstantiateWithFlags(&e, g, 0);
        for (int i = 0; i < launches && r == CUDA_SUCCESS; i++) r = p_cuGraphLaunch(e, NULL);
        if (e && r == CUDA_SUCCESS) r = p_cuGraphExecDestroy(e);
        if (g && r == CUDA_SUCCESS) r = p_cuGraphDestroy(g);
        printf("graph %s\n", ename(r));
        return 3;
    }
    if (!strcmp(op, "gatewait")) {
        NEED(2);
        static uint32_t word[1024] __attribute__((aligned(4096)));
        CUdeviceptr dptr = 0;
        CUevent e = NULL;
        CUfunction f;
        CUresult queried = CUDA_ERROR_UNKNOWN;
        double called = -1, after = -1, t0;
        __atomic_store_n(&word[0], 0, __ATOMIC_RELEASE);
        r = load_function(&f);
        if (r == CUDA_SUCCESS) r = p_cuMemHostRegister_v2(word, sizeof word, CU_MEMHOSTREGISTER_DEVICEMAP);
        if (r == CUDA_SUCCESS) r = p_cuMemHostGetDevicePointer_v2(&dptr, word, 0);
        if (r == CUDA_SUCCESS) r = p_cuEventCreate(&e, 0);
        t0 = now_us();
        if (r == CUDA_SUCCESS) r = p_cuStreamWaitValue32_v2(NULL, dptr, 1, CU_STREAM_WAIT_VALUE_GEQ);
        called = now_us() - t0;
        for (int i = 0; i < atoi(argv[1]) && r == CUDA_SUCCESS; i++)
            r = p_cuLaunchKernel(f, 264, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        if (r == CUDA_SUCCESS) r = p_cuEventRecord(e, NULL);
        if (r == CUDA_SUCCESS) queried = p_cuEventQuery(e);
        host_work((double)num(argv[2]));
        t0 = now_us();
        __atomic_store_n(&word[0], 1, __ATOMIC_RELEASE);
        if (r == CUDA_SUCCESS) r = p_cuEventSynchronize(e);
        after = now_us() - t0;
        printf("gatewait %s %.0f %s %.0f\n", ename(r), called, ename(queried), after);
        return 3;
    }
    if (!strcmp(op, "events")) {
        NEED(1);
        CUevent a = NULL, b = NULL;
        CUstream s = NULL;
        CUfunction f;
        float ms = -1;
        r = load_function(&f);
        if (r == CUDA_SUCCESS) r = p_cuStreamCreate(&s, 0);
        if (r == CUDA_SUCCESS) r = p_cuEventCreate(&a, 0);
        if (r == CUDA_SUCCESS) r = p_cuEventCreate(&b, 0);
        if (r == CUDA_SUCCESS) r = p_cuEventRecord(a, s);
        for (int i = 0; i < atoi(argv[1]) && r == CUDA_SUCCESS; i++)
            r = p_cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
        if (r == CUDA_SUCCESS) r = p_cuEventRecord(b, s);
        if (r == CUDA_SUCCESS) r = p_cuEventSynchronize(b);
        if (r == CUDA_SUCCESS) r = p_cuEventElapsedTime(&ms, a, b);
        if (r == CUDA_SUCCESS) r = p_cuEventDestroy_v2(a);
        if (r == CUDA_SUCCESS) r = p_cuEventDestroy_v2(b);
        if (r == CUDA_SUCCESS) r = p_cuStreamDestroy_v2(s);
        printf("events %s %.3f\n", ename(r), ms);
        return 2;
    }
    if (op[0] == 'g' && strcmp(op, "graph")) return graph_ops(argv, argc);
    if (!strcmp(op, "stats")) {
        NEED(1);
        unsigned long long launches = 0, busy = 0, used = 0;
        int rc = p_stats ? p_stats(atoi(argv[1]), &launches, &busy, &used) : -1;
        printf("stats %d launches=%llu busy_ns=%llu used=%llu\n", rc, launches, busy, used);
        return 2;
    }
    if (!strcmp(op, "queries")) {
        printf("queries %llu\n", p_queries ? p_queries() : 0ULL);
        return 1;
    }
    return 0;
#undef NEED
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "cuda_probe: %s\n", dlerror());
        return 2;
    }
#define FN(name, params) p_##name = (__typeof__(p_##name))dlsym(lib, #name);
    CUDA_ABI_ENTRY_POINTS(FN)
#undef FN
    p_stats = (__typeof__(p_stats))dlsym(lib, "fakeCudaDeviceStats");
    p_queries = (__typeof__(p_queries))dlsym(lib, "fakeCudaEventQueries");
    if (!p_cuGetErrorName) {
        fprintf(stderr, "cuda_probe: libcuda.so.1 has no cuGetErrorName\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc;) {
        int used = run(argv + i, argc - i);
        if (!used) {
            fprintf(stderr, "cuda_probe: unknown operation %s\n", argv[i]);
            return 2;
        }
        i += used;
    }
    return 0;
}

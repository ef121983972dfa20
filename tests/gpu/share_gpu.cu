// share_gpu: a CUDA 13 program (static cudart, nvcc's default) used by the real-GPU tests of
// libnvc-share (tests/test_share_gpu.py) and by bench/share. Static cudart reaches the driver only
// through dlopen("libcuda.so.1") + cuGetProcAddress, the path the shim must intercept.
// One output line per operation, "op value...", so the callers parse without guessing.
//
//   fill MIB            cudaMalloc MIB-sized chunks until one fails: "fill <MiB allocated> <error name>"
//   asyncfill MIB       the same through cudaMallocAsync (the device's default pool)
//   alloc MIB           one cudaMalloc, kept: "alloc <error name>"
//   graphalloc MIB      a CUDA graph with one memory allocation node (not freed), launched
//   escape PATH         512 MiB at a time through PATH, kept, until one fails or 12 GiB are held:
//                       "escape <PATH> <MiB held> <error name>". PATH: malloc managed pitch malloc3d async
//                       frompool vmm driver array array3d mipmap graph graphnode graphparams capture
//   array W H           cudaMallocArray of W x H float4 elements
//   freeall             cudaFree everything kept
//   meminfo             "meminfo <free> <total>" from cudaMemGetInfo
//   totalmem            "totalmem <bytes>" from cudaDeviceProp::totalGlobalMem (cuDeviceTotalMem)
//   hold                "holding", then waits to be killed
//   compute SEC ITERS   launches a compute-bound kernel for SEC seconds: "compute <kernels/s>"
//   bench N             median and 10th percentile of N samples: "pair_us <µs> <µs>" (cudaMalloc+cudaFree
//                       1 MiB), "launch_us <µs> <µs> <mean µs>" (the mean holds what a launch pays only
//                       now and then, as a sharing shim's look at its completed work)
//   pairab N            cuMemAlloc_v2+cuMemFree_v2 (1 MiB) pairs through the pointers dlsym gives (the
//                       shim's wrappers when it is preloaded) and through glibc's own dlsym (always the
//                       driver's), alternating pair by pair in one process: "pairab <median µs> <median
//                       µs> <median of the N paired differences µs>"
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <unistd.h>
#include <vector>

static double now_us()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double percentile(std::vector<double> v, int pct)
{
    std::sort(v.begin(), v.end());
    return v[v.size() * pct / 100];
}

__global__ void empty_kernel() {}

// A dependent FMA chain per thread: bound by the SMs' arithmetic, not by memory.
__global__ void fma_loop(float *sink, int iters)
{
    float a = threadIdx.x * 1e-3f, b = 0.999f, c = 1e-4f;
    for (int i = 0; i < iters; i++) {
        a = fmaf(a, b, c);
        b = fmaf(b, a, -c);
    }
    if (a == 1234.5f)
        sink[blockIdx.x] = b;
}

static std::vector<void *> kept;

typedef int (*drv_fn)(...);

// The driver's entry point through dlsym (the shim's wrapper when it is preloaded), as a program
// calling the driver API directly gets it.
static drv_fn driver(const char *name)
{
    static void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    return lib ? (drv_fn)dlsym(lib, name) : nullptr;
}

// A graph with one allocation node of `bytes`, made by `how`, instantiated and launched; kept.
static cudaError_t graph_alloc(const char *how, size_t bytes)
{
    static cudaStream_t stream;
    if (!stream && cudaStreamCreate(&stream) != cudaSuccess)
        return cudaErrorUnknown;
    cudaMemAllocNodeParams params = {};
    params.poolProps.allocType = cudaMemAllocationTypePinned;
    params.poolProps.location.type = cudaMemLocationTypeDevice;
    params.poolProps.location.id = 0;
    params.bytesize = bytes;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec;
    cudaGraphNode_t node;
    cudaError_t err = cudaSuccess;
    if (!strcmp(how, "capture")) {
        void *p;
        err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
        if (err == cudaSuccess) {
            err = cudaMallocAsync(&p, bytes, stream);
            cudaError_t end = cudaStreamEndCapture(stream, &graph);
            if (err == cudaSuccess)
                err = end;
        }
    } else {
        err = cudaGraphCreate(&graph, 0);
        if (err == cudaSuccess && !strcmp(how, "graphnode")) {
            cudaGraphNodeParams np = {};
            np.type = cudaGraphNodeTypeMemAlloc;
            np.alloc.poolProps = params.poolProps;
            np.alloc.bytesize = bytes;
            err = cudaGraphAddNode(&node, graph, nullptr, nullptr, 0, &np);
        } else if (err == cudaSuccess) {
            err = cudaGraphAddMemAllocNode(&node, graph, nullptr, 0, &params);
        }
    }
    if (err == cudaSuccess && !strcmp(how, "graphparams")) {
        cudaGraphInstantiateParams ip = {};
        err = cudaGraphInstantiateWithParams(&exec, graph, &ip);
    } else if (err == cudaSuccess) {
        err = cudaGraphInstantiate(&exec, graph, 0);
    }
    if (err == cudaSuccess)
        err = cudaGraphLaunch(exec, stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(stream);
    return err;
}

// One 512 MiB allocation through `path` (a name of the escape operation).
static cudaError_t escape_step(const char *path, size_t chunk)
{
    void *p = nullptr;
    if (!strcmp(path, "malloc"))
        return cudaMalloc(&p, chunk);
    if (!strcmp(path, "managed"))
        return cudaMallocManaged(&p, chunk);
    if (!strcmp(path, "pitch")) {
        size_t pitch;
        return cudaMallocPitch(&p, &pitch, 1 << 16, chunk >> 16);
    }
    if (!strcmp(path, "malloc3d")) {
        cudaPitchedPtr pp;
        return cudaMalloc3D(&pp, make_cudaExtent(1 << 12, 1 << 10, chunk >> 22));
    }
    if (!strcmp(path, "async") || !strcmp(path, "frompool")) {
        static cudaMemPool_t pool;
        if (path[0] == 'f' && !pool) {
            cudaMemPoolProps props = {};
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            cudaError_t err = cudaMemPoolCreate(&pool, &props);
            if (err != cudaSuccess)
                return err;
        }
        cudaError_t err = path[0] == 'f' ? cudaMallocFromPoolAsync(&p, chunk, pool, 0) : cudaMallocAsync(&p, chunk, 0);
        return err == cudaSuccess ? cudaStreamSynchronize(0) : err;
    }
    if (!strcmp(path, "vmm") || !strcmp(path, "driver"))
        cudaFree(nullptr);                 // the runtime's primary context, current for the driver calls below
    if (!strcmp(path, "vmm")) {            // cuMemCreate, as PyTorch's expandable segments and NCCL use it
        unsigned long long handle;
        struct { int type, handle_types, loc_type, loc_id; void *win32; unsigned char flags[8]; } prop = {1, 0, 1, 0};
        int rc = driver("cuMemCreate")(&handle, chunk, &prop, 0ull);
        return rc == 0 ? cudaSuccess : rc == 2 ? cudaErrorMemoryAllocation : cudaErrorUnknown;
    }
    if (!strcmp(path, "driver")) {
        unsigned long long dptr;
        int rc = driver("cuMemAlloc_v2")(&dptr, chunk);
        return rc == 0 ? cudaSuccess : rc == 2 ? cudaErrorMemoryAllocation : cudaErrorUnknown;
    }
    if (!strcmp(path, "array") || !strcmp(path, "array3d") || !strcmp(path, "mipmap")) {
        cudaChannelFormatDesc desc = cudaCreateChannelDesc<float4>();       // 16 bytes an element
        if (path[0] == 'm') {
            cudaMipmappedArray_t m;                                          // one level
            return cudaMallocMipmappedArray(&m, &desc, make_cudaExtent(8192, chunk / 16 / 8192, 0), 1);
        }
        cudaArray_t a;
        if (path[5] == '3')
            return cudaMalloc3DArray(&a, &desc, make_cudaExtent(1024, 1024, chunk / 16 / (1 << 20)));
        return cudaMallocArray(&a, &desc, 8192, chunk / 16 / 8192);
    }
    return graph_alloc(path, chunk);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        if (!strcmp(op, "fill") || !strcmp(op, "asyncfill")) {
            size_t chunk = strtoull(argv[++i], nullptr, 10) << 20;
            bool async = op[0] == 'a';
            size_t total = 0;
            cudaError_t err;
            for (;;) {
                void *p = nullptr;
                err = async ? cudaMallocAsync(&p, chunk, 0) : cudaMalloc(&p, chunk);
                if (async && err == cudaSuccess)
                    err = cudaStreamSynchronize(0);
                if (err != cudaSuccess)
                    break;
                kept.push_back(p);
                total += chunk;
                if (total > (size_t(200) << 30))
                    break;
            }
            cudaGetLastError();
            printf("%s %zu %s\n", op, total >> 20, cudaGetErrorName(err));
        } else if (!strcmp(op, "escape")) {
            const char *path = argv[++i];
            size_t chunk = size_t(512) << 20, held = 0;
            cudaError_t err;
            while ((err = escape_step(path, chunk)) == cudaSuccess && (held += chunk) < (size_t(12) << 30))
                ;
            cudaGetLastError();
            printf("escape %s %zu %s\n", path, held >> 20, cudaGetErrorName(err));
        } else if (!strcmp(op, "alloc")) {
            void *p = nullptr;
            cudaError_t err = cudaMalloc(&p, strtoull(argv[++i], nullptr, 10) << 20);
            if (err == cudaSuccess)
                kept.push_back(p);
            cudaGetLastError();
            printf("alloc %s\n", cudaGetErrorName(err));
        } else if (!strcmp(op, "graphalloc")) {
            cudaMemAllocNodeParams params = {};
            params.poolProps.allocType = cudaMemAllocationTypePinned;
            params.poolProps.location.type = cudaMemLocationTypeDevice;
            params.poolProps.location.id = 0;
            params.bytesize = strtoull(argv[++i], nullptr, 10) << 20;
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            cudaGraphNode_t node;
            cudaError_t err = cudaGraphCreate(&graph, 0);
            if (err == cudaSuccess)
                err = cudaGraphAddMemAllocNode(&node, graph, nullptr, 0, &params);
            if (err == cudaSuccess)
                err = cudaGraphInstantiate(&exec, graph, 0);
            if (err == cudaSuccess)
                err = cudaGraphLaunch(exec, 0);
            if (err == cudaSuccess)
                err = cudaStreamSynchronize(0);
            cudaGetLastError();
            printf("graphalloc %s\n", cudaGetErrorName(err));
        } else if (!strcmp(op, "array")) {
            size_t w = strtoull(argv[++i], nullptr, 10), h = strtoull(argv[++i], nullptr, 10);
            cudaChannelFormatDesc desc = cudaCreateChannelDesc<float4>();
            cudaArray_t array;
            cudaError_t err = cudaMallocArray(&array, &desc, w, h);
            cudaGetLastError();
            printf("array %s\n", cudaGetErrorName(err));
        } else if (!strcmp(op, "freeall")) {
            for (void *p : kept)
                cudaFree(p);
            kept.clear();
            cudaDeviceSynchronize();
            printf("freeall ok\n");
        } else if (!strcmp(op, "meminfo")) {
            size_t free_b = 0, total = 0;
            cudaError_t err = cudaMemGetInfo(&free_b, &total);
            printf("meminfo %zu %zu %s\n", free_b, total, cudaGetErrorName(err));
        } else if (!strcmp(op, "totalmem")) {
            cudaDeviceProp prop;
            cudaGetDeviceProperties(&prop, 0);
            printf("totalmem %zu\n", prop.totalGlobalMem);
        } else if (!strcmp(op, "hold")) {
            printf("holding\n");
            pause();
        } else if (!strcmp(op, "compute")) {
            double seconds = atof(argv[++i]);
            int iters = atoi(argv[++i]);
            float *sink;
            cudaMalloc(&sink, 4096 * sizeof(float));
            fma_loop<<<1056, 256>>>(sink, iters);           // warm-up: module load, clocks
            cudaDeviceSynchronize();
            long n = 0;
            double start = now_us(), end = start + seconds * 1e6;
            while (now_us() < end) {
                fma_loop<<<1056, 256>>>(sink, iters);
                n++;
            }
            cudaError_t err = cudaDeviceSynchronize();
            double elapsed = now_us() - start;
            cudaFree(sink);
            printf("compute %.1f %s\n", n / (elapsed / 1e6), cudaGetErrorName(err));
        } else if (!strcmp(op, "bench")) {
            int n = atoi(argv[++i]);
            std::vector<double> pair, launch;
            for (int k = 0; k < n + 20; k++) {
                void *p;
                double t = now_us();
                cudaMalloc(&p, 1 << 20);
                cudaFree(p);
                if (k >= 20)
                    pair.push_back(now_us() - t);
            }
            empty_kernel<<<1, 32>>>();
            cudaDeviceSynchronize();
            for (int k = 0; k < n; k++) {
                double t = now_us();
                empty_kernel<<<1, 32>>>();
                launch.push_back(now_us() - t);
                if (k % 256 == 255)
                    cudaDeviceSynchronize();            // keep the launch queue short, untimed
            }
            cudaDeviceSynchronize();
            double total = 0;
            for (double t : launch)
                total += t;
            printf("pair_us %.3f %.3f\nlaunch_us %.3f %.3f %.3f\n", percentile(pair, 50), percentile(pair, 10),
                   percentile(launch, 50), percentile(launch, 10), total / n);
        } else if (!strcmp(op, "pairab")) {
            int n = atoi(argv[++i]);
            cudaFree(nullptr);                      // the primary context, current on this thread
            typedef void *(*dlsym_fn)(void *, const char *);
            typedef int (*alloc_fn)(unsigned long long *, size_t);
            typedef int (*free_fn)(unsigned long long);
            void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
            void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
            dlsym_fn glibc_dlsym = (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.34");
            if (!glibc_dlsym)
                glibc_dlsym = (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.2.5");
            if (!cuda || !glibc_dlsym) {
                fprintf(stderr, "share_gpu: pairab: no libcuda.so.1 or glibc dlsym\n");
                return 1;
            }
            alloc_fn alloc[2] = {(alloc_fn)dlsym(cuda, "cuMemAlloc_v2"), (alloc_fn)glibc_dlsym(cuda, "cuMemAlloc_v2")};
            free_fn release[2] = {(free_fn)dlsym(cuda, "cuMemFree_v2"), (free_fn)glibc_dlsym(cuda, "cuMemFree_v2")};
            std::vector<double> t[2], delta;
            for (int k = 0; k < n + 20; k++) {
                double pair[2];
                for (int side = 0; side < 2; side++) {
                    unsigned long long p;
                    double t0 = now_us();
                    if (alloc[side](&p, 1 << 20) || release[side](p)) {
                        fprintf(stderr, "share_gpu: pairab: allocation failed\n");
                        return 1;
                    }
                    pair[side] = now_us() - t0;
                }
                if (k >= 20) {
                    t[0].push_back(pair[0]);
                    t[1].push_back(pair[1]);
                    delta.push_back(pair[0] - pair[1]);
                }
            }
            printf("pairab %.3f %.3f %.3f\n", percentile(t[0], 50), percentile(t[1], 50), percentile(delta, 50));
        } else {
            fprintf(stderr, "share_gpu: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}

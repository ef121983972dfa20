/* Entry points: the launches a compute share throttles (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz forms). Without a compute limit a wrapper
 * adds one branch; with one, it hands the launch to the launch queue (accounting/launches.c). */
#include "accounting/freerun.h"
#include "accounting/graphmem.h"
#include "accounting/launches.h"
#include "accounting/launchlog.h"
#include "base/ground.h"
#include "base/real.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"
#include "scheduling/kernels.h"

/* The fraction of the device a grid occupies: min(1, 2 x blocks / SMs). A grid of half the SMs or more
 * counts as the whole device: persistent GEMM kernels (cuBLAS on Hopper) launch fewer blocks than SMs,
 * one per SM and using all of it, and were undercharged by blocks / SMs (a 25 % share gave 29 %). */
static double grid_factor(struct nvc_device *d, unsigned gx, unsigned gy, unsigned gz)
{
    double blocks = 2.0 * gx * gy * gz;
    return d && d->sm_count && blocks < d->sm_count ? blocks / d->sm_count : 1.0;
}

/* A kernel launch as the queue sees it: the current device looked up once, for the grid's factor and the queue. */
static struct nvc_launch grid_launch(int ptsz, CUstream stream, CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
    struct nvc_device *d = nvc_device_current(NULL);
    return (struct nvc_launch){d, ptsz, stream, grid_factor(d, gx, gy, gz), nvc_kernel_key(f, gx, gy, gz)};
}

/* Whether a compute limit or weight is in force for this launch: the wrappers then still send it straight to
 * the driver where freerun.h lets it, else to the launch queue. */
static int limited(void)
{
    return !nvc_depth && nvc_ready() == NVC_ACTIVE && nvc_compute_limited;
}

/* The throttled path's own host time, logged at exit (launchlog.c, NVC_SHARE_LOG=2; not timed otherwise): each
 * call timed whole and its driver launch within it, so that what a weight costs a host-bound loop shows apart
 * from what the driver costs. */
struct timed {
    nvc_launch_fn fn;
    const void *args;
};

static CUresult call_timed(const void *a)
{
    const struct timed *t = a;
    uint64_t at = nvc_now_ns();
    CUresult rc = t->fn(t->args);
    __atomic_add_fetch(&nvc_launch_tally.driver_ns, nvc_now_ns() - at, __ATOMIC_RELAXED);
    return rc;
}

static CUresult throttled(const struct nvc_launch *l, nvc_launch_fn fn, const void *args)
{
    if (!nvc_logs(2))
        return nvc_launch_throttled(l, fn, args);
    struct timed t = {fn, args};
    uint64_t at = nvc_now_ns();
    CUresult rc = nvc_launch_throttled(l, call_timed, &t);
    __atomic_add_fetch(&nvc_launch_tally.path_ns, nvc_now_ns() - at, __ATOMIC_RELAXED);
    __atomic_add_fetch(&nvc_launch_tally.calls, 1, __ATOMIC_RELAXED);
    return rc;
}

/* ---- the entry points ---- */

struct kernel_args {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **,
                   void **);
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    void **params, **extra;
};

static CUresult call_kernel(const void *a)
{
    const struct kernel_args *k = a;
    return k->fn(k->f, k->gx, k->gy, k->gz, k->bx, k->by, k->bz, k->shmem, k->stream, k->params, k->extra);
}

#define KERNEL_WRAPPER(name, ptsz) \
    NVC_API CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                          unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params, \
                          void **extra) \
    { \
        if (__builtin_expect(!nvc_cuda.name, 0) && (!nvc_load_cuda() || !nvc_cuda.name)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
        if (__builtin_expect(!limited(), 1) || nvc_launches_free(nvc_kernel_key(f, gx, gy, gz))) \
            return nvc_cuda.name(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra); \
        struct kernel_args a = {nvc_cuda.name, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra}; \
        struct nvc_launch l = grid_launch(ptsz, stream, f, gx, gy, gz); \
        return throttled(&l, call_kernel, &a); \
    }
KERNEL_WRAPPER(cuLaunchKernel, 0)
KERNEL_WRAPPER(cuLaunchKernel_ptsz, 1)

struct coop_args {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    void **params;
};

static CUresult call_coop(const void *a)
{
    const struct coop_args *k = a;
    return k->fn(k->f, k->gx, k->gy, k->gz, k->bx, k->by, k->bz, k->shmem, k->stream, k->params);
}

#define COOP_WRAPPER(name, ptsz) \
    NVC_API CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                          unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params) \
    { \
        if (__builtin_expect(!nvc_cuda.name, 0) && (!nvc_load_cuda() || !nvc_cuda.name)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
        if (__builtin_expect(!limited(), 1) || nvc_launches_free(nvc_kernel_key(f, gx, gy, gz))) \
            return nvc_cuda.name(f, gx, gy, gz, bx, by, bz, shmem, stream, params); \
        struct coop_args a = {nvc_cuda.name, f, gx, gy, gz, bx, by, bz, shmem, stream, params}; \
        struct nvc_launch l = grid_launch(ptsz, stream, f, gx, gy, gz); \
        return throttled(&l, call_coop, &a); \
    }
COOP_WRAPPER(cuLaunchCooperativeKernel, 0)
COOP_WRAPPER(cuLaunchCooperativeKernel_ptsz, 1)

struct ex_args {
    CUresult (*fn)(const CUlaunchConfig *, CUfunction, void **, void **);
    const CUlaunchConfig *config;
    CUfunction f;
    void **params, **extra;
};

static CUresult call_ex(const void *a)
{
    const struct ex_args *k = a;
    return k->fn(k->config, k->f, k->params, k->extra);
}

#define EX_WRAPPER(name, ptsz) \
    NVC_API CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) \
    { \
        if (__builtin_expect(!nvc_cuda.name, 0) && (!nvc_load_cuda() || !nvc_cuda.name)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
        if (__builtin_expect(!limited(), 1) || !config || \
            nvc_launches_free(nvc_kernel_key(f, config->gridDimX, config->gridDimY, config->gridDimZ))) \
            return nvc_cuda.name(config, f, params, extra); \
        struct ex_args a = {nvc_cuda.name, config, f, params, extra}; \
        struct nvc_launch l = \
            grid_launch(ptsz, config->hStream, f, config->gridDimX, config->gridDimY, config->gridDimZ); \
        return throttled(&l, call_ex, &a); \
    }
EX_WRAPPER(cuLaunchKernelEx, 0)
EX_WRAPPER(cuLaunchKernelEx_ptsz, 1)

struct graph_args {
    CUresult (*fn)(CUgraphExec, CUstream);
    CUgraphExec exec;
    CUstream stream;
};

static CUresult call_graph(const void *a)
{
    const struct graph_args *g = a;
    return g->fn(g->exec, g->stream);
}

/* A graph is charged as a whole-device launch for its measured duration. Its memory allocation
 * nodes were charged when created; graphmem.c notes which are live now. */
#define GRAPH_WRAPPER(name, ptsz) \
    NVC_API CUresult name(CUgraphExec exec, CUstream stream) \
    { \
        if (__builtin_expect(!nvc_cuda.name, 0) && (!nvc_load_cuda() || !nvc_cuda.name)) \
            return CUDA_ERROR_NOT_INITIALIZED; \
        if (nvc_depth || nvc_ready() != NVC_ACTIVE) \
            return nvc_cuda.name(exec, stream); \
        CUresult rc; \
        if (nvc_compute_limited && !nvc_launches_free(exec)) { \
            struct graph_args a = {nvc_cuda.name, exec, stream}; \
            struct nvc_launch l = {nvc_device_current(NULL), ptsz, stream, 1.0, exec}; \
            rc = throttled(&l, call_graph, &a); \
        } else { \
            rc = nvc_cuda.name(exec, stream); \
        } \
        if (rc == CUDA_SUCCESS && nvc_mem_limited) \
            nvc_graph_launched(exec); \
        return rc; \
    }
GRAPH_WRAPPER(cuGraphLaunch, 0)
GRAPH_WRAPPER(cuGraphLaunch_ptsz, 1)

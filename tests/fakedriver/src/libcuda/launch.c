/* The fake libcuda's modules and kernel launches, queued on the device timeline. Test double only. */
#include "internal.h"

/* ---------------------------------------------------------------- modules */

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
    return fake_create_owned(K_MODULE, 0, 0, (void **)module);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    return fake_create_owned(K_MODULE, 0, 0, (void **)module);
}

/* Every name resolves (there is no image to search); asking twice gives the same handle. */
CUresult cuModuleGetFunction(CUfunction *func, CUmodule module, const char *name)
{
    if (!func || !name || !*name) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *m, *f = NULL;
    CUresult r = fake_find(K_MODULE, (uintptr_t)module, CUDA_ERROR_INVALID_HANDLE, &m);
    for (struct obj *o = fake_all; r == CUDA_SUCCESS && o && !f; o = o->next)
        if (o->kind == K_FUNC && o->parent == m && strcmp(o->name, name) == 0) f = o;
    if (r == CUDA_SUCCESS && !f) {
        f = fake_obj_new(K_FUNC, 0);
        if (!f || !(f->name = strdup(name))) {
            if (f) fake_obj_free(f);
            f = NULL;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            f->parent = m;
            f->ctx = m->ctx;
            f->dev = m->dev;
        }
    }
    if (r == CUDA_SUCCESS) *func = (CUfunction)f;
    unlock();
    return r;
}

CUresult cuModuleUnload(CUmodule module) { return fake_destroy(K_MODULE, module, CUDA_ERROR_INVALID_HANDLE); }

/* ---------------------------------------------------------------- launches */

CUresult fake_check_launch(const struct obj *f, const struct launch *l)
{
    static const unsigned grid_max[3] = {INT_MAX, 65535, 65535}, block_max[3] = {1024, 1024, 64};
    uint64_t threads = 1, blocks = 1;
    for (int i = 0; i < 3; i++) {
        if (l->grid[i] == 0 || l->grid[i] > grid_max[i] || l->block[i] == 0 || l->block[i] > block_max[i])
            return CUDA_ERROR_INVALID_VALUE;
        threads *= l->block[i];
        blocks *= l->grid[i];
    }
    if (threads > 1024) return CUDA_ERROR_INVALID_VALUE;
    if (l->cooperative) { /* every block must be resident at once */
        const struct fake_gpu *g = fake_dev[f->dev].gpu;
        uint64_t per_sm = (uint64_t)fake_threads_per_sm(g->cc_major, g->cc_minor) / threads;
        if (per_sm > 32) per_sm = 32;
        if (blocks > per_sm * g->sm_count) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    return CUDA_SUCCESS;
}

/* Queues `kernels` kernels of function f (NULL for a graph) on a stream, waiting while the device's
 * queue is full. */
CUresult fake_submit(CUfunction func, const struct launch *l, CUstream stream, CUgraphExec exec)
{
    int memory_done = 0;
    for (;;) {
        lock();
        struct fctx *c;
        uint64_t *done;
        uint64_t kernels = 1;
        CUresult r = fake_stream_resolve(stream, &c, &done);
        if (r == CUDA_SUCCESS && func) {
            struct obj *f = fake_handle_find(K_FUNC, func);
            if (!f)
                r = CUDA_ERROR_INVALID_HANDLE;
            else if (f->ctx != c)
                r = CUDA_ERROR_INVALID_HANDLE; /* its module lives in another context */
            else
                r = fake_check_launch(f, l);
        }
        if (r == CUDA_SUCCESS && !func) {
            struct obj *e = fake_handle_find(K_EXEC, exec);
            if (!e)
                r = CUDA_ERROR_INVALID_HANDLE;
            else
                kernels = e->kernels;
            if (r == CUDA_SUCCESS && !memory_done) r = fake_graph_memory_launch(e);
            memory_done = 1;
        }
        uint64_t point, wait = r == CUDA_SUCCESS ? fake_timeline_enqueue(c->dev, kernels, done, &point) : 0;
        if (r == CUDA_SUCCESS && !wait && done) *done = point;
        unlock();
        if (!wait) return r;
        sleep_until(wait);
    }
}

static CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, CUstream stream, int cooperative)
{
    struct launch l = {{gx, gy, gz}, {bx, by, bz}, cooperative};
    return fake_submit(f, &l, stream, NULL);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params,
                        void **extra)
{
    (void)shmem, (void)params, (void)extra;
    return launch_kernel(f, gx, gy, gz, bx, by, bz, stream, 0);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params,
                             void **extra)
{
    (void)shmem, (void)params, (void)extra;
    return launch_kernel(f, gx, gy, gz, bx, by, bz, stream ? stream : STREAM_PER_THREAD, 0);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    (void)params, (void)extra;
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    return launch_kernel(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                         config->blockDimZ, config->hStream, 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    CUlaunchConfig c = *config;
    if (!c.hStream) c.hStream = STREAM_PER_THREAD;
    return cuLaunchKernelEx(&c, f, params, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                   unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params)
{
    (void)shmem, (void)params;
    return launch_kernel(f, gx, gy, gz, bx, by, bz, stream, 1);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                        CUstream stream, void **params)
{
    (void)shmem, (void)params;
    return launch_kernel(f, gx, gy, gz, bx, by, bz, stream ? stream : STREAM_PER_THREAD, 1);
}

/* The fake libcuda's contexts (primary and created, the per-thread current-context stack) and the
 * objects a context owns. Test double only. */
#include "internal.h"

/* ---------------------------------------------------------------- contexts */

static __thread CUcontext t_stack[CTX_STACK_MAX]; /* handles, validated on use */
static __thread int t_depth;

/* Resolves a context handle (a primary context's address, or a created context's object) without
 * dereferencing anything the library did not hand out. */
static struct fctx *ctx_lookup(CUcontext h)
{
    for (int i = 0; i < fake_ndev; i++)
        if ((void *)h == (void *)&fake_dev[i].primary) return &fake_dev[i].primary;
    struct obj *o = fake_handle_find(K_CTX, h);
    return o ? &o->cctx : NULL;
}

/* After the init check, the live context behind a handle. */
static CUresult find_live_ctx(CUcontext h, struct fctx **out)
{
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    *out = ctx_lookup(h);
    return *out && (*out)->live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* The calling thread's current context, or the error the real driver gives for it. */
CUresult fake_current_ctx(struct fctx **out)
{
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct fctx *c = ctx_lookup(t_stack[t_depth - 1]);
    if (!c || !c->live) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

/* Frees what the context owns (allocations, arrays, streams, events, modules and their functions,
 * graph executables), as the real driver does when a context goes away. Pools and VMM handles belong
 * to the device and stay. */
static void ctx_teardown(struct fctx *c)
{
    for (struct obj *o = fake_all, *next; o; o = next) {
        next = o->next;
        if (o->ctx != c) continue;
        if (o->kind == K_MEM || o->kind == K_ARRAY || o->kind == K_MIPMAP) fake_uncharge(o->dev, o->size);
        fake_obj_free(o);
    }
    fake_dev[c->dev].ctx_bytes -= fake_ctx_reserve(&fake_dev[c->dev]);
    c->live = 0;
}

static CUresult ctx_activate(struct fctx *c)
{
    struct fdev *d = &fake_dev[c->dev];
    uint64_t need = fake_ctx_reserve(d), total = d->gpu->memory_total;
    if (d->used + d->ctx_bytes > total || need > total - d->used - d->ctx_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    d->ctx_bytes += need;
    c->live = 1;
    return CUDA_SUCCESS;
}

static int valid_ctx_flags(unsigned flags) { return (flags & ~0xffu) == 0 && (flags & 7u) != 3u; }

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS && fake_dev[dev].primary_refs == 0) r = ctx_activate(&fake_dev[dev].primary);
    if (r == CUDA_SUCCESS) {
        fake_dev[dev].primary_refs++;
        *pctx = (CUcontext)&fake_dev[dev].primary;
    }
    unlock();
    return r;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS && fake_dev[dev].primary_refs == 0) r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS && --fake_dev[dev].primary_refs == 0) ctx_teardown(&fake_dev[dev].primary);
    unlock();
    return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS && fake_dev[dev].primary_refs > 0) {
        ctx_teardown(&fake_dev[dev].primary);
        fake_dev[dev].primary_refs = 0;
    }
    if (r == CUDA_SUCCESS) fake_dev[dev].primary.flags = 0;
    unlock();
    return r;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS) {
        *flags = fake_dev[dev].primary.flags;
        *active = fake_dev[dev].primary_refs > 0;
    }
    unlock();
    return r;
}

static CUresult primary_set_flags(CUdevice dev, unsigned flags, int allow_active)
{
    if (!valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS && !allow_active && fake_dev[dev].primary_refs > 0) r = CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    if (r == CUDA_SUCCESS) fake_dev[dev].primary.flags = flags;
    unlock();
    return r;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags, 0); }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags, 1); }

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (!pctx || !valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS && t_depth == CTX_STACK_MAX) r = CUDA_ERROR_INVALID_VALUE;
    struct obj *o = NULL;
    if (r == CUDA_SUCCESS && !(o = fake_obj_new(K_CTX, 0))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        o->cctx.dev = dev;
        o->cctx.flags = flags;
        o->dev = dev;
        r = ctx_activate(&o->cctx);
        if (r != CUDA_SUCCESS) {
            fake_obj_free(o);
        } else {
            *pctx = (CUcontext)o;
            t_stack[t_depth++] = (CUcontext)o;
        }
    }
    unlock();
    return r;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return cuCtxCreate_v2(pctx, flags, dev); }

/* _v3 adds execution-affinity (SM count) requests and _v4 green-context/CIG parameters; the fake has
 * no SMs to partition, so they are accepted and ignored. */
CUresult cuCtxCreate_v3(CUcontext *pctx, void *affinity_params, int num_params, unsigned int flags, CUdevice dev)
{
    if (num_params < 0 || (num_params > 0 && !affinity_params)) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, void *create_params, unsigned int flags, CUdevice dev)
{
    (void)create_params;
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    lock();
    struct fctx *c;
    CUresult r = find_live_ctx(ctx, &c);
    if (r == CUDA_SUCCESS && c == &fake_dev[c->dev].primary)
        r = CUDA_ERROR_INVALID_CONTEXT; /* primary contexts are released, not destroyed */
    if (r == CUDA_SUCCESS) {
        if (t_depth > 0 && t_stack[t_depth - 1] == ctx) t_depth--;
        ctx_teardown(c);
        fake_obj_free(fake_handle_find(K_CTX, ctx));
    }
    unlock();
    return r;
}

CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    lock();
    CUresult r = fake_check_init();
    struct fctx *c = NULL;
    if (r == CUDA_SUCCESS && ctx && !(c = ctx_lookup(ctx))) r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        if (!c)
            t_depth = t_depth > 0 ? t_depth - 1 : 0;
        else if (t_depth == 0)
            t_stack[t_depth++] = ctx;
        else
            t_stack[t_depth - 1] = ctx;
    }
    unlock();
    return r;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_check_init();
    if (r == CUDA_SUCCESS) *pctx = t_depth ? t_stack[t_depth - 1] : NULL;
    return r;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct fctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) *device = c->dev;
    unlock();
    return r;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    lock();
    struct fctx *c;
    CUresult r = find_live_ctx(ctx, &c);
    if (r == CUDA_SUCCESS && t_depth == CTX_STACK_MAX) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) t_stack[t_depth++] = ctx;
    unlock();
    return r;
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = fake_check_init();
    if (r == CUDA_SUCCESS && t_depth == 0) r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        CUcontext c = t_stack[--t_depth];
        if (pctx) *pctx = c;
    }
    return r;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

/* ---------------------------------------------------------------- objects owned by a context */

/* A new object of kind k owned by context c, charged `bytes` on its device (0 but for arrays). Called
 * under the lock. */
CUresult fake_owned_new(struct fctx *c, enum kind k, uint64_t bytes, struct obj **out)
{
    CUresult r = fake_charge(c->dev, bytes);
    if (r == CUDA_SUCCESS && !(*out = fake_obj_new(k, 0))) {
        fake_uncharge(c->dev, bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        (*out)->ctx = c;
        (*out)->dev = c->dev;
        (*out)->size = bytes;
    }
    return r;
}

/* Creates an object of kind k in the calling thread's current context and hands it out as *handle. */
CUresult fake_create_owned(enum kind k, uint64_t bytes, unsigned flags, void **handle)
{
    lock();
    struct fctx *c;
    struct obj *o;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) r = fake_owned_new(c, k, bytes, &o);
    if (r == CUDA_SUCCESS) {
        o->flags = flags;
        *handle = o;
    }
    unlock();
    return r;
}

static void free_children(const struct obj *parent)
{
    for (struct obj *o = fake_all, *next; o; o = next) {
        next = o->next;
        if (o->parent == parent) fake_obj_free(o);
    }
}

/* Destroys the object of kind k behind handle, with a module's functions or a graph's nodes; an array
 * gives its bytes back. `missing` is the real driver's error for an unknown handle of that kind. */
CUresult fake_destroy(enum kind k, const void *handle, CUresult missing)
{
    lock();
    struct obj *o;
    CUresult r = fake_find(k, (uintptr_t)handle, missing, &o);
    if (r == CUDA_SUCCESS && (k == K_MODULE || k == K_GRAPH)) free_children(o);
    for (struct obj *e = fake_all; r == CUDA_SUCCESS && k == K_GRAPH && e; e = e->next)
        if (e->kind == K_EXEC && e->graph == o) e->graph = NULL; /* an executable outlives its graph */
    if (r == CUDA_SUCCESS && k == K_EXEC && o->graph) o->graph->has_exec = 0;
    if (r == CUDA_SUCCESS && (k == K_ARRAY || k == K_MIPMAP)) fake_uncharge(o->dev, o->size);
    if (r == CUDA_SUCCESS) fake_obj_free(o);
    unlock();
    return r;
}

/* The fake libcuda's streams, stream memory operations and events, on the device timelines of
 * timeline.c. Test double only. */
#include "internal.h"

/* ---------------------------------------------------------------- streams */

/* Resolves a stream to its context; the NULL, legacy and per-thread handles mean the current context.
 * done points at the stream's last work's end (a point of timeline.c), or is NULL for a default stream
 * (they wait for the whole device). */
CUresult fake_stream_resolve(CUstream s, struct fctx **ctx, uint64_t **done)
{
    if (!s || s == STREAM_LEGACY || s == STREAM_PER_THREAD) {
        *done = NULL;
        return fake_current_ctx(ctx);
    }
    CUresult r = fake_check_init();
    if (r != CUDA_SUCCESS) return r;
    struct obj *o = fake_handle_find(K_STREAM, s);
    if (!o) return CUDA_ERROR_INVALID_HANDLE;
    *ctx = o->ctx;
    *done = &o->point;
    return CUDA_SUCCESS;
}

static uint64_t completion_point(const struct fctx *c, const uint64_t *done)
{
    return done ? *done : fake_timeline_tail(c->dev);
}

/* Waits until the work up to point has run, then trims the device's pools. Called with the lock held;
 * returns with it held. */
static void wait_and_trim(int dev, uint64_t point)
{
    fake_timeline_wait(dev, point);
    fake_trim_pools(dev);
}

CUresult cuCtxSynchronize(void)
{
    lock();
    struct fctx *c;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) wait_and_trim(c->dev, fake_timeline_tail(c->dev));
    unlock();
    return r;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    if (!stream || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
    return fake_create_owned(K_STREAM, 0, flags, (void **)stream);
}

CUresult cuStreamDestroy_v2(CUstream stream) { return fake_destroy(K_STREAM, stream, CUDA_ERROR_INVALID_HANDLE); }

CUresult cuStreamDestroy(CUstream stream) { return cuStreamDestroy_v2(stream); }

CUresult cuStreamSynchronize(CUstream stream)
{
    lock();
    struct fctx *c;
    uint64_t *done;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    if (r == CUDA_SUCCESS) wait_and_trim(c->dev, completion_point(c, done));
    unlock();
    return r;
}

CUresult cuStreamSynchronize_ptsz(CUstream stream) { return cuStreamSynchronize(stream); }

CUresult cuStreamQuery(CUstream stream)
{
    lock();
    struct fctx *c;
    uint64_t *done;
    uint64_t at;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    if (r == CUDA_SUCCESS && !fake_timeline_reached(c->dev, completion_point(c, done), &at)) r = CUDA_ERROR_NOT_READY;
    unlock();
    return r;
}

CUresult cuStreamQuery_ptsz(CUstream stream) { return cuStreamQuery(stream); }

/* Stream memory operations on page-locked host memory. A wait on a host word holds the device's
 * private timeline, as a GPU holds the stream (timeline.c), and the caller goes on; where the timeline
 * cannot be held (a shared GPU's, or one held on another word), the calling thread waits until the
 * word satisfies it. FAKE_CUDA_NO_STREAM_MEMOPS=1: the device cannot use them. */
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    lock();
    CUresult r = fake_check_init();
    unlock();
    return r == CUDA_SUCCESS && (!p || !bytesize || (flags & ~0xfu)) ? CUDA_ERROR_INVALID_VALUE : r;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    if (!dptr || !p || flags) return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the host address */
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags)
{
    const char *off = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
    if (off && !strcmp(off, "1")) return CUDA_ERROR_NOT_SUPPORTED;
    lock();
    struct fctx *c;
    uint64_t *done;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    if (r == CUDA_SUCCESS && (!addr || flags)) /* greater-or-equal only */
        r = CUDA_ERROR_INVALID_VALUE;
    int held = r == CUDA_SUCCESS && fake_timeline_hold(c->dev, (const uint32_t *)(uintptr_t)addr, value);
    unlock();
    while (!held && r == CUDA_SUCCESS &&
           (int32_t)(__atomic_load_n((uint32_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE) - value) < 0)
        usleep(20);
    return r;
}

CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags)
{
    return cuStreamWaitValue32_v2(stream, addr, value, flags);
}

/* ---------------------------------------------------------------- events */

CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    if (!event || (flags & ~7u)) return CUDA_ERROR_INVALID_VALUE;
    return fake_create_owned(K_EVENT, 0, flags, (void **)event);
}

CUresult cuEventRecord(CUevent event, CUstream stream)
{
    lock();
    struct fctx *c;
    uint64_t *done;
    struct obj *e;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    if (r == CUDA_SUCCESS) r = fake_find(K_EVENT, (uintptr_t)event, CUDA_ERROR_INVALID_HANDLE, &e);
    if (r == CUDA_SUCCESS) {
        e->dev = c->dev;
        e->point = completion_point(c, done);
        e->recorded_ns = now_ns();
        e->recorded = 1;
    }
    unlock();
    return r;
}

CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) { return cuEventRecord(event, stream); }

CUresult cuEventSynchronize(CUevent event)
{
    lock();
    struct obj *e;
    CUresult r = fake_find(K_EVENT, (uintptr_t)event, CUDA_ERROR_INVALID_HANDLE, &e);
    if (r == CUDA_SUCCESS && e->recorded) wait_and_trim(e->dev, e->point);
    unlock();
    return r;
}

static unsigned long long event_queries; /* fakeCudaEventQueries */

unsigned long long fakeCudaEventQueries(void) { return __atomic_load_n(&event_queries, __ATOMIC_RELAXED); }

CUresult cuEventQuery(CUevent event)
{
    __atomic_add_fetch(&event_queries, 1, __ATOMIC_RELAXED);
    lock();
    struct obj *e;
    uint64_t at;
    CUresult r = fake_find(K_EVENT, (uintptr_t)event, CUDA_ERROR_INVALID_HANDLE, &e);
    if (r == CUDA_SUCCESS && e->recorded && !fake_timeline_reached(e->dev, e->point, &at)) r = CUDA_ERROR_NOT_READY;
    unlock();
    return r;
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_init();
    struct obj *a = fake_handle_find(K_EVENT, start), *b = fake_handle_find(K_EVENT, end);
    if (r == CUDA_SUCCESS &&
        (!a || !b || !a->recorded || !b->recorded || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)))
        r = CUDA_ERROR_INVALID_HANDLE;
    uint64_t at_a, at_b;
    if (r == CUDA_SUCCESS &&
        (!fake_timeline_reached(a->dev, a->point, &at_a) || !fake_timeline_reached(b->dev, b->point, &at_b)))
        r = CUDA_ERROR_NOT_READY;
    if (r == CUDA_SUCCESS) /* each event's time: when it was recorded, or when the work before it ran */
        *ms = (float)((double)((int64_t)(max_u64(at_b, b->recorded_ns) - max_u64(at_a, a->recorded_ns))) / 1e6);
    unlock();
    return r;
}

CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) { return cuEventElapsedTime(ms, start, end); }

CUresult cuEventDestroy_v2(CUevent event) { return fake_destroy(K_EVENT, event, CUDA_ERROR_INVALID_HANDLE); }

CUresult cuEventDestroy(CUevent event) { return cuEventDestroy_v2(event); }

/* Gates: how a capped process keeps its launch queue primed across the off part of a slice. Outside
 * the container's slice, instead of holding the launching thread on the host (which stops its host
 * work too, and starts every slice with an empty queue), each stream it launches on is put behind a
 * GPU-side wait on a word of page-locked host memory mapped for the device (cuStreamWaitValue32,
 * greater-or-equal to the gate's generation), and the thread goes on queueing. A gate thread of the
 * process, started on the first gated launch, starts the next slice once the container's credit
 * allows (nvc_region_slice, as the launching thread would) and writes the new generation, which opens
 * every stream behind the gate at once; a slice another process started opens them too. The gate
 * thread exists whenever a gate is closed (no wait is queued without it), and it opens every gate when
 * the process exits, so no stream is left waiting for a word nobody writes. */
#define _GNU_SOURCE
#include "scheduling/gate.h"
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"

#define FLAGS_BYTES 4096
#define LINE 16          /* words between two devices' flags: one cache line each */
#define GATED_STREAMS 64 /* streams known to wait for the closed generation, per device */
#define OPEN_TIMES 8
#define POLL_MIN_NS 20000ll
#define POLL_MAX_NS 1000000ll /* the gate thread looks again at least every millisecond */
#define STUCK_NS 100000000ull /* older work that never settles: the slice starts anyway */
#define MAX_BEHIND \
    256 /* launches behind a closed gate, each with up to two event records:
                                      * a stream queues about 1000 entries before the driver blocks */

struct gate {
    int state;     /* 0 not yet tried, 1 usable, -1 not usable */
    CUcontext ctx; /* the context flag_dev is mapped in */
    CUdeviceptr flag_dev;
    unsigned percent;
    uint32_t target; /* the generation its streams wait for; the flag holds the last opened */
    int closed;
    int behind; /* launches queued behind it */
    uint64_t undrained_since;
    struct {
        CUstream stream;
        pthread_t thread; /* the per-thread default stream's owner; 0 for other streams */
        uint32_t gen;
    } gated[GATED_STREAMS];
    unsigned next;
    uint64_t opened_at[OPEN_TIMES];
    uint32_t opened_gen[OPEN_TIMES];
};

static struct gate gates[NVC_REGION_DEVICES];
static uint32_t *flags;  /* page-locked, mapped for the devices; our own memory, never freed */
static int flags_state;  /* 0 not yet tried, 1 registered, -1 failed */
static int enabled = -1; /* NVC_SHARE_GATE=0 turns gating off */
static CUresult (*wait_value)(CUstream, CUdeviceptr, unsigned int, unsigned int);
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int thread_state;       /* 0 none, 1 running, -1 could not start */
static int exiting, in_driver; /* the process exits; the gate thread is inside a driver call */
static nvc_gate_drained_fn drained_of;
static uint64_t waits_queued, opened_by_thread, opened_by_launch;

static void unusable(struct gate *g, int dev, const char *why)
{
    g->state = -1;
    nvc_log(2, "compute cap: launches outside the slice wait on the host for region device %d (%s)", dev, why);
}

/* The flag page, registered once for every context (portable) and mapped for the devices. */
static int flags_ready_locked(void)
{
    if (flags_state)
        return flags_state > 0;
    flags_state = -1;
    if (!nvc_cuda.cuMemHostRegister_v2 || !nvc_cuda.cuMemHostGetDevicePointer_v2)
        return 0;
    void *page = mmap(NULL, FLAGS_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 0;
    if (nvc_cuda.cuMemHostRegister_v2(page, FLAGS_BYTES, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) !=
        CUDA_SUCCESS) {
        munmap(page, FLAGS_BYTES);
        return 0;
    }
    flags = page;
    flags_state = 1;
    return 1;
}

/* Whether dev's streams in ctx (the current context) can be gated: the driver has stream memory
 * operations (the _v2 ones of CUDA 12 always; the first ones where the device says so) and the flag
 * is mapped in ctx. */
static int usable_locked(struct gate *g, int dev, CUcontext ctx)
{
    if (g->state > 0 && g->ctx == ctx)
        return 1;
    if (g->state < 0)
        return 0;
    if (enabled < 0) {
        const char *env = getenv("NVC_SHARE_GATE");
        enabled = !env || strcmp(env, "0");
    }
    CUdevice ordinal;
    int v1 = 0;
    if (!nvc_cuda.cuStreamWaitValue32_v2 && nvc_cuda.cuStreamWaitValue32 && nvc_cuda.cuDeviceGetAttribute &&
        nvc_cuda.cuCtxGetDevice && nvc_cuda.cuCtxGetDevice(&ordinal) == CUDA_SUCCESS)
        nvc_cuda.cuDeviceGetAttribute(&v1, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, ordinal);
    wait_value = nvc_cuda.cuStreamWaitValue32_v2 ? nvc_cuda.cuStreamWaitValue32_v2
                 : v1                            ? nvc_cuda.cuStreamWaitValue32
                                                 : NULL;
    CUdeviceptr p = 0;
    if (!enabled)
        unusable(g, dev, "NVC_SHARE_GATE=0");
    else if (!wait_value)
        unusable(g, dev, "the driver has no stream memory operations");
    else if (!flags_ready_locked() || nvc_cuda.cuMemHostGetDevicePointer_v2(&p, &flags[dev * LINE], 0) != CUDA_SUCCESS)
        unusable(g, dev, "no page-locked host memory mapped for the device");
    else {
        g->ctx = ctx;
        g->flag_dev = p;
        g->state = 1;
    }
    return g->state > 0;
}

static void open_locked(int dev, uint64_t now)
{
    struct gate *g = &gates[dev];
    __atomic_store_n(&g->closed, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&flags[dev * LINE], g->target, __ATOMIC_RELEASE);
    g->opened_at[g->target % OPEN_TIMES] = now;
    g->opened_gen[g->target % OPEN_TIMES] = g->target;
}

/* Starts each closed gate's next slice as soon as the container's credit allows, the work launched
 * before the gate closed being done (so that any of it that ran past the last slice is charged). */
static void *gate_main(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&gate_mu);
    for (;;) {
        int64_t step = 0;
        for (int d = 0; d < NVC_REGION_DEVICES && !exiting; d++) {
            struct gate *g = &gates[d];
            if (!g->closed)
                continue;
            CUcontext ctx = g->ctx;
            uint32_t closed = g->target;
            unsigned percent = g->percent;
            in_driver = 1;
            pthread_mutex_unlock(&gate_mu);
            if (nvc_cuda.cuCtxSetCurrent)
                nvc_cuda.cuCtxSetCurrent(ctx);
            int drained = drained_of(d, closed, &percent);
            uint64_t now = nvc_now_ns();
            pthread_mutex_lock(&gate_mu);
            in_driver = 0;
            pthread_cond_broadcast(&gate_cv);
            if (!g->closed)
                continue;
            if (drained || !g->undrained_since)
                g->undrained_since = drained ? 0 : now;
            else if (now - g->undrained_since > STUCK_NS)
                drained = 1;
            int64_t wait = percent < 100 ? nvc_region_slice(d, percent, now, drained) : 0;
            if (!wait) {
                open_locked(d, now);
                opened_by_thread++;
            } else if (!step || wait < step) {
                step = wait;
            }
        }
        if (exiting || !step) {
            pthread_cond_wait(&gate_cv, &gate_mu);
            continue;
        }
        pthread_mutex_unlock(&gate_mu);
        nvc_sleep_ns(step < POLL_MIN_NS ? POLL_MIN_NS : step > POLL_MAX_NS ? POLL_MAX_NS : step);
        pthread_mutex_lock(&gate_mu);
    }
    return NULL;
}

/* At exit (before the driver's own handlers, registered earlier): every gate opens, so that work the
 * exit waits for runs, and the gate thread makes no more driver calls. */
static void open_all_at_exit(void)
{
    pthread_mutex_lock(&gate_mu);
    exiting = 1;
    while (in_driver)
        pthread_cond_wait(&gate_cv, &gate_mu);
    uint64_t now = nvc_now_ns();
    for (int d = 0; d < NVC_REGION_DEVICES; d++)
        if (gates[d].closed)
            open_locked(d, now);
    pthread_mutex_unlock(&gate_mu);
    if (waits_queued)
        nvc_log(2,
                "compute: %llu streams put behind a closed gate; gates opened %llu times by the gate thread, %llu "
                "by a launch",
                (unsigned long long)waits_queued, (unsigned long long)opened_by_thread,
                (unsigned long long)opened_by_launch);
}

static int thread_running_locked(nvc_gate_drained_fn drained)
{
    if (thread_state)
        return thread_state > 0;
    drained_of = drained;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals are the application's threads' business */
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    thread_state = pthread_create(&t, &attr, gate_main, NULL) == 0 && atexit(open_all_at_exit) == 0 ? 1 : -1;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (thread_state < 0)
        nvc_log(1, "compute cap: no gate thread: launches outside the slice wait on the host");
    return thread_state > 0;
}

int nvc_stream_capturing(CUstream stream, int ptsz)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = ptsz && nvc_cuda.cuStreamGetCaptureInfo_v2_ptsz
                      ? nvc_cuda.cuStreamGetCaptureInfo_v2_ptsz(stream, &status, NULL, NULL, NULL, NULL)
                  : nvc_cuda.cuStreamGetCaptureInfo_v2
                      ? nvc_cuda.cuStreamGetCaptureInfo_v2(stream, &status, NULL, NULL, NULL, NULL)
                      : CUDA_ERROR_NOT_SUPPORTED;
    return rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

uint32_t nvc_gate_stream(int dev, unsigned percent, CUcontext ctx, CUstream stream, int ptsz,
                         nvc_gate_drained_fn drained)
{
    if (dev < 0 || dev >= NVC_REGION_DEVICES)
        return 0;
    struct gate *g = &gates[dev];
    /* the per-thread default stream is each thread's own: one handle, many streams */
    CUstream s = ptsz && !stream ? CU_STREAM_PER_THREAD : stream;
    pthread_t owner = s == CU_STREAM_PER_THREAD ? pthread_self() : 0;
    uint32_t gen = 0;
    pthread_mutex_lock(&gate_mu);
    if (exiting || !usable_locked(g, dev, ctx) || !thread_running_locked(drained) ||
        (g->closed && g->behind >= MAX_BEHIND)) {
        pthread_mutex_unlock(&gate_mu);
        return 0;
    }
    if (!g->closed) {
        __atomic_store_n(&g->target, g->target + 1 ? g->target + 1 : 1, __ATOMIC_RELEASE);
        __atomic_store_n(&g->closed, 1, __ATOMIC_RELEASE);
        g->behind = 0;
        g->percent = percent;
        g->undrained_since = 0;
        pthread_cond_broadcast(&gate_cv);
    }
    gen = g->target;
    g->behind++;
    int known = 0;
    for (int i = 0; i < GATED_STREAMS && !known; i++)
        known = g->gated[i].gen == gen && g->gated[i].stream == s && g->gated[i].thread == owner;
    CUdeviceptr flag = g->flag_dev;
    pthread_mutex_unlock(&gate_mu);
    if (known)
        return gen;
    /* No lock held across these calls: a queue the driver finds full blocks them until the GPU takes
     * work, which may need the gate thread. The gate may open meanwhile: the wait then passes at once. */
    if (nvc_stream_capturing(stream, ptsz))
        return 0;
    CUresult rc = wait_value(s, flag, gen, CU_STREAM_WAIT_VALUE_GEQ);
    pthread_mutex_lock(&gate_mu);
    if (rc != CUDA_SUCCESS) {
        nvc_log(1, "compute cap: cuStreamWaitValue32 failed (%d)", (int)rc);
        unusable(g, dev, "a stream could not wait for its gate");
        gen = 0;
    } else {
        g->gated[g->next % GATED_STREAMS].stream = s;
        g->gated[g->next % GATED_STREAMS].thread = owner;
        g->gated[g->next++ % GATED_STREAMS].gen = gen;
        waits_queued++;
    }
    pthread_mutex_unlock(&gate_mu);
    return gen;
}

uint32_t nvc_gate_closed(int dev)
{
    if (dev < 0 || dev >= NVC_REGION_DEVICES || !__atomic_load_n(&gates[dev].closed, __ATOMIC_ACQUIRE))
        return 0;
    return __atomic_load_n(&gates[dev].target, __ATOMIC_ACQUIRE);
}

void nvc_gate_open(int dev)
{
    if (dev < 0 || dev >= NVC_REGION_DEVICES || !__atomic_load_n(&gates[dev].closed, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&gate_mu);
    if (gates[dev].closed) {
        open_locked(dev, nvc_now_ns());
        opened_by_launch++;
    }
    pthread_mutex_unlock(&gate_mu);
}

uint64_t nvc_gate_opened_ns(int dev, uint32_t gen)
{
    if (dev < 0 || dev >= NVC_REGION_DEVICES || !gen)
        return 0;
    pthread_mutex_lock(&gate_mu);
    struct gate *g = &gates[dev];
    uint64_t at = g->opened_gen[gen % OPEN_TIMES] == gen ? g->opened_at[gen % OPEN_TIMES] : 0;
    pthread_mutex_unlock(&gate_mu);
    return at;
}

/* The child has no gate thread and cannot use the parent's CUDA: it starts with every gate unknown. */
void nvc_gate_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&gate_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD) {
        memset(gates, 0, sizeof gates);
        thread_state = exiting = in_driver = 0;
        waits_queued = opened_by_thread = opened_by_launch = 0;
        pthread_cond_init(&gate_cv, NULL);
    }
    pthread_mutex_unlock(&gate_mu);
}

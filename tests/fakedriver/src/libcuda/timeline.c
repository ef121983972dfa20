/* The fake libcuda's device timelines: where queued kernels run, and when the work a stream or event
 * waits for has run. A point on a timeline is what a stream's last work or an event recorded ends at.
 * Test double only.
 *
 * By default each process has its own GPU: one in-order timeline per device, fixed when work is
 * queued, and a point is the time its work ends. With FAKE_CUDA_SHARED_GPU=FILE the processes that
 * name the same file share their GPUs as a real one is shared: each process's work on a device is one
 * in-order queue, and the device serves every process with work queued at once, each at 1/n of its
 * speed (the time-slicing between contexts, taken to its limit), so two busy processes each run at half
 * speed and together keep the GPU as busy as one. A point is then an amount of the process's own queued
 * work; when it was reached is read from the marks the shared simulation leaves (the served work of
 * each process at each moment the sharing changed). The file holds every process's queue of every GPU
 * of the machine, under flock; a process owns its slot by an open-file-description lock on the slot's
 * byte past the end of the data, which the kernel drops when the process dies: a dead process's queue
 * is dropped (its context gone), across PID namespaces too (containers sharing the file).
 *
 * FAKE_CUDA_CONCURRENT_STREAMS=1 (private timelines only): a created stream's kernels run beside the
 * other streams' instead of after them, each stream in order behind its own last work, as a GPU with
 * SMs to spare runs them (an MPS client's side streams): their work then completes out of launch order.
 * The default streams still wait for all of it.
 *
 * A stream wait on a host word (cuStreamWaitValue32) holds a private timeline as a GPU holds the
 * stream: work queued behind it is counted, not placed, and its points say how far into the held
 * work they are (HELD, the hold's epoch, the offset); the first call that sees the word written places
 * the held work from then on, and every point of that hold reads from where it was placed. */
#include "internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>

#define SLOTS 32  /* processes sharing one GPU */
#define MARKS 512 /* moments kept per process: events older than these read the oldest */

struct mark {
    uint64_t at, served;
};

struct slot {
    uint32_t taken;
    uint32_t next;           /* the ring's next mark */
    uint64_t queued, served; /* ns of work, since the slot was taken */
    struct mark mark[MARKS];
};

struct shared_gpu {
    uint64_t at; /* simulated up to this time */
    struct slot slot[SLOTS];
};

#define DATA_BYTES ((off_t)(FAKE_GPU_COUNT * sizeof(struct shared_gpu)))

static const char *shared_path;
static int concurrent;               /* FAKE_CUDA_CONCURRENT_STREAMS=1 */
static struct shared_gpu *shared;    /* FAKE_GPU_COUNT of them, mapped; NULL: each process its own GPU */
static int shared_fd = -1;           /* this process's own open file description (locks are per description) */
static int own_slot[FAKE_GPU_COUNT]; /* per machine GPU; -1 none yet */
static pid_t own_pid;

#define HELD (1ull << 63)
#define EPOCH_SHIFT 44 /* offsets up to 2^44 ns (almost 5 hours) */
#define EPOCHS (sizeof(((struct fdev *)0)->released_at) / sizeof(uint64_t))
#define HOLD_POLL_NS 20000ull

static uint64_t held_point(const struct fdev *d, uint64_t offset)
{
    return HELD | (uint64_t)(d->hold_epoch & 0xffff) << EPOCH_SHIFT | offset;
}

/* Places the held work once the word reaches the value (greater-or-equal, wrapping). */
static void see_hold(struct fdev *d, uint64_t now)
{
    if (!d->hold_word || (int32_t)(__atomic_load_n(d->hold_word, __ATOMIC_ACQUIRE) - d->hold_value) < 0) return;
    uint64_t start = max_u64(now, d->busy_until_ns);
    d->busy_until_ns = start + d->held_ns;
    d->released_at[d->hold_epoch % EPOCHS] = start;
    d->hold_epoch++;
    d->hold_word = NULL;
    d->held_ns = 0;
}

int fake_timeline_hold(int dev, const uint32_t *word, uint32_t value)
{
    struct fdev *d = &fake_dev[dev];
    if (shared) return 0;
    see_hold(d, now_ns());
    if (d->hold_word) return d->hold_word == word && d->hold_value == value; /* another hold: the caller waits */
    if ((int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) >= 0) return 1;
    d->hold_word = word;
    d->hold_value = value;
    return 1;
}

static int reopen(void)
{
    int fd = open(shared_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    if (shared_fd >= 0) close(shared_fd); /* a forked child's copy of its parent's: its locks stay the parent's */
    shared_fd = fd;
    own_pid = getpid();
    for (int i = 0; i < FAKE_GPU_COUNT; i++) own_slot[i] = -1;
    return 0;
}

CUresult fake_timeline_init(void)
{
    const char *streams = getenv("FAKE_CUDA_CONCURRENT_STREAMS");
    concurrent = streams && !strcmp(streams, "1");
    shared_path = getenv("FAKE_CUDA_SHARED_GPU");
    if (!shared_path || !*shared_path) return CUDA_SUCCESS;
    void *map = reopen() < 0 || ftruncate(shared_fd, DATA_BYTES) < 0
                    ? MAP_FAILED
                    : mmap(NULL, (size_t)DATA_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "fake libcuda: FAKE_CUDA_SHARED_GPU=%s: %s\n", shared_path, strerror(errno));
        return CUDA_ERROR_UNKNOWN;
    }
    shared = map;
    return CUDA_SUCCESS;
}

/* The slot's ownership: its lock byte, taken (F_WRLCK), released, or asked about (F_OFD_GETLK). */
static int slot_lock(int index, int i, int cmd, short type)
{
    struct flock l = {.l_type = type, .l_whence = SEEK_SET, .l_start = DATA_BYTES + index * SLOTS + i, .l_len = 1};
    if (fcntl(shared_fd, cmd, &l) < 0) return -1;
    return cmd == F_OFD_GETLK ? l.l_type != F_UNLCK : 0;
}

static int busy(const struct slot *s) { return s->taken && s->queued > s->served; }

static void mark(struct slot *s, uint64_t at)
{
    s->mark[s->next % MARKS] = (struct mark){at, s->served};
    s->next++;
}

/* The served work of every process with work, at a moment its speed changes (a queue started or
 * emptied): between two of its marks a process was served at one speed. */
static void mark_busy(struct shared_gpu *g, uint64_t at)
{
    for (int i = 0; i < SLOTS; i++)
        if (busy(&g->slot[i])) mark(&g->slot[i], at);
}

/* The busy slots of g (into busy_slots, their count returned) and the least work one of them has left. */
static int busy_slots(const struct shared_gpu *g, int *busy_slots, uint64_t *least)
{
    int k = 0;
    *least = UINT64_MAX;
    for (int i = 0; i < SLOTS; i++)
        if (busy(&g->slot[i])) {
            busy_slots[k++] = i;
            if (g->slot[i].queued - g->slot[i].served < *least) *least = g->slot[i].queued - g->slot[i].served;
        }
    return k;
}

/* When a process with `left` work queued has it served, or the first queue empties (the speeds
 * change), whichever comes first at the present speeds. */
static uint64_t next_change(const struct shared_gpu *g, uint64_t left)
{
    int slots[SLOTS];
    uint64_t least, n = (uint64_t)busy_slots(g, slots, &least);
    return g->at + (left < least ? left : least) * (n ? n : 1);
}

/* Serves the queued work of every process from the simulation's time to now, each process with work
 * at 1/n of the device's speed while n have work. */
static void advance(struct shared_gpu *g, uint64_t now)
{
    while (g->at < now) {
        int served[SLOTS];
        uint64_t least, n = (uint64_t)busy_slots(g, served, &least);
        int k = (int)n;
        if (!n) {
            g->at = now;
            break;
        }
        int empties = now - g->at >= least * n; /* a queue empties by now: the others' speeds change */
        uint64_t each = empties ? least : (now - g->at) / n;
        g->at += empties ? least * n : now - g->at;
        for (int j = 0; j < k; j++) {
            g->slot[served[j]].served += each;
            if (empties) mark(&g->slot[served[j]], g->at);
        }
    }
}

/* This process's slot of a machine GPU: at first use, one whose lock nobody holds (free, or its
 * process dead). */
static struct slot *own(int index)
{
    struct shared_gpu *g = &shared[index];
    for (int i = 0; i < SLOTS && own_slot[index] < 0; i++)
        if (slot_lock(index, i, F_OFD_SETLK, F_WRLCK) == 0) {
            memset(&g->slot[i], 0, sizeof(g->slot[i]));
            g->slot[i].taken = 1;
            own_slot[index] = i;
        }
    if (own_slot[index] < 0) {
        fprintf(stderr, "fake libcuda: more than %d processes share GPU %d\n", SLOTS, index);
        abort();
    }
    return &g->slot[own_slot[index]];
}

/* Drops the queues of processes that died (their lock gone), as their contexts are. */
static void drop_dead(struct shared_gpu *g, int index, uint64_t now)
{
    for (int i = 0; i < SLOTS; i++)
        if (i != own_slot[index] && g->slot[i].taken && slot_lock(index, i, F_OFD_GETLK, F_WRLCK) == 0) {
            g->slot[i].taken = 0;
            mark_busy(g, now);
        }
}

/* Takes the file's lock and brings the device's simulation to now (read under the lock: the
 * simulation never goes back), returned in *now. */
static struct slot *enter(int dev, uint64_t *now)
{
    if (getpid() != own_pid && reopen() < 0) {
        fprintf(stderr, "fake libcuda: FAKE_CUDA_SHARED_GPU=%s: %s\n", shared_path, strerror(errno));
        abort();
    }
    while (flock(shared_fd, LOCK_EX) < 0 && errno == EINTR)
        ;
    int index = fake_dev[dev].index;
    *now = max_u64(now_ns(), shared[index].at);
    advance(&shared[index], *now);
    drop_dead(&shared[index], index, *now);
    return own(index);
}

static void leave(void) { flock(shared_fd, LOCK_UN); }

uint64_t fake_timeline_enqueue(int dev, uint64_t kernels, const uint64_t *after, uint64_t *point)
{
    struct fdev *d = &fake_dev[dev];
    uint64_t now = now_ns(), work = kernels * fake_kernel_ns, backlog = MAX_QUEUED_KERNELS * fake_kernel_ns;
    if (!shared) {
        see_hold(d, now);
        uint64_t ahead = max_u64(now, d->busy_until_ns) - now + d->held_ns;
        if (fake_kernel_ns && ahead > backlog) return d->hold_word ? now + HOLD_POLL_NS : d->busy_until_ns - backlog;
        if (d->hold_word) {
            d->held_ns += work;
            *point = held_point(d, d->held_ns);
        } else if (concurrent && after && !(*after & HELD)) {
            *point = max_u64(now, *after) + work;
            d->busy_until_ns = max_u64(d->busy_until_ns, *point);
        } else {
            d->busy_until_ns = max_u64(now, d->busy_until_ns) + work;
            *point = d->busy_until_ns;
        }
    } else {
        struct slot *s = enter(dev, &now);
        uint64_t behind = s->queued - s->served;
        if (fake_kernel_ns && behind > backlog) {
            leave();
            return now + behind - backlog;
        }
        if (!behind) { /* it starts now, and the others slow down */
            mark_busy(&shared[d->index], now);
            mark(s, now);
        }
        s->queued += work;
        *point = s->queued;
        leave();
    }
    d->busy_ns += work;
    d->launches += kernels;
    return 0;
}

uint64_t fake_timeline_tail(int dev)
{
    struct fdev *d = &fake_dev[dev];
    if (!shared) {
        see_hold(d, now_ns());
        return d->hold_word ? held_point(d, d->held_ns) : d->busy_until_ns;
    }
    uint64_t now, tail = enter(dev, &now)->queued;
    leave();
    return tail;
}

/* When the slot's served work reached point: between the mark before it and the one after (or the
 * simulation's present), at the speed it had there; the oldest mark kept where point is older. */
static uint64_t reached_at(const struct shared_gpu *g, const struct slot *s, uint64_t point)
{
    struct mark after = {g->at, s->served};
    uint32_t kept = s->next < MARKS ? s->next : MARKS;
    for (uint32_t k = 1; k <= kept; k++) {
        const struct mark *m = &s->mark[(s->next - k) % MARKS];
        if (m->served < point) return m->at + (after.at - m->at) * (point - m->served) / (after.served - m->served);
        after = *m;
    }
    return after.at;
}

int fake_timeline_reached(int dev, uint64_t point, uint64_t *at)
{
    uint64_t now = now_ns();
    if (!shared) {
        struct fdev *d = &fake_dev[dev];
        see_hold(d, now);
        if (point & HELD) {
            uint32_t epoch = (uint32_t)(point >> EPOCH_SHIFT) & 0xffff;
            if (d->hold_word && epoch == (d->hold_epoch & 0xffff)) {
                *at = now + HOLD_POLL_NS; /* still held: look again then */
                return 0;
            }
            point = d->released_at[epoch % EPOCHS] + (point & ((1ull << EPOCH_SHIFT) - 1));
        }
        *at = point;
        return point <= now;
    }
    struct slot *s = enter(dev, &now);
    int done = s->served >= point;
    if (done) *at = reached_at(&shared[fake_dev[dev].index], s, point);
    leave();
    return done;
}

void fake_timeline_wait(int dev, uint64_t point)
{
    uint64_t until;
    while (!fake_timeline_reached(dev, point, &until)) {
        if (shared) { /* private: the point is the time */
            uint64_t now;
            struct slot *s = enter(dev, &now);
            until = next_change(&shared[fake_dev[dev].index], point > s->served ? point - s->served : 0);
            leave();
        }
        unlock();
        sleep_until(until);
        lock();
    }
}

/* A process that exits leaves nothing queued on the shared GPUs: the others speed up. */
__attribute__((destructor)) static void release(void)
{
    if (!shared || own_pid != getpid()) return;
    flock(shared_fd, LOCK_EX);
    for (int i = 0; i < FAKE_GPU_COUNT; i++)
        if (own_slot[i] >= 0) {
            uint64_t now = max_u64(now_ns(), shared[i].at); /* as in enter: the simulation never goes back */
            advance(&shared[i], now);
            shared[i].slot[own_slot[i]].taken = 0;
            mark_busy(&shared[i], now);
            slot_lock(i, own_slot[i], F_OFD_SETLK, F_UNLCK);
        }
    flock(shared_fd, LOCK_UN);
}

/* The per-container shared region: one memory budget across the container's processes.
 * Locking is an OFD lock on one byte of the file (the kernel drops it when the holder dies, so a
 * SIGKILL cannot wedge it) plus a process mutex (OFD locks do not exclude threads sharing the fd).
 * Every out-of-memory decision first reaps slots whose process is gone. */
#define _GNU_SOURCE
#include "base/region.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/config.h"
#include "base/ground.h"

_Static_assert(sizeof(struct nvc_region_device) == 128, "device entry layout");
_Static_assert(sizeof(struct nvc_region_slot) == 160, "slot layout");
_Static_assert(offsetof(struct nvc_region, dev) == 128, "header layout");

static struct nvc_region *region;
static int region_fd = -1;
static char region_path[300];
static pthread_mutex_t region_mu = PTHREAD_MUTEX_INITIALIZER;
static int my_slot = -1;
static pid_t my_pid;
static uint64_t my_start, my_pidns;
static int lock_warned;

static void lock_region(void)
{
    pthread_mutex_lock(&region_mu);
    if (region_fd < 0)
        return;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = NVC_REGION_LOCK_BYTE, .l_len = 1};
    while (fcntl(region_fd, F_OFD_SETLKW, &fl) == -1) {
        if (errno == EINTR)
            continue;
        if (!lock_warned++)
            nvc_log(0, "cannot lock %s (%s): cross-process accounting is unsynchronised", region_path, strerror(errno));
        break;
    }
}

static void unlock_region(void)
{
    if (region_fd >= 0) {
        struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = NVC_REGION_LOCK_BYTE, .l_len = 1};
        fcntl(region_fd, F_OFD_SETLK, &fl);
    }
    pthread_mutex_unlock(&region_mu);
}

/* Start time (field 22) of /proc/<pid>/stat; 0 when the process is gone or a zombie. */
static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return 0;
    p += 2;
    if (*p == 'Z' || *p == 'X') /* exited: the driver has already released its memory */
        return 0;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

static uint64_t pidns_inode(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static int slot_alive(const struct nvc_region_slot *s)
{
    if (s->pid <= 0)
        return 0;
    if (s->pidns_ino != my_pidns)
        return 1; /* cannot judge another pid namespace: keep its charge */
    if (kill(s->pid, 0) == -1 && errno == ESRCH)
        return 0;
    uint64_t start = proc_start_time(s->pid);
    return start != 0 && start == s->start_time;
}

static int live_slots(void)
{
    int live = 0;
    for (uint32_t i = 0; i < region->slot_hwm && i < NVC_REGION_SLOTS; i++)
        live += slot_alive(&region->slots[i]);
    return live;
}

static void reap(void)
{
    for (uint32_t i = 0; i < region->slot_hwm && i < NVC_REGION_SLOTS; i++) {
        struct nvc_region_slot *s = &region->slots[i];
        if (s->pid && (int)i != my_slot && !slot_alive(s))
            memset(s, 0, sizeof *s);
    }
}

static void init_header(const struct nvc_config *cfg)
{
    memset(region, 0, sizeof *region);
    memcpy(region->magic, NVC_REGION_MAGIC, 8);
    region->version = NVC_REGION_VERSION;
    region->size = sizeof *region;
    region->config_hash = cfg->hash;
    region->nslots = NVC_REGION_SLOTS;
    region->memory_default = cfg->memory_default;
    region->compute_default = cfg->compute_default;
}

static void relimit(const struct nvc_config *cfg)
{
    region->config_hash = cfg->hash;
    region->memory_default = cfg->memory_default;
    region->compute_default = cfg->compute_default;
}

void nvc_region_relimit(const struct nvc_config *cfg)
{
    if (!region)
        return;
    lock_region();
    relimit(cfg);
    unlock_region();
}

static void use_private_region(const struct nvc_config *cfg)
{
    void *mem = mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return;
    region = mem;
    init_header(cfg);
}

/* The hook's region (NVC_FIXED_DIR) is made by nvc-py at its final size in a tmpfs of fixed size:
 * it is never created, resized or anything but a regular file here. Elsewhere (plain LD_PRELOAD
 * use, our own 0700 directory) the first process creates and sizes it. */
static int region_fixed;

static int open_file(void)
{
    if (region_fixed)
        return open(region_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    return open(region_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
}

/* A hook region that is missing, not a regular file or not of the right size was changed by
 * someone in the container: keep this process's limits in a region of its own, and say so. */
static void refuse_fixed_region(const char *why)
{
    nvc_log(0, "shared region %s %s: this process enforces its own limits alone (not shared with the others)",
            region_path, why);
    if (region_fd >= 0)
        close(region_fd);
    region_fd = -1;
}

int nvc_region_open(const char *dir, const struct nvc_config *cfg)
{
    my_pid = getpid();
    my_start = proc_start_time(my_pid);
    my_pidns = pidns_inode();
    snprintf(region_path, sizeof region_path, "%s/region", dir);
    region_fixed = !strcmp(dir, NVC_FIXED_DIR);
    region_fd = open_file();
    struct stat st;
    if (region_fixed) {
        char why[96];
        if (region_fd < 0)
            snprintf(why, sizeof why, "cannot be opened (%s)", strerror(errno));
        else if (fstat(region_fd, &st) || !S_ISREG(st.st_mode))
            snprintf(why, sizeof why, "is not a regular file");
        else if (st.st_size != (off_t)sizeof *region)
            snprintf(why, sizeof why, "is %lld bytes, not %zu", (long long)st.st_size, sizeof *region);
        else
            why[0] = '\0';
        if (why[0]) {
            refuse_fixed_region(why);
            use_private_region(cfg);
            return region ? 0 : -1;
        }
    }
    if (region_fd < 0) {
        nvc_log(0, "cannot open shared region %s (%s)", region_path, strerror(errno));
        return -1;
    }
    lock_region();
    if (fstat(region_fd, &st) || (st.st_size < (off_t)sizeof *region && ftruncate(region_fd, sizeof *region))) {
        nvc_log(0, "cannot size shared region %s (%s)", region_path, strerror(errno));
        unlock_region();
        close(region_fd);
        region_fd = -1;
        return -1;
    }
    void *mem = mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
    if (mem == MAP_FAILED) {
        nvc_log(0, "cannot map shared region %s (%s)", region_path, strerror(errno));
        unlock_region();
        close(region_fd);
        region_fd = -1;
        return -1;
    }
    region = mem;
    int layout_ok = !memcmp(region->magic, NVC_REGION_MAGIC, 8) && region->version == NVC_REGION_VERSION &&
                    region->size == sizeof *region;
    if (!layout_ok) {
        if (region->magic[0])
            nvc_log(1, "re-initialising shared region %s (unknown layout or version)", region_path);
        init_header(cfg);
    } else if (region->config_hash != cfg->hash) {
        if (region_fixed) {
            /* The hook's limits file is the container's only authority: a region written under other
             * limits means they were changed since (`nvc-py share set`), and the processes already
             * running take the change within NVC_RELOAD_NS. */
            relimit(cfg);
        } else if (live_slots() == 0) {
            nvc_log(1, "re-initialising stale shared region %s (written under other limits)", region_path);
            init_header(cfg);
        } else {
            /* Live processes run under other limits: do not corrupt their accounting, and do not
             * drop ours either - keep a per-process budget with this process's limits. */
            nvc_log(0,
                    "shared region %s is in use under other limits; this process enforces its own limits "
                    "alone (not shared with the others)",
                    region_path);
            unlock_region();
            munmap(mem, sizeof *region);
            close(region_fd);
            region_fd = -1;
            use_private_region(cfg);
            return region ? 0 : -1;
        }
    }
    unlock_region();
    return 0;
}

int nvc_region_device(const char *key, uint64_t memory_limit, unsigned compute, unsigned sm_count)
{
    if (!region)
        return -1;
    int found = -1;
    lock_region();
    for (uint32_t i = 0; i < region->ndevices && i < NVC_REGION_DEVICES; i++)
        if (!strncmp(region->dev[i].key, key, sizeof region->dev[i].key))
            found = (int)i;
    if (found < 0 && region->ndevices < NVC_REGION_DEVICES) {
        found = (int)region->ndevices;
        snprintf(region->dev[found].key, sizeof region->dev[found].key, "%s", key);
        region->ndevices++;
    }
    if (found >= 0) {
        region->dev[found].memory_limit = memory_limit;
        region->dev[found].compute = compute;
        if (sm_count)
            region->dev[found].sm_count = sm_count;
    }
    unlock_region();
    return found;
}

/* This process's slot, registered on first use (and again in a forked child). Caller holds the lock. */
static struct nvc_region_slot *own_slot_locked(void)
{
    if (my_slot >= 0)
        return &region->slots[my_slot];
    reap();
    for (int i = 0; i < NVC_REGION_SLOTS; i++) {
        struct nvc_region_slot *s = &region->slots[i];
        if (s->pid == 0) {
            memset(s, 0, sizeof *s);
            s->start_time = my_start;
            s->pidns_ino = my_pidns;
            s->pid = my_pid;
            my_slot = i;
            if ((uint32_t)i >= region->slot_hwm)
                region->slot_hwm = (uint32_t)i + 1;
            return s;
        }
    }
    return NULL;
}

static uint64_t total_all(int d)
{
    uint64_t total = 0;
    uint32_t hwm = __atomic_load_n(&region->slot_hwm, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < hwm && i < NVC_REGION_SLOTS; i++)
        total += __atomic_load_n(&region->slots[i].used[d], __ATOMIC_SEQ_CST);
    return total;
}

/* Charge first, then look at the container's total: with sequentially consistent adds and loads,
 * of two processes racing for the last bytes at least one sees the other's charge, so the limit
 * holds without a lock on the allocation path (a file lock costs microseconds per allocation).
 * Only an over-limit total takes the lock, reaps dead processes and decides. A free slot's used[]
 * is 0 (a slot is zeroed when freed or reaped), so summing every slot below the hwm is exact. */
int nvc_region_charge(int d, uint64_t bytes, uint64_t limit)
{
    if (!region || d < 0 || d >= NVC_REGION_DEVICES)
        return 0;
    if (my_slot < 0) {
        lock_region();
        struct nvc_region_slot *s = own_slot_locked();
        unlock_region();
        if (!s) {
            nvc_fail("no free process slot in the shared region");
            return 0;
        }
    }
    uint64_t *used = &region->slots[my_slot].used[d];
    uint64_t mine = __atomic_add_fetch(used, bytes, __ATOMIC_SEQ_CST);
    if (!limit || (mine >= bytes && total_all(d) <= limit))
        return 0;
    lock_region();
    reap();
    uint64_t total = total_all(d);
    int rc = (mine < bytes || total > limit) ? -1 : 0;
    unlock_region();
    if (rc)
        nvc_region_uncharge(d, bytes);
    return rc;
}

void nvc_region_uncharge(int d, uint64_t bytes)
{
    if (!region || d < 0 || d >= NVC_REGION_DEVICES || my_slot < 0)
        return;
    uint64_t *used = &region->slots[my_slot].used[d];
    uint64_t cur = __atomic_load_n(used, __ATOMIC_RELAXED), next;
    do
        next = cur > bytes ? cur - bytes : 0; /* never wraps, whatever happened before */
    while (!__atomic_compare_exchange_n(used, &cur, next, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

uint64_t nvc_region_used(int d)
{
    if (!region || d < 0 || d >= NVC_REGION_DEVICES)
        return 0;
    lock_region();
    reap();
    uint64_t total = total_all(d);
    unlock_region();
    return total;
}

#define SLICE_PERIOD_NS 50000000ull /* a cap of p % is a slice of p % of every 50 ms */
#define SLICE_POLL_NS 100000ll      /* while its own last work drains */

uint64_t nvc_region_slice_length(unsigned percent)
{
    return SLICE_PERIOD_NS * percent / 100;
}

/* Credit accrues at percent x wall time and is never banked above 0: idling saves nothing. */
static int64_t refill(struct nvc_region_device *dev, unsigned percent, uint64_t now)
{
    uint64_t last = __atomic_load_n(&dev->refill_ns, __ATOMIC_ACQUIRE);
    if (now > last && __atomic_compare_exchange_n(&dev->refill_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        int64_t cur = __atomic_add_fetch(&dev->credit_ns, (int64_t)((now - last) * percent / 100), __ATOMIC_ACQ_REL);
        while (cur > 0 && !__atomic_compare_exchange_n(&dev->credit_ns, &cur, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            ;
    }
    return __atomic_load_n(&dev->credit_ns, __ATOMIC_ACQUIRE);
}

uint64_t nvc_region_slices_started, nvc_region_overrun_charged_ns; /* by this process */

/* Work that ran past the slice's end (the queue a slice's last launches left) is charged once,
 * whichever of the container's processes notices it. */
static void charge_overrun(struct nvc_region_device *dev, uint64_t end, uint64_t now)
{
    uint64_t done = __atomic_load_n(&dev->done_ns, __ATOMIC_ACQUIRE);
    uint64_t charged = __atomic_load_n(&dev->charged_until_ns, __ATOMIC_ACQUIRE);
    done = done < now ? done : now;
    uint64_t from = charged > end ? charged : end;
    if (done > from &&
        __atomic_compare_exchange_n(&dev->charged_until_ns, &charged, done, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        __atomic_sub_fetch(&dev->credit_ns, (int64_t)(done - from), __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&nvc_region_overrun_charged_ns, done - from, __ATOMIC_RELAXED);
    }
}

/* The cap is a share of wall time, not of measured kernel time: the container's processes launch
 * freely during a slice of percent x 50 ms, then wait until the credit the slice (and any work that
 * ran past its end) cost has accrued again. Charging wall time makes the share one of the workload's
 * own throughput, whatever it does between kernels (a training step's host work, small grids, clocks
 * that rise while the GPU idles), as kernel-time accounting could not. */
int64_t nvc_region_slice(int d, unsigned percent, uint64_t now, int drained)
{
    if (!region || d < 0 || d >= NVC_REGION_DEVICES)
        return 0;
    struct nvc_region_device *dev = &region->dev[d];
    uint64_t end = __atomic_load_n(&dev->slice_end_ns, __ATOMIC_ACQUIRE);
    if (now < end)
        return 0;
    if (!drained)
        return SLICE_POLL_NS;
    charge_overrun(dev, end, now);
    int64_t credit = refill(dev, percent, now);
    if (credit < 0)
        return -credit * 100 / (int64_t)percent;
    if (__atomic_compare_exchange_n(&dev->slice_end_ns, &end, now + nvc_region_slice_length(percent), 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        __atomic_sub_fetch(&dev->credit_ns, (int64_t)nvc_region_slice_length(percent), __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&nvc_region_slices_started, 1, __ATOMIC_RELAXED);
    }
    return 0; /* its slice, or one another process started just now */
}

static void atomic_max(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        ;
}

uint64_t nvc_region_slice_end(int d)
{
    return region && d >= 0 && d < NVC_REGION_DEVICES ? __atomic_load_n(&region->dev[d].slice_end_ns, __ATOMIC_ACQUIRE)
                                                      : 0;
}

void nvc_region_done(int d, uint64_t done)
{
    if (region && d >= 0 && d < NVC_REGION_DEVICES)
        atomic_max(&region->dev[d].done_ns, done);
}

void nvc_region_slice_extend(int d, uint64_t until)
{
    if (region && d >= 0 && d < NVC_REGION_DEVICES)
        atomic_max(&region->dev[d].slice_end_ns, until);
}

void nvc_region_slice_off(int d, uint64_t now)
{
    if (region && d >= 0 && d < NVC_REGION_DEVICES)
        atomic_max(&region->dev[d].charged_until_ns, now);
}

void nvc_region_account_launch(int d, uint64_t busy_ns, uint64_t waited_ns)
{
    if (!region || d < 0 || d >= NVC_REGION_DEVICES)
        return;
    __atomic_add_fetch(&region->dev[d].busy_ns, busy_ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&region->dev[d].throttled_ns, waited_ns, __ATOMIC_RELAXED);
    if (!busy_ns)
        __atomic_add_fetch(&region->dev[d].launches, 1, __ATOMIC_RELAXED);
}

/* The child shares the parent's open file description, so it would share its OFD lock too:
 * give it its own. It owns no allocation yet; it registers its own slot on first charge. */
void nvc_region_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&region_mu);
        return;
    }
    pthread_mutex_unlock(&region_mu);
    if (phase == NVC_FORK_PARENT)
        return;
    my_slot = -1;
    nvc_region_slices_started = nvc_region_overrun_charged_ns = 0;
    my_pid = getpid();
    my_start = proc_start_time(my_pid);
    if (region_fd >= 0) {
        close(region_fd);
        region_fd = open_file();
    }
}

__attribute__((destructor)) static void release_slot(void)
{
    if (!region || my_slot < 0 || my_pid != getpid())
        return;
    lock_region();
    memset(&region->slots[my_slot], 0, sizeof region->slots[my_slot]);
    my_slot = -1;
    unlock_region();
}

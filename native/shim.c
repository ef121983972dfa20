/* Initialisation, logging, the per-process device table and fork handling of libnvc-share.
 * The shim never installs signal handlers and never starts threads: it only runs inside the
 * application's own CUDA/NVML calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "launch.h"
#include "memory.h"
#include "region.h"
#include "sched.h"

extern char **environ;

struct nvc_config nvc_cfg;
int nvc_mem_limited, nvc_compute_limited;
__thread int nvc_depth __attribute__((tls_model("initial-exec")));

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static volatile enum nvc_state state = NVC_OFF;
static int log_level = 1;
static int failed;

uint64_t nvc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void nvc_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "nvc-share[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, buf, (size_t)n);   /* one write: lines do not interleave */
    (void)ignored;
}

void nvc_fail(const char *what)
{
    if (__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
        return;
    if (nvc_cfg.on_error == NVC_FAIL_CLOSED) {
        nvc_log(0, "FAILED: %s; on_error=fail-closed: CUDA calls now fail", what);
        state = NVC_CLOSED;
    } else {
        nvc_log(0, "FAILED: %s; GPU sharing limits are NOT enforced in this process (pass-through)", what);
        state = NVC_OFF;
    }
}

static int read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t n;
    while (got < size - 1 && (n = read(fd, buf + got, size - 1 - got)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return got == size - 1 ? -2 : 0;
}

void nvc_devices_fork(enum nvc_fork_phase phase);

/* Lock order: devices, memory (pools, records, graphs), launches, scheduler, region. */
static void fork_all(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        nvc_devices_fork(phase);
        nvc_memory_fork(phase);
        nvc_launch_fork(phase);
        nvc_sched_fork(phase);
        nvc_region_fork(phase);
    } else {
        nvc_region_fork(phase);
        nvc_sched_fork(phase);
        nvc_launch_fork(phase);
        nvc_memory_fork(phase);
        nvc_devices_fork(phase);
    }
}
static void atfork_prepare(void) { fork_all(NVC_FORK_PREPARE); }
static void atfork_parent(void) { fork_all(NVC_FORK_PARENT); }
static void atfork_child(void) { fork_all(NVC_FORK_CHILD); }

static void do_init(void)
{
    const char *lvl = getenv("NVC_SHARE_LOG");
    if (lvl && *lvl >= '0' && *lvl <= '3' && !lvl[1])
        log_level = *lvl - '0';
    char err[256] = "", text[16384];
    const char *limits = NVC_FIXED_DIR "/limits";
    int rc = read_file(limits, text, sizeof text);
    if (rc == 0 || errno != ENOENT) {
        /* Inside a container: the hook's read-only file is the only authority; the environment,
         * which the workload controls, is ignored (NVC_SHARE_DIR and the kill switch included). */
        if (rc != 0) {
            snprintf(err, sizeof err, "cannot read %s (%s)", limits, rc == -2 ? "too large" : strerror(errno));
        } else if (nvc_parse_limits_text(text, &nvc_cfg, err, sizeof err) == 0) {
            snprintf(nvc_cfg.dir, sizeof nvc_cfg.dir, "%s", NVC_FIXED_DIR);
            err[0] = '\0';
        }
    } else {
        const char *dir = getenv("NVC_SHARE_DIR");
        char fallback[64];
        if (!dir || !*dir) {
            snprintf(fallback, sizeof fallback, "/tmp/nvc-share-%u", (unsigned)getuid());
            dir = fallback;
        }
        char path[300];
        snprintf(path, sizeof path, "%s/limits", dir);
        rc = read_file(path, text, sizeof text);
        if (rc == 0) {
            if (nvc_parse_limits_text(text, &nvc_cfg, err, sizeof err) == 0)
                err[0] = '\0';
        } else {
            nvc_config_from_env(environ, &nvc_cfg, err, sizeof err);
        }
        snprintf(nvc_cfg.dir, sizeof nvc_cfg.dir, "%s", dir);
    }
    if (err[0]) {
        nvc_fail(err);
        return;
    }
    nvc_config_finish(&nvc_cfg);
    if (!nvc_cfg.enabled) {
        nvc_log(2, "disabled by configuration");
        return;
    }
    nvc_mem_limited = nvc_cfg.memory_default != 0;
    nvc_compute_limited = nvc_cfg.compute_default < 100;
    for (int i = 0; i < nvc_cfg.nrules; i++) {
        nvc_mem_limited |= nvc_cfg.rules[i].memory != 0;
        nvc_compute_limited |= (nvc_cfg.rules[i].compute != 0 && nvc_cfg.rules[i].compute < 100) ||
                               nvc_cfg.rules[i].weight != 0;
    }
    nvc_compute_limited |= nvc_cfg.weight_default != 0;
    if (!nvc_mem_limited && !nvc_compute_limited) {
        nvc_log(2, "no limits configured");
        return;
    }
    if (!nvc_cfg.from_file)
        mkdir(nvc_cfg.dir, 0700);    /* plain LD_PRELOAD use; an existing directory is fine */
    if (nvc_region_open(nvc_cfg.dir, &nvc_cfg)) {
        nvc_fail("cannot use the shared region");
        return;
    }
    if (nvc_compute_limited)
        nvc_sched_open(&nvc_cfg);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    state = NVC_ACTIVE;
    nvc_log(2, "active: memory default %llu, compute default %u%%, %d device rules, region %s/region",
            (unsigned long long)nvc_cfg.memory_default, nvc_cfg.compute_default, nvc_cfg.nrules, nvc_cfg.dir);
}

enum nvc_state nvc_init(void)
{
    pthread_once(&init_once, do_init);
    return state;
}

/* ---- devices ---- */

#define MAX_ORDINALS 64
static struct nvc_device by_ordinal[MAX_ORDINALS];
static struct {
    char key[NVC_UUID_KEY_LEN];
    struct nvc_device dev;
} by_key[MAX_ORDINALS];
static int nkeys;
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;

/* NVML index of a UUID, for index-keyed limits: the index space is NVML's (what nvidia-smi shows),
 * not the CUDA ordinal, which CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER renumber. */
static int nvml_index_of(const char *key)
{
    if (!nvc_config_has_index_rules(&nvc_cfg))
        return -1;
    static int nvml_ready = -1;
    if (nvml_ready < 0)
        nvml_ready = nvc_load_nvml() && nvc_nvml.nvmlInit_v2 && nvc_nvml.nvmlInit_v2() == NVML_SUCCESS &&
                     nvc_nvml.nvmlDeviceGetHandleByUUID && nvc_nvml.nvmlDeviceGetIndex;
    if (!nvml_ready) {
        nvc_log(0, "NVML unavailable: per-index limits cannot be matched to device %s", key);
        return -1;
    }
    static const char *const prefixes[] = {"GPU-", "MIG-"};
    for (int i = 0; i < 2; i++) {
        char uuid[64];
        nvmlDevice_t h;
        unsigned index;
        snprintf(uuid, sizeof uuid, "%s%s", prefixes[i], key);
        if (nvc_nvml.nvmlDeviceGetHandleByUUID(uuid, &h) == NVML_SUCCESS &&
            nvc_nvml.nvmlDeviceGetIndex(h, &index) == NVML_SUCCESS)
            return (int)index;
    }
    return -1;
}

static void fill_device(struct nvc_device *d, const char *key, int nvml_index, unsigned sm_count)
{
    d->memory_limit = nvc_config_memory(&nvc_cfg, key, nvml_index);
    d->compute = nvc_config_compute(&nvc_cfg, key, nvml_index);
    d->weight = nvc_config_weight(&nvc_cfg, key, nvml_index);
    d->sm_count = sm_count ? sm_count : 1;
    if (d->compute < 100 || d->weight)
        d->sched = nvc_sched_device(key, d->weight ? d->weight : 1, d->compute);
    d->region_index = nvc_region_device(key, d->memory_limit, d->compute, sm_count);
    if (d->region_index < 0) {
        nvc_fail("shared region device table is full");
        return;
    }
    __atomic_store_n(&d->valid, 1, __ATOMIC_RELEASE);
}

struct nvc_device *nvc_device_by_ordinal(CUdevice ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORDINALS)
        return NULL;
    struct nvc_device *d = &by_ordinal[ordinal];
    if (__atomic_load_n(&d->valid, __ATOMIC_ACQUIRE))
        return d;
    pthread_mutex_lock(&dev_mu);
    if (!d->valid) {
        CUuuid u;
        CUresult rc = nvc_cuda.cuDeviceGetUuid_v2 ? nvc_cuda.cuDeviceGetUuid_v2(&u, ordinal)
                                                  : nvc_cuda.cuDeviceGetUuid ? nvc_cuda.cuDeviceGetUuid(&u, ordinal)
                                                                             : CUDA_ERROR_NOT_FOUND;
        if (rc == CUDA_SUCCESS) {
            const unsigned char *b = (const unsigned char *)u.bytes;
            char key[NVC_UUID_KEY_LEN];
            snprintf(key, sizeof key, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                     b[14], b[15]);
            int sm = 0;
            if (nvc_cuda.cuDeviceGetAttribute)
                nvc_cuda.cuDeviceGetAttribute(&sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal);
            d->ordinal = ordinal;
            fill_device(d, key, nvml_index_of(key), sm > 0 ? (unsigned)sm : 0);
        }
    }
    pthread_mutex_unlock(&dev_mu);
    return d->valid ? d : NULL;
}

struct nvc_device *nvc_device_current(CUdevice *ordinal)
{
    CUdevice dev;
    if (!nvc_cuda.cuCtxGetDevice || nvc_cuda.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return NULL;
    if (ordinal)
        *ordinal = dev;
    return nvc_device_by_ordinal(dev);
}

struct nvc_device *nvc_device_by_key(const char *key, int nvml_index)
{
    struct nvc_device *found = NULL;
    pthread_mutex_lock(&dev_mu);
    for (int i = 0; i < nkeys && !found; i++)
        if (!strcmp(by_key[i].key, key))
            found = &by_key[i].dev;
    if (!found && nkeys < MAX_ORDINALS) {
        snprintf(by_key[nkeys].key, sizeof by_key[nkeys].key, "%s", key);
        by_key[nkeys].dev.ordinal = -1;
        fill_device(&by_key[nkeys].dev, key, nvml_index, 0);
        if (by_key[nkeys].dev.valid)
            found = &by_key[nkeys++].dev;
    }
    pthread_mutex_unlock(&dev_mu);
    return found;
}

void nvc_devices_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE)
        pthread_mutex_lock(&dev_mu);
    else
        pthread_mutex_unlock(&dev_mu);
}

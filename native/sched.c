/* Weighted, work-conserving sharing of a GPU between containers. Each container (tenant) publishes,
 * per device, its weighted GPU time and whether it is busy in a scheduler file of its own; it reads
 * every other tenant's file (read-only) and asks schedpolicy.c before each launch whether it holds the
 * turn. Inside a container the hook mounts its own file read-write at NVC_SCHED_SELF and the directory
 * of all tenants' files read-only at NVC_SCHED_PEERS, so a tenant can only ever write its own entry;
 * with plain LD_PRELOAD use, NVC_SHARE_SCHED_DIR names that directory and NVC_SHARE_TENANT the file.
 * Layout: nvc/sharesched.py reads it for `nvc-py share status`. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "sched.h"
#include "schedpolicy.h"

#define NVC_SCHED_SELF "/var/run/nvc-share-sched"
#define NVC_SCHED_PEERS "/var/run/nvc-share-peers"
#define SCHED_MAGIC "NVCSCHD\0"
#define SCHED_VERSION 1u
#define SCHED_FILE_SIZE 4096
#define MAX_PEERS 64
#define RESCAN_NS 100000000ull        /* new and gone tenants are noticed within 100 ms */
#define SHARE_WINDOW_NS 500000000ull  /* the measured share shown by `share status` */

struct nvc_sched_entry {              /* 128 bytes */
    char key[40];                     /* device UUID key, as in the region */
    uint64_t vtime;                   /* GPU ns x NVC_WEIGHT_UNIT / weight, cumulative */
    uint64_t seen_ns;
    uint64_t busy_until_ns;
    uint64_t busy_ns;                 /* measured GPU time, cumulative */
    uint64_t window_start_ns, window_busy_ns;
    uint32_t weight, cap, running, capped, share_permille, pad;
    uint64_t reserved[2];
};

struct sched_file {                   /* SCHED_FILE_SIZE bytes */
    char magic[8];
    uint32_t version, ndevices;
    uint64_t reserved[6];             /* header: 64 bytes */
    struct nvc_sched_entry dev[NVC_MAX_DEVICES];
};

_Static_assert(sizeof(struct nvc_sched_entry) == 128, "scheduler entry layout");
_Static_assert(sizeof(struct sched_file) <= SCHED_FILE_SIZE, "scheduler file layout");

static struct sched_file *own;
static uint64_t own_id;
static char peers_dir[256];
static struct {
    struct sched_file *map;
    uint64_t id;
    int seen;
} peers[MAX_PEERS];
static int npeers;
static uint64_t last_scan;
static pthread_mutex_t sched_mu = PTHREAD_MUTEX_INITIALIZER;

static struct sched_file *map_file(int fd, int writable)
{
    void *p = mmap(NULL, SCHED_FILE_SIZE, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int nvc_sched_open(const struct nvc_config *cfg)
{
    char self[600];
    int fixed = cfg->from_file && !strcmp(cfg->dir, NVC_FIXED_DIR);
    if (fixed) {
        snprintf(self, sizeof self, "%s", NVC_SCHED_SELF);
        snprintf(peers_dir, sizeof peers_dir, "%s", NVC_SCHED_PEERS);
    } else {
        const char *dir = getenv("NVC_SHARE_SCHED_DIR"), *tenant = getenv("NVC_SHARE_TENANT");
        if (!dir || !*dir)
            return 0;
        char name[256];
        snprintf(name, sizeof name, "%s", tenant && *tenant ? tenant : cfg->dir);
        for (char *c = name; *c; c++)
            if (*c == '/')
                *c = '_';
        snprintf(peers_dir, sizeof peers_dir, "%s", dir);
        snprintf(self, sizeof self, "%s/%s", dir, name);
    }
    /* The hook's file exists at its final size; plain use creates its own. Never resized here. */
    int fd = open(self, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (fixed ? O_NONBLOCK : O_CREAT), 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) ||
        (st.st_size != SCHED_FILE_SIZE && (fixed || st.st_size || ftruncate(fd, SCHED_FILE_SIZE)))) {
        if (fd >= 0 || fixed)
            nvc_log(1, "no usable scheduler file %s: weights do not apply, caps do", self);
        if (fd >= 0)
            close(fd);
        return 0;
    }
    own = map_file(fd, 1);
    close(fd);
    if (!own)
        return 0;
    own_id = (uint64_t)st.st_ino;
    if (memcmp(own->magic, SCHED_MAGIC, 8) || own->version != SCHED_VERSION) {
        memset(own, 0, sizeof *own);
        memcpy(own->magic, SCHED_MAGIC, 8);
        own->version = SCHED_VERSION;
    }
    return 1;
}

struct nvc_sched_entry *nvc_sched_device(const char *key, unsigned weight, unsigned cap)
{
    if (!own)
        return NULL;
    pthread_mutex_lock(&sched_mu);
    struct nvc_sched_entry *e = NULL;
    uint32_t n = own->ndevices < NVC_MAX_DEVICES ? own->ndevices : NVC_MAX_DEVICES;
    for (uint32_t i = 0; i < n && !e; i++)
        if (!strncmp(own->dev[i].key, key, sizeof own->dev[i].key))
            e = &own->dev[i];
    if (!e && n < NVC_MAX_DEVICES) {
        e = &own->dev[n];
        snprintf(e->key, sizeof e->key, "%s", key);
        __atomic_store_n(&own->ndevices, n + 1, __ATOMIC_RELEASE);
    }
    if (e) {
        e->weight = weight;
        e->cap = cap;
    }
    pthread_mutex_unlock(&sched_mu);
    return e;
}

/* Maps the files of tenants that appeared since the last scan; forgets those that went. */
static void rescan_locked(uint64_t now)
{
    if (now - last_scan < RESCAN_NS && last_scan)
        return;
    last_scan = now;
    DIR *dir = opendir(peers_dir);
    if (!dir)
        return;
    for (int i = 0; i < npeers; i++)
        peers[i].seen = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (de->d_name[0] == '.' || de->d_ino == own_id)
            continue;
        int known = 0;
        for (int i = 0; i < npeers && !known; i++)
            if (peers[i].id == de->d_ino)
                known = peers[i].seen = 1;
        if (known || npeers == MAX_PEERS)
            continue;
        int fd = openat(dirfd(dir), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st;
        if (fd < 0)
            continue;
        if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size == SCHED_FILE_SIZE && st.st_ino != own_id) {
            struct sched_file *map = map_file(fd, 0);
            if (map) {
                peers[npeers].map = map;
                peers[npeers].id = (uint64_t)st.st_ino;
                peers[npeers++].seen = 1;
            }
        }
        close(fd);
    }
    closedir(dir);
    for (int i = 0; i < npeers;)
        if (!peers[i].seen) {
            munmap(peers[i].map, SCHED_FILE_SIZE);
            peers[i] = peers[--npeers];
        } else {
            i++;
        }
}

static void view_of(const struct nvc_sched_entry *e, uint64_t id, struct nvc_sched_view *v)
{
    v->id = id;
    v->vtime = __atomic_load_n(&e->vtime, __ATOMIC_ACQUIRE);
    v->seen_ns = __atomic_load_n(&e->seen_ns, __ATOMIC_ACQUIRE);
    v->busy_until_ns = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
    v->running = __atomic_load_n(&e->running, __ATOMIC_ACQUIRE);
    v->capped = __atomic_load_n(&e->capped, __ATOMIC_ACQUIRE);
    v->weight = __atomic_load_n(&e->weight, __ATOMIC_ACQUIRE);
}

/* The other tenants' views of this device. Caller holds sched_mu. */
static int others_locked(const char *key, struct nvc_sched_view *out)
{
    int n = 0;
    for (int i = 0; i < npeers; i++) {
        const struct sched_file *f = peers[i].map;
        if (memcmp(f->magic, SCHED_MAGIC, 8))
            continue;
        uint32_t nd = __atomic_load_n(&f->ndevices, __ATOMIC_ACQUIRE);
        for (uint32_t d = 0; d < nd && d < NVC_MAX_DEVICES; d++)
            if (!strncmp(f->dev[d].key, key, sizeof f->dev[d].key))
                view_of(&f->dev[d], peers[i].id, &out[n++]);
    }
    return n;
}

int nvc_sched_ready(struct nvc_sched_entry *e, uint64_t now, int capped)
{
    if (capped) {                     /* held back by its own cap: nobody should wait for it */
        __atomic_store_n(&e->capped, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&e->running, 0, __ATOMIC_RELEASE);
        return 0;
    }
    struct nvc_sched_view others[MAX_PEERS], self;
    pthread_mutex_lock(&sched_mu);
    rescan_locked(now);
    int n = others_locked(e->key, others);
    pthread_mutex_unlock(&sched_mu);
    view_of(e, own_id, &self);
    if (!nvc_sched_active(&self, now)) {  /* busy again after idling: no banked time */
        uint64_t from = nvc_sched_catch_up(self.vtime, others, n, now);
        __atomic_compare_exchange_n(&e->vtime, &self.vtime, from, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
        self.vtime = __atomic_load_n(&e->vtime, __ATOMIC_ACQUIRE);
    }
    __atomic_store_n(&e->capped, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
    self.capped = 0;
    self.seen_ns = now;
    int run = nvc_sched_decide(&self, others, n, now) == NVC_SCHED_RUN;
    __atomic_store_n(&e->running, (uint32_t)run, __ATOMIC_RELEASE);
    return run;
}

static uint64_t weighted(int64_t ns, uint32_t weight)
{
    return (uint64_t)ns * NVC_WEIGHT_UNIT / (weight ? weight : 1);
}

void nvc_sched_launched(struct nvc_sched_entry *e, uint64_t now, int64_t estimate_ns)
{
    if (estimate_ns > 0)
        __atomic_add_fetch(&e->vtime, weighted(estimate_ns, e->weight), __ATOMIC_ACQ_REL);
    uint64_t until = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
    uint64_t next = (until > now ? until : now) + (uint64_t)(estimate_ns > 0 ? estimate_ns : 0);
    __atomic_store_n(&e->busy_until_ns, next, __ATOMIC_RELEASE);
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
}

void nvc_sched_drained(struct nvc_sched_entry *e, uint64_t now)
{
    __atomic_store_n(&e->busy_until_ns, now, __ATOMIC_RELEASE);
}

void nvc_sched_measured(struct nvc_sched_entry *e, uint64_t now, int64_t correction_ns, uint64_t cost_ns)
{
    if (correction_ns > 0) {
        __atomic_add_fetch(&e->vtime, weighted(correction_ns, e->weight), __ATOMIC_ACQ_REL);
    } else if (correction_ns < 0) {
        uint64_t back = weighted(-correction_ns, e->weight), cur = __atomic_load_n(&e->vtime, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&e->vtime, &cur, cur > back ? cur - back : 0, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
            ;
    }
    __atomic_add_fetch(&e->busy_ns, cost_ns, __ATOMIC_RELAXED);
    /* the share over the last window, for `share status` (approximate across processes) */
    uint64_t start = __atomic_load_n(&e->window_start_ns, __ATOMIC_ACQUIRE);
    uint64_t busy = __atomic_add_fetch(&e->window_busy_ns, cost_ns, __ATOMIC_ACQ_REL);
    if (!start) {
        __atomic_store_n(&e->window_start_ns, now, __ATOMIC_RELEASE);
    } else if (now - start >= SHARE_WINDOW_NS &&
               __atomic_compare_exchange_n(&e->window_start_ns, &start, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        uint64_t permille = busy * 1000 / (now - start);
        __atomic_store_n(&e->share_permille, (uint32_t)(permille > 1000 ? 1000 : permille), __ATOMIC_RELEASE);
        __atomic_sub_fetch(&e->window_busy_ns, busy, __ATOMIC_ACQ_REL);
    }
}

/* The mappings survive fork (MAP_SHARED): the child is the same tenant. */
void nvc_sched_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE)
        pthread_mutex_lock(&sched_mu);
    else
        pthread_mutex_unlock(&sched_mu);
}

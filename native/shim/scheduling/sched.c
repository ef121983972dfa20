/* Weighted, work-conserving sharing of a GPU between containers. Each container (tenant) publishes,
 * per device, its share of the GPU and whether it has work queued in a scheduler file of its own; it
 * reads every other tenant's file (read-only) and asks schedpolicy.c before each launch whether it may
 * launch now. Inside a container the hook mounts its own file read-write at NVC_SCHED_SELF and the
 * directory of all tenants' files read-only at NVC_SCHED_PEERS, so a tenant can only ever write its own
 * entry; with plain LD_PRELOAD use, NVC_SHARE_SCHED_DIR names that directory and NVC_SHARE_TENANT the
 * file. Another tenant's file is never mapped: it can truncate, grow, rewrite or replace it at any
 * moment, and a mapping of it would fault (SIGBUS) here. It is read with pread, one entry at a time,
 * and what it says is untrusted (sanitised; its weight is the one the hook granted it, in GRANTED_DIR).
 * Layout: nvc/share/sched.py reads it for `nvc-py share status`. */
#define _GNU_SOURCE
#include "scheduling/sched.h"
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "base/config.h"
#include "base/ground.h"
#include "scheduling/schedpolicy.h"

#define NVC_SCHED_SELF "/var/run/nvc-share-sched"
#define NVC_SCHED_PEERS "/var/run/nvc-share-peers"
#define GRANTED_DIR ".granted" /* <tenant>: the limits the hook granted it (nvc/share/limits.py) */
#define GRANTED_MAX 8192
#define SCHED_MAGIC "NVCSCHD\0"
#define SCHED_VERSION 2u /* 1: turns by weighted GPU time (not read: its tenants ignore ours too) */
#define SCHED_FILE_SIZE 4096
#define MAX_PEERS 64
#define RESCAN_NS 20000000ull /* new and gone tenants, and their new devices, are noticed within 20 ms */
#define REREAD_NS \
    50000ull /* others' entries are read at most every 50 us (a waiting tenant asks
                                       * every 100 us: a launch-bound loop must not pay a pread per peer
                                       * per launch) */

struct nvc_sched_entry { /* 128 bytes */
    char key[40];        /* device UUID key, as in the region */
    uint64_t charged_ns; /* its part of the GPU's time (nvc_sched_charge), cumulative */
    uint64_t seen_ns;
    uint64_t busy_until_ns;
    uint64_t busy_ns;                   /* measured GPU time, cumulative */
    uint64_t share_acc_ns, share_at_ns; /* the decaying account its share is read from, and its time */
    uint32_t weight, cap, running, capped, share_permille, klass; /* klass: enum nvc_class */
    uint32_t mps, backlog_permille;                               /* schedpolicy.h's MPS clients */
    uint32_t steady_permille, duty; /* schedpolicy.h's duty cycle: the steadiness, the duty found (%, 0: none) */
};

struct sched_file { /* SCHED_FILE_SIZE bytes */
    char magic[8];
    uint32_t version, ndevices;
    uint64_t reserved[6]; /* header: 64 bytes */
    struct nvc_sched_entry dev[NVC_MAX_DEVICES];
};

_Static_assert(sizeof(struct nvc_sched_entry) == 128, "scheduler entry layout");
_Static_assert(sizeof(struct sched_file) <= SCHED_FILE_SIZE, "scheduler file layout");

static struct sched_file *own; /* mapped: only this tenant's own processes can break it */
static uint64_t own_id;
static char peers_dir[256];
static struct peer {
    int fd; /* its file, read with pread only */
    uint64_t ino, dev;
    int seen;
    struct nvc_config *granted;       /* the limits the hook granted it; NULL: none (plain use) */
    struct stat granted_st;           /* that file as last read (`nvc-py share set` replaces it) */
    int8_t at[NVC_MAX_DEVICES];       /* its entry for our device d; -1: none */
    uint16_t weight[NVC_MAX_DEVICES]; /* its granted weight there; 0: take its claim */
    uint8_t klass[NVC_MAX_DEVICES];   /* its granted latency class there (with granted limits) */
} peers[MAX_PEERS];
static int npeers;
static uint64_t last_scan;
static struct {  /* the others' views of our device d, as last read */
    uint64_t at; /* when; 0: to be read */
    int n;
    struct nvc_sched_view v[MAX_PEERS];
} read_of[NVC_MAX_DEVICES];
static struct nvc_sched_history sharing_of[NVC_MAX_DEVICES]; /* this process's view: under sched_mu */
static uint32_t peers_active[NVC_MAX_DEVICES];  /* others active or with work queued on our device d, last look */
static uint32_t yields[NVC_MAX_DEVICES];        /* a latency-critical other on our device d, and we are not one */
static uint32_t urgent_others[NVC_MAX_DEVICES]; /* latency-critical others on our device d, last look */
static uint64_t looked_at[NVC_MAX_DEVICES];     /* when others_of last looked at our device d */
static struct sched_file scan_buf;              /* a peer's file as read at a rescan (under sched_mu) */
static char granted_buf[GRANTED_MAX + 1];
static pthread_mutex_t sched_mu = PTHREAD_MUTEX_INITIALIZER;

int nvc_sched_open(const struct nvc_config *cfg)
{
    if (own)
        return 1; /* opened before the limits changed */
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
    void *map = mmap(NULL, SCHED_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return 0;
    own = map;
    own_id = (uint64_t)st.st_ino;
    if (memcmp(own->magic, SCHED_MAGIC, 8) || own->version != SCHED_VERSION) {
        memset(own, 0, sizeof *own);
        memcpy(own->magic, SCHED_MAGIC, 8);
        own->version = SCHED_VERSION;
    }
    return 1;
}

struct nvc_sched_entry *nvc_sched_device(const char *key, unsigned weight, unsigned cap, unsigned klass, int mps)
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
        __atomic_store_n(&e->weight, weight, __ATOMIC_RELEASE);
        __atomic_store_n(&e->cap, cap, __ATOMIC_RELEASE);
        __atomic_store_n(&e->klass, klass, __ATOMIC_RELEASE);
        __atomic_store_n(&e->mps, (uint32_t)(mps != 0), __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&sched_mu);
    return e;
}

/* Whether a key read from a peer's file (40 bytes, maybe not terminated) is exactly `key`. */
static int same_key(const char peer_key[40], const char *key)
{
    size_t n = strnlen(key, 40);
    return n < 40 && !memcmp(peer_key, key, n + 1);
}

/* The hook's file and directory are trusted when no one else can write them: root's and not writable by
 * group or others, or on a read-only mount (a container's view of them; its user namespace may show
 * root's files as another owner's). */
static int trusted(int fd, struct stat *st)
{
    struct statvfs vfs;
    return !fstat(fd, st) && !(st->st_mode & 022) &&
           (st->st_uid == 0 || (!fstatvfs(fd, &vfs) && (vfs.f_flag & ST_RDONLY)));
}

/* The limits the hook granted tenant `name` (GRANTED_DIR/name, the limits file's grammar); NULL when
 * there are none (plain LD_PRELOAD use) or they cannot be trusted. Caller holds sched_mu. */
static struct nvc_config *read_granted(int dir_fd, const char *name)
{
    struct stat st;
    struct nvc_config *cfg = NULL;
    int gd = openat(dir_fd, GRANTED_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = gd < 0 || !trusted(gd, &st) ? -1 : openat(gd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && trusted(fd, &st) && S_ISREG(st.st_mode) && st.st_size <= GRANTED_MAX) {
        ssize_t got = pread(fd, granted_buf, GRANTED_MAX, 0);
        char err[160];
        cfg = got >= 0 ? malloc(sizeof *cfg) : NULL;
        if (cfg) {
            granted_buf[got] = '\0';
            if (nvc_parse_limits_text(granted_buf, cfg, err, sizeof err)) {
                nvc_log(1, "%s/%s/%s: %s: its claimed weight is used", peers_dir, GRANTED_DIR, name, err);
                free(cfg);
                cfg = NULL;
            }
        }
    }
    if (fd >= 0)
        close(fd);
    if (gd >= 0)
        close(gd);
    return cfg;
}

/* The peer's granted limits, read again when their file was replaced or rewritten since. Caller holds sched_mu. */
static void refresh_granted(struct peer *p, int dir_fd, const char *name)
{
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", GRANTED_DIR, name);
    if (fstatat(dir_fd, path, &st, AT_SYMLINK_NOFOLLOW))
        memset(&st, 0, sizeof st);
    const struct stat *was = &p->granted_st;
    if (p->granted && st.st_ino == was->st_ino && st.st_size == was->st_size &&
        st.st_mtim.tv_sec == was->st_mtim.tv_sec && st.st_mtim.tv_nsec == was->st_mtim.tv_nsec)
        return;
    free(p->granted);
    p->granted = read_granted(dir_fd, name);
    p->granted_st = st;
}

/* Whether the peer's descriptor still names its file (the application may have closed it and opened
 * something else under that number). */
static int still_ours(const struct peer *p)
{
    struct stat st;
    return !fstat(p->fd, &st) && (uint64_t)st.st_ino == p->ino && (uint64_t)st.st_dev == p->dev;
}

static void forget(struct peer *p)
{
    if (still_ours(p))
        close(p->fd);
    free(p->granted);
}

/* Where the peer's entry of each of our devices is, from its whole file; its granted weight there.
 * Caller holds sched_mu. */
static void locate(struct peer *p)
{
    memset(p->at, -1, sizeof p->at);
    ssize_t got = pread(p->fd, &scan_buf, sizeof scan_buf, 0);
    if (got < (ssize_t)offsetof(struct sched_file, dev) || memcmp(scan_buf.magic, SCHED_MAGIC, 8) ||
        scan_buf.version != SCHED_VERSION)
        return;
    size_t nd = ((size_t)got - offsetof(struct sched_file, dev)) / sizeof scan_buf.dev[0];
    if (scan_buf.ndevices < nd)
        nd = scan_buf.ndevices;
    uint32_t mine = __atomic_load_n(&own->ndevices, __ATOMIC_ACQUIRE);
    for (uint32_t d = 0; d < mine && d < NVC_MAX_DEVICES; d++) {
        for (size_t j = 0; j < nd && p->at[d] < 0; j++)
            if (same_key(scan_buf.dev[j].key, own->dev[d].key))
                p->at[d] = (int8_t)j;
        p->weight[d] = p->granted ? (uint16_t)nvc_config_weight_bound(p->granted, own->dev[d].key) : 0;
        if (p->granted && !p->weight[d])
            p->weight[d] = 1; /* granted a cap and no weight: it counts with weight 1 */
        p->klass[d] = p->granted ? (uint8_t)nvc_config_class_bound(p->granted, own->dev[d].key) : 0;
    }
}

/* Opens the files of tenants that appeared since the last scan and forgets those that went (or were
 * replaced: a new inode is a new peer); finds every peer's entries again. */
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
        if (de->d_name[0] == '.' || de->d_ino == own_id || (de->d_type != DT_REG && de->d_type != DT_UNKNOWN))
            continue;
        struct peer *p = NULL;
        for (int i = 0; i < npeers && !p; i++)
            if (peers[i].ino == de->d_ino && still_ours(&peers[i]))
                p = &peers[i];
        if (!p && npeers < MAX_PEERS) {
            int fd = openat(dirfd(dir), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            struct stat st;
            if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_ino != own_id) {
                p = &peers[npeers++];
                *p = (struct peer){.fd = fd, .ino = (uint64_t)st.st_ino, .dev = (uint64_t)st.st_dev};
            } else if (fd >= 0) {
                close(fd);
            }
        }
        if (!p)
            continue;
        p->seen = 1;
        refresh_granted(p, dirfd(dir), de->d_name);
        locate(p);
    }
    closedir(dir);
    for (int d = 0; d < NVC_MAX_DEVICES; d++)
        read_of[d].at = 0;
    for (int i = 0; i < npeers;)
        if (!peers[i].seen) {
            forget(&peers[i]);
            peers[i] = peers[--npeers];
        } else {
            i++;
        }
}

static void view_of(const struct nvc_sched_entry *e, uint64_t id, struct nvc_sched_view *v)
{
    v->id = id;
    v->seen_ns = __atomic_load_n(&e->seen_ns, __ATOMIC_ACQUIRE);
    v->busy_until_ns = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
    v->capped = __atomic_load_n(&e->capped, __ATOMIC_ACQUIRE);
    v->weight = __atomic_load_n(&e->weight, __ATOMIC_ACQUIRE);
    v->cap = __atomic_load_n(&e->cap, __ATOMIC_ACQUIRE);
    v->share_permille = __atomic_load_n(&e->share_permille, __ATOMIC_ACQUIRE);
    v->klass = __atomic_load_n(&e->klass, __ATOMIC_ACQUIRE);
    v->mps = __atomic_load_n(&e->mps, __ATOMIC_ACQUIRE);
    v->backlog_permille = __atomic_load_n(&e->backlog_permille, __ATOMIC_ACQUIRE);
    v->steady_permille = __atomic_load_n(&e->steady_permille, __ATOMIC_ACQUIRE);
}

/* The other tenants' views of our device d: each one entry, read afresh (a copy: what the file says
 * next cannot change it) unless read less than REREAD_NS ago, sanitised, with the weight the hook
 * granted. An entry that moved or went is looked for again at the next rescan. Caller holds sched_mu. */
static int others_locked(uint32_t d, uint64_t now, struct nvc_sched_view *out)
{
    if (read_of[d].at && now - read_of[d].at < REREAD_NS) {
        memcpy(out, read_of[d].v, (size_t)read_of[d].n * sizeof *out);
        return read_of[d].n;
    }
    int n = 0;
    for (int i = 0; i < npeers; i++) {
        struct peer *p = &peers[i];
        struct nvc_sched_entry e;
        if (p->at[d] < 0)
            continue;
        off_t at = (off_t)(offsetof(struct sched_file, dev) + (size_t)p->at[d] * sizeof e);
        if (pread(p->fd, &e, sizeof e, at) != (ssize_t)sizeof e || !same_key(e.key, own->dev[d].key)) {
            p->at[d] = -1;
            continue;
        }
        out[n] = (struct nvc_sched_view){.id = p->ino,
                                         .seen_ns = e.seen_ns,
                                         .busy_until_ns = e.busy_until_ns,
                                         .capped = e.capped,
                                         .weight = e.weight,
                                         .share_permille = e.share_permille,
                                         .klass = e.klass,
                                         .mps = e.mps,
                                         .backlog_permille = e.backlog_permille,
                                         .steady_permille = e.steady_permille};
        nvc_sched_sanitize(&out[n], now);
        if (p->weight[d])
            out[n].weight = p->weight[d];
        if (p->granted)
            out[n].klass = p->klass[d]; /* the class the hook granted it, never its claim */
        n++;
    }
    read_of[d].at = now;
    read_of[d].n = n;
    memcpy(read_of[d].v, out, (size_t)n * sizeof *out);
    return n;
}

/* The other tenants' views of e's device, noting how many share the GPU now. */
static int others_of(struct nvc_sched_entry *e, uint64_t now, struct nvc_sched_view *out)
{
    uint32_t d = (uint32_t)(e - own->dev);
    pthread_mutex_lock(&sched_mu);
    rescan_locked(now);
    int n = others_locked(d, now, out);
    nvc_sched_note(&sharing_of[d], now, nvc_sched_sharing(out, n, now));
    uint32_t active = 0, urgent_peer = 0;
    for (int i = 0; i < n; i++) {
        active += (uint32_t)(nvc_sched_active(&out[i], now) || nvc_sched_busy(&out[i], now));
        urgent_peer |= out[i].klass == NVC_CLASS_LATENCY_CRITICAL;
    }
    __atomic_store_n(&peers_active[d], active, __ATOMIC_RELAXED);
    __atomic_store_n(&yields[d], urgent_peer && e->klass != NVC_CLASS_LATENCY_CRITICAL, __ATOMIC_RELAXED);
    __atomic_store_n(&urgent_others[d], urgent_peer, __ATOMIC_RELAXED);
    __atomic_store_n(&looked_at[d], now, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&sched_mu);
    return n;
}

int nvc_sched_contended(const struct nvc_sched_entry *e)
{
    return __atomic_load_n(&peers_active[e - own->dev], __ATOMIC_RELAXED) > 0;
}

int nvc_sched_yields(const struct nvc_sched_entry *e)
{
    return __atomic_load_n(&yields[e - own->dev], __ATOMIC_RELAXED) != 0;
}

int nvc_sched_unhindered(struct nvc_sched_entry *e, uint64_t now)
{
    if (!e || __atomic_load_n(&e->klass, __ATOMIC_ACQUIRE) != NVC_CLASS_LATENCY_CRITICAL)
        return 0;
    uint32_t d = (uint32_t)(e - own->dev);
    if (now - __atomic_load_n(&looked_at[d], __ATOMIC_RELAXED) > RESCAN_NS) {
        struct nvc_sched_view others[MAX_PEERS];
        others_of(e, now, others);
    }
    if (__atomic_load_n(&urgent_others[d], __ATOMIC_RELAXED))
        return 0;
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
    return 1;
}

void nvc_sched_observe(struct nvc_sched_entry *e, uint64_t now)
{
    struct nvc_sched_view others[MAX_PEERS];
    others_of(e, now, others);
}

/* The tenant's share account, shared by its processes: decayed to now (whichever process gets there
 * first moves its time), plus charged_ns; returns the share it gives, in ‰. */
static uint32_t account(struct nvc_sched_entry *e, uint64_t now, uint64_t charged_ns)
{
    uint64_t at = __atomic_load_n(&e->share_at_ns, __ATOMIC_ACQUIRE);
    uint64_t acc = __atomic_load_n(&e->share_acc_ns, __ATOMIC_ACQUIRE);
    if (now > at && __atomic_compare_exchange_n(&e->share_at_ns, &at, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        while (!__atomic_compare_exchange_n(&e->share_acc_ns, &acc, nvc_sched_decay(acc, at ? now - at : 0), 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            ;
    if (charged_ns)
        __atomic_add_fetch(&e->share_acc_ns, charged_ns, __ATOMIC_ACQ_REL);
    uint32_t share = nvc_sched_share(__atomic_load_n(&e->share_acc_ns, __ATOMIC_ACQUIRE));
    __atomic_store_n(&e->share_permille, share, __ATOMIC_RELEASE);
    return share;
}

int nvc_sched_ready(struct nvc_sched_entry *e, uint64_t now, int capped)
{
    if (capped) { /* held back by its own cap: nobody should wait for it */
        __atomic_store_n(&e->capped, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&e->running, 0, __ATOMIC_RELEASE);
        return 0;
    }
    struct nvc_sched_view others[MAX_PEERS], self;
    int n = others_of(e, now, others);
    __atomic_store_n(&e->capped, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
    view_of(e, own_id, &self);
    self.share_permille = account(e, now, 0);
    enum nvc_sched_decision decision = nvc_sched_decide(&self, others, n, now);
    __atomic_store_n(&e->running, (uint32_t)(decision != NVC_SCHED_WAIT), __ATOMIC_RELEASE);
    return (int)decision;
}

void nvc_sched_backlog(struct nvc_sched_entry *e, uint64_t now, int backlogged, int pending)
{
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
    uint32_t was = __atomic_load_n(&e->backlog_permille, __ATOMIC_ACQUIRE);
    __atomic_store_n(&e->backlog_permille, nvc_sched_backlog_after(was, backlogged), __ATOMIC_RELEASE);
    was = __atomic_load_n(&e->steady_permille, __ATOMIC_ACQUIRE);
    __atomic_store_n(&e->steady_permille, nvc_sched_steady_after(was, pending), __ATOMIC_RELEASE);
}

unsigned nvc_sched_duty_now(struct nvc_sched_entry *e, uint64_t now)
{
    struct nvc_sched_view others[MAX_PEERS], self;
    int n = others_of(e, now, others);
    view_of(e, own_id, &self);
    self.share_permille = account(e, now, 0);
    unsigned duty = nvc_sched_duty(&self, others, n, now);
    __atomic_store_n(&e->duty, duty, __ATOMIC_RELEASE); /* for `nvc-py share status` */
    return duty;
}

int nvc_sched_on_duty(struct nvc_sched_entry *e, uint64_t now)
{
    struct nvc_sched_view others[MAX_PEERS], self;
    int n = others_of(e, now, others);
    view_of(e, own_id, &self);
    return nvc_sched_duty_holds(&self, others, n, now);
}

/* Its queued work is published as busy until twice its estimate from now: the estimates are the
 * kernels' elapsed times as last measured, and while more tenants share the GPU than then, the queue
 * drains slower. One that is too early would make the others charge a shared moment as theirs alone;
 * one too late is cut short when the work is measured (the queue drained). */
void nvc_sched_queued(struct nvc_sched_entry *e, uint64_t now, int64_t queued_ns)
{
    uint64_t until = __atomic_load_n(&e->busy_until_ns, __ATOMIC_ACQUIRE);
    uint64_t next = now + 2 * (uint64_t)(queued_ns > 0 ? queued_ns : 0);
    if (queued_ns <= 0 || next > until)
        __atomic_store_n(&e->busy_until_ns, queued_ns > 0 ? next : now, __ATOMIC_RELEASE);
}

void nvc_sched_launched(struct nvc_sched_entry *e, uint64_t now, int64_t queued_ns)
{
    nvc_sched_queued(e, now, queued_ns > 0 ? queued_ns : 1);
    __atomic_store_n(&e->seen_ns, now, __ATOMIC_RELEASE);
}

void nvc_sched_measured(struct nvc_sched_entry *e, uint64_t now, uint64_t began_ns, uint64_t ended_ns, uint64_t cost_ns,
                        uint64_t work_ns)
{
    uint32_t d = (uint32_t)(e - own->dev);
    nvc_sched_observe(e, now);
    pthread_mutex_lock(&sched_mu);
    uint64_t mine = nvc_sched_charge(&sharing_of[d], began_ns, ended_ns);
    pthread_mutex_unlock(&sched_mu);
    /* its share of the elapsed time, at the grid's part of the device, unless its work is known */
    uint64_t charged = work_ns ? (work_ns < cost_ns ? work_ns : cost_ns)
                       : ended_ns > began_ns
                           ? (uint64_t)((double)cost_ns * (double)mine / (double)(ended_ns - began_ns))
                           : 0;
    __atomic_add_fetch(&e->busy_ns, cost_ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&e->charged_ns, charged, __ATOMIC_RELAXED);
    account(e, now, charged);
}

void nvc_sched_ran(struct nvc_sched_entry *e, uint64_t now, uint64_t work_ns)
{
    if (!work_ns)
        return;
    __atomic_add_fetch(&e->busy_ns, work_ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&e->charged_ns, work_ns, __ATOMIC_RELAXED);
    account(e, now, work_ns);
}

/* The mappings survive fork (MAP_SHARED): the child is the same tenant; what it saw is its parent's. */
void nvc_sched_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&sched_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD)
        memset(sharing_of, 0, sizeof sharing_of);
    pthread_mutex_unlock(&sched_mu);
}

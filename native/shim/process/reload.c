/* Limits changed while the container runs. `nvc-py share set` rewrites the container's limits file in
 * place (the container sees it through a read-only bind of that very file, so a new file would not reach
 * it); every process of the container looks at the file's inode, size and modification time at most every
 * NVC_RELOAD_NS, inside a call it makes anyway, and reads it again when they changed. New limits are put
 * in force at once: a raised memory limit or cap is there for the next allocation or launch, a lowered
 * memory limit refuses new allocations while the container holds more (what it holds is never taken
 * back), a new weight or cap is what the scheduler publishes from then on. A file caught half-written
 * (truncated, not yet filled) does not parse: the limits in force stay, and the next look reads it again.
 * No thread is started: a process that makes no call does not need the new limits until it does. */
#define _GNU_SOURCE
#include "process/reload.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "base/config.h"
#include "base/region.h"
#include "process/devices.h"
#include "process/init.h"
#include "scheduling/sched.h"

static uint64_t next_look; /* CLOCK_MONOTONIC; 0: at the first call */
static struct stat seen;   /* the file as last read whole */
static int have_seen;
static struct nvc_config fresh; /* under reload_mu */
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER;

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Caller holds reload_mu. */
static void look(void)
{
    char path[300], text[16384], err[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/limits", nvc_cfg.dir);
    if (stat(path, &st) || (have_seen && same_file(&st, &seen)))
        return;
    if (nvc_read_text(path, text, sizeof text) || nvc_parse_limits_text(text, &fresh, err, sizeof err)) {
        nvc_log(2, "limits file %s changed but cannot be read now: the limits in force stay", path);
        return; /* looked at again next time */
    }
    seen = st;
    have_seen = 1;
    nvc_config_finish(&fresh);
    if (fresh.hash == nvc_cfg.hash)
        return;
    snprintf(fresh.dir, sizeof fresh.dir, "%s", nvc_cfg.dir);
    nvc_limits_in_force(&fresh);
    if (nvc_compute_limited)
        nvc_sched_open(&fresh);
    nvc_region_relimit(&fresh);
    nvc_devices_reconfigure(&fresh);
    nvc_log(2, "limits changed: memory default %llu, compute default %u%%, weight default %u, %d device rules",
            (unsigned long long)fresh.memory_default, fresh.compute_default, fresh.weight_default, fresh.nrules);
}

enum nvc_state nvc_ready(void)
{
    enum nvc_state state = nvc_init();
    if (state != NVC_ACTIVE || !nvc_cfg.from_file)
        return state;
    uint64_t now = nvc_now_ns();
    if (now < __atomic_load_n(&next_look, __ATOMIC_RELAXED) || pthread_mutex_trylock(&reload_mu))
        return state; /* not yet, or another thread is looking */
    if (now >= next_look) {
        __atomic_store_n(&next_look, now + NVC_RELOAD_NS, __ATOMIC_RELAXED);
        look();
    }
    pthread_mutex_unlock(&reload_mu);
    return nvc_current_state();
}

void nvc_reload_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE)
        pthread_mutex_lock(&reload_mu);
    else
        pthread_mutex_unlock(&reload_mu);
}

/* Initialisation, once, at the first wrapped call: the limits (the container's read-only file, or
 * for plain LD_PRELOAD use a directory's file or the environment), the shared region and the
 * scheduler. The shim never installs signal handlers and never starts threads: it only runs inside
 * the application's own CUDA/NVML calls. */
#define _GNU_SOURCE
#include "process/init.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/config.h"
#include "base/ground.h"
#include "base/region.h"
#include "scheduling/sched.h"

extern char **environ;

struct nvc_config nvc_cfg;
int nvc_mem_limited, nvc_compute_limited;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int activated;

void nvc_limits_in_force(const struct nvc_config *cfg)
{
    int mem = cfg->memory_default != 0,
        compute = cfg->compute_default < 100 || cfg->weight_default != 0 || cfg->class_default != NVC_CLASS_NONE;
    for (int i = 0; i < cfg->nrules; i++) {
        const struct nvc_limit_rule *r = &cfg->rules[i];
        mem |= r->memory != 0;
        compute |= (r->compute != 0 && r->compute < 100) || r->weight != 0 || r->klass != NVC_CLASS_NONE;
    }
    nvc_mem_limited |= mem;
    nvc_compute_limited |= compute;
}

/* Outside a container (plain LD_PRELOAD use): reads `dir`/limits, dir being NVC_SHARE_DIR or the user's own;
 * nvc_read_text's result. */
static int read_plain_limits(char *dir, size_t dir_size, char *text, size_t text_size)
{
    const char *given = getenv("NVC_SHARE_DIR");
    if (given && *given)
        snprintf(dir, dir_size, "%s", given);
    else
        snprintf(dir, dir_size, "/tmp/nvc-share-%u", (unsigned)getuid());
    char path[300];
    snprintf(path, sizeof path, "%s/limits", dir);
    return nvc_read_text(path, text, text_size);
}

static void do_init(void)
{
    const char *lvl = getenv("NVC_SHARE_LOG");
    if (lvl && *lvl >= '0' && *lvl <= '3' && !lvl[1])
        nvc_set_log_level(*lvl - '0');
    char err[256] = "", text[16384];
    const char *limits = NVC_FIXED_DIR "/limits";
    int rc = nvc_read_text(limits, text, sizeof text);
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
        char dir[256];
        rc = read_plain_limits(dir, sizeof dir, text, sizeof text);
        if (rc == 0) {
            if (nvc_parse_limits_text(text, &nvc_cfg, err, sizeof err) == 0)
                err[0] = '\0';
        } else {
            nvc_config_from_env(environ, &nvc_cfg, err, sizeof err);
        }
        snprintf(nvc_cfg.dir, sizeof nvc_cfg.dir, "%s", dir);
    }
    nvc_set_fail_closed(nvc_cfg.on_error == NVC_FAIL_CLOSED); /* honoured even if another line is junk */
    if (err[0]) {
        nvc_fail(err);
        return;
    }
    nvc_config_finish(&nvc_cfg);
    if (!nvc_cfg.enabled) {
        nvc_log(2, "disabled by configuration");
        return;
    }
    nvc_limits_in_force(&nvc_cfg);
    if (!nvc_mem_limited && !nvc_compute_limited) {
        nvc_log(2, "no limits configured");
        return;
    }
    if (!nvc_cfg.from_file)
        mkdir(nvc_cfg.dir, 0700); /* plain LD_PRELOAD use; an existing directory is fine */
    if (nvc_region_open(nvc_cfg.dir, &nvc_cfg)) {
        nvc_fail("cannot use the shared region");
        return;
    }
    if (nvc_compute_limited)
        nvc_sched_open(&nvc_cfg);
    __atomic_store_n(&activated, 1, __ATOMIC_RELEASE);
    nvc_set_active();
    nvc_log(2, "active: memory default %llu, compute default %u%%, %d device rules, region %s/region",
            (unsigned long long)nvc_cfg.memory_default, nvc_cfg.compute_default, nvc_cfg.nrules, nvc_cfg.dir);
}

void nvc_mps_env(void)
{
    static struct nvc_config cfg; /* the constructor runs once, before any thread */
    char text[16384], err[256], dir[256];
    int rc = nvc_read_text(NVC_FIXED_DIR "/limits", text, sizeof text);
    if (rc && errno == ENOENT) /* plain use, as nvc_init reads it */
        rc = read_plain_limits(dir, sizeof dir, text, sizeof text);
    if (rc || nvc_parse_limits_text(text, &cfg, err, sizeof err))
        return; /* nvc_init reports a junk file at the first wrapped call */
    for (int i = 0; i < NVC_MPS_VARS; i++)
        if (cfg.mps_env[i][0])
            setenv(nvc_mps_names[i], cfg.mps_env[i], 1);
}

enum nvc_state nvc_init(void)
{
    pthread_once(&init_once, do_init);
    return nvc_current_state();
}

int nvc_init_activated(void)
{
    return __atomic_load_n(&activated, __ATOMIC_ACQUIRE);
}

/* `nvc-py info` with no server: the front starts its driver helper, the native one (native/driver), before it
 * executes the Python program, so that NVML starts while the interpreter does, not after it and its imports
 * (docs/performance.md). The program takes the answer (nvc/rpc/native_snapshot.py) where its options ask for
 * what the helper was started with: the root given, else the configuration's as root's program last recorded
 * it for the configuration file as it is (nvc/config/driverguess.py), else /; the identity the configuration
 * names likewise, else the one the Python helper would take (the kernel's overflow user for root, else the
 * caller's own). Otherwise it kills this one and starts its own (and records the configuration's for root).
 * Only `info` is guessed (its own options, --csv and --json, change no driver helper's), with no global option
 * but the root and the ld cache, in the spellings nvc/commands/plain.py reads them: another (--user, --debug,
 * --load-kmods) may change what the helper is or when it may start. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_start.h"
#include "runcache.h"
#include "server_start.h"
#include "version.h"

#define SNAPSHOT_PROGRAM PROGRAM_DIR "/nvc-py-driver-snapshot"
#define GUESS_NAME "driver-guess"
#define GUESS_MAGIC "nvc-py-driver-guess/1 " NVC_VERSION /* as nvc/config/driverguess.py's MAGIC */

/* The kernel's overflow id from /proc/sys/kernel/NAME (as nvc/rpc/driver_wire.py's overflow_ids); 0 if unread. */
static int overflow_id(const char *name, unsigned *id)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/sys/kernel/%s", name);
    FILE *f = fopen(path, "re");
    int ok = f && fscanf(f, "%u", id) == 1;
    if (f)
        fclose(f);
    return ok;
}

/* Whether argv is `nvc-py [--root ROOT] [--ldcache PATH] [--debug PATH] [--load-kmods] info ...` in
 * nvc/commands/plain.py's spellings (where --load-kmods makes a node, the program ends this helper and starts
 * another after it); *root: the root given, NULL where none is. */
static int guessed_info(char **argv, const char **root)
{
    int i = 1;
    for (; argv[i] && argv[i][0] == '-'; i++) {
        const char *name = argv[i];
        if (!strncmp(name, "--root=", 7))
            *root = name + 7;
        else if (!strncmp(name, "--ldcache=", 10) || !strncmp(name, "--debug=", 8) || !strcmp(name, "-k") ||
                 !strcmp(name, "--load-kmods"))
            continue;
        else if ((!strcmp(name, "--root") || !strcmp(name, "-r")) && argv[i + 1] && argv[i + 1][0] != '-')
            *root = argv[++i];
        else if ((!strcmp(name, "--ldcache") || !strcmp(name, "-l") || !strcmp(name, "--debug") ||
                  !strcmp(name, "-d")) &&
                 argv[i + 1] && argv[i + 1][0] != '-')
            i++;
        else
            return 0;
    }
    return argv[i] && !strcmp(argv[i], "info");
}

/* A decimal id of at most 32 bits, whole. */
static int parse_id(const char *text, unsigned *id)
{
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    *id = (unsigned)value;
    return !errno && *text >= '0' && *text <= '9' && !*end && value <= 0xfffffffful;
}

/* The configuration's driver root and helper identity as root's program last read them
 * (nvc/config/driverguess.py), for this configuration file as it is now; 0 where none is known. */
static int configured(const char **root, unsigned *uid, unsigned *gid)
{
    static struct text key;
    static char cache[MAX_CACHE + 1];
    size_t n;
    const char *fields[3]; /* the root, the uid, the gid */
    text_add_str(&key, GUESS_MAGIC);
    text_end_field(&key);
    const char *values = text_add_config(&key) ? runcache_values(GUESS_NAME, &key, cache, &n) : NULL;
    if (!values)
        return 0;
    const char *at = values, *end = values + n;
    for (int i = 0; i < 3; i++) {
        if (at >= end)
            return 0;
        fields[i] = at;
        at += strlen(at) + 1;
    }
    if (at != end || fields[0][0] != '/' || !parse_id(fields[1], uid) || !parse_id(fields[2], gid))
        return 0;
    *root = fields[0];
    return 1;
}

void driver_start(const char *base, char **argv)
{
    const char *root = NULL, *configured_root = NULL;
    if (strcmp(base, "nvc-py") || !guessed_info(argv, &root))
        return;
    unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
    if (uid == 0 && !configured(&configured_root, &uid, &gid) &&
        (!overflow_id("overflowuid", &uid) || !overflow_id("overflowgid", &gid)))
        return;
    root = root ? root : configured_root ? configured_root : "/";
    if (root[0] != '/')
        return;
    int answer[2];
    if (pipe2(answer, O_CLOEXEC) < 0)
        return;
    char ids[2][16];
    snprintf(ids[0], sizeof ids[0], "%u", uid);
    snprintf(ids[1], sizeof ids[1], "%u", gid);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* kept across the exec: gone with the program that waits for it */
        if (getppid() != parent || dup2(answer[1], STDOUT_FILENO) < 0)
            _exit(1);
        execl(SNAPSHOT_PROGRAM, SNAPSHOT_PROGRAM, root, ids[0], ids[1], (char *)NULL);
        _exit(127); /* no answer: the program starts its own helper, which says what is wrong */
    }
    close(answer[1]);
    char value[64 + PATH_MAX];
    if (pid > 0 && fcntl(answer[0], F_SETFD, 0) == 0 &&
        (size_t)snprintf(value, sizeof value, "%d %d %u %u %s", answer[0], (int)pid, uid, gid, root) < sizeof value &&
        setenv(DRIVER_SNAPSHOT_ENV, value, 1) == 0)
        return;
    close(answer[0]);
    if (pid > 0) { /* not named: the program would not wait for it */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

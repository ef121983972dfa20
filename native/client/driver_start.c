/* `nvc-py info` with no server: the front starts its driver helper, the native one (native/driver), before it
 * executes the Python program, so that NVML starts while the interpreter does, not after it and its imports
 * (docs/performance.md). The program takes the answer (nvc/rpc/native_snapshot.py) where its options ask for
 * what the helper was started with: the root given (/ where none is) and the identity the Python helper would
 * take (the kernel's overflow user for root, else the caller's own); otherwise it kills this one and starts its
 * own.
 * Only `info` is guessed (its own options, --csv and --json, change no driver helper's), with no global option
 * but the root and the ld cache, in the spellings nvc/commands/plain.py reads them: another (--user, --debug,
 * --load-kmods) may change what the helper is or when it may start. */
#define _GNU_SOURCE
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
#include "server_start.h"

#define SNAPSHOT_PROGRAM PROGRAM_DIR "/nvc-py-driver-snapshot"

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

/* The root `nvc-py ARGV... info` asks for before its command ("/" where none is given); NULL where the command
 * is not info, or another global option comes before it, or the root is not absolute. */
static const char *info_root(char **argv)
{
    const char *root = "/";
    int i = 1;
    for (; argv[i] && argv[i][0] == '-'; i++) {
        const char *name = argv[i];
        if (!strncmp(name, "--root=", 7))
            root = name + 7;
        else if (!strncmp(name, "--ldcache=", 10))
            continue;
        else if ((!strcmp(name, "--root") || !strcmp(name, "-r")) && argv[i + 1] && argv[i + 1][0] != '-')
            root = argv[++i];
        else if ((!strcmp(name, "--ldcache") || !strcmp(name, "-l")) && argv[i + 1] && argv[i + 1][0] != '-')
            i++;
        else
            return NULL;
    }
    return argv[i] && !strcmp(argv[i], "info") && root[0] == '/' ? root : NULL;
}

void driver_start(const char *base, char **argv)
{
    const char *root = strcmp(base, "nvc-py") ? NULL : info_root(argv);
    if (!root)
        return;
    unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
    if (uid == 0 && (!overflow_id("overflowuid", &uid) || !overflow_id("overflowgid", &gid)))
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
        _exit(127); /* no answer: the program forks its own helper, which says what is wrong */
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

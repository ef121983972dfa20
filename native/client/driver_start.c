/* `nvc-py info` with no server: the front starts its driver helper, the native one (native/driver), before it
 * executes the Python program, so that NVML starts while the interpreter does, not after it and its imports
 * (docs/performance.md). The program takes the answer (nvc/rpc/native_snapshot.py) where its configuration
 * asks for what the helper was started with: the root / and the identity the Python helper would take (the
 * kernel's overflow user for root, else the caller's own); otherwise it kills this one and starts its own.
 * Only `info` with no global option is guessed (its own options, --csv and --json, change no driver helper's):
 * a global option may name another root or user. */
#define _GNU_SOURCE
#include <fcntl.h>
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

void driver_start(const char *base, char **argv)
{
    if (strcmp(base, "nvc-py") || !argv[1] || strcmp(argv[1], "info"))
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
        execl(SNAPSHOT_PROGRAM, SNAPSHOT_PROGRAM, "/", ids[0], ids[1], (char *)NULL);
        _exit(127); /* no answer: the program forks its own helper, which says what is wrong */
    }
    close(answer[1]);
    char value[64];
    if (pid > 0 && fcntl(answer[0], F_SETFD, 0) == 0 &&
        (size_t)snprintf(value, sizeof value, "%d %d %u %u", answer[0], (int)pid, uid, gid) < sizeof value &&
        setenv(DRIVER_SNAPSHOT_ENV, value, 1) == 0)
        return;
    close(answer[0]);
    if (pid > 0) { /* not named: the program would not wait for it */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

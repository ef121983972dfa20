/* Telling a wedged hook server from a busy one.
 *
 * A call waits at most the hand-over timeout (hook_client.c's ACK_TIMEOUT_US) for the server's `ready`, then runs
 * the program itself. Without more, a wedged server would cost every container start that timeout, one after the
 * other, until someone noticed. Two things let a call learn it at once:
 * - The listening process's own state: the server is the process that called listen() (SO_PEERCRED names it on
 *   every connection). One that is stopped (SIGSTOP, a tracer's stop) answers nothing; a call sees it as it
 *   connects, and again while it waits (every WEDGE_SLICE_MS). (A dead one is no wedge: its idle workers die
 *   with it, and the kernel resets the calls it left queued.)
 * - For a server wedged otherwise (its workers hung, the listener running): the first call that times out leaves
 *   a marker, WEDGED_NAME beside the socket. Calls that find it fresh (less than WEDGED_RETRY_S old) run the
 *   program at once, and so do calls already waiting when it appears; once it is older, one call (the one that
 *   takes the marker's lock) tries the server again, and the marker goes when a server answers it. A server
 *   removes it as it starts listening.
 * The marker is trusted under the socket directory's rules (socket_dir.h: the client checked the directory first):
 * a regular file of root's that group and others cannot write, opened without following a link or blocking.
 * Anything else there is ignored, never written through.
 */
#define _GNU_SOURCE
#include "wedge.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int wedge_listener_stopped(int sock, pid_t *pid)
{
    struct ucred peer = {0};
    socklen_t len = sizeof peer;
    char path[64], stat_line[512];
    *pid = 0;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0 || peer.pid <= 0)
        return 0;
    *pid = peer.pid;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)peer.pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0; /* not known: another pid namespace's /proc, say */
    ssize_t n = read(fd, stat_line, sizeof stat_line - 1);
    close(fd);
    if (n <= 0)
        return 0;
    stat_line[n] = '\0';
    const char *end = strrchr(stat_line, ')'); /* the name may hold anything, ')' too */
    return end && end[1] == ' ' && (end[2] == 'T' || end[2] == 't');
}

/* The marker opened (O_RDWR; -1 where absent or not one to trust) and its status. */
static int open_marker(int dirfd, struct stat *st)
{
    int fd = openat(dirfd, WEDGED_NAME, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_uid != 0 || (st->st_mode & 022))) {
        close(fd);
        return -1;
    }
    return fd;
}

static int fresh(const struct stat *st)
{
    time_t now = time(NULL);
    return st->st_mtime <= now && now - st->st_mtime < WEDGED_RETRY_S;
}

enum wedge_marker wedge_marker_check(int dirfd, int *held)
{
    struct stat st;
    *held = -1;
    int fd = open_marker(dirfd, &st);
    if (fd < 0)
        return WEDGE_NONE;
    if (fresh(&st) || flock(fd, LOCK_EX | LOCK_NB) < 0) { /* recent, or another call is trying the server */
        close(fd);
        return WEDGE_FRESH;
    }
    futimens(fd, NULL);
    *held = fd;
    return WEDGE_PROBE;
}

int wedge_marker_fresh(int dirfd)
{
    struct stat st;
    return fstatat(dirfd, WEDGED_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
           !(st.st_mode & 022) && fresh(&st);
}

void wedge_marker_set(int dirfd)
{
    struct stat st;
    int fd = openat(dirfd, WEDGED_NAME, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0)
        futimens(fd, NULL); /* one that was there already is fresh again */
    close(fd);
}

void wedge_marker_clear(int dirfd)
{
    struct stat st;
    int fd = open_marker(dirfd, &st);
    if (fd >= 0) {
        close(fd);
        unlinkat(dirfd, WEDGED_NAME, 0);
    }
}

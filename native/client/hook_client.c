/* nvc-py-hook-client, and the native front of nvc-py: hands one call of nvc-py-hook or nvc-py to a
 * running `nvc-py-hook serve`.
 *
 * As nvc-py-hook-client (argv[0]'s basename), it is registered as the hook instead of nvc-py-hook:
 *     nvc-py-hook-client /usr/local/bin/nvc-py-hook prestart
 * or runs in a hook script, for the CLI:
 *     nvc-py-hook-client /usr/local/bin/nvc-py configure --pid PID ... ROOTFS
 * Installed under another name, it is that program's front: `make install` puts it where the nvc-py
 * and nvc-py-hook console scripts were, so `nvc-py info` is handed over as it is typed, and so are
 * hooks that name nvc-py-hook (CDI's). The Python program it stands for is then
 * /usr/lib/nvc-py/NAME-python (a launcher make install writes). The name is the installed file's
 * (/proc/self/exe), not argv[0]'s. As nvc-py-runtime's front it executes the runtime itself where the call
 * only passes through (runtime_front.c); a create that may ask for a GPU it hands over, and executes the
 * runtime once the worker rewrote the spec; anything else, the program.
 *
 * Whatever the name, it first drops from its environment every variable of nvc/system/unsafe-environment.list
 * (environment.c): neither the Python program it executes nor the server's worker sees them. The runtime
 * nvc-py-runtime executes alone gets the caller's environment whole, as runc would from the engine.
 *
 * A Python program pays for an interpreter start and its imports at every run (most of its cost:
 * docs/performance.md); the server has
 * imported everything once and keeps a worker forked ahead of each call (an idle one even has
 * NVML loaded). This client sends its arguments, its environment, its standard streams (the OCI
 * state arrives on stdin; errors go to the runtime's stderr) and its working directory over the
 * server's socket and exits with the worker's status.
 *
 * Where no server answers (not running, no socket, not root: the socket is root's alone), or the
 * server says so (this process is weaker than the server or in other namespaces), or the call is
 * `serve` itself, it executes the Python program with the same arguments: the same result, only
 * slower. Before it sends anything it makes sure root answers: the socket's directory is root's,
 * not a symlink, not writable by group or others; the socket is root's; the listening peer's
 * credentials (SO_PEERCRED) are uid 0. Otherwise it says so in one line and runs the program itself.
 *
 * A hook call that finds no server at all starts one where the host runs none (server_start.c): a
 * host is served without setting a daemon up. A call no worker read (the server was killed with it
 * queued) is reset by the kernel (ECONNRESET) before `ready`: that one falls back too.
 *
 * A call is an exchange (see hook/server/handover.py): the message with the working directory; `ready PID FD`
 * with the worker's pidfd (or a refusal: `fall back`, or `refused N` and a line this client writes on
 * stderr); `go` with the three standard streams and /proc/PID/fd/FD opened (the worker's end of the
 * connection: the proof that no Landlock domain confines this process more than the worker, see
 * nvc/hook/server/peer.py; where it cannot be opened, the client runs the program itself); `exit N`. No
 * worker runs anything, or holds a stream, before `go`: without `ready` within ACK_TIMEOUT_US (a
 * wedged or stopped server), or with the connection closed before it, the client runs the program
 * itself. Once it sent `go` it falls back only on the worker's `fall back` (the proof was not its
 * connection: it ran nothing); otherwise the worker may have changed the container already: no status
 * within $NVC_PY_HOOK_TIMEOUT seconds (default 60; its grammar is handover.py's timeout_us) kills the
 * worker (as a runtime kills a hook past its timeout; its end closes the streams a runtime may be
 * waiting on) and fails with one line, as does a worker that ends without a status. Connecting and
 * sending are bounded by ACK_TIMEOUT_US too (SO_SNDTIMEO).
 *
 * A wedged server costs that wait once, not at every call (wedge.c): a call sees a stopped listener at once,
 * and one that timed out leaves a marker that keeps the next calls from waiting. A container start's hook
 * call that finds the server wedged so puts a new one in its place (server_start.c) and hands its call to it.
 *
 * Socket: $NVC_PY_HOOK_SOCKET, else /run/nvc-py/hook.sock; `none` hands nothing over. A program run
 * after trying the server gets NVC_PY_HOOK_SOCKET=none, so that a front behind it does not try again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/nvc-py/hook.sock"
#define NO_SERVER "none"              /* $NVC_PY_HOOK_SOCKET's value for "hand nothing over" */
#define DEFAULT_TIMEOUT_US 60000000LL /* for a served call's status; $NVC_PY_HOOK_TIMEOUT */
#define ACK_TIMEOUT_US 2000000LL      /* at most to connect, send and get `ready` */
#define MAX_TIMEOUT_CHARS 32          /* the longest $NVC_PY_HOOK_TIMEOUT read, as handover.py's */
#define CLIENT_NAME "nvc-py-hook-client"

#include "driver_start.h"
#include "environment.h"
#include "message.h"
#include "runtime_front.h"
#include "server_start.h"
#include "socket_dir.h"
#include "wedge.h"

static const char *self;   /* this program's name in messages */
static const char *target; /* the Python program: what runs when no server does */
static int front;          /* this is the installed program's front (not nvc-py-hook-client) */

/* Runs the call here, in the Python program (never this front again). */
__attribute__((noreturn)) static void fall_back(char **argv)
{
    if (front)
        driver_start(self, argv); /* `nvc-py info`: NVML starts while the program does */
    execv(target, argv);
    fprintf(stderr, "%s: cannot execute %s: %s\n", self, target, strerror(errno));
    exit(127);
}

/* Runs the call here after trying the server: with $NVC_PY_HOOK_SOCKET set to NO_SERVER, so that a front
 * of nvc-py behind the target (or pip's console script) does not try, wait or warn again. */
__attribute__((noreturn)) static void give_up(char **argv)
{
    setenv("NVC_PY_HOOK_SOCKET", NO_SERVER, 1);
    fall_back(argv);
}

/* Sends len bytes of buf with n (at most 4) descriptors attached (SCM_RIGHTS); 1 when all went. */
static int send_with_fds(int sock, const char *buf, size_t len, const int *fds, size_t n)
{
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = CMSG_SPACE(n * sizeof(int))};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(cmsg), fds, n * sizeof(int));
    ssize_t sent;
    do
        sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)len;
}

/* Why the socket at path may not be root's server's (NULL: root's, so far as the files tell; an absent
 * socket, or one this caller may not reach (not root), reads as NULL: connecting fails, silently, as where no
 * server runs. *dirfd: the socket's directory (O_PATH) where it is root's and holds the socket, else -1. */
static const char *not_roots(const char *path, int *dirfd)
{
    char directory[sizeof((struct sockaddr_un *)0)->sun_path];
    const char *slash = strrchr(path, '/');
    if (!slash)
        strcpy(directory, ".");
    else if (slash == path)
        strcpy(directory, "/");
    else
        snprintf(directory, sizeof directory, "%.*s", (int)(slash - path), path);
    struct stat sock, st;
    *dirfd = open(directory, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const char *why = NULL;
    if (*dirfd < 0 && lstat(path, &sock) == 0) /* a socket there, in a symlink or what is no directory */
        why = SOCKET_DIR_PROBLEM;
    else if (*dirfd < 0 || fstat(*dirfd, &st) < 0 ||
             fstatat(*dirfd, slash ? slash + 1 : path, &sock, AT_SYMLINK_NOFOLLOW) < 0)
        why = errno == ENOENT || errno == EACCES || errno == ELOOP || errno == ENOTDIR ? NULL /* no socket there */
                                                                                       : "it cannot be examined";
    else if (!socket_dir_is_roots(&st))
        why = SOCKET_DIR_PROBLEM;
    else if (!S_ISSOCK(sock.st_mode) || sock.st_uid != 0)
        why = "it is not a socket of root's";
    else
        return NULL;
    if (*dirfd >= 0)
        close(*dirfd);
    *dirfd = -1;
    return why;
}

/* Sets the socket's send and receive timeouts (microseconds, above 0: 0 would mean no timeout). */
static void set_timeouts(int sock, long long us)
{
    struct timeval tv = {.tv_sec = (time_t)(us / 1000000), .tv_usec = (suseconds_t)(us % 1000000)};
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* One answer of the server, NUL-terminated; its length, 0 at end of file, -1 on error (errno). *fd: the
 * descriptor attached to it (close-on-exec), -1 if none. */
static ssize_t answer(int sock, char *reply, size_t size, int *fd)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = reply, .iov_len = size - 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    *fd = -1;
    struct cmsghdr *cmsg = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (cmsg && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS &&
        cmsg->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(fd, CMSG_DATA(cmsg), sizeof(int));
    reply[n > 0 ? n : 0] = '\0';
    return n;
}

/* Why a call got no `ready` (first_answer). */
enum silence { ANSWERED, TIMED_OUT, STOPPED, MARKED, BROKEN };

static long long since_us(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000000LL + (now.tv_nsec - start->tv_nsec) / 1000;
}

/* The server's first answer (as answer()) within timeout_us, looking every WEDGE_SLICE_MS whether the listener
 * stopped or (with watch) another call marked the server wedged meanwhile (wedge.c); *why says how it ended. */
static ssize_t first_answer(int sock, int dirfd, int watch, long long timeout_us, char *reply, size_t size, int *fd,
                            enum silence *why)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    *fd = -1;
    for (;;) {
        long long left = timeout_us - since_us(&start);
        if (left <= 0) {
            *why = TIMED_OUT;
            return -1;
        }
        struct pollfd ready = {.fd = sock, .events = POLLIN};
        int got = poll(&ready, 1, left / 1000 < WEDGE_SLICE_MS ? (int)(left / 1000) + 1 : WEDGE_SLICE_MS);
        if (got > 0) {
            ssize_t n = answer(sock, reply, size, fd);
            *why = n > 0 ? ANSWERED : BROKEN;
            return n;
        }
        pid_t listener;
        if (got < 0 && errno != EINTR)
            *why = BROKEN;
        else if (wedge_listener_stopped(sock, &listener))
            *why = STOPPED;
        else if (watch && wedge_marker_fresh(dirfd))
            *why = MARKED;
        else
            continue;
        return -1;
    }
}

/* $NVC_PY_HOOK_TIMEOUT in microseconds, for a served call's status: the grammar of hook/server/handover.py's
 * timeout_us (decimal seconds, rounded up to whole microseconds); DEFAULT_TIMEOUT_US where it is unset or
 * not such a value. */
static long long call_timeout(void)
{
    const char *text = getenv("NVC_PY_HOOK_TIMEOUT");
    long long whole = 0, fraction = 0, round_up = 0;
    int digits = 0, fraction_digits = 0, point = 0;
    if (!text || strlen(text) > MAX_TIMEOUT_CHARS)
        return DEFAULT_TIMEOUT_US;
    for (const char *c = text; *c; c++) {
        if (*c == '.' && !point) {
            point = 1;
            continue;
        }
        if (*c < '0' || *c > '9')
            return DEFAULT_TIMEOUT_US;
        digits++;
        if (!point) {
            if ((whole = whole * 10 + (*c - '0')) >= 1000000000)
                return DEFAULT_TIMEOUT_US;
        } else if (fraction_digits < 6) {
            fraction = fraction * 10 + (*c - '0');
            fraction_digits++;
        } else if (*c != '0') {
            round_up = 1;
        }
    }
    for (; fraction_digits < 6; fraction_digits++)
        fraction *= 10;
    long long us = whole * 1000000 + fraction + round_up;
    return digits && us > 0 ? us : DEFAULT_TIMEOUT_US;
}

/* For `ready PID FD`: /proc/PID/fd/FD opened with O_PATH, the proof `go` carries (nvc/hook/server/peer.py); -1 for
 * any other answer, or where it cannot be opened (Landlock refuses it). */
static int worker_connection(const char *reply)
{
    unsigned pid, fd;
    char end, path[64];
    if (sscanf(reply, "ready %u %u%c", &pid, &fd, &end) != 2)
        return -1;
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
    return open(path, O_PATH | O_CLOEXEC);
}

/* Runs the program here unless the server listening on sock is root's (SO_PEERCRED), saying so in one line. */
static void roots_or_give_up(int sock, const char *path, char **argv)
{
    struct ucred peer = {.uid = (uid_t)-1};
    socklen_t peer_len = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) < 0 || peer.uid != 0) {
        fprintf(stderr, "%s: not handing over to the hook server (%s: served by uid %d, not root); running %s\n", self,
                path, (int)peer.uid, target);
        give_up(argv);
    }
}

/* `serve` is the server's own command: a worker refuses it, so it always runs here. */
static int is_serve(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "serve"))
            return 1;
    return 0;
}

/* The name this binary was installed under: the file's, not the caller's argv[0] (a hook's args[0] is
 * whatever its configuration says). */
static const char *own_name(const char *argv0, char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    const char *path = argv0;
    if (n > 0) {
        buf[n] = '\0';
        path = buf;
    }
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The programs a server runs (by argv[0]'s basename); the front of any other (nvc-py-runtime) only drops the
 * unsafe variables and executes it. */
static int is_served(const char *name)
{
    return !strcmp(name, "nvc-py") || !strcmp(name, "nvc-py-hook");
}

/* One call as it is handed over: the program's arguments, the server's socket (its path, address and
 * directory), the message, the caller's working directory, the wedged-server marker found, the timeouts. */
struct call {
    int argc;
    char **argv;
    const char *path;
    struct sockaddr_un addr;
    int dirfd;
    enum wedge_marker marker;
    char *buf;
    size_t len;
    int cwd;
    long long timeout, ack_timeout;
};

/* Sets target, the program that runs here when no server does, and makes argv the call: this client's
 * own name takes the program's path first; a front's program is PROGRAM_DIR/NAME-python, its argv[0] the
 * name. Returns 0, or 2 after a usage error. */
static int take_call(const char *base, int *argc, char ***argv, char *program, size_t size)
{
    if (!strcmp(base, CLIENT_NAME)) { /* the program's path comes first */
        if (*argc < 2 || (*argv)[1][0] != '/') {
            fprintf(stderr, "usage: " CLIENT_NAME " /ABSOLUTE/PATH/nvc-py-hook STAGE [ARG...]\n"
                            "       " CLIENT_NAME " /ABSOLUTE/PATH/nvc-py [ARG...]\n");
            return 2;
        }
        (*argc)--;
        (*argv)++;
        target = (*argv)[0];
    } else { /* the front of the program named like this one */
        if ((size_t)snprintf(program, size, PROGRAM_DIR "/%s-python", base) >= size) {
            fprintf(stderr, "%s: name too long\n", base);
            return 2;
        }
        target = program;
        front = 1;
        (*argv)[0] = (char *)base; /* what the server runs */
    }
    return 0;
}

/* A stream the runtime left closed is passed as /dev/null, never as another open file; read-only, so a
 * write to it fails as on the closed descriptor and the program says it lost its output
 * (nvc/system/stdio.py), where it runs. */
static void open_closed_streams(char **argv)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDONLY) != fd)
            fall_back(argv);
}

/* The server's socket ($NVC_PY_HOOK_SOCKET or the default) into c->path and c->addr; none (NO_SERVER)
 * runs the program here. */
static void find_server(struct call *c)
{
    c->path = getenv("NVC_PY_HOOK_SOCKET");
    if (!c->path || !*c->path)
        c->path = DEFAULT_SOCKET;
    if (!strcmp(c->path, NO_SERVER))
        fall_back(c->argv);
    c->addr = (struct sockaddr_un){.sun_family = AF_UNIX};
    if (strlen(c->path) >= sizeof c->addr.sun_path)
        give_up(c->argv);
    strcpy(c->addr.sun_path, c->path);
}

/* Runs the program here unless the socket's directory is root's (socket_dir.h) and no server there left
 * a call unanswered lately (the marker: c->dirfd, c->marker). Returns the marker's descriptor where this
 * call is the one to try a server marked wedged again, else -1. */
static int check_server_dir(struct call *c)
{
    const char *why = not_roots(c->path, &c->dirfd);
    if (why) {
        fprintf(stderr, "%s: not handing over to the hook server (%s: %s); running %s\n", self, c->path, why, target);
        give_up(c->argv);
    }
    int held = -1; /* the marker, where this call is the one to try a server marked wedged again */
    c->marker = c->dirfd >= 0 ? wedge_marker_check(c->dirfd, &held) : WEDGE_NONE;
    if (c->marker == WEDGE_FRESH) {
        fprintf(stderr, "%s: the hook server left a call unanswered less than %d s ago; running %s\n", self,
                WEDGED_RETRY_S, target);
        give_up(c->argv);
    }
    return held;
}

/* The message and the working directory to hand over, and the timeouts. */
static void prepare_call(struct call *c)
{
    static char buf[MAX_MESSAGE];
    c->buf = buf;
    c->len = 0;
    if (!message_build(c->buf, &c->len, c->argc, c->argv))
        give_up(c->argv);
    c->cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (c->cwd < 0)
        give_up(c->argv);
    c->timeout = call_timeout();
    c->ack_timeout = c->timeout < ACK_TIMEOUT_US ? c->timeout : ACK_TIMEOUT_US;
}

/* A connection to the server; where none listens, a container start's hook call starts one
 * (server_start.c), and any other runs the program here. */
static int connect_server(struct call *c)
{
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        give_up(c->argv);
    set_timeouts(sock, c->ack_timeout);
    message_stamp(c->buf, c->len); /* before connect: a spare may accept before connect returns */
    if (connect(sock, (struct sockaddr *)&c->addr, sizeof c->addr) < 0) {
        int failed = errno;
        close(sock);
        /* no server: a container start's hook call starts one (server_start.c); its wait counts as queueing */
        message_stamp(c->buf, c->len);
        const char *not_started = NULL;
        sock = (failed == ENOENT || failed == ECONNREFUSED) && server_start_wanted(c->argc, c->argv)
                   ? server_start_and_connect(&c->addr, 0, &not_started)
                   : -1;
        if (sock < 0) {
            if (not_started)
                fprintf(stderr, "%s: not starting the hook server (%s: %s); running %s\n", self, c->path, not_started,
                        target);
            give_up(c->argv); /* nothing was handed over */
        }
    }
    return sock;
}

/* Hands the call over on sock until a worker answers (its answer in reply, its pidfd in *worker); returns
 * the socket it answered on. A stopped or silent server is replaced once where a container start's hook
 * call may start one; otherwise the program runs here, saying why. */
static int hand_over(struct call *c, int sock, char *reply, size_t size, int *worker)
{
    for (int replaced = 0;; replaced = 1) {
        set_timeouts(sock, c->ack_timeout);
        roots_or_give_up(sock, c->path, c->argv);
        pid_t listener;
        enum silence silence = BROKEN;
        if (wedge_listener_stopped(sock, &listener))
            silence = STOPPED;
        else if (send_with_fds(sock, c->buf, c->len, &c->cwd, 1))
            first_answer(sock, c->dirfd, c->marker == WEDGE_NONE, c->ack_timeout, reply, size, worker, &silence);
        if (silence == ANSWERED)
            return sock;
        if (silence == TIMED_OUT)
            wedge_marker_set(c->dirfd);
        /* No worker runs anything before `go`. A container start's hook call puts a new server in the place of a
         * wedged one (server_start.c) and hands its call to it; any other call runs the program here. */
        close(sock);
        const char *not_started = NULL;
        message_stamp(c->buf, c->len);
        sock = !replaced && (silence == STOPPED || silence == TIMED_OUT) && server_start_wanted(c->argc, c->argv)
                   ? server_start_and_connect(&c->addr, listener, &not_started)
                   : -1;
        if (sock >= 0)
            continue;
        if (silence == TIMED_OUT)
            fprintf(stderr, "%s: the hook server did not answer in %g s; running %s\n", self, c->ack_timeout / 1e6,
                    target);
        else if (silence == STOPPED)
            fprintf(stderr, "%s: the hook server (pid %d) is stopped; running %s\n", self, (int)listener, target);
        else if (silence == MARKED)
            fprintf(stderr, "%s: the hook server left another call unanswered; running %s\n", self, target);
        give_up(c->argv);
    }
}

/* `go` with this process's streams and the proof to the worker, then its status: the program's exit
 * status, or 1 where the worker gave none (killed past the call's timeout). */
static int run_by_worker(const struct call *c, int sock, int proof, int worker, char *reply, size_t size)
{
    int status;
    const int fds[4] = {0, 1, 2, proof};
    if (!send_with_fds(sock, "go", 2, fds, 4))
        give_up(c->argv); /* the worker did not get it: it runs nothing */
    close(proof);
    set_timeouts(sock, c->timeout);
    int none;
    ssize_t n = answer(sock, reply, size, &none);
    if (n > 0 && sscanf(reply, "exit %d", &status) == 1 && status >= 0 && status <= 255)
        return status;
    if (n > 0 && !strcmp(reply, "fall back"))
        give_up(c->argv); /* the worker did not take the proof, and ran nothing */
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        /* As a runtime kills a hook past its timeout: the worker's end closes the streams it holds. */
        syscall(SYS_pidfd_send_signal, worker, SIGKILL, NULL, 0);
        fprintf(stderr, "%s: the hook server's worker gave no status in %g s (killed)\n", self, c->timeout / 1e6);
    } else {
        fprintf(stderr, "%s: the hook server's worker ended without a status (%s)\n", self,
                n < 0 ? strerror(errno) : "no answer");
    }
    return 1;
}

/* The server's refusal: its status, and why on stderr. Any other answer runs the program here. */
static int refused(const char *reply, char **argv)
{
    int status;
    const char *line = strchr(reply, '\n');
    if (sscanf(reply, "refused %d", &status) == 1 && status >= 0 && status <= 255 && line) {
        fputs(line + 1, stderr); /* why */
        return status;
    }
    /* `fall back` (weaker caller, other namespaces), `ready` with a worker this process may not reach (Landlock),
     * or an answer this client does not know (an older server's refusal of this newer exchange): nothing was
     * done. */
    give_up(argv);
}

int main(int argc, char **argv)
{
    environment_scrub(); /* before anything is executed or sent */
    static char exe[4096];
    const char *base = own_name(argv[0], exe, sizeof exe);
    self = base;
    char program[4096];
    if (take_call(base, &argc, &argv, program, sizeof program))
        return 2;
    if (target == program && !strcmp(base, "nvc-py-hook") && argc == 2 && !strcmp(argv[1], "start-server")) {
        const char *path = getenv("NVC_PY_HOOK_SOCKET");
        if (path && !strcmp(path, NO_SERVER)) {
            fprintf(stderr, "%s: no hook server to start: NVC_PY_HOOK_SOCKET is %s\n", base, NO_SERVER);
            return 2;
        }
        return server_start_command(path && *path ? path : DEFAULT_SOCKET);
    }
    /* From here argv is the call; the server runs the program its argv[0]'s basename names. */
    const char *runtime = NULL; /* nvc-py-runtime's create: the runtime to execute once a worker rewrote the spec */
    if (target == program && !strcmp(base, "nvc-py-runtime")) {
        environment_stash_for_runtime(); /* for the program's exec of the runtime */
        if (!(runtime = runtime_pass_through(argc, argv)))
            fall_back(argv);
    }
    if (is_serve(argc, argv) || (target == program && !is_served(base) && !runtime))
        fall_back(argv);
    open_closed_streams(argv);
    struct call c = {.argc = argc, .argv = argv};
    find_server(&c);
    int held = check_server_dir(&c);
    prepare_call(&c);
    char reply[1024];
    int worker = -1;
    int sock = hand_over(&c, connect_server(&c), reply, sizeof reply, &worker);
    if (held >= 0) { /* a server answered: the mark goes */
        wedge_marker_clear(c.dirfd);
        close(held);
    }
    int proof = worker_connection(reply);
    int status = proof >= 0 ? run_by_worker(&c, sock, proof, worker, reply, sizeof reply) : refused(reply, argv);
    if (runtime && status == 0) { /* the spec is rewritten: the runtime runs here, as the program would execute it */
        argv[0] = (char *)runtime;
        execve(runtime, argv, environment_original());
        argv[0] = (char *)base; /* gone since the cache named it: the program says what is wrong */
        give_up(argv);
    }
    return status;
}

/* Starting `nvc-py-hook serve` on demand, for hosts where no systemd socket unit runs it.
 *
 * A hook call that finds no server (the socket is absent, or nobody listens on it) starts one, so
 * that a host is served without a daemon set up by hand; every later call is handed over.
 * - One server per host: the starting client holds an exclusive flock on server.lock beside the
 *   socket and passes it to the server, which closes it once it listens. A client that connects
 *   while the lock is held waits for it to be released (at most START_WAIT_MS) and connects then;
 *   where that fails it runs the program itself. Waiting, measured on the CPU test host (no-GPU
 *   prestarts): 32 first calls at once p50 154-179 ms, all served, against 543-643 ms each run
 *   directly; a lone first call 127 ms against 42 ms direct (README: served by default).
 * - The host's server: only a client in the mount, pid, user and network namespaces of PID 1 starts
 *   one (a runtime inside a container would start it in the container's), and the server joins PID
 *   1's cgroups (best effort: every v1 hierarchy and the v2 one mounted under /sys/fs/cgroup), not
 *   the caller's, which may be a container's that goes away with it. It is detached from the caller
 *   (new session, double fork: reparented to init) and keeps none of its descriptors (the first
 *   thing the child does: a runtime reading the hook's stdout and stderr sees them end when the
 *   client exits), stdin/stdout on /dev/null, stderr appended to server.log beside the socket, with
 *   a fixed environment, and exits after an idle time.
 * - Only in a socket directory the clients would trust (socket_dir.h: root's, not a symlink, not
 *   writable by group or others; created 0700 where absent), checked before anything there is
 *   created or opened and then used through that very descriptor. server.lock and server.log are
 *   opened without blocking and without following a symlink, and used only when they are regular
 *   files of root's (the lock readable by root alone: whoever can open it can hold it); a log that
 *   is not is replaced by /dev/null, a lock that is not means no start (the call runs itself).
 * - Not started where `nvc-py setup ... --no-server` wrote the no-server file beside the
 *   configuration file (NVC_PY_CONFIG's directory, else /etc/nvc-py), nor for a caller that is
 *   not root.
 * - A server a call found wedged (wedge.c: its listener stopped, or no `ready` in time) is replaced: the call
 *   takes the start lock, and where the socket's listener is still that server, and its command line shows it is
 *   `nvc-py-hook serve --socket` this very socket (never another program, never PID 1: systemd's socket), ends it
 *   (SIGKILL through a pidfd; its idle workers die with it, its busy ones finish their calls), says so in
 *   server.log, and starts the next one as above: one server at a time serves the socket.
 * - `nvc-py-hook start-server` (what `nvc-py setup` runs where systemd does not) starts the same way a server
 *   with no idle exit: one that a runtime never adopts (started outside any container start, so that crun's
 *   `run`, which waits for every child it adopted, never waits for it) and that serves every later start. It
 *   takes the start lock (after an on-demand start under way), keeps a server there that stays (started so
 *   before, by hand, or systemd's socket) and ends one started on demand (as a wedged one is ended) to take
 *   its place.
 * NVC_PY_HOST_PID names another process whose namespaces and cgroups stand for the host's (tests
 * run in a private mount namespace).
 */
#define _GNU_SOURCE
#include "server_start.h"
#include "socket_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_WAIT_MS 1000
#define END_WAIT_MS 2000 /* at most for a wedged server to be gone once killed */
#define MAX_CMDLINE 8192
#define HOST_PID_ENV "NVC_PY_HOST_PID"
#define DEFAULT_CONFIG "/etc/nvc-py/config.yaml"
#define NO_SERVER_FILE "no-server"
#define SERVER_PROGRAM PROGRAM_DIR "/nvc-py-hook-python"
#define SERVER_ENV_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define IDLE_EXIT_NAME "NVC_PY_SERVE_IDLE_EXIT" /* seconds; hook/server/activation.py reads it */
#define IDLE_EXIT_ENV IDLE_EXIT_NAME "=600"
#define STAYS_ENV "NVC_PY_SERVE_STAYS=1" /* start-server's: it starts its successor after an upgrade */
#define COMMAND_WAIT_MS 30000            /* at most for the server `start-server` started to listen */
#define LOCK_FD 3                        /* NVC_PY_SERVE_LOCK_FD, as passed */
#define LOCK_NAME "server.lock"
#define LOCK_PROBLEM "its " LOCK_NAME " is not a regular file only root can open"
#define LOCK_FORBIDDEN 077 /* whoever could open the lock could hold it, and no server would start */
#define LOG_NAME "server.log"

static const char *const hook_stages[] = {"prestart", "poststop", "create-symlinks", "update-ldcache", NULL};

int server_start_wanted(int argc, char **argv)
{
    const char *slash = strrchr(argv[0], '/');
    if (strcmp(slash ? slash + 1 : argv[0], "nvc-py-hook") || argc < 2)
        return 0;
    for (int i = 0; hook_stages[i]; i++)
        if (!strcmp(argv[1], hook_stages[i]))
            return 1;
    return 0;
}

/* dir of path (no trailing slash) into buf; 0 when it does not fit. */
static int dir_of(const char *path, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (n >= size)
        return 0;
    memcpy(buf, slash ? path : ".", n);
    buf[n] = '\0';
    return 1;
}

static const char *host_pid(void)
{
    const char *pid = getenv(HOST_PID_ENV);
    return pid && *pid ? pid : "1";
}

static int in_host_namespaces(void)
{
    static const char *const names[] = {"mnt", "pid", "user", "net"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char theirs[64], ours[64];
        struct stat a, b;
        snprintf(theirs, sizeof theirs, "/proc/%s/ns/%s", host_pid(), names[i]);
        snprintf(ours, sizeof ours, "/proc/self/ns/%s", names[i]);
        if (stat(theirs, &a) || stat(ours, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
            return 0;
    }
    return 1;
}

static int start_disabled(void)
{
    const char *config = getenv("NVC_PY_CONFIG");
    char dir[PATH_MAX], path[PATH_MAX + sizeof NO_SERVER_FILE + 1];
    if (!dir_of(config && *config ? config : DEFAULT_CONFIG, dir, sizeof dir))
        return 1;
    snprintf(path, sizeof path, "%s/" NO_SERVER_FILE, dir);
    return access(path, F_OK) == 0;
}

static int try_connect(const struct sockaddr_un *addr)
{
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock >= 0 && connect(sock, (const struct sockaddr *)addr, sizeof *addr) == 0)
        return sock;
    if (sock >= 0)
        close(sock);
    return -1;
}

/* This process into the cgroups of the host's reference process: a line "ID:CONTROLLERS:PATH" of
 * /proc/PID/cgroup is /sys/fs/cgroup/CONTROLLERS/PATH (v1; "name=systemd" is mounted as "systemd"),
 * or /sys/fs/cgroup/PATH (v2; /sys/fs/cgroup/unified/PATH on a hybrid host). */
static void join_host_cgroups(void)
{
    char path[PATH_MAX], line[PATH_MAX];
    snprintf(path, sizeof path, "/proc/%s/cgroup", host_pid());
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char pid[24];
    int pid_len = snprintf(pid, sizeof pid, "%d", (int)getpid());
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *group = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!group)
            continue;
        *group++ = '\0';
        controllers++;
        if (!strncmp(controllers, "name=", 5))
            controllers += 5;
        if (*controllers)
            snprintf(path, sizeof path, "/sys/fs/cgroup/%s%s/cgroup.procs", controllers, group);
        else
            snprintf(path, sizeof path, "/sys/fs/cgroup%s%s/cgroup.procs",
                     access("/sys/fs/cgroup/cgroup.procs", F_OK) ? "/unified" : "", group);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (write(fd, pid, pid_len) < 0) { /* best effort: a cgroup we may not enter stays as it is */
            }
            close(fd);
        }
    }
    fclose(f);
}

/* The detached server's process (the grandchild), holding nothing of the caller's (detach): never returns.
 * persistent: no idle exit (`start-server`'s). */
static void exec_server(const char *socket_path, int persistent)
{
    join_host_cgroups();
    if (chdir("/")) {
    }
    /* nothing of the first caller's process state either: its umask, blocked or ignored signals */
    umask(022);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    char lock_env[32], host_env[64];
    snprintf(lock_env, sizeof lock_env, "NVC_PY_SERVE_LOCK_FD=%d", LOCK_FD);
    /* a stand-in for the host's PID 1 (tests) goes on to the start of a successor (hook/server/loop.py) */
    const char *stand_in = getenv(HOST_PID_ENV);
    snprintf(host_env, sizeof host_env, HOST_PID_ENV "=%s", stand_in ? stand_in : "");
    char *env[5] = {SERVER_ENV_PATH, lock_env};
    size_t n = 2;
    env[n++] = persistent ? STAYS_ENV : IDLE_EXIT_ENV;
    if (stand_in)
        env[n++] = host_env;
    env[n] = NULL;
    char *const args[] = {"nvc-py-hook", "serve", "--socket", (char *)socket_path, NULL};
    execve(SERVER_PROGRAM, args, env);
    _exit(127);
}

/* In the forked child, before anything else: stdin and stdout on /dev/null, stderr on log (or /dev/null
 * where log < 0), the lock on LOCK_FD, every other descriptor closed: a caller's stream or pipe held here
 * would keep whoever reads it waiting for the server's idle exit. */
static void detach(int lock, int log)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(log >= 0 ? log : null, 2) < 0)
        _exit(127);
    if (lock == LOCK_FD ? fcntl(lock, F_SETFD, 0) < 0 : dup2(lock, LOCK_FD) < 0)
        _exit(127);
    if (syscall(SYS_close_range, LOCK_FD + 1, ~0U, 0) < 0)
        for (int fd = LOCK_FD + 1; fd < 65536; fd++)
            close(fd);
}

/* Starts the server detached, passing it the held lock and log (-1: none); 0 when it could not be forked. */
static int spawn_server(int lock, int log, const char *socket_path, int persistent)
{
    /* the child's status is read below: not reaped by the kernel where the caller ignored SIGCHLD (a server
     * starting its successor does, and an ignored disposition outlives exec) */
    signal(SIGCHLD, SIG_DFL);
    pid_t child = fork();
    if (child < 0)
        return 0;
    if (child == 0) {
        detach(lock, log);
        setsid();
        pid_t server = fork();
        if (server == 0)
            exec_server(socket_path, persistent);
        _exit(server < 0);
    }
    int status = 0;
    pid_t got;
    while ((got = waitpid(child, &status, 0)) < 0 && errno == EINTR)
        ;
    return got == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* name in the checked socket directory dirfd, opened with flags without blocking (a FIFO) or following a
 * symlink, created 0600 with O_CREAT; -1 unless it is a regular file of root's without the forbidden mode
 * bits. */
static int open_roots_file(int dirfd, const char *name, int flags, mode_t forbidden)
{
    int fd = openat(dirfd, name, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & forbidden))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* flock(fd, op) within about ms milliseconds (polled each millisecond); whether it was taken. */
static int lock_within(int fd, int op, int ms)
{
    struct timespec pause = {.tv_nsec = 1000000};
    for (int waited = 0; flock(fd, op | LOCK_NB) < 0; waited++) {
        if (waited >= ms)
            return 0;
        nanosleep(&pause, NULL);
    }
    return 1;
}

/* Waits (at most wait_ms) until nobody holds the start lock in dirfd, then connects. */
static int wait_and_connect(int dirfd, const struct sockaddr_un *addr, int wait_ms)
{
    int lock = open_roots_file(dirfd, LOCK_NAME, O_RDONLY, LOCK_FORBIDDEN);
    if (lock < 0)
        return -1;
    int locked = lock_within(lock, LOCK_SH, wait_ms);
    close(lock);
    return locked ? try_connect(addr) : -1;
}

static pid_t listener_of(int sock)
{
    struct ucred peer = {0};
    socklen_t len = sizeof peer;
    return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 ? peer.pid : 0;
}

/* The start of /proc/PID/NAME (a list of NUL-terminated strings) into buf; its length, or -1. */
static ssize_t proc_strings(pid_t pid, const char *name, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size);
    close(fd);
    return n;
}

/* Whether process pid's command line holds `serve --socket SOCKET_PATH` (the server of this socket). */
static int serves(pid_t pid, const char *socket_path)
{
    char cmdline[MAX_CMDLINE], wanted[sizeof((struct sockaddr_un *)0)->sun_path + 32];
    ssize_t n = proc_strings(pid, "cmdline", cmdline, sizeof cmdline);
    int len = snprintf(wanted, sizeof wanted, "%cserve%c--socket%c%s%c", 0, 0, 0, socket_path, 0);
    return n > 0 && memmem(cmdline, (size_t)n, wanted, (size_t)len) != NULL;
}

/* Ends the server pid, the listener of socket_path found wedged, or started on demand where `start-server`
 * puts a persistent one (what, for the log line; see the top of this file); 1 once it is gone. */
static int end_server(pid_t pid, const char *socket_path, int log, const char *what)
{
    if (pid <= 1)
        return 0;
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return errno == ESRCH;
    struct pollfd exited = {.fd = pidfd, .events = POLLIN};
    int gone = poll(&exited, 1, 0) > 0;      /* it died meanwhile */
    if (!gone && serves(pid, socket_path)) { /* checked once the pidfd pins the process: no pid reused since */
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
        gone = poll(&exited, 1, END_WAIT_MS) > 0;
        if (gone && log >= 0)
            dprintf(log, "nvc-py-hook-client: ended the %s hook server (pid %d) to start another\n", what, (int)pid);
    }
    close(pidfd);
    return gone;
}

/* With the start lock held in dirfd: a server started (persistent: with no idle exit), in the place of victim
 * (the listener found there, ended first; what: why, for the log line) or where none listened (victim 0), its
 * stderr on server.log; 1 once it is forked (it holds the lock until it listens). */
static int replace_server(int dirfd, int lock, const struct sockaddr_un *addr, pid_t victim, const char *what,
                          int persistent)
{
    int log = open_roots_file(dirfd, LOG_NAME, O_WRONLY | O_APPEND | O_CREAT, 022);
    int spawned = (victim <= 0 || end_server(victim, addr->sun_path, log, what)) &&
                  spawn_server(lock, log, addr->sun_path, persistent);
    if (log >= 0)
        close(log);
    return spawned;
}

/* With dirfd the checked socket directory: the connection, after starting a server (in place of the wedged one,
 * where wedged is its pid) or waiting for one. */
static int start_in(int dirfd, const struct sockaddr_un *addr, pid_t wedged, const char **why)
{
    int lock = open_roots_file(dirfd, LOCK_NAME, O_RDWR | O_CREAT, LOCK_FORBIDDEN);
    if (lock < 0) {
        *why = LOCK_PROBLEM;
        return -1;
    }
    if (flock(lock, LOCK_EX | LOCK_NB) == 0) {
        /* a server another client started (or put in the wedged one's place) since this one's call failed */
        int sock = try_connect(addr);
        if (sock >= 0 && (wedged <= 0 || listener_of(sock) != wedged)) {
            close(lock);
            return sock;
        }
        if (sock >= 0)
            close(sock);
        if (!replace_server(dirfd, lock, addr, sock >= 0 ? wedged : 0, "wedged", 0)) {
            close(lock);
            return -1;
        }
    }
    close(lock); /* the server holds the lock now, until it listens */
    return wait_and_connect(dirfd, addr, START_WAIT_MS);
}

/* The socket's directory (created 0700 where absent), opened and checked as socket_dir.h says; -1 where it
 * cannot be made or opened, or (*why set then) is not one to start a server in. */
static int checked_dir(const struct sockaddr_un *addr, const char **why)
{
    char dir[sizeof addr->sun_path];
    if (!dir_of(addr->sun_path, dir, sizeof dir) || (mkdir(dir, 0700) < 0 && errno != EEXIST))
        return -1;
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dirfd < 0 || fstat(dirfd, &st) < 0 || !socket_dir_is_roots(&st)) {
        *why = SOCKET_DIR_PROBLEM;
        if (dirfd >= 0)
            close(dirfd);
        return -1;
    }
    return dirfd;
}

int server_start_and_connect(const struct sockaddr_un *addr, pid_t wedged, const char **why)
{
    if (geteuid() != 0 || start_disabled() || !in_host_namespaces())
        return -1;
    int dirfd = checked_dir(addr, why);
    if (dirfd < 0)
        return -1;
    int sock = start_in(dirfd, addr, wedged, why);
    close(dirfd);
    return sock;
}

/* Whether process pid was started on demand: its environment (as it was executed) sets the idle exit. */
static int started_on_demand(pid_t pid)
{
    char env[MAX_CMDLINE];
    ssize_t n = proc_strings(pid, "environ", env, sizeof env - 1);
    if (n <= 0)
        return 0;
    env[n] = '\0';
    for (const char *entry = env; entry < env + n; entry += strlen(entry) + 1)
        if (!strncmp(entry, IDLE_EXIT_NAME "=", sizeof IDLE_EXIT_NAME))
            return 1;
    return 0;
}

/* With the start lock held: the listener a persistent server is, after ending one started on demand and
 * starting one in its place where needed; 0 with *why set where none could be. *started: whether it is new. */
static pid_t persistent_in(int dirfd, int lock, const struct sockaddr_un *addr, int *started, const char **why)
{
    int sock = try_connect(addr);
    pid_t listener = sock >= 0 ? listener_of(sock) : 0;
    if (sock >= 0)
        close(sock); /* a spare sees a call that ends before its message, and takes the next */
    *started = 0;
    if (sock >= 0 && listener <= 0) {
        *why = "its listener's credentials cannot be read";
        return 0;
    }
    if (sock >= 0 && (listener == 1 || !started_on_demand(listener)))
        return listener; /* PID 1: systemd's socket; else one started to stay */
    if (!replace_server(dirfd, lock, addr, sock >= 0 ? listener : 0, "on-demand", 1)) {
        *why = sock < 0 ? "it could not be forked" : "the on-demand server there did not end";
        return 0;
    }
    close(lock); /* the server holds the lock now, until it listens */
    sock = wait_and_connect(dirfd, addr, COMMAND_WAIT_MS);
    *started = 1;
    if (sock < 0) {
        *why = "it did not listen in time (its server.log may say why)";
        return 0;
    }
    listener = listener_of(sock);
    close(sock);
    if (listener <= 0)
        *why = "its listener's credentials cannot be read";
    return listener;
}

int server_start_command(const char *socket_path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *why = NULL;
    int dirfd = -1, lock = -1, started = 0;
    pid_t listener = 0;
    if (strlen(socket_path) >= sizeof addr.sun_path)
        why = "the path is too long";
    else if (geteuid() != 0)
        why = "not root";
    else if (!in_host_namespaces())
        why = "not in the host's namespaces (PID 1's mount, pid, user and network namespaces)";
    else if (strcpy(addr.sun_path, socket_path), (dirfd = checked_dir(&addr, &why)) < 0) {
        if (!why)
            why = "its directory cannot be made";
    } else if ((lock = open_roots_file(dirfd, LOCK_NAME, O_RDWR | O_CREAT, LOCK_FORBIDDEN)) < 0)
        why = LOCK_PROBLEM;
    else if (!lock_within(lock, LOCK_EX, COMMAND_WAIT_MS)) /* an on-demand start under way: after it */
        why = "its " LOCK_NAME " stayed locked";
    else
        listener = persistent_in(dirfd, lock, &addr, &started, &why);
    if (lock >= 0 && !started)
        close(lock);
    if (dirfd >= 0)
        close(dirfd);
    if (listener <= 0) {
        fprintf(stderr, "nvc-py-hook: no hook server started on %s: %s\n", socket_path, why);
        return 1;
    }
    if (started)
        printf("nvc-py-hook: started the hook server on %s (pid %d), to stay (no idle exit)\n", socket_path,
               (int)listener);
    else if (listener == 1)
        printf("nvc-py-hook: systemd's socket serves %s\n", socket_path);
    else
        printf("nvc-py-hook: the hook server on %s (pid %d) runs already, to stay\n", socket_path, (int)listener);
    return 0;
}

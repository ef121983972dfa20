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
 *   (new session, double fork: reparented to init), stdin/stdout on /dev/null, stderr appended to
 *   server.log beside the socket, with a fixed environment, and exits after an idle time.
 * - Not started where `nvc-py setup ... --no-server` wrote the no-server file beside the
 *   configuration file (NVC_PY_CONFIG's directory, else /etc/nvc-py), nor for a caller that is
 *   not root.
 * NVC_PY_HOST_PID names another process whose namespaces and cgroups stand for the host's (tests
 * run in a private mount namespace).
 */
#define _GNU_SOURCE
#include "server_start.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#define HOST_PID_ENV "NVC_PY_HOST_PID"
#define DEFAULT_CONFIG "/etc/nvc-py/config.yaml"
#define NO_SERVER_FILE "no-server"
#define SERVER_PROGRAM PROGRAM_DIR "/nvc-py-hook-python"
#define SERVER_ENV_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define IDLE_EXIT_ENV "NVC_PY_SERVE_IDLE_EXIT=600" /* seconds; hook/activation.py reads it */
#define LOCK_FD 3                                  /* NVC_PY_SERVE_LOCK_FD, as passed */

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

/* The detached server's process (the grandchild): never returns. */
static void exec_server(int lock, const char *socket_path, const char *dir)
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
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/server.log", dir);
    int err = open(log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(err >= 0 ? err : null, 2) < 0)
        _exit(127);
    if (lock == LOCK_FD ? fcntl(lock, F_SETFD, 0) < 0 : dup2(lock, LOCK_FD) < 0)
        _exit(127);
    /* nothing of the caller's (a runtime's descriptors) stays open in a long-lived daemon */
    if (syscall(SYS_close_range, LOCK_FD + 1, ~0U, 0) < 0)
        for (int fd = LOCK_FD + 1; fd < 65536; fd++)
            close(fd);
    char lock_env[32];
    snprintf(lock_env, sizeof lock_env, "NVC_PY_SERVE_LOCK_FD=%d", LOCK_FD);
    char *const env[] = {SERVER_ENV_PATH, lock_env, IDLE_EXIT_ENV, NULL};
    char *const args[] = {"nvc-py-hook", "serve", "--socket", (char *)socket_path, NULL};
    execve(SERVER_PROGRAM, args, env);
    _exit(127);
}

/* Starts the server detached, passing it the held lock; 0 when it could not be forked. */
static int spawn_server(int lock, const char *socket_path, const char *dir)
{
    pid_t child = fork();
    if (child < 0)
        return 0;
    if (child == 0) {
        setsid();
        pid_t server = fork();
        if (server == 0)
            exec_server(lock, socket_path, dir);
        _exit(server < 0);
    }
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Waits (bounded) until nobody holds the start lock, then connects. */
static int wait_and_connect(const char *lock_path, const struct sockaddr_un *addr)
{
    int lock = open(lock_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (lock < 0)
        return -1;
    struct timespec pause = {.tv_nsec = 1000000};
    for (int waited = 0; flock(lock, LOCK_SH | LOCK_NB) < 0; waited++) {
        if (waited >= START_WAIT_MS) {
            close(lock);
            return -1;
        }
        nanosleep(&pause, NULL);
    }
    close(lock);
    return try_connect(addr);
}

int server_start_and_connect(const struct sockaddr_un *addr)
{
    char dir[sizeof addr->sun_path], lock_path[sizeof addr->sun_path + 16];
    if (geteuid() != 0 || !dir_of(addr->sun_path, dir, sizeof dir) || start_disabled() || !in_host_namespaces())
        return -1;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -1;
    snprintf(lock_path, sizeof lock_path, "%s/server.lock", dir);
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock < 0)
        return -1;
    if (flock(lock, LOCK_EX | LOCK_NB) == 0) {
        int sock = try_connect(addr); /* a server another client started since this one's connect failed */
        if (sock >= 0) {
            close(lock);
            return sock;
        }
        if (!spawn_server(lock, addr->sun_path, dir)) {
            close(lock);
            return -1;
        }
    }
    close(lock); /* the server holds the lock now, until it listens */
    return wait_and_connect(lock_path, addr);
}

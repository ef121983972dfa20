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
 * (/proc/self/exe), not argv[0]'s.
 *
 * A Python program pays for an interpreter start and its imports at every run (most of its cost:
 * ~100 ms of a hook's ~130 ms on the H100 host, ~100 ms of `nvc-py info`'s ~120); the server has
 * imported everything once and keeps a worker forked ahead of each call (an idle one even has
 * NVML loaded). This client sends its arguments, its environment, its standard streams (the OCI
 * state arrives on stdin; errors go to the runtime's stderr) and its working directory over the
 * server's socket and exits with the worker's status.
 *
 * Where no server answers (not running, no socket, not root: the socket is root's alone), or the
 * server says so (this process is in other namespaces than the server's), or the call is `serve`
 * itself, it executes the Python program with the same arguments: the same result, only slower.
 * Once a worker took the call it never falls back (the worker may have changed the container
 * already): a worker that ends without a status is an error. A call no worker read (the server was
 * killed with it queued) is reset by the kernel (ECONNRESET, where a worker that read it and ended
 * gives end of file): that one falls back.
 *
 * A hook call that finds no server at all starts one where the host runs none (server_start.c):
 * a host is served without setting a daemon up.
 *
 * Socket: $NVC_PY_HOOK_SOCKET, else /run/nvc-py/hook.sock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/nvc-py/hook.sock"
#define MAGIC "nvc-py-hook/1"
#define MAX_MESSAGE (64 * 1024) /* the server reads no more */
#define CLIENT_NAME "nvc-py-hook-client"

#include "server_start.h"

extern char **environ;

static const char *self;   /* this program's name in messages */
static const char *target; /* the Python program: what runs when no server does */

/* Runs the call here, in the Python program (never this front again). */
static void fall_back(char **argv)
{
    execv(target, argv);
    fprintf(stderr, "%s: cannot execute %s: %s\n", self, target, strerror(errno));
    exit(127);
}

/* Appends s and its NUL; 0 when the message would outgrow MAX_MESSAGE. */
static int put(char *buf, size_t *len, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*len + n > MAX_MESSAGE)
        return 0;
    memcpy(buf + *len, s, n);
    *len += n;
    return 1;
}

/* The message for argv (argc strings) and this process's environment. */
static int build_message(char *buf, size_t *len, int argc, char **argv)
{
    char count[32];
    int envc = 0;
    while (environ[envc])
        envc++;
    if (!put(buf, len, MAGIC))
        return 0;
    snprintf(count, sizeof count, "%d", argc);
    if (!put(buf, len, count))
        return 0;
    snprintf(count, sizeof count, "%d", envc);
    if (!put(buf, len, count))
        return 0;
    for (int i = 0; i < argc; i++)
        if (!put(buf, len, argv[i]))
            return 0;
    for (int i = 0; i < envc; i++)
        if (!put(buf, len, environ[i]))
            return 0;
    return 1;
}

/* Sends the message with descriptors 0, 1, 2 and the working directory attached. */
static int send_call(int sock, const char *buf, size_t len, int cwd)
{
    int fds[4] = {0, 1, 2, cwd};
    char control[CMSG_SPACE(sizeof fds)];
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent;
    do
        sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)len;
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

int main(int argc, char **argv)
{
    static char exe[4096];
    const char *base = own_name(argv[0], exe, sizeof exe);
    self = base;
    char program[4096];
    if (!strcmp(base, CLIENT_NAME)) { /* the program's path comes first */
        if (argc < 2 || argv[1][0] != '/') {
            fprintf(stderr, "usage: " CLIENT_NAME " /ABSOLUTE/PATH/nvc-py-hook STAGE [ARG...]\n"
                            "       " CLIENT_NAME " /ABSOLUTE/PATH/nvc-py [ARG...]\n");
            return 2;
        }
        argc--;
        argv++;
        target = argv[0];
    } else { /* the front of the program named like this one */
        if ((size_t)snprintf(program, sizeof program, PROGRAM_DIR "/%s-python", base) >= sizeof program) {
            fprintf(stderr, "%s: name too long\n", base);
            return 2;
        }
        target = program;
        argv[0] = (char *)base; /* what the server runs */
    }
    /* From here argv is the call; the server runs the program its argv[0]'s basename names. */
    if (is_serve(argc, argv))
        fall_back(argv);
    /* A stream the runtime left closed is passed as /dev/null, never as another open file. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
            fall_back(argv);

    const char *path = getenv("NVC_PY_HOOK_SOCKET");
    if (!path || !*path)
        path = DEFAULT_SOCKET;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        fall_back(argv);
    strcpy(addr.sun_path, path);

    static char buf[MAX_MESSAGE];
    size_t len = 0;
    if (!build_message(buf, &len, argc, argv))
        fall_back(argv);
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0)
        fall_back(argv);
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        fall_back(argv);
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int failed = errno;
        close(sock);
        /* no server: a container start's hook call starts one (server_start.c) */
        sock = (failed == ENOENT || failed == ECONNREFUSED) && server_start_wanted(argc, argv)
                   ? server_start_and_connect(&addr) : -1;
        if (sock < 0)
            fall_back(argv);
    }
    if (!send_call(sock, buf, len, cwd))
        fall_back(argv); /* nothing was handed over yet */

    char reply[64];
    ssize_t n;
    do
        n = recv(sock, reply, sizeof reply - 1, 0);
    while (n < 0 && errno == EINTR);
    int status;
    if (n < 0 && errno == ECONNRESET) /* the message was never read: the server went before a worker took it */
        fall_back(argv);
    if (n > 0) {
        reply[n] = '\0';
        if (sscanf(reply, "exit %d", &status) == 1 && status >= 0 && status <= 255)
            return status;
        if (!strcmp(reply, "fall back")) /* other namespaces than the server's: nothing was done */
            fall_back(argv);
    }
    fprintf(stderr, "%s: the hook server's worker ended without a status (%s)\n", self,
            n < 0 ? strerror(errno) : "no answer");
    return 1;
}

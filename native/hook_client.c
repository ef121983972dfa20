/* nvc-py-hook-client: hands one call of nvc-py-hook (or nvc-py) to a running `nvc-py-hook serve`.
 *
 * Registered as the hook instead of nvc-py-hook itself:
 *     nvc-py-hook-client /usr/local/bin/nvc-py-hook prestart
 * or in a hook script, for the CLI:
 *     nvc-py-hook-client /usr/local/bin/nvc-py configure --pid PID ... ROOTFS
 * A Python hook pays for an interpreter start and its imports at every container start (most of
 * its cost); the server has imported everything once and forks a worker per call. This client
 * sends its arguments, its environment, its standard streams (the OCI state arrives on stdin;
 * errors go to the runtime's stderr) and its working directory over the server's socket and
 * exits with the worker's status.
 *
 * Where no server answers (not running, no socket), or the server says so (this process is in
 * other namespaces than the server's), it executes the program given as its first argument,
 * with the remaining arguments: the same result, only slower. Once a worker took the call it
 * never falls back (the worker may have changed the container already): a worker that ends
 * without a status is an error.
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

extern char **environ;

static void fall_back(char **argv)
{
    execv(argv[1], argv + 1);
    fprintf(stderr, "nvc-py-hook-client: cannot execute %s: %s\n", argv[1], strerror(errno));
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

static int build_message(char *buf, size_t *len, int argc, char **argv)
{
    char count[32];
    int envc = 0;
    while (environ[envc])
        envc++;
    if (!put(buf, len, MAGIC))
        return 0;
    snprintf(count, sizeof count, "%d", argc - 1);
    if (!put(buf, len, count))
        return 0;
    snprintf(count, sizeof count, "%d", envc);
    if (!put(buf, len, count))
        return 0;
    for (int i = 1; i < argc; i++)
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

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] != '/') {
        fprintf(stderr, "usage: nvc-py-hook-client /ABSOLUTE/PATH/nvc-py-hook STAGE [ARG...]\n"
                        "       nvc-py-hook-client /ABSOLUTE/PATH/nvc-py [ARG...]\n");
        return 2;
    }
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
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0 || !send_call(sock, buf, len, cwd))
        fall_back(argv); /* nothing was handed over yet */

    char reply[64];
    ssize_t n;
    do
        n = recv(sock, reply, sizeof reply - 1, 0);
    while (n < 0 && errno == EINTR);
    int status;
    if (n > 0) {
        reply[n] = '\0';
        if (sscanf(reply, "exit %d", &status) == 1 && status >= 0 && status <= 255)
            return status;
        if (!strcmp(reply, "fall back")) /* other namespaces than the server's: nothing was done */
            fall_back(argv);
    }
    fprintf(stderr, "nvc-py-hook-client: the hook server's worker ended without a status (%s)\n",
            n < 0 ? strerror(errno) : "no answer");
    return 1;
}

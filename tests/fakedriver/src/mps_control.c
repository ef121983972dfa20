/* The fake nvidia-cuda-mps-control: enough of MPS's control daemon for tests of the daemons nvc-py
 * runs. Test double only.
 *
 *   -d: needs CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY (as the real one: an error
 *       naming the variable without them); daemonizes (the caller's process returns 0), then makes
 *       the pipe directory's `control` FIFO (0666) and `nvidia-cuda-mps-control.pid` (the real
 *       daemon's pid file), and in the log directory `control.log`, `env` (the environment it was
 *       started with, a line each) and `clients`, where each client's line goes. It reads the FIFO:
 *       `quit` ends it (the FIFO and the pid file removed, "quit" logged); `client ...` (what the
 *       fake libcuda's cuInit writes) is appended to `clients`; anything else is logged.
 *   without -d: the control client: each line of stdin written to the daemon's FIFO; no daemon
 *       reading it is exit 1 with the real client's message.
 *
 * The real control socket is a Unix socket and the clients reach a server it starts; a FIFO is
 * enough to see who connected with which variables. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_machine.h"

extern char **environ;

static const char *need(const char *name)
{
    const char *value = getenv(name);
    if (!value || !*value) {
        fprintf(stderr, "%s must be set to start or to communicate with MPS control daemon\n", name);
        exit(1);
    }
    return value;
}

static void append(const char *dir, const char *name, const char *line)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s\n", line);
    fclose(f);
}

static int serve(const char *pipe_dir, const char *log_dir)
{
    char control[4096], pidfile[4096], line[8192];
    snprintf(control, sizeof control, "%s/control", pipe_dir);
    snprintf(pidfile, sizeof pidfile, "%s/nvidia-cuda-mps-control.pid", pipe_dir);
    unlink(control);
    if (mkfifo(control, 0666) || chmod(control, 0666)) return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/env", log_dir);
    FILE *env = fopen(path, "w");
    if (!env) return 1;
    for (char **e = environ; *e; e++) fprintf(env, "%s\n", *e);
    fclose(env);
    snprintf(line, sizeof line, "Starting control daemon using socket %s (fake, driver %s)", control,
             FAKE_DRIVER_VERSION);
    append(log_dir, "control.log", line);
    snprintf(path, sizeof path, "%s/clients", log_dir);
    close(open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    int fd = open(control, O_RDWR | O_CLOEXEC); /* a writer of its own: no end of file between clients */
    if (fd < 0) return 1;
    FILE *pf = fopen(pidfile, "w");
    if (!pf) return 1;
    fprintf(pf, "%d\n", (int)getpid()); /* last: the daemon is ready once its pid is there */
    fclose(pf);
    FILE *in = fdopen(fd, "r");
    while (fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strcmp(line, "quit")) {
            unlink(control);
            unlink(pidfile);
            append(log_dir, "control.log", "quit");
            return 0;
        }
        append(log_dir, strncmp(line, "client ", 7) ? "control.log" : "clients", line);
    }
    return 1;
}

int main(int argc, char **argv)
{
    const char *pipe_dir = need("CUDA_MPS_PIPE_DIRECTORY");
    if (argc > 1 && !strcmp(argv[1], "-d")) {
        const char *log_dir = need("CUDA_MPS_LOG_DIRECTORY");
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid > 0) return 0;
        setsid();
        if (fork() != 0) _exit(0);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (chdir("/")) _exit(1);
        _exit(serve(pipe_dir, log_dir));
    }
    char control[4096], line[4096];
    snprintf(control, sizeof control, "%s/control", pipe_dir);
    int fd = open(control, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "Cannot find MPS control daemon process\n");
        return 1;
    }
    while (fgets(line, sizeof line, stdin))
        if (write(fd, line, strlen(line)) < 0) return 1;
    close(fd);
    return 0;
}

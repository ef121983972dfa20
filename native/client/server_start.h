/* Starting `nvc-py-hook serve` on demand from the hook client (server_start.c). */
#ifndef NVC_SERVER_START_H
#define NVC_SERVER_START_H

#include <sys/types.h>
#include <sys/un.h>

#ifndef PROGRAM_DIR
#define PROGRAM_DIR "/usr/lib/nvc-py" /* where make install writes the Python programs' launchers */
/* `nvc-py-hook start-server`: a server on socket_path that stays (no idle exit), for hosts where no systemd
 * runs it (`nvc-py setup`): started detached as on demand, in the place of one started on demand there; one
 * that stays already, or systemd's socket, is kept. One line on stdout, or why not on stderr; the exit status. */
int server_start_command(const char *socket_path);

#endif

/* Whether this call (argv[0] the program's name) is a container start's hook call: those start a server. */
int server_start_wanted(int argc, char **argv);

/* A connection to a server at addr that this call started, or that another client started and this
 * one waited for (bounded); -1 when there is none: the caller runs the program itself (*why says why where
 * the socket's directory, or the start lock there, is not one to start a server with). wedged: the pid of a
 * server the call found wedged, which this start replaces (0: none). */
int server_start_and_connect(const struct sockaddr_un *addr, pid_t wedged, const char **why);

/* `nvc-py-hook start-server`: a server on socket_path that stays (no idle exit), for hosts where no systemd
 * runs it (`nvc-py setup`): started detached as on demand, in the place of one started on demand there; one
 * that stays already, or systemd's socket, is kept. One line on stdout, or why not on stderr; the exit status. */
int server_start_command(const char *socket_path);

#endif

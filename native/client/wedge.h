/* Telling a wedged hook server from a busy one, so that a wedged server costs one call its hand-over timeout,
 * not every call (wedge.c). As hook/server/handover.py's. */
#ifndef NVC_WEDGE_H
#define NVC_WEDGE_H

#include <sys/types.h>

#define WEDGED_NAME "server.wedged" /* the marker, beside the socket */
#define WEDGED_RETRY_S 10           /* seconds a marker keeps calls away before one call tries the server again */
#define WEDGE_SLICE_MS 20           /* how often a call waiting for `ready` looks again */

enum wedge_marker {
    WEDGE_NONE,  /* no marker (or none to trust): try the server */
    WEDGE_FRESH, /* a call timed out on the server less than WEDGED_RETRY_S ago, or another call is trying it
                    again now: run the program here */
    WEDGE_PROBE, /* an older marker, and this call is the one to try the server again (it holds the marker) */
};

/* Whether the process listening on the connected socket sock is stopped (SIGSTOP, a tracer's stop);
 * *pid: its pid as SO_PEERCRED gives it (0 where unknown: then it is not known to be stopped). */
int wedge_listener_stopped(int sock, pid_t *pid);

/* The marker in the checked socket directory dirfd. With WEDGE_PROBE, *held is the marker's descriptor (locked;
 * its time set to now, so other calls keep away while this one tries): close it when done; -1 otherwise. */
enum wedge_marker wedge_marker_check(int dirfd, int *held);

/* Whether a fresh marker stands in dirfd now (another call timed out while this one waited). */
int wedge_marker_fresh(int dirfd);

/* Marks the server wedged (a call got no `ready` in time), or clears the mark (a server answered). */
void wedge_marker_set(int dirfd);
void wedge_marker_clear(int dirfd);

#endif

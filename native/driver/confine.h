/* The driver helper's row of nvc/system/confinement.py (DRIVER_HELPER), for the native driver snapshot. */
#ifndef NVC_DRIVER_CONFINE_H
#define NVC_DRIVER_CONFINE_H

#include <sys/types.h>

/* What a failed step says, as the Python steps raise it: kind is an nvc.errors kind ("permission",
 * "initialization"), message names the step and the path or user. */
struct confine_failure {
    const char *kind;
    char message[512];
};

/* Takes the row's steps in confinement.py's order: the root's change (a chroot, none for "/"), the bounding
 * set emptied (where CAP_SETPCAP allows), the switch to uid:gid with no supplementary groups (where it is
 * not the caller's already; PDEATHSIG armed again, the kernel clears it there), every capability set
 * emptied, NO_NEW_PRIVS. 0 when all were taken, else -1 with *failure filled. parent: the process that
 * must still be this one's parent (it exits at once where it is gone). */
int confine_driver_helper(const char *root, uid_t uid, gid_t gid, pid_t parent, struct confine_failure *failure);

#endif

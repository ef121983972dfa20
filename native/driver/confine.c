/* The driver helper's confinement in C: nvc/system/confinement.py's DRIVER_HELPER row, step by step in that
 * module's order (STEPS), with its messages. That row keeps nothing: NVML from the driver root runs chrooted
 * into it, as the kernel's overflow user (or the unprivileged caller itself), with no capability and
 * NO_NEW_PRIVS, so that a driver root can at most lie to nvc-py. tests/test_driver_snapshot.py checks the
 * process against the row. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "confine.h"

/* -1, with *failure saying "WHAT: <errno's text>" (what as the Python step words it). */
static int fail(struct confine_failure *failure, const char *kind, const char *what)
{
    failure->kind = kind;
    snprintf(failure->message, sizeof failure->message, "%s: %s", what, strerror(errno));
    return -1;
}

/* PDEATHSIG (SIGKILL) armed; exits at once where the parent is gone already. */
static void die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
}

static int effective_setpcap(void)
{
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    if (syscall(SYS_capget, &header, data) < 0)
        return 0;
    return (data[CAP_TO_INDEX(CAP_SETPCAP)].effective & CAP_TO_MASK(CAP_SETPCAP)) != 0;
}

int confine_driver_helper(const char *root, uid_t uid, gid_t gid, pid_t parent, struct confine_failure *failure)
{
    die_with_parent(parent);
    char what[sizeof failure->message - 64];
    if (strcmp(root, "/")) { /* change_root */
        snprintf(what, sizeof what, "chroot failed: %s", root);
        if (chroot(root) < 0 || chdir("/") < 0)
            return fail(failure, errno == EPERM || errno == EACCES ? "permission" : "initialization", what);
    }
    if (effective_setpcap()) /* limit_bounding: the row keeps nothing */
        for (int cap = 0; prctl(PR_CAPBSET_READ, cap) >= 0; cap++)
            if (prctl(PR_CAPBSET_DROP, cap) < 0)
                return fail(failure, "initialization", "cannot limit the bounding set");
    /* switch_identity: given, with no supplementary groups (an unprivileged caller keeps its own, groups too) */
    int own = uid == geteuid() && gid == getegid();
    if (!own || getgroups(0, NULL) > 0) {
        snprintf(what, sizeof what, "cannot switch to user %u:%u", (unsigned)uid, (unsigned)gid);
        if ((setgroups(0, NULL) < 0 && (errno != EPERM || !own)) || setresgid(gid, gid, gid) < 0 ||
            setresuid(uid, uid, uid) < 0)
            return fail(failure, errno == EPERM || errno == EACCES ? "permission" : "initialization", what);
    }
    die_with_parent(parent);
    /* limit_caps: effective, inheritable (and so ambient) and permitted emptied */
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &header, none) < 0)
        return fail(failure, "initialization", "cannot drop capabilities");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) /* set_no_new_privs */
        return fail(failure, "initialization", "cannot set NO_NEW_PRIVS");
    return 0;
}

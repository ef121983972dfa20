/* The launch queue (launches.c): what the launch entry points and the rest of the shim call of it. */
#ifndef NVC_LAUNCHES_H
#define NVC_LAUNCHES_H

#include "base/ground.h"
#include "base/real.h"

struct nvc_device;

/* One launch as the queue sees it. */
struct nvc_launch {
    struct nvc_device *dev; /* the current context's device (devices.h; NULL: not one the shim knows) */
    int ptsz;               /* on the per-thread default stream */
    CUstream stream;
    double factor;   /* the fraction of the device its grid occupies */
    const void *key; /* the CUfunction or CUgraphExec */
};

/* Makes the launch: fn(args), the driver's call. */
typedef CUresult (*nvc_launch_fn)(const void *args);

/* Waits for the cap's slice and the scheduler's turn, then launches between two events. */
CUresult nvc_launch_throttled(const struct nvc_launch *l, nvc_launch_fn fn, const void *args);

void nvc_launches_fork(enum nvc_fork_phase phase);

#endif

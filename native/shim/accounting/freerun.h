/* Launches that run free (freerun.c): what the launch entry points and the launch queue call of it. */
#ifndef NVC_FREERUN_H
#define NVC_FREERUN_H

#include <stdint.h>

struct nvc_sched_entry;

/* Whether a launch of kernel `key` (nvc_kernel_key, or a CUgraphExec) may go straight to the driver now:
 * no driver call. */
int nvc_launches_free(const void *key);

/* After a launch on device dev through the launch queue's whole path: where `free_of` (the tenant's scheduler
 * entry there) is given, launches go free from now until the next look at the backlog is due, unless this
 * process has launched on another device too. Whether they may go free now. */
int nvc_freerun_after(int dev, struct nvc_sched_entry *free_of, uint64_t now);

/* The work (its kernels' least times, ns) launched free since the last call: a look at the backlog takes it. */
int64_t nvc_freerun_launched(void);

/* A forked child forgets its parent's (it has not launched yet). */
void nvc_freerun_forget(void);

#endif

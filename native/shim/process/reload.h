/* Limits changed while the container runs (reload.c): `nvc-py share set` rewrites the limits file in place. */
#ifndef NVC_RELOAD_H
#define NVC_RELOAD_H

#include "base/ground.h"

#define NVC_RELOAD_NS 200000000ull /* a process looks at its limits file at most every 200 ms */

/* nvc_init, then, at most every NVC_RELOAD_NS, the limits file looked at: a change is put in force in this
 * process before the call goes on. What every wrapper calls first. */
enum nvc_state nvc_ready(void);
void nvc_reload_fork(enum nvc_fork_phase phase);

#endif

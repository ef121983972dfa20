/* Launch throttling (launch.c): what the rest of the shim calls of it. */
#ifndef NVC_LAUNCH_H
#define NVC_LAUNCH_H

#include "ground.h"

void nvc_launch_fork(enum nvc_fork_phase phase);

#endif

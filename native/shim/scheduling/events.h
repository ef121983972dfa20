/* A pool of CUDA events for launch.c's measurements (events.c): creating two events per launch would
 * cost a launch-bound loop more than the launches. Callers serialise (launch.c's lock). */
#ifndef NVC_EVENTS_H
#define NVC_EVENTS_H

#include "base/real.h"

/* An event of context ctx, from the pool or new; NULL when none can be created. */
CUevent nvc_event_get(CUcontext ctx);
/* Back to the pool (destroyed when it is full). */
void nvc_event_put(CUevent ev, CUcontext ctx);
/* Records ev on the launch's stream (the per-thread default stream where it is _ptsz). */
void nvc_event_record(CUevent ev, CUstream stream, int ptsz);
/* In a forked child: the parent's events mean nothing there. */
void nvc_events_forget(void);

#endif

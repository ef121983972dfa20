/* When a measured launch's work ended on the GPU (launchend.c): what launches.c's settling asks, a pure
 * function over what the process knows then, loaded alone by tests/test_share_launchend.py. */
#ifndef NVC_LAUNCHEND_H
#define NVC_LAUNCHEND_H

#include <stdint.h>

/* The end of a launch whose end event has completed, all times in ns of nvc_now_ns's clock:
 * done: when the process's measured work was estimated to end before it; launched: its (group's first)
 * launch; opened: when the gate it was queued behind opened (0: none); full: its measured time, start
 * event to end event; between: from the previous settled end event to its own, where that is known and
 * not negative, else -1; settled: now, after its end event was seen complete. */
uint64_t nvc_launch_end_ns(uint64_t done, uint64_t launched, uint64_t opened, uint64_t full, int64_t between,
                           uint64_t settled);

#endif

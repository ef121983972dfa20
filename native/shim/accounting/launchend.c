/* A measured launch's end on the GPU. Launched behind queued work, it ended the time between the two end
 * events after the previous end (the gaps between kernels included: thousands of microsecond kernels add
 * up); launched to an idle queue, its measured time after its launch, or after its gate opened. Whatever
 * that reconstruction says, the work ended before its end event was seen complete: kernels of other
 * streams (an MPS client's, or a library's side streams) finish out of order, and an end estimated from
 * the previous one plus each launch's whole time would otherwise run ahead of the clock without bound, and
 * a cap would charge every moment up to it as the container's work (region.c) and never refill. */
#include "accounting/launchend.h"

uint64_t nvc_launch_end_ns(uint64_t done, uint64_t launched, uint64_t opened, uint64_t full, int64_t between,
                           uint64_t settled)
{
    uint64_t end;
    if (between >= 0 && launched < done)
        end = done + (uint64_t)between;
    else {
        uint64_t from = launched > done ? launched : done;
        end = (opened > from ? opened : from) + full;
    }
    return end < settled ? end : settled;
}

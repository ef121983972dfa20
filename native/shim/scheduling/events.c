/* See events.h. */
#include "scheduling/events.h"

#define MAX_FREE_EVENTS 1024

static struct {
    CUevent ev;
    CUcontext ctx;
} free_events[MAX_FREE_EVENTS];
static int nfree;

CUevent nvc_event_get(CUcontext ctx)
{
    for (int i = nfree - 1; i >= 0; i--)
        if (free_events[i].ctx == ctx) {
            CUevent ev = free_events[i].ev;
            free_events[i] = free_events[--nfree];
            return ev;
        }
    CUevent ev = NULL;
    if (nvc_cuda.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    return ev;
}

void nvc_event_put(CUevent ev, CUcontext ctx)
{
    if (nfree < MAX_FREE_EVENTS) {
        free_events[nfree].ev = ev;
        free_events[nfree++].ctx = ctx;
    } else if (nvc_cuda.cuEventDestroy_v2) {
        nvc_cuda.cuEventDestroy_v2(ev);
    }
}

void nvc_events_forget(void)
{
    nfree = 0;
}

void nvc_event_record(CUevent ev, CUstream stream, int ptsz)
{
    if (ptsz && nvc_cuda.cuEventRecord_ptsz)
        nvc_cuda.cuEventRecord_ptsz(ev, stream);
    else
        nvc_cuda.cuEventRecord(ev, stream);
}

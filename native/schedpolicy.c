/* See schedpolicy.h. */
#include "schedpolicy.h"

int nvc_sched_active(const struct nvc_sched_view *v, uint64_t now)
{
    if (v->capped)
        return 0;
    return now < v->seen_ns + NVC_SCHED_ACTIVE_NS || now < v->busy_until_ns;
}

static int before(uint64_t vtime_a, uint64_t id_a, uint64_t vtime_b, uint64_t id_b)
{
    return vtime_a < vtime_b || (vtime_a == vtime_b && id_a < id_b);
}

enum nvc_sched_decision nvc_sched_decide(const struct nvc_sched_view *self, const struct nvc_sched_view *others,
                                         int n, uint64_t now)
{
    int any = 0, occupied = 0, lowest = 1, outranked = 0;
    uint64_t min_vtime = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        const struct nvc_sched_view *o = &others[i];
        if (now + NVC_SCHED_HANDOVER_NS < o->busy_until_ns)
            occupied = 1;             /* its work is still on the GPU, capped or not: let it drain */
        if (!nvc_sched_active(o, now))
            continue;
        any = 1;
        if (o->vtime < min_vtime)
            min_vtime = o->vtime;
        if (before(o->vtime, o->id, self->vtime, self->id)) {
            lowest = 0;
            outranked |= o->running;
        }
        if (o->running)
            occupied = 1;
    }
    if (!any)
        return occupied && !self->running ? NVC_SCHED_WAIT : NVC_SCHED_RUN;
    if (self->running && outranked)
        return NVC_SCHED_WAIT;        /* two took the turn at once (each found itself alone): one yields */
    if (self->running)
        return self->vtime <= min_vtime + NVC_SCHED_SLICE_NS * NVC_WEIGHT_UNIT / (self->weight ? self->weight : 1)
                   ? NVC_SCHED_RUN : NVC_SCHED_WAIT;
    return !occupied && lowest ? NVC_SCHED_RUN : NVC_SCHED_WAIT;
}

uint64_t nvc_sched_catch_up(uint64_t vtime, const struct nvc_sched_view *others, int n, uint64_t now)
{
    uint64_t min_vtime = UINT64_MAX;
    for (int i = 0; i < n; i++)
        if (nvc_sched_active(&others[i], now) && others[i].vtime < min_vtime)
            min_vtime = others[i].vtime;
    return min_vtime != UINT64_MAX && min_vtime > vtime ? min_vtime : vtime;
}

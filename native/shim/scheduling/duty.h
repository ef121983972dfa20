/* A time-sliced weight's duty cycle as the launch queue applies it (duty.c; the rule is schedpolicy.h's
 * nvc_sched_duty): the cap in force on a device now. */
#ifndef NVC_DUTY_H
#define NVC_DUTY_H

#include <stdint.h>
#include "base/ground.h"

struct nvc_sched_entry;
/* The cap in force on region device dev now: `compute` where it is a cap (< 100) or the tenant has no
 * weight (or no scheduler entry e), else the duty cycle's percent, or 100 where none holds. The duty is
 * looked at again at most every millisecond. When it goes out of force, the slice's overrun account is
 * closed (nvc_region_slice_off): what then runs free is never charged to the next slice. */
unsigned nvc_duty_cap(int dev, struct nvc_sched_entry *e, unsigned compute, unsigned weight, uint64_t now);
/* For the gate thread: the cap in force on dev now, where a gate closed at `closed_at` percent was a duty's
 * (then as nvc_duty_cap), else closed_at. */
unsigned nvc_duty_in_force(int dev, unsigned closed_at, uint64_t now);
/* Times this process saw a duty come into force, for its exit log. */
extern uint64_t nvc_duty_engaged;
void nvc_duty_fork(enum nvc_fork_phase phase);

#endif

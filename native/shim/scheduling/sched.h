/* Weighted scheduling between containers (sched.c; the decisions are schedpolicy.c's). */
#ifndef NVC_SCHED_H
#define NVC_SCHED_H

#include <stdint.h>
#include "base/config.h"
#include "base/ground.h"

struct nvc_sched_entry;
/* Opens this container's scheduler file and its peers' directory (fixed paths in a container,
 * NVC_SHARE_SCHED_DIR/NVC_SHARE_TENANT otherwise); 0 when there is none (no cross-container
 * scheduling: the cap alone applies). */
int nvc_sched_open(const struct nvc_config *cfg); /* again: 1 when open already */
/* This tenant's entry for device `key`, its weight, cap and latency class (enum nvc_class) set, and whether
 * it is a client of the device's MPS daemon. */
struct nvc_sched_entry *nvc_sched_device(const char *key, unsigned weight, unsigned cap, unsigned klass, int mps);
/* A tenant launches (schedpolicy.h: its backlog): it is active now, and its look found the work queued
 * at its previous look still queued (pending), or that much work queued at once since (backlogged). */
void nvc_sched_backlog(struct nvc_sched_entry *e, uint64_t now, int backlogged, int pending);
/* A time-sliced weight's duty cycle now (schedpolicy.h nvc_sched_duty): percent, 0 for none; published in
 * e's entry. */
unsigned nvc_sched_duty_now(struct nvc_sched_entry *e, uint64_t now);
/* Whether an MPS client's duty cycle holds now: a heavier MPS client on e's device is active and backlogged. */
int nvc_sched_on_duty(struct nvc_sched_entry *e, uint64_t now);
/* Whether a latency-critical tenant shares e's device and e is not one (at the last look): e's queue is
 * kept within NVC_SCHED_URGENT_BUDGET_NS, all that may run ahead of the urgent tenant's next kernel. */
int nvc_sched_yields(const struct nvc_sched_entry *e);
/* A latency-critical tenant alone in its class on e's device (no other latency-critical tenant there at the
 * last look, taken again every RESCAN_NS): nothing holds its launches and nothing it is charged matters to
 * anyone, so it only publishes that it launched now (the others hold while it does) and launches; 0 for
 * any other tenant, or NULL. */
int nvc_sched_unhindered(struct nvc_sched_entry *e, uint64_t now);
/* Before a launch: an enum nvc_sched_decision (schedpolicy.h): 0 = wait (over its share while another
 * wants more), else it may launch now (2: within its share; 3: nothing can hold it). capped: held back by
 * its own cap. */
int nvc_sched_ready(struct nvc_sched_entry *e, uint64_t now, int capped);
/* A launch goes in, or launches were measured: queued_ns of estimated work is now queued (0: none). */
void nvc_sched_launched(struct nvc_sched_entry *e, uint64_t now, int64_t queued_ns);
void nvc_sched_queued(struct nvc_sched_entry *e, uint64_t now, int64_t queued_ns);
/* A launch measured: it ran on the GPU from began_ns to ended_ns (CLOCK_MONOTONIC), cost_ns of it at
 * the grid's part of the device. Charged its work_ns where known (what the kernel takes when nothing
 * slows it: its useful work, however the GPU time-sliced it with others), else the part of its elapsed
 * time the GPU was this tenant's (nvc_sched_charge). */
void nvc_sched_measured(struct nvc_sched_entry *e, uint64_t now, uint64_t began_ns, uint64_t ended_ns, uint64_t cost_ns,
                        uint64_t work_ns);
/* Launches not measured (they ran free: accounting/freerun.c): charged their work_ns, their kernels' least
 * times, as a measured launch whose work is known is. */
void nvc_sched_ran(struct nvc_sched_entry *e, uint64_t now, uint64_t work_ns);
/* Whether another tenant was active on e's device, or had work queued there, at the last look (the
 * scheduler's last word at a launch): alone, nothing it is charged matters to anyone yet. */
int nvc_sched_contended(const struct nvc_sched_entry *e);
/* Waiting for its own queue to drain: looks how many tenants share the GPU meanwhile. */
void nvc_sched_observe(struct nvc_sched_entry *e, uint64_t now);
void nvc_sched_fork(enum nvc_fork_phase phase);

#endif

/* Initialisation at the first wrapped call (init.c): the limits in force and which of them apply. */
#ifndef NVC_INIT_H
#define NVC_INIT_H

#include "base/config.h"
#include "base/ground.h"

extern struct nvc_config nvc_cfg;
extern int nvc_mem_limited;     /* some device has a memory limit */
extern int nvc_compute_limited; /* some device has a compute share below 100, a weight or a latency class */
enum nvc_state nvc_init(void);  /* idempotent */
/* Sets the two flags above for these limits (at init, and when they change: a flag once set stays set, so
 * memory charged before a change is still released, and launches already queued are still tracked). */
void nvc_limits_in_force(const struct nvc_config *cfg);
/* The limits were put in force in this process (the state may have failed since): from then on
 * fork must take every shim mutex (shim.c's handlers do nothing before). */
int nvc_init_activated(void);
/* A container shared through MPS: its limits file's mps.NAME=VALUE lines set in this process's
 * environment (called as the library loads, before anything can reach the driver's cuInit). */
void nvc_mps_env(void);

#endif

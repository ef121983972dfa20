/* This process's devices (devices.c): each one's limits, region entry and scheduler entry, found by
 * CUDA ordinal or by UUID key (NVML). */
#ifndef NVC_DEVICES_H
#define NVC_DEVICES_H

#include <stdint.h>
#include "base/config.h"
#include "base/ground.h"
#include "base/real.h"

struct nvc_sched_entry;
struct nvc_device {
    int valid;
    int region_index;      /* index in the region's device table */
    uint64_t memory_limit; /* 0 = unlimited */
    unsigned compute;      /* percent; 100 = unthrottled */
    unsigned weight;       /* share of the GPU among busy containers; 0 = not weighted */
    unsigned sm_count;
    struct nvc_sched_entry *sched; /* this container's scheduler entry, NULL when not time-sliced */
    struct nvc_sched_entry *mps;   /* the same for an MPS client with a weight (schedpolicy.h), else NULL */
    int ordinal;                   /* CUDA ordinal; -1 when found by NVML handle */
    int nvml_index;                /* NVML index for index-keyed limits; -1 when unknown */
    char key[NVC_UUID_KEY_LEN];    /* UUID key (the limits' and the region's) */
};
struct nvc_device *nvc_device_by_ordinal(CUdevice dev);
struct nvc_device *nvc_device_current(CUdevice *ordinal);
struct nvc_device *nvc_device_by_key(const char *key, int nvml_index);
/* The limits changed (reload.c): `cfg` becomes nvc_cfg, and every device this process uses takes its
 * new memory limit, compute cap and weight at once (its region and scheduler entries too). */
void nvc_devices_reconfigure(const struct nvc_config *cfg);
void nvc_devices_fork(enum nvc_fork_phase phase);

#endif

/* The shim's state (shim.c): initialisation, logging, this process's devices, the re-entrancy
 * guard, and the fork phases every file with a mutex takes part in. */
#ifndef NVC_SHIM_H
#define NVC_SHIM_H

#include "config.h"
#include "real.h"

enum nvc_state { NVC_OFF = 0, NVC_ACTIVE = 1, NVC_CLOSED = 2 };
extern struct nvc_config nvc_cfg;
extern int nvc_mem_limited;          /* some device has a memory limit */
extern int nvc_compute_limited;      /* some device has a compute share below 100 or a weight */
enum nvc_state nvc_init(void);       /* idempotent */
void nvc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nvc_fail(const char *what);     /* loud one-time failure line; switches to on_error mode */
uint64_t nvc_now_ns(void);

/* Per-device information of this process, found by CUDA ordinal or NVML handle. */
struct nvc_device {
    int valid;
    int region_index;                /* index in the region's device table */
    uint64_t memory_limit;           /* 0 = unlimited */
    unsigned compute;                /* percent; 100 = unthrottled */
    unsigned weight;                 /* share of the GPU among busy containers; 0 = not weighted */
    unsigned sm_count;
    struct nvc_sched_entry *sched;   /* this container's scheduler entry, NULL when not scheduled */
    int ordinal;                     /* CUDA ordinal; -1 when found by NVML handle */
};
struct nvc_device *nvc_device_by_ordinal(CUdevice dev);
struct nvc_device *nvc_device_current(CUdevice *ordinal);
struct nvc_device *nvc_device_by_key(const char *key, int nvml_index);

/* Fork handling, one per file with a mutex: phase 0 = prepare (lock), 1 = parent (unlock),
 * 2 = child (unlock and forget what belongs to the parent). Called in a fixed lock order. */
enum nvc_fork_phase { NVC_FORK_PREPARE = 0, NVC_FORK_PARENT = 1, NVC_FORK_CHILD = 2 };
void nvc_devices_fork(enum nvc_fork_phase phase);

/* Re-entrancy guard: a driver that calls its own exported entry points must not be charged twice. */
extern __thread int nvc_depth __attribute__((tls_model("initial-exec")));

#endif

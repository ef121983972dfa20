/* On-disk layout of the shared region (<dir>/region), version 1. Read by `nvc-py share status`
 * too, so every field has a fixed size and offset (little-endian, x86-64 alignment) and the
 * layout only changes together with NVC_REGION_VERSION. See README.md. */
#ifndef NVC_REGION_H
#define NVC_REGION_H

#include <stdint.h>
#include "base/config.h"
#include "base/ground.h"

#define NVC_REGION_MAGIC "NVCSHRG\0"
#define NVC_REGION_VERSION 1u
#define NVC_REGION_SLOTS 1024
#define NVC_REGION_DEVICES 16
#define NVC_REGION_LOCK_BYTE 0 /* F_OFD_SETLKW write lock on this one byte guards slots/devices */

struct nvc_region_device { /* 128 bytes */
    char key[40];          /* UUID without GPU-/MIG- prefix, lower case, NUL padded */
    uint64_t memory_limit; /* bytes, 0 = unlimited (informational: each process enforces its own) */
    uint32_t compute;      /* percent, 100 = unthrottled */
    uint32_t sm_count;
    int64_t credit_ns;         /* compute cap: wall-time credit, shared by the container (<= 0) */
    uint64_t refill_ns;        /* CLOCK_MONOTONIC of the last refill */
    uint64_t busy_ns;          /* measured SM-weighted GPU time of launches, cumulative */
    uint64_t throttled_ns;     /* time launches spent waiting for credit, cumulative */
    uint64_t launches;         /* launches seen while throttling was active */
    uint64_t slice_end_ns;     /* compute cap: the container's current slice ends (CLOCK_MONOTONIC) */
    uint64_t done_ns;          /* compute cap: when the container's measured work last ended */
    uint64_t charged_until_ns; /* compute cap: work past a slice's end is charged up to here */
    uint64_t reserved[1];
};

struct nvc_region_slot { /* 160 bytes */
    int32_t pid;         /* in the pid namespace of pidns_ino; 0 = free */
    uint32_t flags;
    uint64_t start_time;               /* /proc/<pid>/stat field 22: guards against pid reuse */
    uint64_t pidns_ino;                /* inode of /proc/self/ns/pid */
    uint64_t used[NVC_REGION_DEVICES]; /* bytes charged per region device */
    uint64_t reserved;
};

struct nvc_region {
    char magic[8];
    uint32_t version;
    uint32_t size;        /* sizeof(struct nvc_region) */
    uint64_t config_hash; /* FNV-1a of the limits that initialised it */
    uint32_t ndevices;
    uint32_t nslots;   /* NVC_REGION_SLOTS */
    uint32_t slot_hwm; /* slots at or above this index have never been used */
    uint32_t pad;
    uint64_t memory_default;
    uint32_t compute_default;
    uint32_t pad2;
    uint64_t reserved[9]; /* header is 128 bytes */
    struct nvc_region_device dev[NVC_REGION_DEVICES];
    struct nvc_region_slot slots[NVC_REGION_SLOTS];
};

/* ---- the region's API (region.c) ---- */
int nvc_region_open(const char *dir, const struct nvc_config *cfg);
/* The limits changed: the header records them, so processes starting under them join this region. */
void nvc_region_relimit(const struct nvc_config *cfg);
int nvc_region_device(const char *key, uint64_t memory_limit, unsigned compute, unsigned sm_count);
/* Charge bytes to this process on region device d; fails (returns -1) when over limit. */
int nvc_region_charge(int d, uint64_t bytes, uint64_t limit);
void nvc_region_uncharge(int d, uint64_t bytes);
uint64_t nvc_region_used(int d); /* container total on device d, dead processes reaped */
void nvc_region_fork(enum nvc_fork_phase phase);
/* Compute cap on region device d (launch.c drives it): 0 when the container's processes may launch
 * now (inside its slice of wall time, or one starts), else how long to wait (ns). drained: this
 * process has no launch of d still running, so when its work ended is known (nvc_region_done). */
int64_t nvc_region_slice(int d, unsigned percent, uint64_t now, int drained);
extern uint64_t nvc_region_slices_started, nvc_region_overrun_charged_ns; /* by this process, for its log */
uint64_t nvc_region_slice_end(int d);
uint64_t nvc_region_slice_length(unsigned percent);  /* a cap's slice */
void nvc_region_done(int d, uint64_t done);          /* measured work ran on the GPU until done */
void nvc_region_slice_extend(int d, uint64_t until); /* the slice does not run while another holds the turn */
/* The cap goes out of force now (a duty cycle's, schedpolicy.h): what runs from now on is not a slice's
 * overrun, and is never charged as one when the cap comes back. */
void nvc_region_slice_off(int d, uint64_t now);
void nvc_region_account_launch(int d, uint64_t busy_ns, uint64_t waited_ns);

#endif

/* Fake libnvidia-ml.so.1: answers the NVML calls nvc-py, pynvml and the fake nvidia-smi make,
 * from the machine compiled in by machine.py (fake_machine.h).
 *
 * Like the real library it sees the GPUs the current mount namespace gives it: at init a GPU
 * counts only if /dev/nvidia<minor> is its character device, and a MIG device only if its
 * GPU-instance and compute-instance capability nodes (/dev/nvidia-caps/nvidia-cap<N>) exist.
 * Visible GPUs are numbered 0..n-1 in host order, so a container given GPU 1 sees it as index 0.
 * Error codes follow NVML's documentation. Test double only: nothing here talks to hardware.
 *
 * This header is what the library's parts share (devices.c: init, handles and device queries;
 * events.c: XID event sets), all linked into the one libnvidia-ml.so.1. What it declares is hidden:
 * the library exports the NVML entry points only. */
#ifndef FAKE_NVML_INTERNAL_H
#define FAKE_NVML_INTERNAL_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "base/nvml_abi.h"
#include "fake_machine.h"

#define API __attribute__((visibility("default")))
#define MAX_MIG_DEVICES 7u /* nvmlDeviceGetMaxMigDeviceCount of A100/H100 */

struct nvmlDevice_st {
    const struct fake_gpu *gpu;
    const struct fake_mig *mig;   /* NULL for a full GPU */
    struct nvmlDevice_st *parent; /* the full GPU of a MIG device */
    unsigned index;               /* position among the visible GPUs or the parent's MIGs */
    int visible;
};

typedef nvmlReturn_t (*lookup_fn)(nvmlDevice_t handle, struct nvmlDevice_st **out);

#pragma GCC visibility push(hidden)

/* devices.c: the device tables of the last init (one entry per GPU of the machine, visible or not),
 * under fake_nvml_lock, and the handle checks. */
extern pthread_mutex_t fake_nvml_lock;
extern struct nvmlDevice_st fake_gpus[FAKE_GPU_COUNT];
extern struct nvmlDevice_st *fake_visible_migs[FAKE_GPU_COUNT][MAX_MIG_DEVICES];
extern unsigned fake_visible_mig_count[FAKE_GPU_COUNT];

int fake_initialized(void);
nvmlReturn_t fake_lookup_gpu(nvmlDevice_t handle, struct nvmlDevice_st **out);
nvmlReturn_t fake_device_query(nvmlDevice_t handle, lookup_fn check, int outputs_given, struct nvmlDevice_st **dev);

#pragma GCC visibility pop

/* Defines the query `name(device, type *out)`: once the handle passed `check` and out is not NULL, the
 * statement `fill` answers from dev into out (it may set ret to an error of its own). */
#define DEVICE_QUERY(name, check, type, fill) \
    API nvmlReturn_t name(nvmlDevice_t device, type *out) \
    { \
        struct nvmlDevice_st *dev; \
        nvmlReturn_t ret = fake_device_query(device, check, out != NULL, &dev); \
        if (ret == NVML_SUCCESS) fill; \
        return ret; \
    }

#endif

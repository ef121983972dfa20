/* Types of the compiled-in machine description shared by the fake NVML and CUDA stubs.
 * machine.py turns a machine YAML into fake_machine.h (an instance of these types), so the stub
 * libraries carry their machine with them into chroots and containers. Test double only. */
#ifndef FAKE_MACHINE_TYPES_H
#define FAKE_MACHINE_TYPES_H

struct fake_mig {
    unsigned gpu_instance_id;
    unsigned compute_instance_id;
    const char *uuid;                /* "MIG-…" */
    unsigned long long memory_total; /* bytes */
    unsigned sm_count;
    unsigned gpu_slices;     /* "<g>g" of the profile name */
    unsigned compute_slices; /* "<c>c" of the profile name, = gpu_slices when absent */
};

struct fake_gpu {
    unsigned index;                  /* NVML index on the host */
    unsigned minor;                  /* /dev/nvidia<minor> */
    const char *uuid;                /* "GPU-…" */
    const char *pci_bus_id;          /* "00000000:3B:00.0" */
    const char *name;                /* "NVIDIA H100 80GB HBM3" */
    int brand;                       /* nvmlBrandType_t value */
    int cc_major, cc_minor;          /* CUDA compute capability */
    unsigned long long memory_total; /* bytes */
    unsigned sm_count;
    int mig_enabled;
    unsigned mig_count;
    const struct fake_mig *migs;
    int mig_capable;        /* 0: MIG queries answer NVML_ERROR_NOT_SUPPORTED */
    unsigned pci_device_id; /* nvmlPciInfo_t.pciDeviceId, e.g. 0x233010DE */
};

/* fake_machine.h defines:
 *   #define FAKE_DRIVER_VERSION "580.95.05"
 *   #define FAKE_CUDA_VERSION 13000      (nvmlSystemGetCudaDriverVersion / cuDriverGetVersion)
 *   #define FAKE_NVML_VERSION "13.580.95.05"
 *   #define FAKE_GPU_COUNT 2
 *   static const struct fake_gpu FAKE_GPUS[FAKE_GPU_COUNT] = { … };
 */
#endif

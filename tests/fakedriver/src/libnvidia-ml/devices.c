/* The fake libnvidia-ml's init, system queries, device handles and device queries. Test double only. */
#include "internal.h"

#define NVIDIA_MAJOR 195u
#define MIG_MINORS_FIRST 3u     /* mig-minors: config 1, monitor 2, then per GPU */
#define MIG_MINORS_PER_GPU 135u /* 15 GPU instances x (1 + 8 compute instances) */
#define MIG_MINORS_PER_GI 9u

pthread_mutex_t fake_nvml_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned init_count;
struct nvmlDevice_st fake_gpus[FAKE_GPU_COUNT];
static struct nvmlDevice_st migs[FAKE_GPU_COUNT][MAX_MIG_DEVICES];
static struct nvmlDevice_st *visible_gpus[FAKE_GPU_COUNT];
static unsigned visible_gpu_count;
struct nvmlDevice_st *fake_visible_migs[FAKE_GPU_COUNT][MAX_MIG_DEVICES];
unsigned fake_visible_mig_count[FAKE_GPU_COUNT];

static int is_char_device(const char *path, unsigned major_number, unsigned minor_number, int check_major)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISCHR(st.st_mode)) return 0;
    if (minor(st.st_rdev) != minor_number) return 0;
    return !check_major || major(st.st_rdev) == major_number;
}

static int cap_node_exists(unsigned cap_minor)
{
    char path[64];
    snprintf(path, sizeof path, "/dev/nvidia-caps/nvidia-cap%u", cap_minor);
    /* The caps major is dynamic (read from /proc/devices by real tools): check the minor only. */
    return is_char_device(path, 0, cap_minor, 0);
}

static int mig_visible(const struct fake_gpu *gpu, const struct fake_mig *mig)
{
    unsigned gi_minor = MIG_MINORS_FIRST + gpu->minor * MIG_MINORS_PER_GPU + mig->gpu_instance_id * MIG_MINORS_PER_GI;
    unsigned ci_minor = gi_minor + 1 + mig->compute_instance_id;
    return cap_node_exists(gi_minor) && cap_node_exists(ci_minor);
}

/* Rebuild the visible device tables from the nodes present now. Called under the lock. */
static void scan_devices(void)
{
    visible_gpu_count = 0;
    for (unsigned g = 0; g < FAKE_GPU_COUNT; g++) {
        const struct fake_gpu *gpu = &FAKE_GPUS[g];
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%u", gpu->minor);
        struct nvmlDevice_st *dev = &fake_gpus[g];
        *dev = (struct nvmlDevice_st){.gpu = gpu, .visible = is_char_device(path, NVIDIA_MAJOR, gpu->minor, 1)};
        fake_visible_mig_count[g] = 0;
        if (dev->visible) {
            dev->index = visible_gpu_count;
            visible_gpus[visible_gpu_count++] = dev;
        }
        for (unsigned m = 0; m < gpu->mig_count && m < MAX_MIG_DEVICES; m++) {
            struct nvmlDevice_st *mdev = &migs[g][m];
            *mdev = (struct nvmlDevice_st){.gpu = gpu, .mig = &gpu->migs[m], .parent = dev};
            mdev->visible = dev->visible && gpu->mig_enabled && mig_visible(gpu, &gpu->migs[m]);
            if (mdev->visible) {
                mdev->index = fake_visible_mig_count[g];
                fake_visible_migs[g][fake_visible_mig_count[g]++] = mdev;
            }
        }
    }
}

int fake_initialized(void)
{
    pthread_mutex_lock(&fake_nvml_lock);
    int ok = init_count > 0;
    pthread_mutex_unlock(&fake_nvml_lock);
    return ok;
}

/* A handle is valid if it is one of ours and was visible at the last init. A query of the GPU or MIG device whose
 * UUID is $FAKE_NVML_GPU_LOST answers GPU_IS_LOST, as a GPU fallen off the bus does once its handle is held: a
 * test's driver failing mid-snapshot. */
static nvmlReturn_t lookup(nvmlDevice_t handle, struct nvmlDevice_st **out)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    const char *p = (const char *)handle;
    const char *g0 = (const char *)fake_gpus, *m0 = (const char *)migs;
    int in_gpus = p >= g0 && p < g0 + sizeof fake_gpus && (size_t)(p - g0) % sizeof fake_gpus[0] == 0;
    int in_migs = p >= m0 && p < m0 + sizeof migs && (size_t)(p - m0) % sizeof migs[0][0] == 0;
    if (!in_gpus && !in_migs) return NVML_ERROR_INVALID_ARGUMENT;
    if (!handle->visible) return NVML_ERROR_INVALID_ARGUMENT;
    const char *lost = getenv("FAKE_NVML_GPU_LOST");
    if (lost != NULL && strcmp(lost, handle->mig ? handle->mig->uuid : handle->gpu->uuid) == 0)
        return NVML_ERROR_GPU_IS_LOST;
    *out = handle;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *buf, unsigned length, const char *value)
{
    if (buf == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* The start of a system query: NVML reports an uninitialized library before a missing output. */
static nvmlReturn_t system_query(int outputs_given)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    return outputs_given ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    if (flags & ~(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_char_device("/dev/nvidiactl", NVIDIA_MAJOR, 255, 1)) return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&fake_nvml_lock);
    if (init_count++ == 0) scan_devices();
    pthread_mutex_unlock(&fake_nvml_lock);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&fake_nvml_lock);
    nvmlReturn_t ret = init_count == 0 ? NVML_ERROR_UNINITIALIZED : NVML_SUCCESS;
    if (init_count > 0) init_count--;
    pthread_mutex_unlock(&fake_nvml_lock);
    return ret;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* $FAKE_NVML_STALL_S seconds of sleep in the first call of a snapshot (nvc-py's helper asks the driver version
 * first): a test's driver that hangs mid-call. */
static void stall(void)
{
    const char *seconds = getenv("FAKE_NVML_STALL_S");
    if (seconds != NULL && *seconds != '\0') sleep((unsigned)atoi(seconds));
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    stall();
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, FAKE_DRIVER_VERSION);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, FAKE_NVML_VERSION);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cuda_version)
{
    nvmlReturn_t ret = system_query(cuda_version != NULL);
    if (ret == NVML_SUCCESS) *cuda_version = FAKE_CUDA_VERSION;
    return ret;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda_version)
{
    return nvmlSystemGetCudaDriverVersion(cuda_version);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t ret = system_query(count != NULL);
    if (ret == NVML_SUCCESS) *count = visible_gpu_count;
    return ret;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = system_query(device != NULL && index < visible_gpu_count);
    if (ret == NVML_SUCCESS) *device = visible_gpus[index];
    return ret;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t ret = system_query(uuid != NULL && device != NULL);
    if (ret != NVML_SUCCESS) return ret;
    for (unsigned g = 0; g < FAKE_GPU_COUNT; g++) {
        if (fake_gpus[g].visible && strcmp(fake_gpus[g].gpu->uuid, uuid) == 0) {
            *device = &fake_gpus[g];
            return NVML_SUCCESS;
        }
        for (unsigned m = 0; m < fake_visible_mig_count[g]; m++) {
            if (strcmp(fake_visible_migs[g][m]->mig->uuid, uuid) == 0) {
                *device = fake_visible_migs[g][m];
                return NVML_SUCCESS;
            }
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* NVML accepts "domain:bus:device.function", "domain:bus:device" and "bus:device.function" (hex). */
static int parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *device)
{
    unsigned function;
    char tail;
    if (sscanf(text, "%x:%x:%x.%x%c", domain, bus, device, &function, &tail) == 4) return 1;
    if (sscanf(text, "%x:%x:%x%c", domain, bus, device, &tail) == 3) return 1;
    *domain = 0;
    return sscanf(text, "%x:%x.%x%c", bus, device, &function, &tail) == 3;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci_bus_id, nvmlDevice_t *device)
{
    unsigned domain, bus, dev;
    nvmlReturn_t ret = system_query(pci_bus_id != NULL && device != NULL);
    if (ret == NVML_SUCCESS && !parse_bus_id(pci_bus_id, &domain, &bus, &dev)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret != NVML_SUCCESS) return ret;
    for (unsigned i = 0; i < visible_gpu_count; i++) {
        unsigned d, b, v;
        parse_bus_id(visible_gpus[i]->gpu->pci_bus_id, &d, &b, &v);
        if (d == domain && b == bus && v == dev) {
            *device = visible_gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Calls that only make sense on a full GPU: a MIG handle answers NOT_SUPPORTED. */
nvmlReturn_t fake_lookup_gpu(nvmlDevice_t handle, struct nvmlDevice_st **out)
{
    nvmlReturn_t ret = lookup(handle, out);
    if (ret == NVML_SUCCESS && (*out)->mig != NULL) return NVML_ERROR_NOT_SUPPORTED;
    return ret;
}

/* Calls that only make sense on a MIG-capable full GPU. */
static nvmlReturn_t lookup_mig_capable(nvmlDevice_t handle, struct nvmlDevice_st **out)
{
    nvmlReturn_t ret = fake_lookup_gpu(handle, out);
    if (ret == NVML_SUCCESS && !(*out)->gpu->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    return ret;
}

/* Calls that only make sense on a MIG device handle. */
static nvmlReturn_t lookup_mig(nvmlDevice_t handle, struct nvmlDevice_st **out)
{
    nvmlReturn_t ret = lookup(handle, out);
    if (ret == NVML_SUCCESS && (*out)->mig == NULL) return NVML_ERROR_NOT_SUPPORTED;
    return ret;
}

/* The start of a device query, in NVML's order of errors: the handle as `check` wants it (uninitialized,
 * invalid, not supported), then a NULL output pointer. */
nvmlReturn_t fake_device_query(nvmlDevice_t handle, lookup_fn check, int outputs_given, struct nvmlDevice_st **dev)
{
    nvmlReturn_t ret = check(handle, dev);
    if (ret == NVML_SUCCESS && !outputs_given) return NVML_ERROR_INVALID_ARGUMENT;
    return ret;
}

DEVICE_QUERY(nvmlDeviceGetIndex, fake_lookup_gpu, unsigned int, *out = dev->index)
DEVICE_QUERY(nvmlDeviceGetMinorNumber, fake_lookup_gpu, unsigned int, *out = dev->gpu->minor)
DEVICE_QUERY(nvmlDeviceGetMultiGpuBoard, fake_lookup_gpu, unsigned int, *out = 0)
DEVICE_QUERY(nvmlDeviceGetBrand, lookup, nvmlBrandType_t, *out = (nvmlBrandType_t)dev->gpu->brand)
DEVICE_QUERY(nvmlDeviceIsMigDeviceHandle, lookup, unsigned int, *out = dev->mig != NULL)
DEVICE_QUERY(nvmlDeviceGetMaxMigDeviceCount, lookup_mig_capable, unsigned int,
             *out = dev->gpu->mig_enabled ? MAX_MIG_DEVICES : 0)
DEVICE_QUERY(nvmlDeviceGetGpuInstanceId, lookup_mig, unsigned int, *out = dev->mig->gpu_instance_id)
DEVICE_QUERY(nvmlDeviceGetComputeInstanceId, lookup_mig, unsigned int, *out = dev->mig->compute_instance_id)

/* A MIG device reports its parent's PCI location, as in NVML. */
static void pci_info(const struct fake_gpu *gpu, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    parse_bus_id(gpu->pci_bus_id, &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = gpu->pci_device_id;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
}

DEVICE_QUERY(nvmlDeviceGetPciInfo_v3, lookup, nvmlPciInfo_t, pci_info(dev->gpu, out))

/* The unversioned export keeps nvml.h's first layout, as the real library's does for old callers (NVIDIA's
 * nvidia-container-cli looks the bare name up): the 16-byte bus id, the ids, four reserved words. */
struct pci_info_v1 {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId, reserved[4];
};

static void pci_info_v1(const struct fake_gpu *gpu, struct pci_info_v1 *pci)
{
    nvmlPciInfo_t now;
    pci_info(gpu, &now);
    *pci = (struct pci_info_v1){.domain = now.domain,
                                .bus = now.bus,
                                .device = now.device,
                                .pciDeviceId = now.pciDeviceId,
                                .pciSubSystemId = now.pciSubSystemId};
    memcpy(pci->busId, now.busIdLegacy, sizeof pci->busId);
}

DEVICE_QUERY(nvmlDeviceGetPciInfo, lookup, struct pci_info_v1, pci_info_v1(dev->gpu, out))

static nvmlDeviceArchitecture_t architecture(const struct fake_gpu *gpu)
{
    int cc = gpu->cc_major * 10 + gpu->cc_minor;
    if (cc >= 100) return NVML_DEVICE_ARCH_BLACKWELL;
    if (cc >= 90) return NVML_DEVICE_ARCH_HOPPER;
    if (cc == 89) return NVML_DEVICE_ARCH_ADA;
    if (cc >= 80) return NVML_DEVICE_ARCH_AMPERE;
    if (cc == 75) return NVML_DEVICE_ARCH_TURING;
    if (cc >= 70) return NVML_DEVICE_ARCH_VOLTA;
    if (cc >= 60) return NVML_DEVICE_ARCH_PASCAL;
    if (cc >= 50) return NVML_DEVICE_ARCH_MAXWELL;
    if (cc >= 30) return NVML_DEVICE_ARCH_KEPLER;
    return NVML_DEVICE_ARCH_UNKNOWN;
}

DEVICE_QUERY(nvmlDeviceGetArchitecture, lookup, nvmlDeviceArchitecture_t, *out = architecture(dev->gpu))

/* Nothing runs on a fake GPU: all of its (or the MIG slice's) memory is free. */
static unsigned long long memory_total(const struct nvmlDevice_st *dev)
{
    return dev->mig ? dev->mig->memory_total : dev->gpu->memory_total;
}

DEVICE_QUERY(nvmlDeviceGetMemoryInfo, lookup, nvmlMemory_t,
             *out = ((nvmlMemory_t){.total = memory_total(dev), .free = memory_total(dev)}))

static nvmlReturn_t memory_info_v2(const struct nvmlDevice_st *dev, nvmlMemory_v2_t *memory)
{
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = memory_total(dev);
    memory->reserved = 0;
    memory->free = memory->total;
    memory->used = 0;
    return NVML_SUCCESS;
}

DEVICE_QUERY(nvmlDeviceGetMemoryInfo_v2, lookup, nvmlMemory_v2_t, ret = memory_info_v2(dev, out))

static void attributes(const struct nvmlDevice_st *dev, nvmlDeviceAttributes_t *attributes)
{
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = dev->mig ? dev->mig->sm_count : dev->gpu->sm_count;
    attributes->gpuInstanceSliceCount = dev->mig ? dev->mig->gpu_slices : 0;
    attributes->computeInstanceSliceCount = dev->mig ? dev->mig->compute_slices : 0;
    attributes->memorySizeMB = memory_total(dev) >> 20;
}

DEVICE_QUERY(nvmlDeviceGetAttributes_v2, lookup, nvmlDeviceAttributes_t, attributes(dev, out))

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = lookup(device, &dev);
    if (ret != NVML_SUCCESS) return ret;
    return copy_string(uuid, length, dev->mig ? dev->mig->uuid : dev->gpu->uuid);
}

static void mig_profile(const struct fake_mig *mig, char *buf, size_t size)
{
    unsigned long long gb = (mig->memory_total + (1ull << 29)) >> 30;
    if (mig->compute_slices != mig->gpu_slices)
        snprintf(buf, size, "%uc.%ug.%llugb", mig->compute_slices, mig->gpu_slices, gb);
    else
        snprintf(buf, size, "%ug.%llugb", mig->gpu_slices, gb);
}

/* A MIG device is named "<GPU name> MIG <profile>", as NVML names it. */
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = lookup(device, &dev);
    if (ret != NVML_SUCCESS) return ret;
    if (dev->mig == NULL) return copy_string(name, length, dev->gpu->name);
    char profile[32], full[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    mig_profile(dev->mig, profile, sizeof profile);
    snprintf(full, sizeof full, "%s MIG %s", dev->gpu->name, profile);
    return copy_string(name, length, full);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major_cc, int *minor_cc)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = fake_device_query(device, lookup, major_cc != NULL && minor_cc != NULL, &dev);
    if (ret == NVML_SUCCESS) {
        *major_cc = dev->gpu->cc_major;
        *minor_cc = dev->gpu->cc_minor;
    }
    return ret;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current_mode, unsigned int *pending_mode)
{
    struct nvmlDevice_st *dev;
    int outputs_given = current_mode != NULL && pending_mode != NULL;
    nvmlReturn_t ret = fake_device_query(device, lookup_mig_capable, outputs_given, &dev);
    if (ret == NVML_SUCCESS)
        *current_mode = *pending_mode = dev->gpu->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return ret;
}

/* Visible MIG devices fill indices 0..k-1; the rest up to the maximum are NOT_FOUND. */
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig_device)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = lookup_mig_capable(device, &dev);
    if (ret != NVML_SUCCESS) return ret;
    unsigned max = dev->gpu->mig_enabled ? MAX_MIG_DEVICES : 0;
    if (mig_device == NULL || index >= max) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned g = (unsigned)(dev - fake_gpus);
    if (index >= fake_visible_mig_count[g]) return NVML_ERROR_NOT_FOUND;
    *mig_device = fake_visible_migs[g][index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig_device, nvmlDevice_t *device)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = lookup(mig_device, &dev);
    if (ret != NVML_SUCCESS) return ret;
    if (dev->mig == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = dev->parent;
    return NVML_SUCCESS;
}

/* The fake libcuda's cuInit (the machine's present GPUs, filtered by CUDA_VISIBLE_DEVICES) and the
 * device queries. Test double only. */
#include <fcntl.h>
#include "internal.h"

/* ---------------------------------------------------------------- cuInit */

static int parse_uuid(const char *text, unsigned char out[16])
{
    if (strncmp(text, "GPU-", 4) != 0) return -1;
    int n = 0;
    for (const char *p = text + 4; *p; p++) {
        if (*p == '-') continue;
        char hex[3] = {p[0], p[1], 0};
        char *end;
        if (n == 16 || !p[1]) return -1;
        unsigned long v = strtoul(hex, &end, 16);
        if (*end) return -1;
        out[n++] = (unsigned char)v;
        p++;
    }
    return n == 16 ? 0 : -1;
}

static int node_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int parse_env_u64(const char *name, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || *v == '-') {
        fprintf(stderr, "fake libcuda: %s=%s is not a non-negative decimal integer\n", name, v);
        return -1;
    }
    *out = x;
    return 1;
}

/* Applies CUDA_VISIBLE_DEVICES to the machine's present GPUs (indices into FAKE_GPUS). */
static int select_visible(const int *present, int npresent, int *out)
{
    const char *spec = getenv("CUDA_VISIBLE_DEVICES");
    if (!spec) {
        memcpy(out, present, sizeof(int) * (size_t)npresent);
        return npresent;
    }
    int n = 0;
    char *copy = strdup(spec), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t len = strlen(tok);
        while (len && tok[len - 1] == ' ') tok[--len] = 0;
        int pick = -1;
        if (len && strspn(tok, "0123456789") == len) {
            long i = strtol(tok, NULL, 10);
            if (i < npresent) pick = present[i];
        } else if (strncmp(tok, "GPU-", 4) == 0) {
            for (int i = 0; i < npresent; i++) {
                if (strncasecmp(FAKE_GPUS[present[i]].uuid, tok, len) != 0) continue;
                if (pick >= 0) { /* ambiguous prefix */
                    pick = -1;
                    break;
                }
                pick = present[i];
            }
        }
        for (int j = 0; j < n && pick >= 0; j++)
            if (out[j] == pick) pick = -1;
        if (pick < 0) break; /* the real driver ignores the rest of the list */
        out[n++] = pick;
    }
    free(copy);
    return n;
}

/* An MPS client, as far as the fake MPS daemon (src/mps_control.c) needs: with its control FIFO in the
 * pipe directory (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps), cuInit tells it who connected with
 * which of MPS's client variables; a FIFO that no daemon reads (it died) fails cuInit with
 * CUDA_ERROR_MPS_CONNECTION_FAILED (805), as a client finds no server. */
static CUresult mps_connect(void)
{
    static const char *const names[] = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                                        "CUDA_MPS_CLIENT_PRIORITY", "CUDA_MPS_PIPE_DIRECTORY"};
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char path[4096], line[2048];
    snprintf(path, sizeof path, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENXIO ? CUDA_ERROR_MPS_CONNECTION_FAILED : CUDA_SUCCESS;
    int n = snprintf(line, sizeof line, "client pid=%d uid=%u", (int)getpid(), (unsigned)getuid());
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *value = getenv(names[i]);
        n += snprintf(line + n, sizeof line - (size_t)n, " %s=%.100s", names[i], value ? value : "-");
    }
    line[n++] = '\n';
    ssize_t put = write(fd, line, (size_t)n);
    close(fd);
    return put == n ? CUDA_SUCCESS : CUDA_ERROR_MPS_CONNECTION_FAILED;
}

static CUresult do_init(void)
{
    uint64_t us = 0;
    fake_ctx_reserve_mib = UINT64_MAX;
    if (parse_env_u64("FAKE_CUDA_KERNEL_US", &us) < 0 ||
        parse_env_u64("FAKE_CUDA_CONTEXT_MIB", &fake_ctx_reserve_mib) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_kernel_ns = us * 1000ull;
    CUresult r = fake_timeline_init();
    if (r != CUDA_SUCCESS) return r;
    if (!node_exists("/dev/nvidiactl")) return CUDA_ERROR_NO_DEVICE;
    if ((r = mps_connect()) != CUDA_SUCCESS) return r;
    int present[FAKE_GPU_COUNT], npresent = 0, visible[FAKE_GPU_COUNT];
    for (int i = 0; i < FAKE_GPU_COUNT; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/dev/nvidia%u", FAKE_GPUS[i].minor);
        if (node_exists(path)) present[npresent++] = i;
    }
    fake_ndev = select_visible(present, npresent, visible);
    if (fake_ndev == 0) return CUDA_ERROR_NO_DEVICE;
    for (int i = 0; i < fake_ndev; i++) {
        struct fdev *d = &fake_dev[i];
        d->gpu = &FAKE_GPUS[visible[i]];
        d->index = visible[i];
        d->primary.dev = i;
        if (parse_uuid(d->gpu->uuid, d->uuid) < 0) {
            fprintf(stderr, "fake libcuda: malformed GPU UUID %s in the machine table\n", d->gpu->uuid);
            return CUDA_ERROR_UNKNOWN;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    if (!fake_init_done) {
        fake_init_result = do_init();
        fake_init_done = 1;
    }
    CUresult r = fake_init_result;
    unlock();
    return r;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = FAKE_CUDA_VERSION;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- device queries */

/* The start of a device query, in the real driver's order of errors: missing outputs, then the device. */
static CUresult device_query(int outputs_given, CUdevice dev)
{
    return outputs_given ? fake_check_device(dev) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *count)
{
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_check_init();
    *count = r == CUDA_SUCCESS ? fake_ndev : 0;
    return r;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = device_query(device != NULL, ordinal);
    if (r == CUDA_SUCCESS) *device = ordinal;
    return r;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = device_query(name && len > 0, dev);
    if (r == CUDA_SUCCESS) snprintf(name, (size_t)len, "%s", fake_dev[dev].gpu->name);
    return r;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult r = device_query(uuid != NULL, dev);
    if (r == CUDA_SUCCESS) memcpy(uuid->bytes, fake_dev[dev].uuid, 16);
    return r;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

/* The machine table holds NVML's "00000000:3B:00.0"; CUDA reports a 4-digit domain. */
static int pci_fields(const struct fake_gpu *g, unsigned *domain, unsigned *bus, unsigned *device, unsigned *function)
{
    return sscanf(g->pci_bus_id, "%x:%x:%x.%x", domain, bus, device, function) == 4 ? 0 : -1;
}

CUresult cuDeviceGetPCIBusId(char *busid, int len, CUdevice dev)
{
    CUresult r = device_query(busid && len > 0, dev);
    if (r != CUDA_SUCCESS) return r;
    unsigned domain, bus, device, function;
    if (pci_fields(fake_dev[dev].gpu, &domain, &bus, &device, &function) < 0) return CUDA_ERROR_UNKNOWN;
    snprintf(busid, (size_t)len, "%04X:%02X:%02X.%X", domain, bus, device, function);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = device_query(bytes != NULL, dev);
    if (r == CUDA_SUCCESS) *bytes = (size_t)fake_dev[dev].gpu->memory_total;
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDeviceTotalMem_v2(&total, dev);
    if (r == CUDA_SUCCESS) *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    return r;
}

/* Resident threads per SM by compute capability (the CUDA programming guide's table). */
int fake_threads_per_sm(int major, int minor)
{
    if (major == 7 && minor == 5) return 1024;
    if ((major == 8 && minor != 0) || major == 12) return 1536;
    return 2048;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = device_query(value != NULL, dev);
    if (r != CUDA_SUCCESS) return r;
    const struct fake_gpu *g = fake_dev[dev].gpu;
    unsigned domain, bus, device, function;
    int have_pci = pci_fields(g, &domain, &bus, &device, &function) == 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = INT_MAX; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 48 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 64 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *value = INT_MAX; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 64 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = (int)g->sm_count; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        *value = fake_threads_per_sm(g->cc_major, g->cc_minor);
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = g->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = g->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        if (!have_pci) return CUDA_ERROR_UNKNOWN;
        *value = (int)domain;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        if (!have_pci) return CUDA_ERROR_UNKNOWN;
        *value = (int)bus;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        if (!have_pci) return CUDA_ERROR_UNKNOWN;
        *value = (int)device;
        break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: /* default */
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *value = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CUresult r = device_query(major && minor, dev);
    if (r == CUDA_SUCCESS) {
        *major = fake_dev[dev].gpu->cc_major;
        *minor = fake_dev[dev].gpu->cc_minor;
    }
    return r;
}

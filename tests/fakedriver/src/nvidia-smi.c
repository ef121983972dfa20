/* Fake nvidia-smi: prints what NVML reports, in the formats of the real tool, so tests can run
 * it inside containers and see exactly the GPUs, MIG devices and memory the container's NVML
 * (the fake libnvidia-ml, or a sharing shim in front of it) reports. Like the real tool it
 * dlopens libnvidia-ml.so.1, so it needs nothing but libc and the mounted driver libraries.
 *
 *   nvidia-smi                    the summary table
 *   nvidia-smi -L                 "GPU 0: NAME (UUID: GPU-…)" plus "  MIG …  Device  0: (UUID: MIG-…)"
 *   nvidia-smi --query-gpu=F,… --format=csv[,noheader][,nounits]
 *   nvidia-smi --version
 * Test double only. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/nvml_abi.h"
#include "fake_machine.h"

/* The real tool carries its driver's version string; nvc-py checks for it. */
static const char BUILT_FOR[] __attribute__((used)) = "nvidia-smi " FAKE_DRIVER_VERSION;

#define TABLE_WIDTH 89 /* characters between the outer '|' of the summary table */

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    const char *(*error_string)(nvmlReturn_t);
    nvmlReturn_t (*driver_version)(char *, unsigned);
    nvmlReturn_t (*nvml_version)(char *, unsigned);
    nvmlReturn_t (*cuda_version)(int *);
    nvmlReturn_t (*count)(unsigned *);
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *);
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*cc)(nvmlDevice_t, int *, int *);
    nvmlReturn_t (*minor)(nvmlDevice_t, unsigned *);
    nvmlReturn_t (*mig_mode)(nvmlDevice_t, unsigned *, unsigned *);
    nvmlReturn_t (*max_migs)(nvmlDevice_t, unsigned *);
    nvmlReturn_t (*mig_by_index)(nvmlDevice_t, unsigned, nvmlDevice_t *);
    nvmlReturn_t (*gi_id)(nvmlDevice_t, unsigned *);
    nvmlReturn_t (*ci_id)(nvmlDevice_t, unsigned *);
} nvml;

static const struct {
    const char *symbol;
    size_t offset;
} symbols[] = {
#define SYM(field, name) \
    { \
        name, offsetof(__typeof__(nvml), field) \
    }
    SYM(init, "nvmlInit_v2"),
    SYM(shutdown, "nvmlShutdown"),
    SYM(error_string, "nvmlErrorString"),
    SYM(driver_version, "nvmlSystemGetDriverVersion"),
    SYM(nvml_version, "nvmlSystemGetNVMLVersion"),
    SYM(cuda_version, "nvmlSystemGetCudaDriverVersion"),
    SYM(count, "nvmlDeviceGetCount_v2"),
    SYM(by_index, "nvmlDeviceGetHandleByIndex_v2"),
    SYM(name, "nvmlDeviceGetName"),
    SYM(uuid, "nvmlDeviceGetUUID"),
    SYM(pci, "nvmlDeviceGetPciInfo_v3"),
    SYM(memory, "nvmlDeviceGetMemoryInfo"),
    SYM(cc, "nvmlDeviceGetCudaComputeCapability"),
    SYM(minor, "nvmlDeviceGetMinorNumber"),
    SYM(mig_mode, "nvmlDeviceGetMigMode"),
    SYM(max_migs, "nvmlDeviceGetMaxMigDeviceCount"),
    SYM(mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex"),
    SYM(gi_id, "nvmlDeviceGetGpuInstanceId"),
    SYM(ci_id, "nvmlDeviceGetComputeInstanceId"),
#undef SYM
};

static void die_nvml(const char *what, nvmlReturn_t ret)
{
    fprintf(stderr, "%s: %s\n", what, nvml.error_string(ret));
    exit((int)ret);
}

static void check(const char *what, nvmlReturn_t ret)
{
    if (ret != NVML_SUCCESS) die_nvml(what, ret);
}

static void load_nvml(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
                        "the NVIDIA Display Driver is properly installed and present in your system.\n");
        exit(NVML_ERROR_LIBRARY_NOT_FOUND);
    }
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *fn = dlsym(lib, symbols[i].symbol);
        if (fn == NULL) {
            fprintf(stderr, "NVIDIA-SMI: %s missing from libnvidia-ml.so.1\n", symbols[i].symbol);
            exit(NVML_ERROR_FUNCTION_NOT_FOUND);
        }
        memcpy((char *)&nvml + symbols[i].offset, &fn, sizeof fn);
    }
    nvmlReturn_t ret = nvml.init();
    if (ret != NVML_SUCCESS) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                        "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        exit((int)ret);
    }
}

struct gpu_info {
    unsigned index;
    nvmlDevice_t handle;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    nvmlPciInfo_t pci;
    nvmlMemory_t memory;
    int cc_major, cc_minor;
    unsigned minor;
    int mig_capable;
    unsigned mig_mode;
};

static void gpu_info(unsigned index, struct gpu_info *info)
{
    unsigned pending;
    info->index = index;
    check("nvmlDeviceGetHandleByIndex", nvml.by_index(index, &info->handle));
    check("nvmlDeviceGetName", nvml.name(info->handle, info->name, sizeof info->name));
    check("nvmlDeviceGetUUID", nvml.uuid(info->handle, info->uuid, sizeof info->uuid));
    check("nvmlDeviceGetPciInfo", nvml.pci(info->handle, &info->pci));
    check("nvmlDeviceGetMemoryInfo", nvml.memory(info->handle, &info->memory));
    check("nvmlDeviceGetCudaComputeCapability", nvml.cc(info->handle, &info->cc_major, &info->cc_minor));
    check("nvmlDeviceGetMinorNumber", nvml.minor(info->handle, &info->minor));
    nvmlReturn_t ret = nvml.mig_mode(info->handle, &info->mig_mode, &pending);
    if (ret != NVML_SUCCESS && ret != NVML_ERROR_NOT_SUPPORTED) die_nvml("nvmlDeviceGetMigMode", ret);
    info->mig_capable = ret == NVML_SUCCESS;
}

static unsigned gpu_count(void)
{
    unsigned count;
    check("nvmlDeviceGetCount", nvml.count(&count));
    return count;
}

/* Calls fn(parent, mig handle, position) for each MIG device, stopping at the first missing one. */
static void for_each_mig(const struct gpu_info *gpu, void (*fn)(const struct gpu_info *, nvmlDevice_t, unsigned))
{
    unsigned max;
    if (!gpu->mig_capable || gpu->mig_mode != NVML_DEVICE_MIG_ENABLE) return;
    check("nvmlDeviceGetMaxMigDeviceCount", nvml.max_migs(gpu->handle, &max));
    for (unsigned i = 0; i < max; i++) {
        nvmlDevice_t mig;
        nvmlReturn_t ret = nvml.mig_by_index(gpu->handle, i, &mig);
        if (ret == NVML_ERROR_NOT_FOUND) return;
        check("nvmlDeviceGetMigDeviceHandleByIndex", ret);
        fn(gpu, mig, i);
    }
}

/* NVML names a MIG device "<GPU name> MIG <profile>"; nvidia-smi shows the profile. */
static const char *mig_profile(const char *mig_name)
{
    const char *p = strstr(mig_name, " MIG ");
    return p ? p + 5 : mig_name;
}

static void list_mig(const struct gpu_info *gpu, nvmlDevice_t mig, unsigned position)
{
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    (void)gpu;
    check("nvmlDeviceGetName", nvml.name(mig, name, sizeof name));
    check("nvmlDeviceGetUUID", nvml.uuid(mig, uuid, sizeof uuid));
    printf("  MIG %-11s Device %2u: (UUID: %s)\n", mig_profile(name), position, uuid);
}

static int list_gpus(void)
{
    unsigned count = gpu_count();
    for (unsigned i = 0; i < count; i++) {
        struct gpu_info gpu;
        gpu_info(i, &gpu);
        printf("GPU %u: %s (UUID: %s)\n", i, gpu.name, gpu.uuid);
        for_each_mig(&gpu, list_mig);
    }
    return 0;
}

static void cuda_version_string(char *buf, size_t size)
{
    int v;
    check("nvmlSystemGetCudaDriverVersion", nvml.cuda_version(&v));
    snprintf(buf, size, "%d.%d", v / 1000, (v % 100) / 10);
}

/* --- --query-gpu ------------------------------------------------------------------------- */

enum field {
    F_INDEX,
    F_NAME,
    F_UUID,
    F_BUS_ID,
    F_DRIVER,
    F_MEM_TOTAL,
    F_MEM_USED,
    F_MEM_FREE,
    F_MIG_MODE,
    F_COMPUTE_CAP,
    F_COUNT,
    F_MINOR
};
static const struct {
    const char *name;
    enum field field;
    int mib;
} fields[] = {
    {"index", F_INDEX, 0},
    {"name", F_NAME, 0},
    {"gpu_name", F_NAME, 0},
    {"uuid", F_UUID, 0},
    {"gpu_uuid", F_UUID, 0},
    {"pci.bus_id", F_BUS_ID, 0},
    {"gpu_bus_id", F_BUS_ID, 0},
    {"driver_version", F_DRIVER, 0},
    {"memory.total", F_MEM_TOTAL, 1},
    {"memory.used", F_MEM_USED, 1},
    {"memory.free", F_MEM_FREE, 1},
    {"mig.mode.current", F_MIG_MODE, 0},
    {"compute_cap", F_COMPUTE_CAP, 0},
    {"count", F_COUNT, 0},
    {"minor_number", F_MINOR, 0},
};
#define NFIELDS (sizeof fields / sizeof fields[0])
#define MAX_QUERY 32

static void field_value(const struct gpu_info *gpu, enum field field, int units, char *out, size_t size)
{
    const char *unit = units ? " MiB" : "";
    switch (field) {
    case F_INDEX: snprintf(out, size, "%u", gpu->index); break;
    case F_NAME: snprintf(out, size, "%s", gpu->name); break;
    case F_UUID: snprintf(out, size, "%s", gpu->uuid); break;
    case F_BUS_ID: snprintf(out, size, "%s", gpu->pci.busId); break;
    case F_DRIVER: check("nvmlSystemGetDriverVersion", nvml.driver_version(out, (unsigned)size)); break;
    case F_MEM_TOTAL: snprintf(out, size, "%llu%s", gpu->memory.total >> 20, unit); break;
    case F_MEM_USED: snprintf(out, size, "%llu%s", gpu->memory.used >> 20, unit); break;
    case F_MEM_FREE: snprintf(out, size, "%llu%s", gpu->memory.free >> 20, unit); break;
    case F_MIG_MODE:
        snprintf(out, size, "%s", !gpu->mig_capable ? "[N/A]" : gpu->mig_mode ? "Enabled" : "Disabled");
        break;
    case F_COMPUTE_CAP: snprintf(out, size, "%d.%d", gpu->cc_major, gpu->cc_minor); break;
    case F_COUNT: snprintf(out, size, "%u", gpu_count()); break;
    case F_MINOR: snprintf(out, size, "%u", gpu->minor); break;
    }
}

static int query_gpu(char *query, const char *format)
{
    size_t picked[MAX_QUERY], n = 0;
    int header = 1, units = 1;
    char *save = NULL;

    if (format == NULL) {
        fprintf(stderr, "Option \"--format\" is required when using \"--query-gpu\".\n");
        return 2;
    }
    char fmt[64];
    snprintf(fmt, sizeof fmt, "%s", format);
    for (char *opt = strtok_r(fmt, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
        if (strcmp(opt, "noheader") == 0)
            header = 0;
        else if (strcmp(opt, "nounits") == 0)
            units = 0;
        else if (strcmp(opt, "csv") != 0) {
            fprintf(stderr, "\"%s\" is not a valid format option.\n", opt);
            return 2;
        }
    }
    for (char *name = strtok_r(query, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        size_t f = 0;
        while (f < NFIELDS && strcmp(fields[f].name, name) != 0) f++;
        if (f == NFIELDS) {
            fprintf(stderr, "Field \"%s\" is not a valid field to query.\n\n", name);
            return 2;
        }
        if (n == MAX_QUERY) {
            fprintf(stderr, "Too many fields to query.\n");
            return 2;
        }
        picked[n++] = f;
    }
    if (header)
        for (size_t i = 0; i < n; i++)
            printf("%s%s%s", i ? ", " : "", fields[picked[i]].name, fields[picked[i]].mib ? " [MiB]" : "");
    if (header) printf("\n");
    unsigned count = gpu_count();
    for (unsigned g = 0; g < count; g++) {
        struct gpu_info gpu;
        gpu_info(g, &gpu);
        for (size_t i = 0; i < n; i++) {
            char value[128];
            field_value(&gpu, fields[picked[i]].field, units && fields[picked[i]].mib, value, sizeof value);
            printf("%s%s", i ? ", " : "", value);
        }
        printf("\n");
    }
    return 0;
}

/* --- the summary table ------------------------------------------------------------------- */

/* One table cell: " left<padding>right |", width characters before the '|' unless the text is longer. */
static void cell(const char *left, const char *right, int width)
{
    int pad = width - 2 - (int)strlen(left) - (int)strlen(right);
    printf(" %s%*s%s |", left, pad > 0 ? pad : 0, "", right);
}

/* A horizontal rule of c over cells of the given widths, '+' at every joint. */
static void rule(char c, const int *widths, int n)
{
    putchar('+');
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < widths[i]; k++) putchar(c);
        putchar('+');
    }
    putchar('\n');
}

static const int gpu_cols[] = {41, 24, 22};
static const int mig_cols[] = {18, 34, 11, 22};

static void table_mig(const struct gpu_info *gpu, nvmlDevice_t mig, unsigned position)
{
    unsigned gi, ci;
    nvmlMemory_t mem;
    char left[64], right[64], name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    check("nvmlDeviceGetGpuInstanceId", nvml.gi_id(mig, &gi));
    check("nvmlDeviceGetComputeInstanceId", nvml.ci_id(mig, &ci));
    check("nvmlDeviceGetMemoryInfo", nvml.memory(mig, &mem));
    check("nvmlDeviceGetName", nvml.name(mig, name, sizeof name));
    printf("|");
    snprintf(left, sizeof left, "%3u  %3u %3u %3u", gpu->index, gi, ci, position);
    cell(left, "", mig_cols[0]);
    snprintf(right, sizeof right, "%lluMiB / %6lluMiB", mem.used >> 20, mem.total >> 20);
    cell("", right, mig_cols[1]);
    cell("", mig_profile(name), mig_cols[2]);
    cell("", "N/A", mig_cols[3]);
    printf("\n");
    rule('-', mig_cols, 4);
}

static int summary(void)
{
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE], cuda[16], line[256], stamp[64];
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%a %b %e %H:%M:%S %Y", localtime(&now));
    printf("%s       \n", stamp);
    check("nvmlSystemGetDriverVersion", nvml.driver_version(driver, sizeof driver));
    cuda_version_string(cuda, sizeof cuda);
    int full[] = {TABLE_WIDTH};
    rule('-', full, 1);
    snprintf(line, sizeof line, "NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s", driver, driver, cuda);
    printf("|");
    cell(line, "", TABLE_WIDTH);
    printf("\n");
    rule('-', gpu_cols, 3);
    printf("|");
    cell("GPU  Name", "Persistence-M", gpu_cols[0]);
    cell("Bus-Id", "Disp.A", gpu_cols[1]);
    cell("", "Volatile Uncorr. ECC", gpu_cols[2]);
    printf("\n|");
    cell("Fan  Temp   Perf", "Pwr:Usage/Cap", gpu_cols[0]);
    cell("", "Memory-Usage", gpu_cols[1]);
    cell("GPU-Util", "Compute M.", gpu_cols[2]);
    printf("\n|");
    cell("", "", gpu_cols[0]);
    cell("", "", gpu_cols[1]);
    cell("", "MIG M.", gpu_cols[2]);
    printf("\n");
    rule('=', gpu_cols, 3);

    unsigned count = gpu_count();
    int any_mig = 0;
    for (unsigned i = 0; i < count; i++) {
        struct gpu_info gpu;
        char left[160], right[64];
        gpu_info(i, &gpu);
        snprintf(left, sizeof left, "%3u  %s", i, gpu.name);
        printf("|");
        cell(left, "N/A", gpu_cols[0]);
        snprintf(left, sizeof left, "  %s", gpu.pci.busId);
        cell(left, "Off", gpu_cols[1]);
        cell("", "N/A", gpu_cols[2]);
        printf("\n|");
        cell("N/A   N/A    N/A", "N/A /  N/A", gpu_cols[0]);
        snprintf(right, sizeof right, "%lluMiB / %6lluMiB", gpu.memory.used >> 20, gpu.memory.total >> 20);
        cell("", right, gpu_cols[1]);
        cell("N/A", "Default", gpu_cols[2]);
        printf("\n|");
        cell("", "", gpu_cols[0]);
        cell("", "", gpu_cols[1]);
        cell("", !gpu.mig_capable ? "N/A" : gpu.mig_mode ? "Enabled" : "Disabled", gpu_cols[2]);
        printf("\n");
        rule('-', gpu_cols, 3);
        any_mig |= gpu.mig_capable && gpu.mig_mode == NVML_DEVICE_MIG_ENABLE;
    }
    if (any_mig) {
        printf("\n");
        rule('-', full, 1);
        printf("|");
        cell("MIG devices:", "", TABLE_WIDTH);
        printf("\n");
        rule('-', mig_cols, 4);
        printf("|");
        cell("GPU  GI  CI  MIG", "", mig_cols[0]);
        cell("", "Memory-Usage", mig_cols[1]);
        cell("", "Profile", mig_cols[2]);
        cell("", "Shared", mig_cols[3]);
        printf("\n");
        rule('=', mig_cols, 4);
        for (unsigned i = 0; i < count; i++) {
            struct gpu_info gpu;
            gpu_info(i, &gpu);
            for_each_mig(&gpu, table_mig);
        }
    }
    printf("\n");
    rule('-', full, 1);
    printf("|");
    cell("Processes:", "", TABLE_WIDTH);
    printf("\n|");
    cell(" GPU   GI   CI              PID   Type   Process name", "GPU Memory", TABLE_WIDTH);
    printf("\n|");
    cell("       ID   ID", "Usage     ", TABLE_WIDTH);
    printf("\n");
    rule('=', full, 1);
    printf("|");
    cell(" No running processes found", "", TABLE_WIDTH);
    printf("\n");
    rule('-', full, 1);
    return 0;
}

static int version(void)
{
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE], nvml_v[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE], cuda[16];
    check("nvmlSystemGetDriverVersion", nvml.driver_version(driver, sizeof driver));
    check("nvmlSystemGetNVMLVersion", nvml.nvml_version(nvml_v, sizeof nvml_v));
    cuda_version_string(cuda, sizeof cuda);
    printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n",
           driver, nvml_v, driver, cuda);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: nvidia-smi [-L | --list-gpus | --version | "
                    "--query-gpu=FIELD,... --format=csv[,noheader][,nounits]]\n");
}

int main(int argc, char **argv)
{
    char *query = NULL;
    const char *format = NULL;
    int list = 0, show_version = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            list = 1;
        else if (strcmp(argv[i], "--version") == 0)
            show_version = 1;
        else if (strncmp(argv[i], "--query-gpu=", 12) == 0)
            query = argv[i] + 12;
        else if (strncmp(argv[i], "--format=", 9) == 0)
            format = argv[i] + 9;
        else {
            fprintf(stderr, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
            usage();
            return 2;
        }
    }
    if (list + show_version + (query != NULL) > 1) {
        usage();
        return 2;
    }
    load_nvml();
    int rc = list ? list_gpus() : show_version ? version() : query ? query_gpu(query, format) : summary();
    nvml.shutdown();
    return rc;
}

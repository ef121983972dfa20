/* nvc-py-driver-snapshot: the driver helper of every snapshot no warm Python helper answers, in C.
 *
 *     nvc-py-driver-snapshot ROOT UID GID
 *
 * writes to its standard output one response of nvc/rpc/protocol.py's schema (unframed): the snapshot method's
 * result (nvc/rpc/driver_service.py: versions, every GPU, every MIG device) or the error it hit. It is what that
 * module's driver helper answers for the same ROOT and identity, through the same NVML calls in the same order,
 * with the same messages (tests/test_driver_snapshot.py compares the two on every fake machine); NVML brands go
 * as NVML's numbers, which nvc.rpc.driver_service.snapshot_from_wire names.
 *
 * Why C: an `info` without a server waited for a Python helper's interpreter, its imports and pynvml before
 * NVML could start, about twice the reference's whole `info` (docs/performance.md). The native front (the
 * installed `nvc-py`, native/client/driver_start.c) starts this program as it executes the Python program,
 * so NVML starts while the interpreter does; the Python program starts it itself for the snapshots it takes without a
 * warm Python helper (another root or user, an inventory asking NVML); nvc/rpc/native_snapshot.py takes the answer.
 *
 * It confines itself first as the driver helper does (confine.c), then loads libnvidia-ml.so.1 through the
 * root's loader cache. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "base/nvml_abi.h"
#include "confine.h"

#define NVML_SONAME "libnvidia-ml.so.1"
#define VERSION_SIZE 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */

/* Host libraries NVML needs, loaded before the chroot (driver_service.py's _HOST_PRELOADS). */
static const char *const host_preloads[] = {"libm.so.6", "librt.so.1", "libpthread.so.0", "libdl.so.2"};

static void *nvml;
static FILE *out; /* where the result is written: a buffer, sent whole once complete */

/* ---- the response ------------------------------------------------------------------------------------ */

static void json_string(const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* The error response, and the end of this program. code < 0: none. */
__attribute__((noreturn)) static void answer_error(const char *kind, const char *message, long code)
{
    out = stdout;
    fputs("{\"v\":1,\"id\":0,\"error\":{\"kind\":", out);
    json_string(kind);
    fputs(",\"message\":", out);
    json_string(message);
    if (code >= 0)
        fprintf(out, ",\"code\":%ld}}\n", code);
    else
        fputs(",\"code\":null}}\n", out);
    exit(fflush(out) ? 1 : 0);
}

/* ---- NVML -------------------------------------------------------------------------------------------- */

/* NVML's own string for an error, lower case as the reference prints it: "nvml error: not supported". */
static void error_text(nvmlReturn_t ret, char *text, size_t size)
{
    const char *(*string)(nvmlReturn_t) = (const char *(*)(nvmlReturn_t))dlsym(nvml, "nvmlErrorString");
    const char *said = string ? string(ret) : NULL;
    snprintf(text, size, "nvml error: %s", said ? said : "unknown error");
    for (char *p = text; *p; p++)
        *p = (char)tolower((unsigned char)*p);
}

/* A failed call: a driver error naming the function as pynvml names it (the entry point without its _vN). */
__attribute__((noreturn)) static void call_failed(nvmlReturn_t ret, const char *function)
{
    char text[256], message[384];
    error_text(ret, text, sizeof text);
    snprintf(message, sizeof message, "%s (%s)", text, function);
    answer_error("driver", message, ret);
}

/* The entry point `symbol`, or a failed call of `function` (NVML_ERROR_FUNCTION_NOT_FOUND, as pynvml). */
static void *entry(const char *symbol, const char *function)
{
    void *fn = dlsym(nvml, symbol);
    if (!fn)
        call_failed(NVML_ERROR_FUNCTION_NOT_FOUND, function);
    return fn;
}

/* CALL(function, symbol, type, args...): the entry point `symbol`, of pointer type `type`, called with args; a
 * failure ends the program with the driver error that names `function`. */
#define CALL(function, symbol, type, ...) \
    do { \
        nvmlReturn_t ret_ = ((type)entry(symbol, function))(__VA_ARGS__); \
        if (ret_ != NVML_SUCCESS) \
            call_failed(ret_, function); \
    } while (0)

typedef nvmlReturn_t (*string_fn)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*uint_fn)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*memory_fn)(nvmlDevice_t, nvmlMemory_t *);

static void load(void)
{
    nvml = dlopen(NVML_SONAME, RTLD_NOW);
    if (!nvml) {
        char message[512];
        const char *reason = dlerror();
        size_t prefix = strlen(NVML_SONAME ": ");
        if (!strncmp(reason, NVML_SONAME ": ", prefix))
            reason += prefix;
        snprintf(message, sizeof message, "load library failed: " NVML_SONAME ": %s", reason);
        answer_error("initialization", message, -1);
    }
    nvmlReturn_t (*init)(unsigned int) = (nvmlReturn_t(*)(unsigned int))dlsym(nvml, "nvmlInitWithFlags");
    nvmlReturn_t ret = init ? init(0) : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (ret != NVML_SUCCESS) {
        char text[256];
        error_text(ret, text, sizeof text);
        answer_error("initialization", text, ret);
    }
}

/* The GPU's MIG devices by position, up to its maximum, stopping at the first empty slot. */
static void mig_devices(nvmlDevice_t gpu)
{
    unsigned int max, id;
    CALL("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMaxMigDeviceCount", uint_fn, gpu, &max);
    typedef nvmlReturn_t (*by_index_fn)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
    by_index_fn by_index =
        (by_index_fn)entry("nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMigDeviceHandleByIndex");
    for (unsigned int position = 0; position < max; position++) {
        nvmlDevice_t mig;
        nvmlReturn_t ret = by_index(gpu, position, &mig);
        if (ret == NVML_ERROR_NOT_FOUND || ret == NVML_ERROR_INVALID_ARGUMENT)
            break;
        if (ret != NVML_SUCCESS)
            call_failed(ret, "nvmlDeviceGetMigDeviceHandleByIndex");
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        nvmlMemory_t memory;
        fprintf(out, "%s{\"index\":%u", position ? "," : "", position);
        CALL("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetGpuInstanceId", uint_fn, mig, &id);
        fprintf(out, ",\"gpu_instance_id\":%u", id);
        CALL("nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetComputeInstanceId", uint_fn, mig, &id);
        fprintf(out, ",\"compute_instance_id\":%u", id);
        CALL("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", string_fn, mig, uuid, sizeof uuid);
        CALL("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", memory_fn, mig, &memory);
        CALL("nvmlDeviceGetName", "nvmlDeviceGetName", string_fn, mig, name, sizeof name);
        fputs(",\"uuid\":", out);
        json_string(uuid);
        fprintf(out, ",\"memory_total\":%llu,\"name\":", memory.total);
        json_string(name);
        fputc('}', out);
    }
}

static void gpu(unsigned int index)
{
    nvmlDevice_t handle;
    nvmlPciInfo_t pci;
    int major, minor;
    unsigned int current, pending, number, brand;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    nvmlMemory_t memory;
    CALL("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", nvmlReturn_t(*)(unsigned int, nvmlDevice_t *),
         index, &handle);
    CALL("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3", nvmlReturn_t(*)(nvmlDevice_t, nvmlPciInfo_t *), handle,
         &pci);
    CALL("nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetCudaComputeCapability",
         nvmlReturn_t(*)(nvmlDevice_t, int *, int *), handle, &major, &minor);
    /* The current MIG mode; a GPU without MIG answers NOT_SUPPORTED: disabled. */
    typedef nvmlReturn_t (*mig_mode_fn)(nvmlDevice_t, unsigned int *, unsigned int *);
    nvmlReturn_t ret = ((mig_mode_fn)entry("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode"))(handle, &current, &pending);
    if (ret != NVML_SUCCESS && ret != NVML_ERROR_NOT_SUPPORTED)
        call_failed(ret, "nvmlDeviceGetMigMode");
    int mig_enabled = ret == NVML_SUCCESS && current == NVML_DEVICE_MIG_ENABLE;
    CALL("nvmlDeviceGetMinorNumber", "nvmlDeviceGetMinorNumber", uint_fn, handle, &number);
    CALL("nvmlDeviceGetName", "nvmlDeviceGetName", string_fn, handle, name, sizeof name);
    CALL("nvmlDeviceGetBrand", "nvmlDeviceGetBrand", uint_fn, handle, &brand);
    CALL("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", string_fn, handle, uuid, sizeof uuid);
    CALL("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", memory_fn, handle, &memory);
    fprintf(out, "%s{\"index\":%u,\"minor\":%u,\"model\":", index ? "," : "", index, number);
    json_string(name);
    fprintf(out, ",\"brand\":%u,\"uuid\":", brand);
    json_string(uuid);
    fprintf(out, ",\"bus_id\":\"%08X:%02X:%02X.0\",\"architecture\":\"%d.%d\",\"memory_total\":%llu", pci.domain,
            pci.bus, pci.device, major, minor, memory.total);
    fprintf(out, ",\"mig_enabled\":%s,\"mig_devices\":[", mig_enabled ? "true" : "false");
    if (mig_enabled)
        mig_devices(handle);
    fputs("]}", out);
}

static void snapshot(void)
{
    char version[VERSION_SIZE];
    int cuda;
    unsigned int count;
    CALL("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion", nvmlReturn_t(*)(char *, unsigned int), version,
         sizeof version);
    CALL("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion", nvmlReturn_t(*)(int *), &cuda);
    CALL("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2", nvmlReturn_t(*)(unsigned int *), &count);
    /* The result is whole before any of it is sent: a failed call on the way answers an error instead. */
    static char body[1 << 20];
    out = fmemopen(body, sizeof body, "w");
    if (!out)
        exit(1);
    fputs("{\"v\":1,\"id\":0,\"result\":{\"driver_version\":", out);
    json_string(version);
    fprintf(out, ",\"cuda_version\":%d,\"gpus\":[", cuda);
    for (unsigned int index = 0; index < count; index++)
        gpu(index);
    fputs("]}}\n", out);
    if (fclose(out) || strlen(body) >= sizeof body - 1)
        exit(1);
    fputs(body, stdout);
    exit(fflush(stdout) ? 1 : 0);
}

/* Only the answer's descriptor (standard output) is kept, as the Python driver helper keeps only its socket:
 * NVML, loaded from the driver root, gets none of its starter's files (its terminal, a directory outside the
 * chroot). */
static void keep_only_stdout(void)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(null, STDERR_FILENO) < 0 || close_range(3, ~0u, 0) < 0)
        exit(1);
}

static int number(const char *text, unsigned long *value)
{
    char *end;
    errno = 0;
    *value = strtoul(text, &end, 10);
    return !errno && *text && !*end && *text != '-' && *value <= 0xfffffffful;
}

int main(int argc, char **argv)
{
    prctl(PR_SET_NAME, "nvc:[driver]");
    unsigned long uid, gid;
    if (argc != 4 || argv[1][0] != '/' || !number(argv[2], &uid) || !number(argv[3], &gid)) {
        fprintf(stderr, "usage: nvc-py-driver-snapshot ROOT UID GID\n");
        return 2;
    }
    keep_only_stdout();
    const char *root = argv[1];
    if (strcmp(root, "/")) /* NVML's own needs, from the host: the root may lack them or ship others */
        for (size_t i = 0; i < sizeof host_preloads / sizeof *host_preloads; i++)
            dlopen(host_preloads[i], RTLD_NOW | RTLD_GLOBAL);
    struct confine_failure failure;
    if (confine_driver_helper(root, (uid_t)uid, (gid_t)gid, getppid(), &failure) < 0)
        answer_error(failure.kind, failure.message, -1);
    load();
    snapshot();
}

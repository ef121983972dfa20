/* The fake libnvidia-ml's event sets. Test double only. */
#include "internal.h"

/* ---- events ------------------------------------------------------------------------------------
 * Critical XIDs come from a text file inside the driver root (EVENTS_FILE; the driver helper is
 * chrooted there), one "<GPU- or MIG-UUID> <xid>" line each, appended by a test. An event set reads
 * the lines appended after its creation, as NVML reports only errors that happen while a set waits.
 * A MIG device's XID is reported on its parent GPU with the MIG device's instance ids, as in NVML. */
#define EVENTS_FILE "/var/lib/fake-nvml/xid-events"
#define SUPPORTED_EVENTS \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState | \
     nvmlEventTypeXidCriticalError)

struct nvmlEventSet_st {
    long offset;                              /* bytes of EVENTS_FILE already read */
    unsigned long long types[FAKE_GPU_COUNT]; /* registered event types per GPU */
};

static long events_file_size(void)
{
    struct stat st;
    return stat(EVENTS_FILE, &st) == 0 ? (long)st.st_size : 0;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    if (*set == NULL) return NVML_ERROR_MEMORY;
    (*set)->offset = events_file_size();
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    free(set);
    return NVML_SUCCESS;
}

DEVICE_QUERY(nvmlDeviceGetSupportedEventTypes, fake_lookup_gpu, unsigned long long, *out = SUPPORTED_EVENTS)

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set)
{
    struct nvmlDevice_st *dev;
    nvmlReturn_t ret = fake_lookup_gpu(device, &dev);
    if (ret != NVML_SUCCESS) return ret;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS) return NVML_ERROR_NOT_SUPPORTED;
    set->types[dev - fake_gpus] |= types;
    return NVML_SUCCESS;
}

/* The event of one line, if it names a visible device whose GPU registered XIDs in `set`. */
static int xid_event(const nvmlEventSet_t set, const char *uuid, unsigned long long xid, nvmlEventData_t *data)
{
    for (unsigned g = 0; g < FAKE_GPU_COUNT; g++) {
        if (!fake_gpus[g].visible || !(set->types[g] & nvmlEventTypeXidCriticalError)) continue;
        unsigned gi = NVML_EVENT_ALL_INSTANCES, ci = NVML_EVENT_ALL_INSTANCES;
        int found = strcmp(fake_gpus[g].gpu->uuid, uuid) == 0;
        for (unsigned m = 0; !found && m < fake_visible_mig_count[g]; m++) {
            if (strcmp(fake_visible_migs[g][m]->mig->uuid, uuid) == 0) {
                found = 1;
                gi = fake_visible_migs[g][m]->mig->gpu_instance_id;
                ci = fake_visible_migs[g][m]->mig->compute_instance_id;
            }
        }
        if (found) {
            *data = (nvmlEventData_t){.device = &fake_gpus[g],
                                      .eventType = nvmlEventTypeXidCriticalError,
                                      .eventData = xid,
                                      .gpuInstanceId = gi,
                                      .computeInstanceId = ci};
            return 1;
        }
    }
    return 0;
}

/* The next complete line after the set's offset that is an event for it; 0 when none is there yet. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    FILE *f = fopen(EVENTS_FILE, "r");
    if (f == NULL) return 0;
    int got = 0;
    char line[256];
    if (fseek(f, set->offset, SEEK_SET) == 0) {
        while (!got && fgets(line, sizeof line, f) != NULL && strchr(line, '\n') != NULL) {
            set->offset += (long)strlen(line);
            char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            unsigned long long xid;
            got = sscanf(line, "%95s %llu", uuid, &xid) == 2 && xid_event(set, uuid, xid, data);
        }
    }
    fclose(f);
    return got;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    if (!fake_initialized()) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const struct timespec step = {0, 10 * 1000 * 1000};
    for (unsigned waited = 0;; waited += 10) {
        pthread_mutex_lock(&fake_nvml_lock);
        int got = next_event(set, data);
        pthread_mutex_unlock(&fake_nvml_lock);
        if (got) return NVML_SUCCESS;
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        nanosleep(&step, NULL);
    }
}

/* Getting in front of the driver: the real entry points, the dlsym override and cuGetProcAddress.
 * Lookups never guess from names: the real resolver answers first (honouring the requested CUDA
 * version and per-thread-stream flags) and its pointer is mapped to the wrapper of exactly that
 * entry point, so _v2/_ptsz/_ptds variants keep their own ABI. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include "real.h"

struct nvc_real_cuda nvc_cuda;
struct nvc_real_nvml nvc_nvml;

struct entry {
    const char *name;
    void **real;
    void *wrapper;
};

#define CUDA_ENTRY(name) {#name, (void **)&nvc_cuda.name, (void *)name},
#define NVML_ENTRY(name) {#name, (void **)&nvc_nvml.name, (void *)name},
#define CALLED_CUDA(name) {#name, (void **)&nvc_cuda.name, NULL},
#define CALLED_NVML(name) {#name, (void **)&nvc_nvml.name, NULL},
static const struct entry cuda_entries[] = {NVC_CUDA_WRAPPED(CUDA_ENTRY) NVC_CUDA_CALLED(CALLED_CUDA)};
static const struct entry nvml_entries[] = {NVC_NVML_WRAPPED(NVML_ENTRY) NVC_NVML_CALLED(CALLED_NVML)};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

void *nvc_real_dlsym(void *handle, const char *name)
{
    if (!real_dlsym_ptr) {
        /* dlvsym is not overridden; glibc >= 2.34 versions dlsym as GLIBC_2.34, older as GLIBC_2.2.5. */
        dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    }
    return real_dlsym_ptr ? real_dlsym_ptr(handle, name) : NULL;
}

static void fill(void *lib, const struct entry *entries, size_t n)
{
    for (size_t i = 0; i < n; i++)
        __atomic_store_n(entries[i].real, nvc_real_dlsym(lib, entries[i].name), __ATOMIC_RELEASE);
}

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int cuda_loaded, nvml_loaded;

/* Fills a table once the library is in the process; does not load it when only_if_loaded. */
static int load(const char *soname, int *loaded, const struct entry *entries, size_t n, int only_if_loaded)
{
    if (__atomic_load_n(loaded, __ATOMIC_ACQUIRE))
        return 1;
    pthread_mutex_lock(&load_mu);
    if (!*loaded) {
        void *lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
        if (!lib && !only_if_loaded)
            lib = dlopen(soname, RTLD_NOW);
        if (lib) {
            fill(lib, entries, n);
            __atomic_store_n(loaded, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&load_mu);
    return *loaded;
}

int nvc_load_cuda(void) { return load("libcuda.so.1", &cuda_loaded, cuda_entries, COUNT(cuda_entries), 0); }
int nvc_load_nvml(void) { return load("libnvidia-ml.so.1", &nvml_loaded, nvml_entries, COUNT(nvml_entries), 0); }

static void *wrap_pointer(void *p, const struct entry *entries, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (entries[i].wrapper && p == __atomic_load_n(entries[i].real, __ATOMIC_ACQUIRE))
            return entries[i].wrapper;
    return p;
}

NVC_API void *dlsym(void *handle, const char *name)
{
    void *p = nvc_real_dlsym(handle, name);
    if (!p || handle == RTLD_NEXT)
        return p;
    if (name[0] == 'c' && name[1] == 'u') {
        if (load("libcuda.so.1", &cuda_loaded, cuda_entries, COUNT(cuda_entries), 1))
            return wrap_pointer(p, cuda_entries, COUNT(cuda_entries));
    } else if (!strncmp(name, "nvml", 4)) {
        if (load("libnvidia-ml.so.1", &nvml_loaded, nvml_entries, COUNT(nvml_entries), 1))
            return wrap_pointer(p, nvml_entries, COUNT(nvml_entries));
    }
    return p;
}

NVC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = nvc_cuda.cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = wrap_pointer(*pfn, cuda_entries, COUNT(cuda_entries));
    return rc;
}

NVC_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = nvc_cuda.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = wrap_pointer(*pfn, cuda_entries, COUNT(cuda_entries));
    return rc;
}

/* Getting in front of the driver: the dlsym override and cuGetProcAddress (real.c keeps the real
 * entry points). It names every wrapper, so it sits above every file that has one.
 * Lookups never guess from names: the real resolver answers first (honouring the requested CUDA
 * version and per-thread-stream flags) and its pointer is mapped to the wrapper of exactly that
 * entry point, so _v2/_ptsz/_ptds variants keep their own ABI. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include "base/real.h"

/* Each wrapped entry point: where its real address is kept, and the wrapper handed out for it. */
struct wrapped {
    void **real;
    void *wrapper;
};

#define CUDA_WRAPPED(name) {(void **)&nvc_cuda.name, (void *)name},
#define NVML_WRAPPED(name) {(void **)&nvc_nvml.name, (void *)name},
static const struct wrapped cuda_wrapped[] = {NVC_CUDA_WRAPPED(CUDA_WRAPPED)};
static const struct wrapped nvml_wrapped[] = {NVC_NVML_WRAPPED(NVML_WRAPPED)};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void *wrap_pointer(void *p, const struct wrapped *entries, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p == __atomic_load_n(entries[i].real, __ATOMIC_ACQUIRE))
            return entries[i].wrapper;
    return p;
}

NVC_API NVC_UNINSTRUMENTED void *dlsym(void *handle, const char *name)
{
    void *p = nvc_real_dlsym(handle, name);
    if (!p || handle == RTLD_NEXT)
        return p;
    if (name[0] == 'c' && name[1] == 'u') {
        if (nvc_cuda_if_loaded())
            return wrap_pointer(p, cuda_wrapped, COUNT(cuda_wrapped));
    } else if (!strncmp(name, "nvml", 4)) {
        if (nvc_nvml_if_loaded())
            return wrap_pointer(p, nvml_wrapped, COUNT(nvml_wrapped));
    }
    return p;
}

NVC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = nvc_cuda.cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = wrap_pointer(*pfn, cuda_wrapped, COUNT(cuda_wrapped));
    return rc;
}

NVC_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status)
{
    if (!nvc_load_cuda() || !nvc_cuda.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = nvc_cuda.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = wrap_pointer(*pfn, cuda_wrapped, COUNT(cuda_wrapped));
    return rc;
}

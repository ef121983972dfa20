/* The real entry points: the driver's libraries (libcuda.so.1, libnvidia-ml.so.1) opened once and
 * the tables of their functions the shim wraps or calls filled through the real dlsym (the shim
 * overrides dlsym itself, resolve.c). */
#define _GNU_SOURCE
#include "base/real.h"
#include <dlfcn.h>
#include <pthread.h>

struct nvc_real_cuda nvc_cuda;
struct nvc_real_nvml nvc_nvml;

struct entry {
    const char *name;
    void **real;
};

#define CUDA_ENTRY(name) {#name, (void **)&nvc_cuda.name},
#define NVML_ENTRY(name) {#name, (void **)&nvc_nvml.name},
static const struct entry cuda_entries[] = {NVC_CUDA_WRAPPED(CUDA_ENTRY) NVC_CUDA_CALLED(CUDA_ENTRY)};
static const struct entry nvml_entries[] = {NVC_NVML_WRAPPED(NVML_ENTRY) NVC_NVML_CALLED(NVML_ENTRY)};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

NVC_UNINSTRUMENTED void *nvc_real_dlsym(void *handle, const char *name)
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

int nvc_load_cuda(void)
{
    return load("libcuda.so.1", &cuda_loaded, cuda_entries, COUNT(cuda_entries), 0);
}
int nvc_load_nvml(void)
{
    return load("libnvidia-ml.so.1", &nvml_loaded, nvml_entries, COUNT(nvml_entries), 0);
}

int nvc_cuda_if_loaded(void)
{
    return load("libcuda.so.1", &cuda_loaded, cuda_entries, COUNT(cuda_entries), 1);
}
int nvc_nvml_if_loaded(void)
{
    return load("libnvidia-ml.so.1", &nvml_loaded, nvml_entries, COUNT(nvml_entries), 1);
}

/* share_app: a CUDA application the way static cudart 12+/13 is one: it dlopens libcuda.so.1, takes
 * only cuGetProcAddress_v2 from dlsym, and resolves every other entry point through it (CUDA 13.0,
 * default or per-thread stream). Test program for libnvc-share; one output line per operation.
 *
 *   [--ptds] init | alloc BYTES | async BYTES | free SLOT | meminfo | which NAME | pool | frompool BYTES |
 *   freeasync SLOT | trim KEEP | defaulttrim | hold | fork OPERATION... end | stdin
 * (async: the device's default pool; trim: the pool frompool made; defaulttrim: the default pool to 0;
 * fork: a child runs the operations up to end and exits, the parent waits for it, says `forked
 * STATUS` and goes on after end; stdin: then the operations of each line of standard input, a line at a
 * time, so that a test can drive a running process)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_fn gpa;
static cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT;
static CUdeviceptr slots[256];
static int nslots;
static CUmemoryPool pool;

static void *resolve(const char *name)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    if (gpa(name, &fn, 13000, flags, &status) != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) return NULL;
    return fn;
}

#define CALL(type, name) ((__typeof__(&type))resolve(name))

static int run(int argc, char **argv);

/* stdin: the operations of each line read, one line at a time, until end of input */
static int from_stdin(void)
{
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char *words[32] = {"share_app"};
        int n = 1;
        for (char *w = strtok(line, " \t\n"); w && n < 31; w = strtok(NULL, " \t\n")) words[n++] = w;
        int rc = run(n, words);
        if (rc) return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib || !(gpa = (gpa_fn)dlsym(lib, "cuGetProcAddress_v2"))) {
        fprintf(stderr, "share_app: no libcuda.so.1 with cuGetProcAddress_v2\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    return run(argc, argv);
}

static int run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        CUresult r;
        if (!strcmp(op, "--ptds")) {
            flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        } else if (!strcmp(op, "init")) {
            CUcontext ctx;
            r = CALL(cuInit, "cuInit")(0);
            if (r == CUDA_SUCCESS) r = CALL(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")(&ctx, 0);
            if (r == CUDA_SUCCESS) r = CALL(cuCtxSetCurrent, "cuCtxSetCurrent")(ctx);
            printf("init %d\n", r);
        } else if (!strcmp(op, "alloc") || !strcmp(op, "frompool") || !strcmp(op, "async")) {
            size_t bytes = strtoull(argv[++i], NULL, 0);
            CUdeviceptr p = 0;
            if (op[1] == 's') {
                r = CALL(cuMemAllocAsync, "cuMemAllocAsync")(&p, bytes, NULL);
            } else if (op[0] == 'a') {
                r = CALL(cuMemAlloc_v2, "cuMemAlloc")(&p, bytes);
            } else {
                CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                        .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
                r = pool ? CUDA_SUCCESS : CALL(cuMemPoolCreate, "cuMemPoolCreate")(&pool, &props);
                if (r == CUDA_SUCCESS)
                    r = CALL(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")(&p, bytes, pool, NULL);
            }
            printf("%s %d %d\n", op, r, r == CUDA_SUCCESS ? nslots : -1);
            if (r == CUDA_SUCCESS) slots[nslots++] = p;
        } else if (!strcmp(op, "free") || !strcmp(op, "freeasync")) {
            CUdeviceptr p = slots[atoi(argv[++i])];
            r = op[4] ? CALL(cuMemFreeAsync, "cuMemFreeAsync")(p, NULL) : CALL(cuMemFree_v2, "cuMemFree")(p);
            printf("%s %d\n", op, r);
        } else if (!strcmp(op, "trim")) {
            r = CALL(cuMemPoolTrimTo, "cuMemPoolTrimTo")(pool, strtoull(argv[++i], NULL, 0));
            printf("trim %d\n", r);
        } else if (!strcmp(op, "defaulttrim")) {
            CUmemoryPool def;
            r = CALL(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool")(&def, 0);
            if (r == CUDA_SUCCESS) r = CALL(cuMemPoolTrimTo, "cuMemPoolTrimTo")(def, 0);
            printf("defaulttrim %d\n", r);
        } else if (!strcmp(op, "meminfo")) {
            size_t free_b = 0, total = 0;
            r = CALL(cuMemGetInfo_v2, "cuMemGetInfo")(&free_b, &total);
            printf("meminfo %d %zu %zu\n", r, free_b, total);
        } else if (!strcmp(op, "which")) {
            Dl_info info = {0};
            void *fn = resolve(argv[++i]);
            if (!fn || !dladdr(fn, &info)) info.dli_fname = info.dli_sname = NULL;
            printf("which %s %s %s\n", argv[i], info.dli_fname ? info.dli_fname : "-",
                   info.dli_sname ? info.dli_sname : "-");
        } else if (!strcmp(op, "fork")) {
            pid_t child = fork();
            if (child == 0) continue;
            int status = -1;
            while (i + 1 < argc && strcmp(argv[i + 1], "end")) i++;
            i++;
            if (child < 0 || waitpid(child, &status, 0) != child) status = -1;
            printf("forked %d\n", status);
        } else if (!strcmp(op, "end")) {
            return 0;
        } else if (!strcmp(op, "stdin")) {
            int rc = from_stdin();
            if (rc) return rc;
        } else if (!strcmp(op, "hold")) {
            printf("holding\n");
            pause();
        } else {
            fprintf(stderr, "share_app: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}

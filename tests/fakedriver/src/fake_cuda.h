/* The fake libcuda's own additions to the CUDA driver ABI, which native/shim/base/cuda_abi.h declares once for
 * the sharing shim and the fake alike (build with -I native). Shared by libcuda/ and the tests'
 * CUDA programs. Test double only. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include "base/cuda_abi.h"

/* Introspection for tests and benchmarks; not part of the CUDA API (no cu prefix, so a sharing shim
 * that wraps cu* names leaves them alone). Counters are per process. */
int fakeCudaDeviceStats(int ordinal, unsigned long long *launches, unsigned long long *busy_ns,
                        unsigned long long *used_bytes);
/* cuEventQuery calls so far: what a sharing shim asks the driver per launch. */
unsigned long long fakeCudaEventQueries(void);

#endif

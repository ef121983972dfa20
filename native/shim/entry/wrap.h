/* The memory wrappers' common prologue (alloc.c, allocasync.c, graphnodes.c): real entry point
 * present, shim state, re-entrancy. A header only: it offers macros, nothing to link. */
#ifndef NVC_WRAP_H
#define NVC_WRAP_H

#include "base/ground.h"
#include "base/real.h"
#include "process/init.h"
#include "process/reload.h"

enum nvc_path { NVC_PASS, NVC_ACCOUNT, NVC_PATH_CLOSED };
static inline enum nvc_path nvc_path_for(void *real)
{
    if (!real)
        return NVC_PATH_CLOSED;
    if (nvc_depth)
        return NVC_PASS;
    switch (nvc_ready()) {
    case NVC_ACTIVE: return nvc_mem_limited ? NVC_ACCOUNT : NVC_PASS;
    case NVC_CLOSED: return NVC_PATH_CLOSED;
    default: return NVC_PASS;
    }
}

#define NVC_PROLOGUE(fn, ...) \
    nvc_load_cuda(); \
    enum nvc_path path_ = nvc_path_for((void *)nvc_cuda.fn); \
    if (path_ == NVC_PATH_CLOSED) \
        return CUDA_ERROR_NOT_INITIALIZED; \
    if (path_ == NVC_PASS) \
        return nvc_cuda.fn(__VA_ARGS__);

/* The real call with the depth guard held; needs a CUresult rc_ in scope. */
#define NVC_REAL(fn, ...) (nvc_depth++, rc_ = nvc_cuda.fn(__VA_ARGS__), nvc_depth--, rc_)

/* A wrapper that calls the driver and, when it succeeded, does `then` (bookkeeping only). */
#define NVC_WRAP_THEN(fn, params, then, ...) \
    NVC_API CUresult fn params \
    { \
        NVC_PROLOGUE(fn, __VA_ARGS__) \
        CUresult rc_ = NVC_REAL(fn, __VA_ARGS__); \
        if (rc_ == CUDA_SUCCESS) { \
            then; \
        } \
        return rc_; \
    }

#endif

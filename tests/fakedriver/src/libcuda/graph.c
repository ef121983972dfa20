/* The fake libcuda's graphs: kernel nodes, executables, graph memory nodes and stream capture. Test
 * double only. */
#include "internal.h"

/* ---------------------------------------------------------------- graphs */

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    if (!graph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_init();
    struct obj *g = NULL;
    if (r == CUDA_SUCCESS && !(g = fake_obj_new(K_GRAPH, 0))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) *graph = (CUgraph)g;
    unlock();
    return r;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                 const CUDA_KERNEL_NODE_PARAMS *params)
{
    if (!node || !params || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *g, *f;
    CUresult r = fake_find(K_GRAPH, (uintptr_t)graph, CUDA_ERROR_INVALID_VALUE, &g);
    if (r == CUDA_SUCCESS) r = fake_find(K_FUNC, (uintptr_t)params->func, CUDA_ERROR_INVALID_VALUE, &f);
    for (size_t i = 0; r == CUDA_SUCCESS && i < ndeps; i++) {
        struct obj *d = fake_handle_find(K_NODE, deps[i]);
        if (!d || d->parent != g) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        struct launch l = {{params->gridDimX, params->gridDimY, params->gridDimZ},
                           {params->blockDimX, params->blockDimY, params->blockDimZ},
                           0};
        r = fake_check_launch(f, &l);
    }
    struct obj *n = NULL;
    if (r == CUDA_SUCCESS && !(n = fake_obj_new(K_NODE, 0))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        n->parent = g;
        g->kernels++;
        *node = (CUgraphNode)n;
    }
    unlock();
    return r;
}

CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_KERNEL_NODE_PARAMS *params)
{
    return cuGraphAddKernelNode_v2(node, graph, deps, ndeps, params);
}

/* Points executable e at graph g: its kernels and a snapshot of g's memory nodes. A graph with memory
 * nodes may have one executable at a time. Called under the lock. */
static CUresult exec_snapshot(struct obj *e, struct obj *g)
{
    size_t na = 0, nf = 0;
    for (struct obj *o = fake_all; o; o = o->next)
        if (o->kind == K_NODE && o->parent == g && o->gmem) {
            na += o->ntype == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
            nf += o->ntype == CU_GRAPH_NODE_TYPE_MEM_FREE;
        }
    if ((na || nf) && g->has_exec && e->graph != g) return CUDA_ERROR_INVALID_VALUE;
    struct obj **allocs = calloc(na + 1, sizeof(*allocs)), **frees = calloc(nf + 1, sizeof(*frees));
    if (!allocs || !frees) {
        free(allocs);
        free(frees);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    na = nf = 0;
    for (struct obj *o = fake_all; o; o = o->next)
        if (o->kind == K_NODE && o->parent == g && o->gmem) {
            if (o->ntype == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                allocs[na++] = o->gmem;
            else
                frees[nf++] = o->gmem;
        }
    if (e->graph) e->graph->has_exec = 0;
    free(e->gallocs);
    free(e->gfrees);
    e->gallocs = allocs;
    e->gfrees = frees;
    e->ngallocs = na;
    e->ngfrees = nf;
    e->kernels = g->kernels;
    e->graph = g;
    g->has_exec = na || nf;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct fctx *c;
    struct obj *g, *e = NULL;
    CUresult r = fake_current_ctx(&c);
    if (r == CUDA_SUCCESS) r = fake_find(K_GRAPH, (uintptr_t)graph, CUDA_ERROR_INVALID_VALUE, &g);
    if (r == CUDA_SUCCESS) r = fake_owned_new(c, K_EXEC, 0, &e);
    if (r == CUDA_SUCCESS) r = exec_snapshot(e, g);
    if (r == CUDA_SUCCESS) {
        e->autofree = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
        *exec = (CUgraphExec)e;
    } else if (e) {
        fake_obj_free(e);
    }
    unlock();
    return r;
}

CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t log_size)
{
    if (log && log_size) log[0] = 0;
    if (error_node) *error_node = NULL;
    return cuGraphInstantiateWithFlags(exec, graph, 0);
}

CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t log_size)
{
    return cuGraphInstantiate_v2(exec, graph, error_node, log, log_size);
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) { return fake_submit(NULL, NULL, stream, exec); }

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    return fake_submit(NULL, NULL, stream ? stream : STREAM_PER_THREAD, exec);
}

CUresult cuGraphExecDestroy(CUgraphExec exec) { return fake_destroy(K_EXEC, exec, CUDA_ERROR_INVALID_VALUE); }
CUresult cuGraphDestroy(CUgraph graph) { return fake_destroy(K_GRAPH, graph, CUDA_ERROR_INVALID_VALUE); }

/* ---------------------------------------------------------------- graph memory */

/* A memory allocation node: its address now (reserved for the graph's lifetime), its memory only when a
 * launch reaches it, from the device's graph reserve (grown, and charged, as needed). Under the lock. */
CUresult fake_gmem_node(struct obj *g, CUgraphNode *node, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (!node || !p || p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.handleTypes != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fake_check_device_location(&p->poolProps.location);
    CUdeviceptr va;
    if (r == CUDA_SUCCESS) r = fake_reserve_va(p->bytesize, 0, &va);
    struct obj *m = NULL, *n = NULL;
    if (r == CUDA_SUCCESS && (!(m = fake_obj_new(K_GMEM, va)) || !(n = fake_obj_new(K_NODE, 0)))) {
        if (m) fake_obj_free(m);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        m->dev = p->poolProps.location.id;
        m->size = p->bytesize;
        n->parent = g;
        n->ntype = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        n->gmem = m;
        p->dptr = va;
        *node = (CUgraphNode)n;
    }
    return r;
}

CUresult fake_gfree_node(struct obj *g, CUgraphNode *node, CUdeviceptr dptr)
{
    struct obj *m = fake_obj_find(K_GMEM, dptr), *n = NULL;
    if (!node || !m) return CUDA_ERROR_INVALID_VALUE;
    if (!(n = fake_obj_new(K_NODE, 0))) return CUDA_ERROR_OUT_OF_MEMORY;
    n->parent = g;
    n->ntype = CU_GRAPH_NODE_TYPE_MEM_FREE;
    n->gmem = m;
    *node = (CUgraphNode)n;
    return CUDA_SUCCESS;
}

static void gmem_release(struct obj *m)
{
    struct fdev *d = &fake_dev[m->dev];
    d->graph_used -= m->size < d->graph_used ? m->size : d->graph_used;
    m->live = 0;
}

/* cuMemFree(Async) of a graph allocation: 1 when it was live. Under the lock. */
int fake_gmem_free(CUdeviceptr dptr)
{
    struct obj *m = fake_obj_find(K_GMEM, dptr);
    if (!m || !m->live) return 0;
    gmem_release(m);
    return 1;
}

/* A launch reaching the executable's memory nodes: its allocations become live (the reserve grows and is
 * charged by what is missing), then its free nodes release theirs. Under the lock. */
CUresult fake_graph_memory_launch(struct obj *e)
{
    for (size_t i = 0; e->autofree && i < e->ngallocs; i++)
        if (e->gallocs[i]->live) gmem_release(e->gallocs[i]);
    for (size_t i = 0; i < e->ngallocs; i++) {
        struct obj *m = e->gallocs[i];
        struct fdev *d = &fake_dev[m->dev];
        if (m->live) continue;
        if (d->graph_used + m->size > d->graph_reserved) {
            uint64_t need = d->graph_used + m->size - d->graph_reserved;
            if (fake_charge(m->dev, need) != CUDA_SUCCESS) {
                for (size_t j = 0; j < i; j++) /* this launch's allocations are undone */
                    if (e->gallocs[j]->live) gmem_release(e->gallocs[j]);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            d->graph_reserved += need;
            d->graph_reserved_high = max_u64(d->graph_reserved_high, d->graph_reserved);
        }
        d->graph_used += m->size;
        d->graph_used_high = max_u64(d->graph_used_high, d->graph_used);
        m->live = 1;
    }
    for (size_t i = 0; i < e->ngfrees; i++)
        if (e->gfrees[i]->live) gmem_release(e->gfrees[i]);
    return CUDA_SUCCESS;
}

static CUresult add_memory_node(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                CUgraphNodeParams *p)
{
    if (!p || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *g;
    CUresult r = fake_find(K_GRAPH, (uintptr_t)graph, CUDA_ERROR_INVALID_VALUE, &g);
    for (size_t i = 0; r == CUDA_SUCCESS && i < ndeps; i++) {
        struct obj *d = fake_handle_find(K_NODE, deps[i]);
        if (!d || d->parent != g) r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            r = fake_gmem_node(g, node, &p->alloc);
        else if (p->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
            r = fake_gfree_node(g, node, p->free.dptr);
        else
            r = CUDA_ERROR_NOT_SUPPORTED; /* the fake builds other nodes with their own calls only */
    }
    unlock();
    return r;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .alloc = *params};
    CUresult r = add_memory_node(node, graph, deps, ndeps, &p);
    params->dptr = p.alloc.dptr;
    return r;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                               CUdeviceptr dptr)
{
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .free = {dptr}};
    return add_memory_node(node, graph, deps, ndeps, &p);
}

CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                        CUgraphNodeParams *params)
{
    return add_memory_node(node, graph, deps, ndeps, params);
}

CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                           size_t ndeps, CUgraphNodeParams *params)
{
    (void)edges;
    return add_memory_node(node, graph, deps, ndeps, params);
}

/* Changing the parameters of memory nodes is not supported (CUDA documents it so); nor, in the fake,
 * of anything else. */
static CUresult set_params(CUgraphNode node, CUgraphNodeParams *params)
{
    lock();
    struct obj *n;
    CUresult r = fake_find(K_NODE, (uintptr_t)node, CUDA_ERROR_INVALID_VALUE, &n);
    if (r == CUDA_SUCCESS && (!params || params->type != n->ntype)) r = CUDA_ERROR_INVALID_VALUE;
    unlock();
    return r == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : r;
}

CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams *params) { return set_params(node, params); }

CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *params)
{
    lock();
    struct obj *e;
    CUresult r = fake_find(K_EXEC, (uintptr_t)exec, CUDA_ERROR_INVALID_VALUE, &e);
    unlock();
    return r == CUDA_SUCCESS ? set_params(node, params) : r;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuGraphInstantiateWithFlags(exec, graph, params->flags);
    params->hErrNode_out = NULL;
    params->result_out = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
    return r;
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return cuGraphInstantiateWithParams(exec, graph, params);
}

/* The executable takes the topology of graph (the fake does not check that it matches). */
CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info)
{
    (void)info;
    lock();
    struct obj *e, *g;
    CUresult r = fake_find(K_EXEC, (uintptr_t)exec, CUDA_ERROR_INVALID_VALUE, &e);
    if (r == CUDA_SUCCESS) r = fake_find(K_GRAPH, (uintptr_t)graph, CUDA_ERROR_INVALID_VALUE, &g);
    if (r == CUDA_SUCCESS) r = exec_snapshot(e, g);
    unlock();
    return r;
}

CUresult cuGraphDestroyNode(CUgraphNode node) { return fake_destroy(K_NODE, node, CUDA_ERROR_INVALID_VALUE); }

CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS) {
        const struct fdev *d = &fake_dev[dev];
        switch (attr) {
        case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = d->graph_used; break;
        case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = d->graph_used_high; break;
        case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = d->graph_reserved; break;
        case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = d->graph_reserved_high; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    unlock();
    return r;
}

/* Gives back the reserve no live graph allocation uses. */
CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    lock();
    CUresult r = fake_check_device(dev);
    if (r == CUDA_SUCCESS) {
        struct fdev *d = &fake_dev[dev];
        fake_uncharge(dev, d->graph_reserved - d->graph_used);
        d->graph_reserved = d->graph_used;
    }
    unlock();
    return r;
}

/* ---------------------------------------------------------------- stream capture */

/* The graph a created stream captures into, or NULL. Under the lock. */
struct obj *fake_capture_of(CUstream stream)
{
    int created = stream && stream != STREAM_LEGACY && stream != STREAM_PER_THREAD;
    struct obj *s = created ? fake_handle_find(K_STREAM, stream) : NULL;
    return s ? s->capture : NULL;
}

/* Only created streams capture here (capturing the legacy stream is an error in CUDA too). */
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *s, *g = NULL;
    CUresult r = fake_find(K_STREAM, (uintptr_t)stream, CUDA_ERROR_INVALID_HANDLE, &s);
    if (r == CUDA_SUCCESS && s->capture) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !(g = fake_obj_new(K_GRAPH, 0))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) s->capture = g;
    unlock();
    return r;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct obj *s;
    CUresult r = fake_find(K_STREAM, (uintptr_t)stream, CUDA_ERROR_INVALID_HANDLE, &s);
    if (r == CUDA_SUCCESS && !s->capture) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        *graph = (CUgraph)s->capture;
        s->capture = NULL;
    }
    unlock();
    return r;
}

CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                   const CUgraphNode **deps, size_t *ndeps)
{
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct fctx *c;
    uint64_t *done;
    CUresult r = fake_stream_resolve(stream, &c, &done);
    struct obj *g = r == CUDA_SUCCESS ? fake_capture_of(stream) : NULL;
    if (r == CUDA_SUCCESS) {
        *status = g ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
        if (id) *id = (cuuint64_t)(uintptr_t)g;
        if (graph && g) *graph = (CUgraph)g;
        if (deps && g) *deps = NULL;
        if (ndeps && g) *ndeps = 0;
    }
    unlock();
    return r;
}

CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                        const CUgraphNode **deps, size_t *ndeps)
{
    return cuStreamGetCaptureInfo_v2(stream ? stream : STREAM_PER_THREAD, status, id, graph, deps, ndeps);
}

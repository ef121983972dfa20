/* The graph entry points that create, change, instantiate and destroy what holds graph memory: a
 * memory allocation node is charged when it is created (memory.c decides), refused a change of its
 * parameters, and its record (graphmem.c) follows the graph, its executables and its destruction. */
#define _GNU_SOURCE
#include <stddef.h>
#include "accounting/graphmem.h"
#include "accounting/memory.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "entry/wrap.h"
#include "process/devices.h"
#include "process/init.h"
#include "process/reload.h"

/* ---- node creation ---- */

static CUresult add_alloc(CUgraph graph, CUDA_MEM_ALLOC_NODE_PARAMS *p, CUgraphNode *node,
                          CUresult (*call)(const void *), const void *args)
{
    CUresult rc_;
    struct nvc_device *d = p && node && p->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE
                               ? nvc_device_by_ordinal(p->poolProps.location.id)
                               : NULL;
    if (!d) {
        nvc_depth++;
        rc_ = call(args);
        nvc_depth--;
        return rc_;
    }
    if (nvc_mem_charge(d, p->bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    nvc_depth++;
    rc_ = call(args);
    nvc_depth--;
    if (rc_ == CUDA_SUCCESS)
        nvc_graph_record_alloc(graph, *node, p->dptr, d->region_index, p->bytesize);
    else
        nvc_region_uncharge(d->region_index, p->bytesize);
    return rc_;
}

struct add_args {
    CUgraphNode *node;
    CUgraph graph;
    const CUgraphNode *deps;
    const CUgraphEdgeData *edges;
    size_t ndeps;
    void *params;
    int kind; /* 0 cuGraphAddMemAllocNode, 1 cuGraphAddNode, 2 cuGraphAddNode_v2 */
};

static CUresult call_add(const void *a)
{
    const struct add_args *x = a;
    switch (x->kind) {
    case 0: return nvc_cuda.cuGraphAddMemAllocNode(x->node, x->graph, x->deps, x->ndeps, x->params);
    case 1: return nvc_cuda.cuGraphAddNode(x->node, x->graph, x->deps, x->ndeps, x->params);
    default: return nvc_cuda.cuGraphAddNode_v2(x->node, x->graph, x->deps, x->edges, x->ndeps, x->params);
    }
}

NVC_API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                        CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    NVC_PROLOGUE(cuGraphAddMemAllocNode, node, graph, deps, ndeps, params)
    struct add_args a = {node, graph, deps, NULL, ndeps, params, 0};
    return add_alloc(graph, params, node, call_add, &a);
}

NVC_API CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                       CUdeviceptr dptr)
{
    NVC_PROLOGUE(cuGraphAddMemFreeNode, node, graph, deps, ndeps, dptr)
    CUresult rc_ = NVC_REAL(cuGraphAddMemFreeNode, node, graph, deps, ndeps, dptr);
    if (rc_ == CUDA_SUCCESS) {
        nvc_graph_record_free(graph, dptr);
    }
    return rc_;
}

static CUresult add_node(struct add_args *a)
{
    CUgraphNodeParams *p = a->params;
    if (p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return add_alloc(a->graph, &p->alloc, a->node, call_add, a);
    CUresult rc_;
    nvc_depth++;
    rc_ = call_add(a);
    nvc_depth--;
    if (rc_ == CUDA_SUCCESS && p && p->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
        nvc_graph_record_free(a->graph, p->free.dptr);
    } else if (rc_ == CUDA_SUCCESS && p && p->type == CU_GRAPH_NODE_TYPE_GRAPH &&
               p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) {
        nvc_graph_adopt(a->graph, p->graph.graph);
    }
    return rc_;
}

NVC_API CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                CUgraphNodeParams *params)
{
    NVC_PROLOGUE(cuGraphAddNode, node, graph, deps, ndeps, params)
    struct add_args a = {node, graph, deps, NULL, ndeps, params, 1};
    return add_node(&a);
}

NVC_API CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                   const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *params)
{
    NVC_PROLOGUE(cuGraphAddNode_v2, node, graph, deps, edges, ndeps, params)
    struct add_args a = {node, graph, deps, edges, ndeps, params, 2};
    return add_node(&a);
}

/* The driver does not support changing a memory node's parameters; refusing it here too means a
 * future driver that did could not resize an allocation behind its charge. */
static int memory_node_params(const CUgraphNodeParams *p)
{
    return p && (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || p->type == CU_GRAPH_NODE_TYPE_MEM_FREE);
}

NVC_API CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams *params)
{
    NVC_PROLOGUE(cuGraphNodeSetParams, node, params)
    if (memory_node_params(params))
        return CUDA_ERROR_NOT_SUPPORTED;
    return nvc_cuda.cuGraphNodeSetParams(node, params);
}

NVC_API CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *params)
{
    NVC_PROLOGUE(cuGraphExecNodeSetParams, exec, node, params)
    if (memory_node_params(params))
        return CUDA_ERROR_NOT_SUPPORTED;
    return nvc_cuda.cuGraphExecNodeSetParams(exec, node, params);
}

/* ---- executables ---- */

#define INSTANTIATE(name, params, ...) \
    NVC_WRAP_THEN(name, params, if (exec) nvc_graph_set_exec(*exec, graph), __VA_ARGS__)
INSTANTIATE(cuGraphInstantiate, (CUgraphExec * exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t size),
            exec, graph, error_node, log, size)
INSTANTIATE(cuGraphInstantiate_v2, (CUgraphExec * exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t size),
            exec, graph, error_node, log, size)
INSTANTIATE(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags), exec, graph,
            flags)
INSTANTIATE(cuGraphInstantiateWithParams, (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params),
            exec, graph, params)
INSTANTIATE(cuGraphInstantiateWithParams_ptsz,
            (CUgraphExec * exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params), exec, graph, params)

/* An updated executable runs the new graph's topology from now on. */
NVC_WRAP_THEN(cuGraphExecUpdate,
              (CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, CUgraphExecUpdateResult *result),
              nvc_graph_set_exec(exec, graph), exec, graph, error_node, result)
NVC_WRAP_THEN(cuGraphExecUpdate_v2, (CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *result_info),
              nvc_graph_set_exec(exec, graph), exec, graph, result_info)
NVC_WRAP_THEN(cuGraphExecDestroy, (CUgraphExec exec), nvc_graph_set_exec(exec, NULL), exec)

/* ---- destruction and trim: the nodes go; allocations that are not live are refunded ---- */

NVC_WRAP_THEN(cuGraphDestroyNode, (CUgraphNode node), nvc_graph_nodes_gone(NULL, node), node)
NVC_WRAP_THEN(cuGraphDestroy, (CUgraph graph), nvc_graph_nodes_gone(graph, NULL), graph)

NVC_API CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    NVC_PROLOGUE(cuDeviceGraphMemTrim, dev)
    CUresult rc_ = NVC_REAL(cuDeviceGraphMemTrim, dev);
    struct nvc_device *d = nvc_device_by_ordinal(dev);
    if (d)
        nvc_graph_reserve_sync(d);
    return rc_;
}

_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS layout");
_Static_assert(sizeof(CUgraphNodeParams) == 256 && offsetof(CUgraphNodeParams, alloc) == 16,
               "CUgraphNodeParams layout");

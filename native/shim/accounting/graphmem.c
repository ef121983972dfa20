/* Graph memory: device memory that CUDA graphs allocate (memory allocation nodes). The driver gives
 * each node its address when the node is created and maps the memory when a launch reaches it; the
 * shim charges the node's size when the node is created - before anything can be granted - however
 * it is created: cuGraphAddMemAllocNode (what cudaGraphAddMemAllocNode calls), cuGraphAddNode(_v2)
 * with CU_GRAPH_NODE_TYPE_MEM_ALLOC (graphnodes.c), or cuMemAllocAsync under stream capture
 * (allocasync.c). Changing a memory node's parameters is refused, as the driver documents it
 * (cuGraphNodeSetParams, cuGraphExecNodeSetParams), so no size can change behind the charge.
 *
 * The charge stays while the allocation can exist: until its node is gone (graph or node destroyed)
 * and it is not live (never launched, or freed since: a free node launched, cuMemFree(Async)). Each
 * allocation is refunded exactly once. On top, what the driver keeps in its graph reserve beyond the
 * charged nodes (physical memory cached after frees, until cuDeviceGraphMemTrim) is charged too,
 * re-read at every refund, trim and out-of-memory decision. The records are here; the graph entry
 * points that keep them are graphnodes.c's. */
#define _GNU_SOURCE
#include "accounting/graphmem.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base/config.h"
#include "base/ground.h"
#include "base/real.h"
#include "base/region.h"
#include "process/devices.h"

struct galloc { /* one graph memory allocation */
    CUdeviceptr dptr;
    CUgraph graph;    /* the graph holding its node */
    CUgraphNode node; /* NULL when made by stream capture */
    int dev;          /* region device */
    uint64_t bytes;
    int node_alive, live;
};
struct gfree { /* a free node: launching `graph` frees dptr */
    CUgraph graph;
    CUdeviceptr dptr;
};
struct gexec { /* an executable graph instantiated from a graph with memory nodes */
    CUgraphExec exec;
    CUgraph graph;
};

static struct galloc *allocs;
static struct gfree *frees;
static struct gexec *execs;
static size_t nallocs, nfrees, nexecs, cap_allocs, cap_frees, cap_execs;
static int any; /* some graph memory record exists: launches look them up */
static uint64_t node_bytes[NVC_MAX_DEVICES], reserve_charged[NVC_MAX_DEVICES];
static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;

/* Appends one element to a growable array; 0 on success. */
static int grow(void **array, size_t *n, size_t *cap, size_t size)
{
    if (*n == *cap) {
        size_t next = *cap ? *cap * 2 : 64;
        void *p = realloc(*array, next * size);
        if (!p)
            return -1;
        *array = p;
        *cap = next;
    }
    (*n)++;
    return 0;
}

static void update_any_locked(void)
{
    __atomic_store_n(&any, nallocs || nfrees || nexecs, __ATOMIC_RELEASE);
}

/* The driver's graph reserve of device d beyond the charged nodes, charged too. Caller holds graph_mu. */
static void reserve_sync_locked(struct nvc_device *d)
{
    cuuint64_t reserved = 0;
    int r = d->region_index;
    if (d->ordinal < 0 || r < 0 || r >= NVC_MAX_DEVICES || !nvc_cuda.cuDeviceGetGraphMemAttribute ||
        nvc_cuda.cuDeviceGetGraphMemAttribute(d->ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
            CUDA_SUCCESS)
        return;
    uint64_t want = reserved > node_bytes[r] ? reserved - node_bytes[r] : 0;
    if (want > reserve_charged[r])
        nvc_region_charge(r, want - reserve_charged[r], 0);
    else
        nvc_region_uncharge(r, reserve_charged[r] - want);
    reserve_charged[r] = want;
}

void nvc_graph_reserve_sync(struct nvc_device *d)
{
    pthread_mutex_lock(&graph_mu);
    reserve_sync_locked(d);
    pthread_mutex_unlock(&graph_mu);
}

static CUgraph exec_graph_locked(CUgraphExec exec)
{
    for (size_t i = 0; i < nexecs; i++)
        if (execs[i].exec == exec)
            return execs[i].graph;
    return NULL;
}

static int has_exec_locked(CUgraph graph)
{
    for (size_t i = 0; i < nexecs; i++)
        if (execs[i].graph == graph)
            return 1;
    return 0;
}

/* Refunds allocation i if it can no longer exist: its node is gone from the graph and from every
 * executable (an executable keeps its own copy of the nodes), and it is not live. Caller holds
 * graph_mu. Returns 1 when removed. */
static int settle_locked(size_t i)
{
    struct galloc a = allocs[i];
    if (a.node_alive || a.live || has_exec_locked(a.graph))
        return 0;
    nvc_region_uncharge(a.dev, a.bytes);
    if (a.dev >= 0 && a.dev < NVC_MAX_DEVICES)
        node_bytes[a.dev] -= a.bytes < node_bytes[a.dev] ? a.bytes : node_bytes[a.dev];
    allocs[i] = allocs[--nallocs];
    return 1;
}

void nvc_graph_record_alloc(CUgraph graph, CUgraphNode node, CUdeviceptr dptr, int region_dev, uint64_t bytes)
{
    pthread_mutex_lock(&graph_mu);
    if (grow((void **)&allocs, &nallocs, &cap_allocs, sizeof *allocs) == 0) {
        allocs[nallocs - 1] = (struct galloc){dptr, graph, node, region_dev, bytes, 1, 0};
        if (region_dev >= 0 && region_dev < NVC_MAX_DEVICES)
            node_bytes[region_dev] += bytes;
    } else {
        nvc_log(0, "out of memory for graph records: %llu bytes at %#llx stay charged", (unsigned long long)bytes,
                (unsigned long long)dptr);
    }
    update_any_locked();
    pthread_mutex_unlock(&graph_mu);
}

static void record_free_locked(CUgraph graph, CUdeviceptr dptr)
{
    if (grow((void **)&frees, &nfrees, &cap_frees, sizeof *frees) == 0)
        frees[nfrees - 1] = (struct gfree){graph, dptr};
    update_any_locked();
}

/* After the free of dptr ran (or is queued, which the driver orders before any reuse). */
static int freed_locked(CUdeviceptr dptr)
{
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i].dptr == dptr) {
            allocs[i].live = 0;
            settle_locked(i);
            return 1;
        }
    return 0;
}

CUgraph nvc_capture_graph(CUstream stream, int ptsz)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph graph = NULL;
    __typeof__(cuStreamGetCaptureInfo_v2) *info =
        ptsz ? nvc_cuda.cuStreamGetCaptureInfo_v2_ptsz : nvc_cuda.cuStreamGetCaptureInfo_v2;
    if (!info || info(stream, &status, NULL, &graph, NULL, NULL) != CUDA_SUCCESS ||
        status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return NULL;
    return graph;
}

int nvc_graph_free_ptr(CUdeviceptr dptr, CUstream stream, int ptsz)
{
    CUgraph captured = ptsz >= 0 ? nvc_capture_graph(stream, ptsz) : NULL;
    if (!captured && !__atomic_load_n(&any, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&graph_mu);
    int ours = 1;
    if (captured)
        record_free_locked(captured, dptr); /* a free node of the graph being captured */
    else
        ours = freed_locked(dptr);
    struct nvc_device *d = ours ? nvc_device_current(NULL) : NULL;
    if (d && !captured)
        reserve_sync_locked(d);
    update_any_locked();
    pthread_mutex_unlock(&graph_mu);
    return ours;
}

void nvc_graph_launched(CUgraphExec exec)
{
    if (!__atomic_load_n(&any, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&graph_mu);
    CUgraph graph = exec_graph_locked(exec);
    if (graph) {
        for (size_t i = 0; i < nallocs; i++)
            if (allocs[i].graph == graph)
                allocs[i].live = 1;
        for (size_t i = 0; i < nfrees; i++)
            if (frees[i].graph == graph)
                freed_locked(frees[i].dptr);
    }
    pthread_mutex_unlock(&graph_mu);
}

/* Does graph hold memory nodes? Caller holds graph_mu. */
static int has_memory_nodes_locked(CUgraph graph)
{
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i].graph == graph && allocs[i].node_alive)
            return 1;
    for (size_t i = 0; i < nfrees; i++)
        if (frees[i].graph == graph)
            return 1;
    return 0;
}

/* Settles the allocations of a graph whose nodes may have gone. Caller holds graph_mu. */
static void settle_graph_locked(CUgraph graph)
{
    for (size_t i = 0; graph && i < nallocs;)
        if (allocs[i].graph == graph && settle_locked(i))
            continue;
        else
            i++;
}

void nvc_graph_set_exec(CUgraphExec exec, CUgraph graph)
{
    if (!__atomic_load_n(&any, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&graph_mu);
    CUgraph old = NULL;
    for (size_t i = 0; i < nexecs; i++)
        if (execs[i].exec == exec) {
            old = execs[i].graph;
            execs[i] = execs[--nexecs];
            break;
        }
    if (graph && has_memory_nodes_locked(graph) && grow((void **)&execs, &nexecs, &cap_execs, sizeof *execs) == 0)
        execs[nexecs - 1] = (struct gexec){exec, graph};
    if (old && old != graph) {
        settle_graph_locked(old);
        struct nvc_device *d = nvc_device_current(NULL);
        if (d)
            reserve_sync_locked(d);
    }
    update_any_locked();
    pthread_mutex_unlock(&graph_mu);
}

void nvc_graph_record_free(CUgraph graph, CUdeviceptr dptr)
{
    pthread_mutex_lock(&graph_mu);
    record_free_locked(graph, dptr);
    pthread_mutex_unlock(&graph_mu);
}

void nvc_graph_adopt(CUgraph parent, CUgraph child)
{
    pthread_mutex_lock(&graph_mu);
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i].graph == child)
            allocs[i].graph = parent;
    for (size_t i = 0; i < nfrees; i++)
        if (frees[i].graph == child)
            frees[i].graph = parent;
    pthread_mutex_unlock(&graph_mu);
}

void nvc_graph_nodes_gone(CUgraph graph, CUgraphNode node)
{
    if (!__atomic_load_n(&any, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&graph_mu);
    int changed = 0;
    for (size_t i = 0; i < nallocs;) {
        if ((graph && allocs[i].graph == graph) || (node && allocs[i].node == node)) {
            allocs[i].node_alive = 0;
            changed = 1;
            if (settle_locked(i))
                continue;
        }
        i++;
    }
    for (size_t i = 0; graph && i < nfrees;)
        if (frees[i].graph == graph)
            frees[i] = frees[--nfrees];
        else
            i++;
    struct nvc_device *d = changed ? nvc_device_current(NULL) : NULL;
    if (d)
        reserve_sync_locked(d);
    update_any_locked();
    pthread_mutex_unlock(&graph_mu);
}

void nvc_graph_fork(enum nvc_fork_phase phase)
{
    if (phase == NVC_FORK_PREPARE) {
        pthread_mutex_lock(&graph_mu);
        return;
    }
    if (phase == NVC_FORK_CHILD) { /* CUDA state does not survive fork */
        nallocs = nfrees = nexecs = 0;
        memset(node_bytes, 0, sizeof node_bytes);
        memset(reserve_charged, 0, sizeof reserve_charged);
        any = 0;
    }
    pthread_mutex_unlock(&graph_mu);
}

/* Graph memory records (graphmem.c): allocation nodes charged when created, free nodes, which graph
 * each executable runs, and the driver's graph reserve beyond the charged nodes. */
#ifndef NVC_GRAPHMEM_H
#define NVC_GRAPHMEM_H

#include <stdint.h>
#include "base/ground.h"
#include "base/real.h"
#include "process/devices.h"

CUgraph nvc_capture_graph(CUstream stream, int ptsz); /* NULL unless capturing */
/* An allocation node of graph (node NULL: made by stream capture), charged bytes on region_dev. */
void nvc_graph_record_alloc(CUgraph graph, CUgraphNode node, CUdeviceptr dptr, int region_dev, uint64_t bytes);
void nvc_graph_record_free(CUgraph graph, CUdeviceptr dptr);         /* a free node: launching graph frees dptr */
int nvc_graph_free_ptr(CUdeviceptr dptr, CUstream stream, int ptsz); /* 1: it was graph memory */
/* A child graph moved into its parent (the only way a graph with memory nodes can be a child) takes
 * its memory nodes along: they now live and die with the parent. */
void nvc_graph_adopt(CUgraph parent, CUgraph child);
/* Remembers which graph an executable runs, when that graph has memory nodes (an executable is a
 * snapshot: nodes added to the graph later are not in it); graph NULL: the executable is gone. */
void nvc_graph_set_exec(CUgraphExec exec, CUgraph graph);
void nvc_graph_launched(CUgraphExec exec);
/* The nodes of graph, or one node, are gone: allocations that are not live are refunded. */
void nvc_graph_nodes_gone(CUgraph graph, CUgraphNode node);
void nvc_graph_reserve_sync(struct nvc_device *d);
void nvc_graph_fork(enum nvc_fork_phase phase);

#endif

/* Gating a capped device's streams outside the container's slice (gate.c): the launching thread goes
 * on queueing work behind a GPU-side wait instead of sleeping, and the gate opens when the next slice
 * starts. */
#ifndef NVC_GATE_H
#define NVC_GATE_H

#include <stdint.h>
#include "base/ground.h"
#include "base/real.h"

/* Whether the device's work not queued behind its closed gate of generation closed (earlier gates'
 * included) has all completed (launch.c answers, for the gate thread, which calls it with no lock of
 * its own held); *percent, the cap the gate was closed at, becomes the cap in force now (a duty cycle
 * moves, or goes out of force: 100 opens the gate). */
typedef int (*nvc_gate_drained_fn)(int dev, uint32_t closed, unsigned *percent);

/* Puts the stream behind region device dev's gate, closing the gate if it is open: work launched on it
 * from now on runs once the container's next slice starts. Returns the gate's generation (non-zero),
 * or 0 where the stream cannot be gated (no stream memory operations, a capturing stream, no gate
 * thread): the caller then waits on the host instead. */
uint32_t nvc_gate_stream(int dev, unsigned percent, CUcontext ctx, CUstream stream, int ptsz,
                         nvc_gate_drained_fn drained);
/* The generation dev's gate is closed at, 0 when it is open. */
uint32_t nvc_gate_closed(int dev);
/* The slice runs (whoever started it): opens dev's gate if it is closed. */
void nvc_gate_open(int dev);
/* When generation gen of dev's gate opened, for the reconstruction of a gated launch's start on the
 * GPU timeline; 0 when unknown (still closed, or long ago). */
uint64_t nvc_gate_opened_ns(int dev, uint32_t gen);
void nvc_gate_fork(enum nvc_fork_phase phase);
/* Whether the stream is being captured into a graph (or that cannot be asked): it records what is
 * launched on it, so a wait or an event of the shim's there would land in the graph. */
int nvc_stream_capturing(CUstream stream, int ptsz);

#endif

/* Each kernel's own running duration (kernels.c), for launch.c's queue estimates. */
#ifndef NVC_KERNELS_H
#define NVC_KERNELS_H

#include <stdint.h>

struct nvc_kernel_cost {
    const void *key;
    int64_t ns;       /* its elapsed time, running mean */
    int64_t work_ns;  /* its elapsed time when nothing slowed it: the least seen, creeping up */
    int64_t least_ns; /* the least it ever took: its work as a look at the backlog counts it (launches.c) */
};
/* The entry of a kernel (nvc_kernel_key), made on first use; NULL when its neighbourhood of the table
 * is full. The caller serialises access (launch.c's mutex). */
struct nvc_kernel_cost *nvc_kernel_slot(const void *key);
/* Notes a measured elapsed time (ns) of the entry's kernel, under that mutex. */
void nvc_kernel_measured(struct nvc_kernel_cost *k, int64_t elapsed_ns);
/* The least time a kernel ever took (ns); 0 when it was never measured. Needs no mutex: it reads what a
 * concurrent nvc_kernel_slot or nvc_kernel_measured writes atomically, and makes nothing. */
int64_t nvc_kernel_least(const void *key);
/* A launch's kernel and grid size: the same function on another grid is other work. */
const void *nvc_kernel_key(const void *f, unsigned gx, unsigned gy, unsigned gz);

#endif

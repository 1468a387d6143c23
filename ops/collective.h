/* Collectives across the processes of a data-parallel run: a communicator per process (one process
 * a GPU) and an in-place mean over the ranks of an f32 device tensor.  The CUDA build with NCCL runs
 * them through kernels/cuda/nccl_comm.cu (whose header tells how no wait can hang); any other build
 * has the same calls, which fail with a message saying that this build has no NCCL. */
#ifndef DG_OPS_COLLECTIVE_H
#define DG_OPS_COLLECTIVE_H

#include "core/internal.h"

#define DG_COMM_ID_BYTES 128 /* the bytes of a communicator's unique id (NCCL's ncclUniqueId) */

typedef struct dg_comm dg_comm;

/* Whether this build can make communicators (CUDA with NCCL). */
bool dg_comm_available(void);
/* A fresh unique id for a new communicator.  0, or -1 with dg_error. */
int dg_comm_unique_id(unsigned char id[DG_COMM_ID_BYTES]);
/* Joins the communicator named by id as rank of world, on this process's GPU; each wait (for the
 * others to join, for a collective to finish) gives up after timeout_s.  NULL with dg_error. */
dg_comm *dg_comm_init(const unsigned char id[DG_COMM_ID_BYTES], int world, int rank, double timeout_s);
/* The side stream, for collectives that overlap the device's stream (kernels/cuda/nccl_comm.h):
 *   side_begin      what comes next on the side stream waits for all queued so far on the device's
 *   side_copy_      dst[dst_off, +n) = src[src_off, +n) on the side stream, contiguous CUDA
 *                   tensors, each f32 or bf16 (converted as they go; src NULL: zeros)
 *   side_mean_      x = the mean of x over the ranks, in place, on the side stream: x is an f32 or
 *                   bf16 contiguous CUDA tensor of the same numel on every rank
 *   side_join       what comes next on the device's stream waits for all queued on the side stream
 * No host wait in any of them.  0, or -1 with dg_error. */
int dg_comm_side_begin(dg_comm *c);
int dg_comm_side_copy_(dg_comm *c, dg_tensor *dst, int64_t dst_off, const dg_tensor *src, int64_t src_off, int64_t n);
int dg_comm_side_mean_(dg_comm *c, dg_tensor *x);
int dg_comm_side_join(dg_comm *c);
/* Marks a point (the end of a queued step) on the device's stream, for dg_comm_wait: 0 or -1. */
int dg_comm_mark(dg_comm *c);
/* Waits for the work queued so far on both streams, collectives included, giving up after the
 * timeout without a mark passed (kernels/cuda/nccl_comm.h).  0 or -1. */
int dg_comm_wait(dg_comm *c);
/* Frees the communicator (NULL: no-op). */
void dg_comm_free(dg_comm *c);

#endif

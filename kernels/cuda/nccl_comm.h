/* NCCL under data-parallel training: one communicator per process (one process a GPU), created from
 * a unique id that the ranks share through a rendezvous (models/data_parallel.c), and the mean of
 * device buffers over the ranks on a side stream of its own, which overlaps the library's stream.
 * Compiled only in a CUDA build that found NCCL (DG_HAVE_NCCL); ops/collective.c is the entry point
 * that the host build also has.
 *
 * Nothing here can hang forever.  The communicator is non-blocking (ncclConfig_t.blocking = 0):
 * initialisation and the enqueueing of a collective return at once and are polled with
 * ncclCommGetAsyncError; completion of queued work is polled with cudaStreamQuery.  Each wait gives
 * up after timeout_s seconds without completion (a peer that died, or never came): the communicator
 * is then aborted (ncclCommAbort stops its kernels) and every later call fails with the reason. */
#ifndef DG_KERNELS_CUDA_NCCL_COMM_H
#define DG_KERNELS_CUDA_NCCL_COMM_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DG_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct dg_nccl dg_nccl;

/* A new unique id (rank 0 makes it; the others receive it).  0, or -1 with dg_error. */
int dg_nccl_unique_id(unsigned char id[DG_NCCL_ID_BYTES]);
/* Joins the communicator of `world` ranks named by id as `rank`, on the library's device (which
 * dg_cuda_init chose: DG_CUDA_DEVICE).  Waits at most timeout_s for every rank to join.  NULL with
 * dg_error. */
dg_nccl *dg_nccl_init(const unsigned char id[DG_NCCL_ID_BYTES], int world, int rank, double timeout_s);
/* The side stream: work that overlaps the library's stream (the gradients' all-reduce during the
 * backward).  side_begin makes what is queued next on the side stream wait for everything queued
 * on the library's stream so far; side_copy copies n elements device to device on the side stream,
 * each f32 or bf16 (f32 to bf16 rounds to nearest even; src NULL: writes zeros); side_allreduce
 * makes buf[0..n) (f32 or bf16) the mean over the ranks of their buf[0..n) (ncclAvg), in place, on
 * the side stream; side_join makes what is queued next on the library's stream wait for everything
 * queued on the side stream.
 * None of them waits on the host.  0, or -1 with dg_error. */
int dg_nccl_side_begin(dg_nccl *c);
int dg_nccl_side_copy(dg_nccl *c, void *dst, bool dst_bf16, const void *src, bool src_bf16, int64_t n);
int dg_nccl_side_allreduce_mean(dg_nccl *c, void *buf, bool bf16, int64_t n);
int dg_nccl_side_join(dg_nccl *c);
/* Marks a point on the library's stream (an event after a queued step), so that dg_nccl_wait can
 * tell a long queue that advances from one that is stuck.  0, or -1 with dg_error. */
int dg_nccl_mark(dg_nccl *c);
/* Waits until the library's stream and the side stream have run everything queued on them, the
 * collectives included.  It gives up (the communicator's timeout) only when no mark has been
 * passed for that long: a queue of many steps may take longer in all.  Marks are kept in a ring of
 * DG_NCCL_MARKS; wait at least once every DG_NCCL_MARKS / 2 marks.  0, or -1 with dg_error (the
 * communicator is then aborted). */
#define DG_NCCL_MARKS 512
int dg_nccl_wait(dg_nccl *c);
/* Finalises and frees the communicator (aborts it if that fails or times out).  NULL is a no-op. */
void dg_nccl_destroy(dg_nccl *c);

#ifdef __cplusplus
}
#endif

#endif

/* The backends of the delta-rule family: one table, a row per kernel family on a device
 * (delta_backends.c), each saying which calls it accepts, the bytes of working set it keeps for
 * the backward, and its forward and backward on a call descriptor (dg_delta_call,
 * kernels/cpu/delta/delta_call.h).  The ops (delta_common.c), `deltagrad bench --device cuda` and
 * the tests run the family only through here: dg_delta_pick takes the first row that accepts a
 * call, dg_delta_backend_named a row by name (benchmarks and tests that force a kernel family).
 * Adding a backend is adding its row. */
#ifndef DG_OPS_DELTA_BACKENDS_H
#define DG_OPS_DELTA_BACKENDS_H

#include "kernels/cpu/delta/delta_call.h"

typedef struct dg_delta_backend {
    const char *name; /* "cpu_recurrent", "cuda_chunk_mma", ... */
    const char *desc; /* a line for listings */
    /* whether the row runs c (device, algorithm, dtype, gate, shape, pointer alignment, the
     * call's options); no error is set either way */
    bool (*accepts)(const dg_delta_call *c);
    /* bytes of device memory the forward keeps for the backward (c->keep): 0 none, -1 error */
    int64_t (*kept_bytes)(const dg_delta_call *c);
    /* the forward (o, hT; with c->l2.on also q, k, rq, rk) and the backward (the gradients) of c:
     * 0, or -1 with dg_error set */
    int (*fwd)(dg_delta_call *c);
    int (*bwd)(dg_delta_call *c);
} dg_delta_backend;

/* the rows, in the order dg_delta_pick tries them (faster families first) */
int dg_delta_backend_count(void);
const dg_delta_backend *dg_delta_backend_at(int i);

/* The first row that accepts c, or NULL with dg_error set (naming the call's device, dtype and
 * algorithm: a dtype the family does not take on that device, or a build without CUDA). */
const dg_delta_backend *dg_delta_pick(const dg_delta_call *c);
/* A 16-bit chunked CUDA call that only the generic kernels take (f32 arithmetic, many times slower
 * than the tensor-core rows) and that did not ask for them (force_generic): one line saying so, in
 * buf, and true; false for every other call and row. */
bool dg_delta_slow_note(const dg_delta_backend *b, const dg_delta_call *c, char *buf, size_t n);
/* The row of that name, or NULL with dg_error listing the valid names. */
const dg_delta_backend *dg_delta_backend_named(const char *name);

/* Run row b on c (b NULL: dg_delta_pick's row).  A row given by name that does not accept c is an
 * error.  kept_bytes: 0 where b keeps nothing for c. */
int64_t dg_delta_kept_bytes(const dg_delta_backend *b, const dg_delta_call *c);
int dg_delta_fwd(const dg_delta_backend *b, dg_delta_call *c);
int dg_delta_bwd(const dg_delta_backend *b, dg_delta_call *c);

#endif

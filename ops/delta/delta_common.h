/* Shared machinery of the delta_rule, gated_delta_rule and kda ops: attributes, input slots,
 * argument validation, the forward and backward that dispatch to the CPU kernels, the decomposition
 * into primitive ops and the samplers.  Each op file (delta_rule.c, gated_delta_rule.c, kda.c) holds
 * only its dg_op_def, its variants and its typed entry point.
 *
 * Inputs of every op of the family, in this order (delta_rule has no g, A_log, dt_bias slots):
 *   q, k, v, [g], beta, initial_state, [A_log, dt_bias], cu_seqlens
 * Outputs: o [B,T,HV,V], final_state [N,HV,K,V] (always computed; the typed entry point hands it
 * out only when asked).
 *
 * The fused preprocessing, when enabled in the attributes, runs inside forward and backward:
 *   use_qk_l2norm_in_kernel:  q <- l2norm(q), k <- l2norm(k) (eps 1e-6); backward through it
 *   use_gate_in_kernel:       g <- -exp(A_log) softplus(g + dt_bias); backward gives dg of the raw
 *                             a, dA_log, ddt_bias
 * What the forward keeps for the backward (node->saved; delta_common.c, SAVED_*), unless
 * opts->recompute_in_backward (then the backward makes all of it again, and nothing is kept between
 * the passes): the results of both (the normalised q, k, their 1/|x|, the gate), and on CUDA with
 * 16-bit storage the chunked kernels' own working set (W, U, states, V', the inverse;
 * dr_chunk_cuda.h). */
#ifndef DG_OPS_DELTA_COMMON_H
#define DG_OPS_DELTA_COMMON_H

#include "deltagrad_delta.h"
#include "kernels/cpu/delta/delta_rule.h"
#include "ops/op.h"

/* backward algorithms a variant can pick */
typedef enum {
    DG_DBWD_CHUNK = 0,     /* dg_dr_chunk_bwd with the variant flags below */
    DG_DBWD_RECURRENT = 1, /* dg_dr_recurrent_bwd */
} dg_delta_bwd_algo;

typedef struct dg_delta_attrs {
    dg_gate_kind gate; /* fixed by the op */
    double scale;      /* resolved: never 0 */
    int chunk;         /* 16, 32, 64 */
    int algorithm;     /* dg_delta_algorithm of the forward */
    bool l2norm_qk;
    bool gate_in_kernel;
    bool keep_forward; /* keep the forward's work for the backward (delta_common.c, SAVED_*) */
} dg_delta_attrs;

/* where each input lives in node->in (-1: the op has no such input) */
typedef struct dg_delta_slots {
    int q, k, v, g, beta, h0, A_log, dt_bias, cu, n_in;
} dg_delta_slots;

extern const dg_delta_slots dg_delta_slots_plain; /* delta_rule */
extern const dg_delta_slots dg_delta_slots_gated; /* gated_delta_rule, kda */

/* A backward variant of the family: which algorithm and which flags of the chunked kernel. */
typedef struct dg_delta_bwd_spec {
    dg_delta_bwd_algo algo;
    dg_dr_variant var;
} dg_delta_bwd_spec;

int dg_delta_forward(dg_node *n, const dg_delta_slots *sl);
int dg_delta_backward(dg_node *n, const dg_delta_slots *sl, const dg_delta_bwd_spec *spec,
                      dg_tensor *const *gout, dg_tensor **gin);

/* The typed entry points' common body: validates, fills the attributes and the input array, picks
 * the variant and applies the op.  g is NULL for delta_rule.  The variant: opts->backward, else
 * DG_BACKWARD, else the recurrent one for the recurrent algorithm, else cuda_default (a variant
 * name, or NULL) for CUDA tensors, else bwd[0]: an op whose variants rank differently on the two
 * devices names its CUDA default here (none does now: kda's was the unfused one until session 9). */
dg_tensor *dg_delta_call(const dg_op_def *def, const dg_delta_slots *sl, dg_gate_kind gate, const char *cuda_default,
                         dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta,
                         const dg_delta_opts *opts, dg_tensor **final_state);

/* Validation alone (used by dg_delta_call; exposed for the tests).  Returns false with the error
 * set.  On success fills *at, and *N with the number of sequences. */
bool dg_delta_validate(const char *op, dg_gate_kind gate, dg_tensor *q, dg_tensor *k, dg_tensor *v,
                       dg_tensor *g, dg_tensor *beta, const dg_delta_opts *opts, dg_delta_attrs *at,
                       int64_t *N);

/* cu_seqlens: i64 [N+1] with B = 1, 0 = c_0 <= ... <= c_N = T, where ref [B,T,...] (named
 * ref_name in messages) gives B and T.  Sets *N.  Returns false with the error set. */
bool dg_delta_check_cu(const char *op, const dg_tensor *cu, const char *ref_name, const dg_tensor *ref,
                       int64_t *N);

/* The same function from primitive ops (token by token), for def->decompose. */
int dg_delta_decompose(const dg_delta_slots *sl, const void *attrs, dg_tensor *const *in,
                       dg_tensor **out);

/* Samples for gradcheck and the tests: see delta_sample.c for the list. */
int dg_delta_sample(const dg_delta_slots *sl, dg_gate_kind gate, int index, dg_dtype dt,
                    uint64_t seed, dg_sample *s);

/* Index of the "recurrent" variant of def (for algorithm = RECURRENT). */
int dg_delta_recurrent_variant(const dg_op_def *def);

#define DG_DELTA_L2NORM_EPS 1e-6

/* ---- kernel calls by device and dtype (delta_kernels.c) ----
 * dtypes: CPU f32 / f64; CUDA f32, or 16-bit storage, bf16 or fp16 (q, k, v, beta, o and their
 * gradients bf16 / f16; g, h0, hT, A_log, dt_bias and their gradients f32; the L2 norm's r f32).  Pointers are of the
 * device given (cu_seqlens in s is always a host array).  Each returns 0, or -1 with dg_error set. */
bool dg_delta_dtype_ok(const char *op, dg_device dev, dg_dtype dt); /* false + message when refused */
/* a 16-bit storage dtype (bf16 or f16): q, k, v, beta and o in it, gates and states f32 */
static inline bool dg_delta_storage16(dg_dtype dt) { return dt == DG_BF16 || dt == DG_F16; }
/* The forward's working set kept for the backward (CUDA bf16 chunked only: dr_chunk_cuda.h): the
 * bytes it takes for this shape (0: nothing is kept here, -1: error).  dg_delta_k_fwd with keep
 * (that many bytes of device memory, 16-byte aligned) sets *kept when it filled it;
 * dg_delta_k_bwd with kept (or NULL) then skips the recompute.  keep NULL: kept may be NULL. */
int64_t dg_delta_k_kept_bytes(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt);
int dg_delta_k_fwd(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt,
                   const void *q, const void *k, const void *v, const void *g, const void *beta,
                   const void *h0, void *o, void *hT, void *keep, int *kept);
/* The same with the L2 norm of q, k in it (use_qk_l2norm_in_kernel) where l2 is non-NULL: q and k
 * then receive the normalised rows of l2->qraw, l2->kraw, and l2->rq, l2->rk their 1/|x| (dtype of
 * the gates) -- by the forward's own kernels where they take the norm in their loads (CUDA,
 * 16-bit, chunked: dg_cuda_dr_chunk_fwd_l2_*), else by dg_delta_k_l2norm_fwd first.  for_bwd 0:
 * nothing will read q, rq, rk after the call (a forward that does not record): the fused kernels
 * then do not write them (k is read by the forward's own later kernels: always written). */
typedef struct dg_delta_l2 {
    const void *qraw, *kraw;
    void *rq, *rk;
    int for_bwd;
} dg_delta_l2;
int dg_delta_k_fwd_l2(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt, void *q,
                      void *k, const void *v, const void *g, const void *beta, const void *h0, void *o, void *hT,
                      void *keep, int *kept, const dg_delta_l2 *l2);
/* rq, rk (NULL, or both; f32 [rows]): q, k are the in-op L2-normalised rows and these their 1/|x|.
 * Where the kernels take the norm's backward with them (CUDA, 16-bit, chunked: kernels/cuda/
 * dr_chunk_cuda.h) dq, dk come back as the gradients of the raw rows and *l2_done is set; else
 * they are those of the normalised rows and the caller runs dg_delta_k_l2norm_bwd. */
int dg_delta_k_bwd(const char *op, int recurrent, const dg_dr_variant *var, const dg_dr_shape *s, dg_device dev,
                   dg_dtype dt, const void *q, const void *k, const void *v, const void *g, const void *beta,
                   const void *h0, const void *dout, const void *dhT, void *dq, void *dk, void *dv, void *dg,
                   void *dbeta, void *dh0, const void *kept, const void *rq, const void *rk, int *l2_done);
int dg_delta_k_l2norm_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x,
                          void *y, void *r);
int dg_delta_k_l2norm_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x,
                          const void *r, const void *dy, void *dx);
/* the gate: dt is the gate's dtype (f32 or f64; f32 with bf16 / f16 storage) */
int dg_delta_k_gate_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C,
                        const void *a, const void *A_log, const void *dt_bias, void *g);
int dg_delta_k_gate_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C,
                        const void *a, const void *A_log, const void *dt_bias, const void *dg, void *da,
                        void *dA_log, void *ddt_bias);

/* A backward variant of an op of the family as its op file declares it: the registry's name (the
 * op's dg_op_def.bwd entry of that name runs spec), a line for the benchmarks, and the spec.  Each
 * op file keeps its variants in one table, in the order of its registry entries (bwd[0] first, the
 * registry's default); tools/bench_cuda.c times the chunked ones from the same table, so that the
 * benchmark's rows are the ops' own variants (tests/test_delta_ops.c checks that the names agree). */
#define DG_DELTA_CHUNK_SPEC(DG_FINAL, FUSED, BLOCKED)                                               \
    {DG_DBWD_CHUNK, {.gdn_dg_from_final = DG_FINAL, .kda_fused = FUSED, .solve_tril_blocked = BLOCKED}}
#define DG_DELTA_RECURRENT_SPEC {DG_DBWD_RECURRENT, {.gdn_dg_from_final = 1, .kda_fused = 1, .solve_tril_blocked = 1}}

typedef struct dg_delta_variant {
    const char *name, *desc;
    dg_delta_bwd_spec spec;
} dg_delta_variant;

typedef struct dg_delta_variants {
    const dg_delta_variant *v;
    int n;
    int cuda_default; /* v[cuda_default]: the chunked default on CUDA (0: the registry's default) */
} dg_delta_variants;

extern const dg_delta_variants dg_delta_rule_variants, dg_gated_delta_rule_variants, dg_kda_variants;
/* the table of the op named op ("delta_rule", "gated_delta_rule", "kda"), or NULL */
const dg_delta_variants *dg_delta_variants_of(const char *op);

/* Defines `static int NAME(dg_node *, gout, gin)`: the backward variant TABLE[I] of an op whose
 * inputs sit at SLOTS. */
#define DG_DELTA_BWD_VARIANT(NAME, SLOTS, TABLE, I)                                                 \
    static int NAME(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {                          \
        return dg_delta_backward(n, SLOTS, &(TABLE)[I].spec, gout, gin);                            \
    }

/* gradcheck / comparison tolerances of the family (f64: finite differences; f32: against f64) */
#define DG_DELTA_TOLERANCES .atol_f64 = 1e-7, .rtol_f64 = 1e-6, .atol_f32 = 1e-4, .rtol_f32 = 1e-3

#endif

/* The cases of `deltagrad bench --device cuda` (bench_cuda_case.c): the shapes, one case's device
 * arrays, the timed bodies (one fwd or fwd+bwd call through the family's backend table, as the ops
 * make it) and the counting of FLOPs and bytes (bench_cuda.c's file comment says what is counted). */
#ifndef DG_TOOLS_BENCH_CUDA_CASE_H
#define DG_TOOLS_BENCH_CUDA_CASE_H

#include "deltagrad.h"
#include "ops/delta/delta_common.h"

typedef enum { R_NORMAL, R_SIGMOID, R_LOGSIGMOID } rand_kind;
/* a device array of n random values of dtype dt (f32, bf16 or f16 bits): N(0,1), its sigmoid, or
 * max(logsigmoid, -5) */
void *bench_dev_random(int64_t n, dg_dtype dt, rand_kind kind);

/* ---- one benchmark case: shape, device arrays ---- */
typedef struct bcase {
    char label[64], op[24];
    dg_dr_shape s;
    int64_t G;                         /* gate values per token and value head: 0, 1, K */
    dg_dtype dt;                       /* of q, k, v, beta, dout, o and the gradients: bf16 or f16 */
    uint16_t *q, *k, *v, *beta, *dout; /* raw inputs (16-bit words) */
    float *g;                          /* per-token log decay, NULL for delta_rule */
    float *h0, *dht; /* [B,HV,K,V]: the initial state and the final state's gradient, or NULL (files only) */
    uint16_t *qn, *kn, *o, *dqn, *dkn, *dq, *dk, *dv, *dbeta;
    float *rq, *rk, *dg;
    float *hT, *dh0; /* [B,HV,K,V]: the final state (where h0 or dht is given) and h0's gradient, or NULL */
    void *keep;      /* the forward's working set kept for the backward (NULL: none for this shape) */
    bool keep_off;   /* time the recomputing backward instead */
    bool norm_first; /* the L2 norm's kernel first, not in the tensor-core forward's loads */
    int64_t *cu;     /* host, [ncu = N+1]: the sequences' offsets into T (s.cu_seqlens, B = 1), or NULL */
    int64_t ncu;
} bcase;

typedef struct shape_def {
    const char *name;
    int64_t B, T, H, HV, K, V; /* H key heads, HV value heads */
    const int64_t *seqlens;    /* nseq > 0: B = 1 and T tokens packed as sequences of these lengths */
    int nseq;
    dg_dtype dt;
    bool by_default; /* run without --shapes */
    unsigned ops;    /* the BENCH_OPS it runs (bit i: BENCH_OPS[i]) without OP; named, also delta_rule at K = 256 */
} shape_def;
enum { BENCH_NSHAPES = 9 };
extern const shape_def BENCH_SHAPES[BENCH_NSHAPES];
extern const char *const BENCH_OPS[3]; /* gated_delta_rule, kda, delta_rule */

int64_t bench_nqk(const bcase *c); /* elements of q */
int64_t bench_nvo(const bcase *c); /* of v */
int64_t bench_nbt(const bcase *c); /* of beta */

/* random q, k, v, dout ~ N(0,1), beta = sigmoid(N(0,1)) (dtype dt), shared by the ops of a shape */
int bench_case_random(bcase *c, const shape_def *d, dg_dtype dt);
/* the case's op and its gate g = max(logsigmoid(N(0,1)), -5), f32, per head or per channel (FLA's
 * benchmark draws); outputs, gradients and the kept working set allocated */
int bench_case_set_op(bcase *c, const char *op);
/* the op and inputs of a safetensors file (written by bench/fla_side_by_side.py), h0 and dht if it has them */
int bench_case_from_file(bcase *c, const char *path);
void bench_case_free(bcase *c);
/* o, dq, dk, dv, dbeta, dg, hT, dh0 (those the case has) of the last call to PATH (safetensors) */
int bench_dump_outputs(const bcase *c, const char *path);
/* 16-bit values that are inf or NaN among o, dq, dk, dv of the last call (-1 on a failed copy) */
int64_t bench_nonfinite(const bcase *c);

/* ---- the timed bodies ---- */
typedef enum { W_FWD, W_FWDBWD, W_NORM } bench_what;
/* one call of w: the forward, the forward and backward of variant var (NULL: the default), or the
 * L2 norm alone; the chunked algorithm or the recurrent one */
int bench_body(bcase *c, bench_what w, const dg_delta_bwd_flags *var, bool recurrent);

/* ---- counting ---- */
double bench_flops_fwd(const dg_dr_shape *s);
double bench_flops_bwd(const dg_dr_shape *s);
double bench_bytes_fwd(const bcase *c);
double bench_bytes_bwd(const bcase *c);

#endif

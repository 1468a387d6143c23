/* deltagrad: a small tensor runtime and tape-based autograd for the delta-rule family of linear
 * attention (DeltaNet, Gated DeltaNet, Kimi Delta Attention).  The one header users include.
 *
 * Lifetime: every tensor an op returns is owned by the innermost scope (dg_scope_begin/end); keep
 * it past the scope with dg_keep (then dg_release it yourself) or hand it to the enclosing scope
 * with dg_scope_return.  With no scope open, the caller owns the returned reference.
 *
 * Errors: fallible calls return NULL (or a negative status) and set a thread-local message,
 * dg_last_error().  An op given a NULL input returns NULL and keeps the first message, so a chain
 * of calls can be checked once at its end. */
#ifndef DELTAGRAD_H
#define DELTAGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DG_MAX_DIMS 6

/* DG_BF16 and DG_F16 (IEEE half) are storage dtypes: creation, element access, copies and casts
 * everywhere, arithmetic in f32 on the device (the delta-rule family, and matmul for bf16).
 * DG_F16 comes last so that the values of the others are those of earlier releases. */
typedef enum { DG_F32, DG_F64, DG_BF16, DG_I32, DG_I64, DG_F16, DG_NUM_DTYPES } dg_dtype;
typedef enum { DG_CPU, DG_CUDA } dg_device;

typedef struct dg_storage {
    void *data;
    size_t nbytes;
    int refcount;
    dg_device device;
} dg_storage;

struct dg_node;

/* A strided view of a storage.  Element (i0..in) lives at data + offset + sum(i_d * stride[d])
 * elements (strides and offset count elements, not bytes).  A stride of 0 broadcasts. */
typedef struct dg_tensor {
    dg_dtype dtype;
    dg_device device;
    int ndim;
    int64_t shape[DG_MAX_DIMS];
    int64_t stride[DG_MAX_DIMS];
    int64_t offset;
    dg_storage *storage;
    int refcount;
    bool requires_grad;
    struct dg_tensor *grad; /* accumulated gradient of a leaf (owned) */
    struct dg_node *node;   /* the autograd node that produced it (owned reference) */
    int out_index;          /* which output of that node */
    char *name;             /* parameters carry their checkpoint name */
} dg_tensor;

/* ---- errors ---------------------------------------------------------------------------------- */
const char *dg_last_error(void); /* "" when none */
void dg_clear_error(void);
bool dg_has_error(void);

/* ---- dtype, device ---------------------------------------------------------------------------- */
size_t dg_dtype_size(dg_dtype dt);
const char *dg_dtype_name(dg_dtype dt);
bool dg_dtype_is_float(dg_dtype dt);
bool dg_cuda_available(void);    /* compiled with CUDA and a GPU is present */
double dg_cuda_free_bytes(void); /* free memory of the process's GPU; -1 without one */
const char *dg_device_name(dg_device d);

/* ---- lifetime ---------------------------------------------------------------------------------- */
dg_tensor *dg_retain(dg_tensor *t);
void dg_release(dg_tensor *t);
void dg_scope_begin(void);
void dg_scope_end(void);
dg_tensor *dg_scope_return(dg_tensor *t); /* ends the scope, t survives into the enclosing one */
dg_tensor *dg_keep(dg_tensor *t);         /* t survives its scope; you own one reference to dg_release
                                   * (with no scope open you own it already: a no-op) */
int dg_scope_depth(void);
size_t dg_live_tensors(void);      /* tensor headers alive (for leak tests) */
size_t dg_live_bytes(dg_device d); /* storage bytes alive on a device */
size_t dg_peak_bytes(dg_device d);
void dg_reset_peak_bytes(dg_device d);

/* ---- creation --------------------------------------------------------------------------------- */
/* empty: the elements are uninitialised (write every one before reading); zeros: cleared.  With
 * DG_DEBUG_FILL_NAN=1 in the environment an empty tensor starts as NaN (integers as -1). */
dg_tensor *dg_empty(int ndim, const int64_t *shape, dg_dtype dt);
dg_tensor *dg_zeros(int ndim, const int64_t *shape, dg_dtype dt);
dg_tensor *dg_ones(int ndim, const int64_t *shape, dg_dtype dt);
dg_tensor *dg_full(int ndim, const int64_t *shape, dg_dtype dt, double value);
dg_tensor *dg_arange(int64_t start, int64_t stop, int64_t step, dg_dtype dt);
dg_tensor *dg_from_data(int ndim, const int64_t *shape, dg_dtype dt, const void *data); /* copies */
dg_tensor *dg_empty_like(const dg_tensor *t);
dg_tensor *dg_zeros_like(const dg_tensor *t);
dg_tensor *dg_empty_on(int ndim, const int64_t *shape, dg_dtype dt, dg_device dev);
dg_tensor *dg_zeros_on(int ndim, const int64_t *shape, dg_dtype dt, dg_device dev);
/* shorthand: DG_SHAPE(2, 3) expands to the (ndim, shape) pair (left unformatted: clang-format
 * would split its compound literal) */
/* clang-format off */
#define DG_SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
/* clang-format on */

/* ---- random numbers: Philox 4x32-10, counter based (CPU and CUDA draw the same numbers) -------- */
typedef struct dg_rng {
    uint64_t seed;
    uint64_t counter; /* blocks of 4 numbers consumed so far */
} dg_rng;
dg_rng dg_rng_new(uint64_t seed);
void dg_manual_seed(uint64_t seed); /* the process-wide generator used when rng is NULL */
dg_rng *dg_default_rng(void);
uint32_t dg_rng_u32(dg_rng *rng);
double dg_rng_uniform(dg_rng *rng);                                            /* [0, 1) */
dg_tensor *dg_rand(int ndim, const int64_t *shape, dg_dtype dt, dg_rng *rng);  /* U[0,1) */
dg_tensor *dg_randn(int ndim, const int64_t *shape, dg_dtype dt, dg_rng *rng); /* N(0,1) */
dg_tensor *dg_rand_range(int ndim, const int64_t *shape, dg_dtype dt, double lo, double hi, dg_rng *rng);

/* ---- element access, conversion, printing --------------------------------------------------- */
int64_t dg_numel(const dg_tensor *t);
bool dg_is_contiguous(const dg_tensor *t);
bool dg_same_shape(const dg_tensor *a, const dg_tensor *b);
double dg_get(const dg_tensor *t, const int64_t *idx); /* any dtype, read as double */
void dg_set(dg_tensor *t, const int64_t *idx, double v);
double dg_item(const dg_tensor *t);                 /* a one-element tensor */
void *dg_data_ptr(const dg_tensor *t);              /* address of element 0 (host tensors) */
int dg_copy_to_host(const dg_tensor *t, void *dst); /* contiguous copy of all elements, t's dtype */
dg_tensor *dg_contiguous(dg_tensor *t);             /* t itself (retained into scope) if already */
dg_tensor *dg_to_dtype(dg_tensor *t, dg_dtype dt);  /* differentiable between float dtypes */
dg_tensor *dg_to_device(dg_tensor *t, dg_device dev);
dg_tensor *dg_clone(dg_tensor *t);                  /* contiguous copy, no autograd link */
dg_tensor *dg_detach(dg_tensor *t);                 /* same storage, no autograd link */
int dg_copy_(dg_tensor *dst, const dg_tensor *src); /* in place, same shape; no autograd */
int dg_fill_(dg_tensor *t, double value);
char *dg_shape_str(const dg_tensor *t, char *buf, size_t n); /* "[2,64,4,32]" */
void dg_print(const dg_tensor *t, FILE *f);
void dg_set_name(dg_tensor *t, const char *name);

/* ---- autograd ---------------------------------------------------------------------------------- */
void dg_set_requires_grad(dg_tensor *t, bool on);
int dg_backward(dg_tensor *loss, dg_tensor *grad); /* grad NULL: loss must have one element */
/* dg_backward that calls leaf_ready(leaf, ctx) for each leaf tensor the walk reaches (a tensor that
 * requires grad and was made by no op: a parameter), once, as soon as the last contribution to its
 * .grad has been queued; .grad is NULL when no contribution came.  The calls come in the order the
 * leaves become final, which depends on the graph alone, so processes that run the same program
 * see the same order (data-parallel training starts a leaf's all-reduce from here, overlapping
 * the rest of the backward).  A non-zero return from leaf_ready stops the backward with an error. */
typedef int (*dg_leaf_ready_fn)(dg_tensor *leaf, void *ctx);
int dg_backward_hooked(dg_tensor *loss, dg_tensor *grad, dg_leaf_ready_fn leaf_ready, void *ctx);
void dg_zero_grad(dg_tensor *t);
bool dg_grad_enabled(void);
void dg_no_grad_begin(void);
void dg_no_grad_end(void);
void dg_set_anomaly_mode(bool on); /* also DG_DETECT_ANOMALY=1 in the environment */
bool dg_anomaly_mode(void);

/* The op profiler.  Between dg_profile_begin and dg_profile_end every outermost op's forward and
 * backward, every gradient accumulation and every named region is timed twice: on the host (the
 * wall clock while it is queued) and on the device (CUDA events on the library's stream; on the CPU
 * the two are one).  An op called inside another op or a region counts to the outer one.
 * dg_profile_flush waits for the device and adds the times so far into the totals (call it once a
 * step: the events are reused); dg_profile_report prints the totals per name, largest first, as
 * milliseconds per step over `steps`.  dg_profile_end stops and forgets. */
int dg_profile_begin(dg_device device);         /* DG_CUDA: device times from CUDA events */
void dg_profile_region_begin(const char *name); /* name: a string that outlives the profile */
void dg_profile_region_end(void);
int dg_profile_flush(void);
void dg_profile_report(FILE *f, int64_t steps);
void dg_profile_end(void);
bool dg_profile_on(void);

/* ---- ops (the typed entry points; each is one registered op, see ops/) ------------------------ */
/* elementwise, broadcasting as numpy */
dg_tensor *dg_add(dg_tensor *a, dg_tensor *b);
dg_tensor *dg_sub(dg_tensor *a, dg_tensor *b);
dg_tensor *dg_mul(dg_tensor *a, dg_tensor *b);
dg_tensor *dg_div(dg_tensor *a, dg_tensor *b);
dg_tensor *dg_neg(dg_tensor *a);
dg_tensor *dg_add_scalar(dg_tensor *a, double s);
dg_tensor *dg_mul_scalar(dg_tensor *a, double s);
dg_tensor *dg_pow_scalar(dg_tensor *a, double p);
dg_tensor *dg_exp(dg_tensor *a);
dg_tensor *dg_log(dg_tensor *a);
dg_tensor *dg_sqrt(dg_tensor *a);
dg_tensor *dg_rsqrt(dg_tensor *a);
dg_tensor *dg_sigmoid(dg_tensor *a);
dg_tensor *dg_logsigmoid(dg_tensor *a);
dg_tensor *dg_silu(dg_tensor *a);
dg_tensor *dg_softplus(dg_tensor *a);
dg_tensor *dg_tanh(dg_tensor *a);
/* reductions: dims NULL/ndims 0 reduces everything */
dg_tensor *dg_sum(dg_tensor *a, int ndims, const int *dims, bool keepdim);
dg_tensor *dg_mean(dg_tensor *a, int ndims, const int *dims, bool keepdim);
dg_tensor *dg_sum_all(dg_tensor *a);
dg_tensor *dg_mean_all(dg_tensor *a);
/* matmul: a [..., M, K] (or [..., K, M] with trans_a) times b [..., K, N] (or [..., N, K]);
 * batch dims broadcast */
dg_tensor *dg_matmul(dg_tensor *a, dg_tensor *b);
dg_tensor *dg_matmul_t(dg_tensor *a, dg_tensor *b, bool trans_a, bool trans_b);
/* views and shape */
dg_tensor *dg_reshape(dg_tensor *a, int ndim, const int64_t *shape); /* one -1 allowed */
dg_tensor *dg_permute(dg_tensor *a, const int *perm);
dg_tensor *dg_transpose(dg_tensor *a, int d0, int d1);
dg_tensor *dg_slice(dg_tensor *a, int dim, int64_t start, int64_t stop); /* step 1 */
dg_tensor *dg_expand(dg_tensor *a, int ndim, const int64_t *shape);
dg_tensor *dg_cat(int n, dg_tensor *const *ts, int dim);
/* network pieces */
dg_tensor *dg_linear(dg_tensor *x, dg_tensor *w, dg_tensor *b); /* x [...,in], w [out,in] */
dg_tensor *dg_embedding(dg_tensor *weight, dg_tensor *ids);     /* weight [V,D], ids i64 */
dg_tensor *dg_rms_norm(dg_tensor *x, dg_tensor *w, double eps); /* w may be NULL */
/* r = h + y and x = rms_norm(r, w, eps) in one pass (a block's residual add and the next norm):
 * returns x, *r_out receives r (both autoreleased; r_out may be NULL).  w may be NULL. */
dg_tensor *dg_add_rms_norm(dg_tensor *h, dg_tensor *y, dg_tensor *w, double eps, dg_tensor **r_out);
dg_tensor *dg_gated_rms_norm(dg_tensor *x, dg_tensor *z, dg_tensor *w, double eps);
dg_tensor *dg_l2norm(dg_tensor *x, double eps); /* over the last dim */
/* x [B,T,D], w [D,W] (W = 1..8), bias [D] or NULL: y_t = sum_j w[:,j] x_{t-W+1+j} (+ b), silu */
dg_tensor *dg_conv1d(dg_tensor *x, dg_tensor *w, dg_tensor *bias, bool silu);
dg_tensor *dg_swiglu(dg_tensor *gate, dg_tensor *up); /* silu(gate) * up */
/* logits [N,C] (or [...,C]), targets i64 [N] (or [...]); mean over targets != ignore_index */
dg_tensor *dg_cross_entropy(dg_tensor *logits, dg_tensor *targets, int64_t ignore_index);
/* cross_entropy(linear(x, w, NULL), targets, ignore_index) without storing the logits: x [...,D],
 * w [C,D], targets i64 [...]; the rows go through the head in chunks of chunk_rows (0: as many as
 * keep a chunk's logits, f32 or f64, within DG_LINEAR_CE_CHUNK_BYTES), the backward recomputes
 * each chunk's logits */
#define DG_LINEAR_CE_CHUNK_BYTES ((int64_t)64 << 20)
dg_tensor *dg_linear_cross_entropy(dg_tensor *x, dg_tensor *w, dg_tensor *targets, int64_t ignore_index,
                                   int64_t chunk_rows);

#ifdef __cplusplus
}
#endif


/* the delta-rule family: delta_rule, gated_delta_rule, kda, their gates */
#include "deltagrad_delta.h"

#endif

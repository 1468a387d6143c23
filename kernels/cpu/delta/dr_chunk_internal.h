/* Internal, precision-independent helpers of the chunked delta-rule kernels (dr_chunk_*.c,
 * chunk_pieces_*.c): the chunk plan (which rows form which chunk, validated shapes), a vectorised
 * exp, and the token-pasting macros of the templated bodies.  Not part of any public API.
 *
 * Row numbering: all per-token arrays are [B,T,...]; a "row" is the flattened index b*T + t.  With
 * cu_seqlens (B = 1) sequence n owns rows [cu[n], cu[n+1]); without, sequence n is batch n and owns
 * rows [n*T, (n+1)*T).  Chunks start at each sequence start, so a chunk never straddles two
 * sequences; the last chunk of a sequence may be partial (1..C rows). */
#ifndef DG_KERNELS_CPU_DR_CHUNK_INTERNAL_H
#define DG_KERNELS_CPU_DR_CHUNK_INTERNAL_H

#include <stdint.h>
#include <string.h>
#ifdef __FMA__
#include <immintrin.h>
#endif

#include "kernels/cpu/delta/delta_rule.h"

typedef struct dg_drc_plan {
    int64_t nseq;        /* N */
    int64_t nchunks;     /* chunks over all sequences */
    int64_t rows;        /* B*T */
    int64_t *row0;       /* [nchunks] first row of each chunk */
    int *len;            /* [nchunks] rows in each chunk (1..C) */
    int64_t *seq_chunk;  /* [N+1] chunks of sequence n are seq_chunk[n] .. seq_chunk[n+1]-1 */
    unsigned char *edge; /* [nchunks] DR_FIRST | DR_LAST: the chunk begins / ends its sequence */
} dg_drc_plan;

#define DR_FIRST 1u
#define DR_LAST 2u

/* Validates the shape fields the chunked kernels use (what names the op in messages: "dr_chunk_fwd",
 * "solve_tril", ...) and builds the plan.  need: bit 1 = H/HV/K used, bit 2 = V used.  Returns 0, or
 * -1 after dg_error() with a message naming the argument. */
int dg_drc_plan_init(dg_drc_plan *p, const dg_dr_shape *s, const char *what, int need);
void dg_drc_plan_free(dg_drc_plan *p);

/* ---- templating: a body file is included once per precision with DR_REAL = float or double ---- */
#define DR_CAT2_(a, b) a##_##b
#define DR_CAT2(a, b) DR_CAT2_(a, b)

/* ---- vectorised exp (GCC vector extensions; 4 doubles / 8 floats per step) ----
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Taylor polynomial of degree 12 (f64) / 7 (f32),
 * scale by 2^n built in the exponent bits.  Max relative error 3.2e-16 (f64), 1.1e-7 (f32) over the
 * normal range.  Results below the smallest normal (x < -708 resp. -87.3) flush to 0; x above 709
 * resp. 88 is clamped there.  NaN propagates. */
/* a*b + c, fused where the target has FMA (-std=c11 turns off GCC's automatic contraction) */
#ifdef __FMA__
#define DG_FMA4D(a, b, c) ((dg_v4d)_mm256_fmadd_pd((__m256d)(a), (__m256d)(b), (__m256d)(c)))
#define DG_FMA8F(a, b, c) ((dg_v8f)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define DG_FMA4D(a, b, c) ((a) * (b) + (c))
#define DG_FMA8F(a, b, c) ((a) * (b) + (c))
#endif
typedef double dg_v4d __attribute__((vector_size(32)));
#define DG_SPLAT4D(x) ((dg_v4d){0, 0, 0, 0} + (x))
#define DG_SPLAT8F(x) ((dg_v8f){0, 0, 0, 0, 0, 0, 0, 0} + (x))
typedef int64_t dg_v4l __attribute__((vector_size(32)));
typedef float dg_v8f __attribute__((vector_size(32)));
typedef int32_t dg_v8i __attribute__((vector_size(32)));

/* in place (pointers, not vector values: no ABI dependence on -mavx) */
static inline void dg_vexp4d(dg_v4d *px) {
    dg_v4d x = *px;
    dg_v4l under = x<-708.0, over = x> 709.0;
    dg_v4d hi = (dg_v4d){0, 0, 0, 0} + 709.0;
    x = (dg_v4d)(((dg_v4l)x & ~(under | over)) | ((dg_v4l)hi & over));
    const double shift = 0x1.8p52;
    dg_v4d t = x * 0x1.71547652b82fep0 + shift;
    dg_v4d n = t - shift;
    dg_v4d r = x - n * 0x1.62e42fefa3800p-1 - n * 0x1.ef35793c7673p-45;
    dg_v4d p = r * (1.0 / 479001600.0) + 1.0 / 39916800.0;
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 3628800.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 362880.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 40320.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 5040.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 720.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 120.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 24.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0 / 6.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(0.5));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0));
    p = DG_FMA4D(p, r, DG_SPLAT4D(1.0));
    dg_v4l e = ((dg_v4l)t - (int64_t)0x4338000000000000LL + 1023) << 52;
    dg_v4d res = p * (dg_v4d)e;
    *px = (dg_v4d)((dg_v4l)res & ~under);
}

static inline void dg_vexp8f(dg_v8f *px) {
    dg_v8f x = *px;
    dg_v8i under = x<-87.3f, over = x> 88.0f;
    dg_v8f hi = (dg_v8f){0, 0, 0, 0, 0, 0, 0, 0} + 88.0f;
    x = (dg_v8f)(((dg_v8i)x & ~(under | over)) | ((dg_v8i)hi & over));
    const float shift = 0x1.8p23f;
    dg_v8f t = x * 0x1.715476p0f + shift;
    dg_v8f n = t - shift;
    dg_v8f r = x - n * 0x1.62e4p-1f - n * 0x1.7f7d1cp-20f;
    dg_v8f p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = DG_FMA8F(p, r, DG_SPLAT8F(1.0f / 120.0f));
    p = DG_FMA8F(p, r, DG_SPLAT8F(1.0f / 24.0f));
    p = DG_FMA8F(p, r, DG_SPLAT8F(1.0f / 6.0f));
    p = DG_FMA8F(p, r, DG_SPLAT8F(0.5f));
    p = DG_FMA8F(p, r, DG_SPLAT8F(1.0f));
    p = DG_FMA8F(p, r, DG_SPLAT8F(1.0f));
    dg_v8i e = ((dg_v8i)t - 0x4B400000 + 127) << 23;
    dg_v8f res = p * (dg_v8f)e;
    *px = (dg_v8f)((dg_v8i)res & ~under);
}

/* y[i] = exp(x[i]), i < n (x and y may alias). */
static inline void dg_vexp_f64(int64_t n, const double *x, double *y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        dg_v4d a;
        memcpy(&a, x + i, sizeof a);
        dg_vexp4d(&a);
        memcpy(y + i, &a, sizeof a);
    }
    if (i < n) {
        dg_v4d a = {0, 0, 0, 0};
        memcpy(&a, x + i, sizeof(double) * (size_t)(n - i));
        dg_vexp4d(&a);
        memcpy(y + i, &a, sizeof(double) * (size_t)(n - i));
    }
}
static inline void dg_vexp_f32(int64_t n, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        dg_v8f a;
        memcpy(&a, x + i, sizeof a);
        dg_vexp8f(&a);
        memcpy(y + i, &a, sizeof a);
    }
    if (i < n) {
        dg_v8f a = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(&a, x + i, sizeof(float) * (size_t)(n - i));
        dg_vexp8f(&a);
        memcpy(y + i, &a, sizeof(float) * (size_t)(n - i));
    }
}

/* y[i] = exp(a[i] - b[i]) (fused: one pass), and y[i] = exp(a[i] - b0) with a scalar b0. */
static inline void dg_vexpdiff_f64(int64_t n, const double *a, const double *b, double *y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        dg_v4d x, z;
        memcpy(&x, a + i, sizeof x);
        memcpy(&z, b + i, sizeof z);
        x -= z;
        dg_vexp4d(&x);
        memcpy(y + i, &x, sizeof x);
    }
    for (; i < n; i++) y[i] = a[i] - b[i];
    if (n % 4) dg_vexp_f64(n % 4, y + (n - n % 4), y + (n - n % 4));
}
static inline void dg_vexpdiff_f32(int64_t n, const float *a, const float *b, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        dg_v8f x, z;
        memcpy(&x, a + i, sizeof x);
        memcpy(&z, b + i, sizeof z);
        x -= z;
        dg_vexp8f(&x);
        memcpy(y + i, &x, sizeof x);
    }
    for (; i < n; i++) y[i] = a[i] - b[i];
    if (n % 8) dg_vexp_f32(n % 8, y + (n - n % 8), y + (n - n % 8));
}

#endif

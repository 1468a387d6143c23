/* The backend table of the delta-rule family (delta_backends.h).  A row per device and kernel
 * family, faster families first:
 *   cpu_recurrent        CPU f32 / f64, token by token           kernels/cpu/delta/dr_recurrent*.c
 *   cpu_chunk            CPU f32 / f64, chunked (WY form)        kernels/cpu/delta/dr_chunk*.c
 *   cuda_recurrent       CUDA f32 / bf16 / f16, token by token   kernels/cuda/delta/dr_recurrent.cu
 *   cuda_chunk_kda_mma   CUDA bf16 / f16, per-channel gate, tensor cores, chunk 64, K <= 128, any V
 *                        (K, V in {64, 128}; others padded with zeros, V a multiple of 64 split
 *                        in heads)                           kernels/cuda/delta/dr_chunk_kda_mma_*.cu
 *   cuda_chunk_mma       CUDA bf16 / f16, gate none or head, tensor cores, the same shapes
 *                                                            kernels/cuda/delta/dr_chunk_mma_*.cu
 *   cuda_chunk_tf32      CUDA bf16 / f16, every gate, 128 < K <= 256 (chunk 64: padded to K = 256 and
 *                        V a multiple of 64 on 16-bit tensor cores; other chunks TF32)
 *                                                            kernels/cuda/delta/dr_chunk_k256*.cu
 *   cuda_chunk_generic   CUDA f32 / bf16 / f16, every gate and chunk, K <= 256
 *                                                            kernels/cuda/delta/dr_chunk_generic.cu
 * The L2 norm of q, k (c->l2): the 16-bit CUDA chunked rows take it in their own kernels
 * (dr_chunk_cuda.h); every other row runs the norm's kernel first (norm_first). */
#include "ops/delta/delta_backends.h"

#include "core/internal.h"
#include "ops/delta/delta_kernels.h"

#include <string.h>

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/delta/dr_chunk_cuda.h"
#endif

/* the CPU kernels' codes: -1 out of memory, else a rejected argument */
static int cpu_status(const dg_delta_call *c, const char *what, int rc) {
    if (rc == 0) return 0;
    if (rc == -1) dg_error("%s: out of host memory in the %s kernel", c->op, what);
    else dg_error("%s: the %s kernel rejected its arguments (code %d)", c->op, what, rc);
    return -1;
}

/* q, k of the call <- the normalised rows of l2.qraw, l2.kraw (rq, rk their 1/|x|), by the norm's
 * own kernel, for rows whose kernels do not take it in their loads */
static int norm_first(const dg_delta_call *c) {
    const int64_t rows = c->s.B * c->s.T * c->s.H;
    if (dg_delta_k_l2norm_fwd(c->op, c->device, c->dtype, rows, c->s.K, c->l2.qraw, (void *)c->q, c->l2.rq) ||
        dg_delta_k_l2norm_fwd(c->op, c->device, c->dtype, rows, c->s.K, c->l2.kraw, (void *)c->k, c->l2.rk))
        return -1;
    return 0;
}

static int64_t keeps_nothing(const dg_delta_call *c) {
    (void)c;
    return 0;
}

/* ---- CPU ---- */

static bool cpu_dtype(const dg_delta_call *c) {
    return c->device == DG_CPU && (c->dtype == DG_F32 || c->dtype == DG_F64);
}

static bool cpu_recurrent_accepts(const dg_delta_call *c) { return cpu_dtype(c) && c->algorithm == DG_DELTA_RECURRENT; }
static int cpu_recurrent_fwd(dg_delta_call *c) {
    if (c->l2.on && norm_first(c)) return -1;
    const dg_dr_shape *s = &c->s;
    const int rc = c->dtype == DG_F32 ? dg_dr_recurrent_fwd_f32(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT)
                                      : dg_dr_recurrent_fwd_f64(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT);
    return cpu_status(c, "recurrent forward", rc);
}
static int cpu_recurrent_bwd(dg_delta_call *c) {
    const dg_dr_shape *s = &c->s;
    c->l2_done = false;
    const int rc = c->dtype == DG_F32 ? dg_dr_recurrent_bwd_f32(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout,
                                                                c->dhT, c->dq, c->dk, c->dv, c->dg, c->dbeta, c->dh0)
                                      : dg_dr_recurrent_bwd_f64(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout,
                                                                c->dhT, c->dq, c->dk, c->dv, c->dg, c->dbeta, c->dh0);
    return cpu_status(c, "recurrent backward", rc);
}

static bool cpu_chunk_accepts(const dg_delta_call *c) { return cpu_dtype(c) && c->algorithm == DG_DELTA_CHUNKED; }
static int cpu_chunk_fwd(dg_delta_call *c) {
    if (c->l2.on && norm_first(c)) return -1;
    const dg_dr_shape *s = &c->s;
    const int rc = c->dtype == DG_F32 ? dg_dr_chunk_fwd_f32(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT)
                                      : dg_dr_chunk_fwd_f64(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT);
    return cpu_status(c, "chunked forward", rc);
}
static int cpu_chunk_bwd(dg_delta_call *c) {
    const dg_dr_shape *s = &c->s;
    const dg_dr_variant var = dg_delta_bwd_variant(c->bwd);
    c->l2_done = false;
    const int rc = c->dtype == DG_F32 ? dg_dr_chunk_bwd_f32(s, &var, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout,
                                                            c->dhT, c->dq, c->dk, c->dv, c->dg, c->dbeta, c->dh0)
                                      : dg_dr_chunk_bwd_f64(s, &var, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout,
                                                            c->dhT, c->dq, c->dk, c->dv, c->dg, c->dbeta, c->dh0);
    return cpu_status(c, "chunked backward", rc);
}

/* ---- CUDA ---- */
#ifdef DG_HAVE_CUDA

static bool cuda_recurrent_accepts(const dg_delta_call *c) {
    return c->device == DG_CUDA && c->algorithm == DG_DELTA_RECURRENT &&
           (c->dtype == DG_F32 || dg_delta_storage16(c->dtype));
}
static int cuda_recurrent_fwd(dg_delta_call *c) {
    if (c->l2.on && norm_first(c)) return -1;
    const dg_dr_shape *s = &c->s;
    if (c->dtype == DG_F32) return dg_cuda_dr_recurrent_fwd_f32(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT);
    if (c->dtype == DG_F16) return dg_cuda_dr_recurrent_fwd_f16(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT);
    return dg_cuda_dr_recurrent_fwd_bf16(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->o, c->hT);
}
static int cuda_recurrent_bwd(dg_delta_call *c) {
    const dg_dr_shape *s = &c->s;
    c->l2_done = false;
    if (c->dtype == DG_F32)
        return dg_cuda_dr_recurrent_bwd_f32(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dhT, c->dq, c->dk,
                                            c->dv, c->dg, c->dbeta, c->dh0);
    if (c->dtype == DG_F16)
        return dg_cuda_dr_recurrent_bwd_f16(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dhT, c->dq, c->dk,
                                            c->dv, c->dg, c->dbeta, c->dh0);
    return dg_cuda_dr_recurrent_bwd_bf16(s, c->q, c->k, c->v, c->g, c->beta, c->h0, c->dout, c->dhT, c->dq, c->dk,
                                         c->dv, c->dg, c->dbeta, c->dh0);
}

/* The chunked rows, one per kernel family of dr_chunk_cuda.h.  f32 calls take the L2 norm's kernel
 * first (their kernels have no fused norm). */
static int cuda_chunk_fwd(dg_drc_family fam, dg_delta_call *c) {
    if (!c->l2.on || dg_delta_storage16(c->dtype)) return dg_cuda_dr_chunk_fwd(fam, c);
    if (norm_first(c)) return -1;
    dg_delta_call normed = *c;
    normed.l2.on = false;
    const int rc = dg_cuda_dr_chunk_fwd(fam, &normed);
    c->kept = normed.kept;
    return rc;
}
#define CUDA_CHUNK_ROW(FAM, SFX)                                                                                \
    static bool cuda_chunk_##SFX##_accepts(const dg_delta_call *c) { return dg_cuda_dr_chunk_accepts(FAM, c); } \
    static int64_t cuda_chunk_##SFX##_kept_bytes(const dg_delta_call *c) {                                      \
        return dg_cuda_dr_chunk_kept_bytes(FAM, c);                                                             \
    }                                                                                                           \
    static int cuda_chunk_##SFX##_fwd(dg_delta_call *c) { return cuda_chunk_fwd(FAM, c); }                      \
    static int cuda_chunk_##SFX##_bwd(dg_delta_call *c) { return dg_cuda_dr_chunk_bwd(FAM, c); }
CUDA_CHUNK_ROW(DG_DRC_KDA_MMA, kda_mma)
CUDA_CHUNK_ROW(DG_DRC_MMA, mma)
CUDA_CHUNK_ROW(DG_DRC_TF32, tf32)
CUDA_CHUNK_ROW(DG_DRC_GENERIC, generic)

#endif /* DG_HAVE_CUDA */

/* ---- the table ---- */

static const dg_delta_backend rows[] = {
    {"cpu_recurrent", "CPU, token by token", cpu_recurrent_accepts, keeps_nothing, cpu_recurrent_fwd,
     cpu_recurrent_bwd},
    {"cpu_chunk", "CPU, chunked", cpu_chunk_accepts, keeps_nothing, cpu_chunk_fwd, cpu_chunk_bwd},
#ifdef DG_HAVE_CUDA
    {"cuda_recurrent", "CUDA, token by token", cuda_recurrent_accepts, keeps_nothing, cuda_recurrent_fwd,
     cuda_recurrent_bwd},
    {"cuda_chunk_kda_mma", "CUDA, chunked, tensor cores, per-channel gate", cuda_chunk_kda_mma_accepts,
     cuda_chunk_kda_mma_kept_bytes, cuda_chunk_kda_mma_fwd, cuda_chunk_kda_mma_bwd},
    {"cuda_chunk_mma", "CUDA, chunked, tensor cores, gate none or head", cuda_chunk_mma_accepts,
     cuda_chunk_mma_kept_bytes, cuda_chunk_mma_fwd, cuda_chunk_mma_bwd},
    {"cuda_chunk_tf32", "CUDA, chunked, TF32 tensor cores, 128 < K <= 256", cuda_chunk_tf32_accepts,
     cuda_chunk_tf32_kept_bytes, cuda_chunk_tf32_fwd, cuda_chunk_tf32_bwd},
    {"cuda_chunk_generic", "CUDA, chunked, f32 arithmetic", cuda_chunk_generic_accepts, cuda_chunk_generic_kept_bytes,
     cuda_chunk_generic_fwd, cuda_chunk_generic_bwd},
#endif
};
enum { N_ROWS = sizeof rows / sizeof rows[0] };

int dg_delta_backend_count(void) { return N_ROWS; }

const dg_delta_backend *dg_delta_backend_at(int i) { return i >= 0 && i < N_ROWS ? &rows[i] : NULL; }

const dg_delta_backend *dg_delta_pick(const dg_delta_call *c) {
    if (!dg_delta_dtype_ok(c->op, c->device, c->dtype)) return NULL;
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].accepts(c)) return &rows[i];
#ifndef DG_HAVE_CUDA
    if (c->device == DG_CUDA) {
        dg_error("%s: this build has no CUDA backend", c->op);
        return NULL;
    }
#endif
    dg_error("%s: no backend takes a %s %s call on %s", c->op,
             c->algorithm == DG_DELTA_RECURRENT ? "recurrent" : "chunked", dg_dtype_name(c->dtype),
             dg_device_name(c->device));
    return NULL;
}

bool dg_delta_slow_note(const dg_delta_backend *b, const dg_delta_call *c, char *buf, size_t n) {
    if (!b || strcmp(b->name, "cuda_chunk_generic") || !dg_delta_call_storage16(c) || c->force_generic) return false;
    snprintf(buf, n,
             "%s in %s with K = %lld, V = %lld, chunk %d runs on the generic chunked CUDA kernels (f32 arithmetic, "
             "many times slower): the tensor-core kernels take chunks of 64 (any K <= 256 and V), or K from 129 to "
             "256 (TF32)",
             c->op, dg_dtype_name(c->dtype), (long long)c->s.K, (long long)c->s.V, c->s.chunk);
    return true;
}

const dg_delta_backend *dg_delta_backend_named(const char *name) {
    for (int i = 0; name && i < N_ROWS; i++)
        if (!strcmp(rows[i].name, name)) return &rows[i];
    char list[512];
    size_t at = 0;
    list[0] = 0;
    for (int i = 0; i < N_ROWS && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", rows[i].name);
    dg_error("delta backend '%s' does not exist; the backends of this build are: %s", name ? name : "(null)", list);
    return NULL;
}

/* b, or the picked row; a named row must accept the call */
static const dg_delta_backend *row_for(const dg_delta_backend *b, const dg_delta_call *c) {
    if (!b) return dg_delta_pick(c);
    if (b->accepts(c)) return b;
    dg_error("%s: backend %s does not take this call (%s %s on %s, gate %d, chunk %d, K = %lld, V = %lld)", c->op,
             b->name, c->algorithm == DG_DELTA_RECURRENT ? "recurrent" : "chunked", dg_dtype_name(c->dtype),
             dg_device_name(c->device), (int)c->s.gate, c->s.chunk, (long long)c->s.K, (long long)c->s.V);
    return NULL;
}

int64_t dg_delta_kept_bytes(const dg_delta_backend *b, const dg_delta_call *c) {
    b = row_for(b, c);
    return b ? b->kept_bytes(c) : -1;
}

int dg_delta_fwd(const dg_delta_backend *b, dg_delta_call *c) {
    c->kept = false;
    b = row_for(b, c);
    return b ? b->fwd(c) : -1;
}

int dg_delta_bwd(const dg_delta_backend *b, dg_delta_call *c) {
    c->l2_done = false;
    b = row_for(b, c);
    return b ? b->bwd(c) : -1;
}

/* delta_rule, gated_delta_rule and kda built from primitive ops, token by token, so that autograd
 * derives an unfused backward to compare the hand-written ones against (def->decompose).
 *
 * Per group of sequences (all B at once without cu_seqlens; each packed sequence alone with it),
 * state S [Bn,HV,K,V], and per token t, with q_t, k_t as [Bn,HV,1,K] (q/k heads repeated over their
 * G = HV/H value heads), v_t [Bn,HV,1,V], beta_t [Bn,HV,1,1]:
 *   S   = S * exp(g_t)           g_t [Bn,HV,1,1] (GDN) or [Bn,HV,K,1] (KDA); skipped for DeltaNet
 *   p   = k_t S                  [Bn,HV,1,V]
 *   u   = beta_t (v_t - p)
 *   S   = S + k_t^T u
 *   o_t = (scale q_t) S          [Bn,HV,1,V] -> [Bn,1,HV,V]
 * The fused preprocessing is decomposed too: the l2norm x rsqrt(sum x^2 + eps) and the gate
 * -exp(A_log) softplus(a + dt_bias) from exp, softplus, mul. */
#include "ops/delta/delta_common.h"

#include <stdlib.h>

/* x / sqrt(sum(x^2 over the last dim) + eps), from primitives */
static dg_tensor *l2norm(dg_tensor *x) {
    const int last = x->ndim - 1;
    dg_tensor *ss = dg_sum(dg_mul(x, x), 1, &last, true);
    return dg_mul(x, dg_rsqrt(dg_add_scalar(ss, DG_DELTA_L2NORM_EPS)));
}

/* [B,T,H,K] -> [B,T,HV,K] by repeating each head G times (value head hv reads head hv / G) */
static dg_tensor *repeat_heads(dg_tensor *x, int64_t G) {
    if (G == 1) return x;
    const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], K = x->shape[3];
    dg_tensor *r = dg_reshape(x, DG_SHAPE(B, T, H, 1, K));
    r = dg_expand(r, DG_SHAPE(B, T, H, G, K));
    return dg_reshape(r, DG_SHAPE(B, T, H * G, K));
}

/* token t of x [Bn,T,HV,D] as [Bn,HV,1,D] */
static dg_tensor *token(dg_tensor *x, int64_t t, int64_t D) {
    dg_tensor *s = dg_slice(x, 1, t, t + 1);
    return dg_reshape(s, DG_SHAPE(x->shape[0], x->shape[2], 1, D));
}

/* Runs tokens [t0, t1) of a group: x tensors are [Bn,T,...]; S is the state in, returned out.
 * Appends the outputs [Bn,1,HV,V] to os. */
static dg_tensor *run_group(const dg_delta_attrs *at, dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g,
                            dg_tensor *beta, dg_tensor *S, int64_t t0, int64_t t1, dg_tensor **os, int *n_os) {
    const int64_t Bn = q->shape[0], HV = q->shape[2], K = q->shape[3], V = v->shape[3];
    const dg_delta_gate *gt = dg_delta_gate_of(at->gate);
    for (int64_t t = t0; t < t1 && S; t++) {
        dg_tensor *qt = token(q, t, K), *kt = token(k, t, K), *vt = token(v, t, V);
        dg_tensor *bt = dg_reshape(dg_slice(beta, 1, t, t + 1), DG_SHAPE(Bn, HV, 1, 1));
        if (g) S = dg_delta_gate_decay(gt, S, dg_slice(g, 1, t, t + 1));
        dg_tensor *p = dg_matmul(kt, S);
        dg_tensor *u = dg_mul(bt, dg_sub(vt, p));
        S = dg_add(S, dg_matmul_t(kt, u, true, false));
        dg_tensor *ot = dg_matmul(dg_mul_scalar(qt, at->scale), S);
        os[(*n_os)++] = dg_reshape(ot, DG_SHAPE(Bn, 1, HV, V));
    }
    return S;
}

int dg_delta_decompose(const dg_delta_slots *sl, const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    const dg_delta_attrs *at = (const dg_delta_attrs *)attrs;
    dg_tensor *q = in[sl->q], *k = in[sl->k], *v = in[sl->v], *beta = in[sl->beta];
    dg_tensor *h0 = in[sl->h0], *cu = in[sl->cu];
    dg_tensor *g = sl->g >= 0 ? in[sl->g] : NULL;
    const int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], K = q->shape[3];
    const int64_t HV = v->shape[2], V = v->shape[3];
    if (at->l2norm_qk) {
        q = l2norm(q);
        k = l2norm(k);
    }
    if (at->gate_in_kernel) {
        /* g = -exp(A_log) softplus(a + dt_bias); A_log [HV] broadcast over tokens (and channels) */
        dg_tensor *A = in[sl->A_log], *bias = in[sl->dt_bias], *x = g;
        if (dg_delta_gate_of(at->gate)->per_channel) {
            A = dg_reshape(A, DG_SHAPE(HV, 1));
            if (bias) bias = dg_reshape(bias, DG_SHAPE(HV, K));
        }
        if (bias) x = dg_add(x, bias);
        g = dg_mul(dg_neg(dg_exp(A)), dg_softplus(x));
    }
    q = repeat_heads(q, HV / H);
    k = repeat_heads(k, HV / H);
    if (!q || !k || (dg_delta_gate_of(at->gate)->gated && !g)) return -1;

    const int64_t N = cu ? cu->shape[0] - 1 : 1; /* groups */
    int64_t *c = NULL;
    if (cu) {
        c = malloc(sizeof(int64_t) * (size_t)(N + 1));
        if (!c || dg_copy_to_host(cu, c) != 0) {
            free(c);
            dg_error("%s: decompose cannot read cu_seqlens", "delta decompose");
            return -1;
        }
    }
    dg_tensor **os = malloc(sizeof(dg_tensor *) * (size_t)(T + 1));
    dg_tensor **hs = malloc(sizeof(dg_tensor *) * (size_t)N);
    int n_os = 0, rc = 0;
    if (!os || !hs) rc = -1;
    for (int64_t n = 0; n < N && rc == 0; n++) {
        const int64_t t0 = c ? c[n] : 0, t1 = c ? c[n + 1] : T, Bn = c ? 1 : B;
        dg_tensor *S = h0 ? (c ? dg_slice(h0, 0, n, n + 1) : h0) : dg_zeros(DG_SHAPE(Bn, HV, K, V), q->dtype);
        S = run_group(at, q, k, v, g, beta, S, t0, t1, os, &n_os);
        if (!S) rc = -1;
        hs[n] = S;
    }
    if (rc == 0) {
        out[0] = n_os == 1 ? os[0] : dg_cat(n_os, os, 1);
        out[1] = N == 1 ? hs[0] : dg_cat((int)N, hs, 0);
        if (!out[0] || !out[1]) rc = -1;
    }
    free(c);
    free(os);
    free(hs);
    return rc;
}

/* Templated body of the chunked backward.  Included after dr_chunk_fwd_impl.h.
 *
 * Forward of one chunk (see dr_chunk_fwd_impl.h), S0 the state entering it, S1 the one leaving it:
 *   (f1) V' = U - W S0                     (f2) O = scale Qg S0 + P V',  Qg = exp(G) o Q
 *   (f3) S1 = exp(G_last) S0 + Kd^T V',     Kd = exp(G_last - G) o K
 *   (f4) W = Ai Kbg, U = Ai Vb,  Kbg = diag(beta) exp(G) o K,  Vb = diag(beta) V
 *   (f5) Ai = (I + A)^-1,  A = diag(beta) Mkk,  Mkk = strictly_lower(K K^T o Gamma)
 *   (f6) P = scale lower_incl(Q K^T o Gamma)
 * Phases (FLA's structure):
 *   A  recompute G, Mkk, Ai, W, U, P                       per chunk and head
 *   B  recompute the chunk states S0 and V' (over U)       per sequence and head, chunks in order
 *   C  dhu: dV' = P^T dO + Kd dS1                           (f2, f3)
 *          dS0 = exp(G_last) dS1 + scale Qg^T dO - W^T dV'  (f3, f2, f1)   chunks in reverse
 *   D1 dqkwg: dQ, dK (from f2, f3, f6), dW = -dV' S0^T (f1), dG of those
 *   D2 WY backward: dK, dV, dbeta, dG from dW, dU = dV' through f4, f5
 *      (dw_on_chip = 1: D1 and D2 in one loop per chunk, dW in a chunk-sized per-thread buffer;
 *       0: D1 over all chunks writes dW [rows,HV,K], then D2 in a second loop)
 *   then dG -> dg by a reverse chunk-local cumsum, and the sum over the value heads of a group
 *   for dq, dk (GVA).
 * Phase by phase, A and D run over all chunks and heads in parallel, B and C over sequences and
 * heads; in the chunk walk (FN(use_walk), FN(walk_bwd)) a thread takes one sequence and head
 * through A and B chunk by chunk, then through C and D chunk by chunk in reverse. */

typedef struct FN(bctx) {
    FN(ctx) *x;
    const R *dout, *dhT;
    R *Sst, *dSst; /* [nchunks, HV, K, V]: state entering / gradient of the state leaving chunk c */
    R *dVn;        /* [rows, HV, V]: dV' */
    R *dqv, *dkv;  /* [rows, HV, K]: dq, dk per value head */
    R *dWb, *dGb;  /* unfused only: [rows, HV, K] and [rows, HV, gs] */
    R *dv, *dg, *dbeta;
    int final_dg;
} FN(bctx);

/* Phase C for sequence n, head hv, chunk by chunk in reverse (dhu_begin: dS = dhT or zeros,
 * dhu_step for each chunk from the last, dhu_end: dh0).  As in the state pass, the products of a
 * dS known to be zero (the last chunk's, without dhT) are skipped, and so is the dS entering the
 * first chunk when nothing reads it (no dh0); dSst still holds the zeros, which D1 does not read
 * (it knows them).  ws: dS (K x V) first, FN(state_ws) elements in all. */
static bool FN(dhu_begin)(const FN(bctx) *b, int64_t n, int hv, R *dS) {
    int64_t KV = (int64_t)b->x->K * b->x->V;
    if (b->dhT) memcpy(dS, b->dhT + (n * b->x->HV + hv) * KV, sizeof(R) * (size_t)KV);
    return !b->dhT; /* dS is exactly zero */
}

/* Chunk c: dV', and dS <- the gradient of the state entering c.  Returns false where the pass
 * ends (the gradient entering the sequence, unread). */
static bool FN(dhu_step)(const FN(bctx) *b, int64_t c, int hv, R *dh0, bool *zero, R *ws) {
    const FN(ctx) *x = b->x;
    int K = x->K, V = x->V, C = x->C, HV = x->HV;
    R *dS = ws, *Qg = dS + (int64_t)K * V, *Kd = Qg + (int64_t)C * K, *e = Kd + (int64_t)C * K;
    FN(ctab) tab;
    FN(cp) p;
    FN(cp_init)(x, c, hv, &p);
    FN(cp_table)(x, c, hv, &p.gate, &tab, 0);
    int L = p.L;
    int64_t off = p.r0 * HV + hv;
    if (!*zero) memcpy(b->dSst + (c * HV + hv) * (int64_t)K * V, dS, sizeof(R) * (size_t)K * V);
    const R *dO = b->dout + off * V;
    R *dVn = b->dVn + off * V;
    const R *kd = p.k, *qg = p.q;
    int64_t ldkd = p.ldq, ldqg = p.ldq;
    if (x->gs) {
        FN(gate_rows)(&p.gate, 1, p.k, p.ldq, Kd, K, e);
        FN(gate_rows)(&p.gate, 0, p.q, p.ldq, Qg, K, e);
        kd = Kd;
        qg = Qg;
        ldkd = ldqg = K;
    }
    /* dV' = P^T dO (f2) + Kd dS1 (f3) */
    FN(gemm_tri)(1, L, V, 1, x->P + off * C, p.ldc, dO, p.ldv, 0, dVn, p.ldv);
    if (!*zero) FN(gemm)(0, 0, L, V, K, 1, kd, ldkd, dS, V, 1, dVn, p.ldv);
    if ((x->pl->edge[c] & DR_FIRST) && !dh0) return false; /* the gradient entering the sequence: unread */
    /* dS0 = exp(G_last) dS1 (f3) + scale Qg^T dO (f2) - W^T dV' (f1) */
    if (!*zero) FN(decay_state)(&p.gate, dS, V, e);
    FN(gemm)(1, 0, K, V, L, x->scale, qg, ldqg, dO, p.ldv, *zero ? 0 : 1, dS, V);
    FN(gemm)(1, 0, K, V, L, -1, x->W + off * K, (int64_t)HV * K, dVn, p.ldv, 1, dS, V);
    *zero = false;
    return true;
}

static void FN(dhu_end)(const FN(bctx) *b, int64_t n, int hv, R *dh0, bool zero, R *dS) {
    if (!dh0) return;
    int64_t KV = (int64_t)b->x->K * b->x->V;
    if (zero) memset(dS, 0, sizeof(R) * (size_t)KV); /* a sequence without chunks (T = 0) */
    memcpy(dh0 + (n * b->x->HV + hv) * KV, dS, sizeof(R) * (size_t)KV);
}

static void FN(bwd_dhu)(const FN(bctx) *b, int64_t n, int hv, R *dh0, R *ws) {
    bool zero = FN(dhu_begin)(b, n, hv, ws);
    for (int64_t c = b->x->pl->seq_chunk[n + 1] - 1; c >= b->x->pl->seq_chunk[n]; c--)
        if (!FN(dhu_step)(b, c, hv, dh0, &zero, ws)) break;
    FN(dhu_end)(b, n, hv, dh0, zero, ws);
}

/* dG (L x gs) += sgn * X o Y (CHANNEL) or rowsum(X o Y) (HEAD). */
static void FN(dg_add_prod)(const FN(cg) *g, R sgn, const R *X, int64_t ldx, const R *Y, int64_t ldy, R *dG,
                            int64_t ldG) {
    int K = g->K;
    for (int i = 0; i < g->L; i++) {
        const R *a = X + i * ldx, *y = Y + i * ldy;
        R *d = dG + i * ldG;
        if (g->kind == DG_GATE_CHANNEL) {
            for (int c = 0; c < K; c++) d[c] += sgn * a[c] * y[c];
        } else {
            d[0] += sgn * FN(dot)(K, a, y);
        }
    }
}

static void FN(add_rows)(int m, int n, const R *X, int64_t ldx, R *Y, int64_t ldy) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) Y[i * ldy + j] += X[i * ldx + j];
}

/* Phase D1 for chunk c, head hv: writes dq, dk (per value head), dW (ld ldw) and dG (ld ldG, the
 * gradient of the cumulative gate, last-row terms included).  The terms of a zero S0 (the first
 * chunk without h0) or a zero dS1 (the last chunk without dhT) are zeros, not products: the same
 * bits, and dSst is not read there (phase C leaves it unwritten). */
static void FN(bwd_dqkwg)(const FN(bctx) *b, int64_t c, int hv, R *dW, int64_t ldw, R *dG, int64_t ldG, R *ws) {
    const FN(ctx) *x = b->x;
    FN(cp) p;
    FN(cp_init)(x, c, hv, &p);
    int L = p.L, K = x->K, V = x->V, C = x->C, HV = x->HV, gs = x->gs;
    int64_t off = p.r0 * HV + hv, ldk = (int64_t)HV * K;
    const R *S0 = b->Sst + (c * HV + hv) * (int64_t)K * V, *dS1 = b->dSst + (c * HV + hv) * (int64_t)K * V;
    const R *Vn = x->U + off * V, *dVn = b->dVn + off * V, *dO = b->dout + off * V;
    R *dq = b->dqv + off * K, *dk = b->dkv + off * K;
    R *dQg = ws, *dP = dQg + C * K, *rp = dP + C * C, *dKp = rp + C * K, *dKd = dKp + C * K, *e = dKd + C * K,
      *dGl = e + C + K + 8, *Eh = dGl + K + 8, *gw = Eh + C * C;
    const FN(cg) *g = &p.gate;
    FN(ctab) tab;
    FN(cp_table)(x, c, hv, &p.gate, &tab, 0);
    if (gs == 1) {
        FN(head_emat)(g, Eh);
        p.gate.E = Eh;
    }
    int partial = gs && !b->final_dg;
    const bool s0zero = (x->pl->edge[c] & DR_FIRST) && !x->h0, s1zero = (x->pl->edge[c] & DR_LAST) && !b->dhT;
    if (gs) {
        FN(zero_rows)(L, gs, dG, ldG);
        memset(dGl, 0, sizeof(R) * (size_t)gs);
    }
    /* (f2) dQg = scale dO S0^T;  dQ = exp(G) o dQg */
    if (s0zero) {
        FN(zero_rows)(L, K, dq, ldk);
    } else {
        FN(gemm)(0, 1, L, K, V, x->scale, dO, p.ldv, S0, V, 0, dQg, K);
        FN(gate_rows)(g, 0, dQg, K, dq, ldk, e);
        if (partial) FN(dg_add_prod)(g, 1, p.q, p.ldq, dq, ldk, dG, ldG);
    }
    /* (f2, f6) dP = dO V'^T (lower);  dQ += dP Gamma K,  dK = dP^T Gamma Q (scaled) */
    FN(gemm_lowc)(L, V, 1, dO, p.ldv, Vn, p.ldv, 0, dP, C);
    FN(mask_lower)(L, dP, C, 0);
    FN(zero_rows)(L, K, rp, K);
    FN(zero_rows)(L, K, dKp, K);
    FN(gated_apply2)(g, dP, C, p.k, p.ldq, p.q, p.ldq, x->scale, rp, K, dKp, K, gw);
    FN(add_rows)(L, K, rp, K, dq, ldk);
    if (partial && g->kind == DG_GATE_CHANNEL) {
        FN(dg_add_prod)(g, 1, p.q, p.ldq, rp, K, dG, ldG);
        FN(dg_add_prod)(g, -1, p.k, p.ldq, dKp, K, dG, ldG);
    } else if (partial) {
        FN(head_rowcol_dg)(L, dP, C, x->P + off * C, p.ldc, dG, ldG);
    }
    /* (f3) dKd = V' dS1^T;  dK += exp(G_last - G) o dKd */
    if (!s1zero) {
        FN(gemm)(0, 1, L, K, V, 1, Vn, p.ldv, dS1, V, 0, dKd, K);
        FN(gate_rows)(g, 1, dKd, K, rp, K, e);
        FN(add_rows)(L, K, rp, K, dKp, K);
    }
    if (gs && !s1zero) {
        /* dG_last += sum_i K_i o dK_i(f3) + exp(G_last) o rowsum(S0 o dS1);  dG_i -= K_i o dK_i(f3) */
        R *tmp = dKd; /* reuse: L x gs zeros */
        FN(zero_rows)(L, gs, tmp, gs);
        FN(dg_add_prod)(g, 1, p.k, p.ldq, rp, K, tmp, gs);
        for (int i = 0; i < L; i++)
            for (int j = 0; j < gs; j++) dGl[j] += tmp[i * gs + j];
        if (partial)
            for (int i = 0; i < L; i++)
                for (int j = 0; j < gs; j++) dG[i * ldG + j] -= tmp[i * gs + j];
        const R *Gl = g->G + (L - 1) * g->ldg;
        for (int j = 0; j < gs; j++) e[j] = Gl[j];
        DR_VEXP(gs, e, e);
        for (int r = 0; r < K && !s0zero; r++) {
            const R s = FN(dot)(V, S0 + (int64_t)r * V, dS1 + (int64_t)r * V);
            dGl[gs == 1 ? 0 : r] += s * e[gs == 1 ? 0 : r];
        }
    }
    FN(copy_rows)(L, K, dKp, K, dk, ldk);
    /* the gate gradient of f2, f3, f6 from the final dq, dk of this stage */
    if (gs && b->final_dg) {
        FN(dg_add_prod)(g, 1, p.q, p.ldq, dq, ldk, dG, ldG);
        FN(dg_add_prod)(g, -1, p.k, p.ldq, dk, ldk, dG, ldG);
    }
    for (int j = 0; j < gs; j++) dG[(L - 1) * ldG + j] += dGl[j];
    /* (f1) dW = -dV' S0^T */
    if (s0zero) FN(zero_rows)(L, K, dW, ldw);
    else FN(gemm)(0, 1, L, K, V, -1, dVn, p.ldv, S0, V, 0, dW, ldw);
}

/* Phase D2 for chunk c, head hv: the WY backward from dW (ld ldw) and dU = dV'; adds to dk and dG,
 * writes dv, dbeta, and dg (reverse cumsum of dG). */
static void FN(bwd_wy)(const FN(bctx) *b, int64_t c, int hv, const R *dW, int64_t ldw, R *dG, int64_t ldG, R *ws) {
    const FN(ctx) *x = b->x;
    FN(cp) p;
    FN(cp_init)(x, c, hv, &p);
    int L = p.L, K = x->K, V = x->V, C = x->C, HV = x->HV, gs = x->gs;
    int64_t off = p.r0 * HV + hv, ldk = (int64_t)HV * K;
    const R *Ai = x->Ai + off * C, *Mkk = x->Mkk + off * C, *dU = b->dVn + off * V;
    R *dk = b->dkv + off * K;
    R *Kg = ws, *Kbg = Kg + C * K, *dKbg = Kbg + C * K, *rp = dKbg + C * K, *cp = rp + C * K, *Vb = cp + C * K,
      *dVb = Vb + C * V, *dAi = dVb + C * V, *dA = dAi + C * C, *tw = dA + C * C, *db = tw + 2 * C * C, *e = db + C + 8,
      *Eh = e + C + K + 8, *gw = Eh + C * C;
    const FN(cg) *g = &p.gate;
    FN(ctab) tab;
    FN(cp_table)(x, c, hv, &p.gate, &tab, 0);
    if (gs == 1) {
        FN(head_emat)(g, Eh);
        p.gate.E = Eh;
    }
    /* (f4) Kbg = beta o exp(G) o K, Vb = beta o V */
    FN(gate_rows)(g, 0, p.k, p.ldq, Kg, K, e);
    for (int i = 0; i < L; i++) {
        R bi = p.beta[i * p.ldb];
        for (int j = 0; j < K; j++) Kbg[i * K + j] = bi * Kg[i * K + j];
        for (int j = 0; j < V; j++) Vb[i * V + j] = bi * p.v[i * p.ldv + j];
    }
    /* dAi = dW Kbg^T + dU Vb^T (lower);  dKbg = Ai^T dW;  dVb = Ai^T dU */
    FN(gemm_lowc)(L, K, 1, dW, ldw, Kbg, K, 0, dAi, C);
    FN(gemm_lowc)(L, V, 1, dU, p.ldv, Vb, V, 1, dAi, C);
    FN(mask_lower)(L, dAi, C, 0);
    FN(gemm_tri)(1, L, K, 1, Ai, p.ldc, dW, ldw, 0, dKbg, K);
    FN(gemm_tri)(1, L, V, 1, Ai, p.ldc, dU, p.ldv, 0, dVb, V);
    /* dv = beta o dVb;  dbeta = rowsum(V o dVb) + rowsum(Kg o dKbg);  dKg = beta o dKbg */
    for (int i = 0; i < L; i++) {
        R bi = p.beta[i * p.ldb];
        db[i] = FN(dot)(V, p.v + i * p.ldv, dVb + i * V) + FN(dot)(K, Kg + i * K, dKbg + i * K);
        if (b->dv)
            for (int j = 0; j < V; j++) b->dv[(off + (int64_t)i * HV) * V + j] = bi * dVb[i * V + j];
        for (int j = 0; j < K; j++) dKbg[i * K + j] *= bi;
    }
    /* dK += exp(G) o dKg;  dG += Kg o dKg */
    FN(gate_rows)(g, 0, dKbg, K, rp, K, e);
    FN(add_rows)(L, K, rp, K, dk, ldk);
    if (gs) FN(dg_add_prod)(g, 1, p.k, p.ldq, rp, K, dG, ldG);
    /* (f5) dA = strictly_lower(-Ai^T dAi Ai^T);  dbeta += rowsum(dA o Mkk);  dMkk = diag(beta) dA */
    FN(tril_inv_bwd)(L, Ai, p.ldc, dAi, C, dA, C, tw);
    for (int i = 0; i < L; i++) {
        R bi = p.beta[i * p.ldb];
        db[i] += FN(dot)(i, dA + i * C, Mkk + i * p.ldc);
        for (int j = 0; j < i; j++) dA[i * C + j] *= bi;
    }
    /* Mkk = K K^T o Gamma: dK += dMkk Gamma K + dMkk^T Gamma K;  dG from both sides */
    if (g->kind == DG_GATE_CHANNEL) {
        FN(zero_rows)(L, K, rp, K);
        FN(zero_rows)(L, K, cp, K);
        FN(gated_apply2)(g, dA, C, p.k, p.ldq, p.k, p.ldq, 1, rp, K, cp, K, gw);
        FN(add_rows)(L, K, rp, K, dk, ldk);
        FN(add_rows)(L, K, cp, K, dk, ldk);
        FN(dg_add_prod)(g, 1, p.k, p.ldq, rp, K, dG, ldG);
        FN(dg_add_prod)(g, -1, p.k, p.ldq, cp, K, dG, ldG);
    } else {
        FN(gated_apply2)(g, dA, C, p.k, p.ldq, p.k, p.ldq, 1, dk, ldk, dk, ldk, gw);
        if (gs) FN(head_rowcol_dg)(L, dA, C, Mkk, p.ldc, dG, ldG);
    }
    if (b->dbeta)
        for (int i = 0; i < L; i++) b->dbeta[off + (int64_t)i * HV] = db[i];
    /* dg = reverse chunk-local cumsum of dG (G_i = g_0 + ... + g_i) */
    if (gs && b->dg) FN(cumsum_rows)(L, gs, dG, ldG, b->dg + off * gs, (int64_t)HV * gs, 1);
}

/* Phase D for chunk c, head hv.  parts: 1 = D1 and D2 together, dW and dG in the thread's
 * chunk-sized buffer (dw_on_chip); 2 = D1 alone into the call's dW, dG buffers; 3 = D2 alone from
 * them. */
static void FN(bwd_chunk)(const FN(bctx) *b, int64_t c, int hv, int parts, R *ws) {
    const FN(ctx) *x = b->x;
    int K = x->K, gs = x->gs, HV = x->HV;
    if (parts == 1) { /* ws: dW (C x K), dG (C x gs <= C x K), then the phases' own workspace */
        R *dWc = ws, *dGc = ws + (int64_t)x->C * K;
        FN(bwd_dqkwg)(b, c, hv, dWc, K, dGc, gs, ws + 2 * (int64_t)x->C * K);
        FN(bwd_wy)(b, c, hv, dWc, K, dGc, gs, ws + 2 * (int64_t)x->C * K);
        return;
    }
    int64_t off = x->pl->row0[c] * HV + hv;
    R *dW = b->dWb + off * K, *dG = gs ? b->dGb + off * gs : NULL;
    if (parts == 2) FN(bwd_dqkwg)(b, c, hv, dW, (int64_t)HV * K, dG, (int64_t)HV * gs, ws);
    else FN(bwd_wy)(b, c, hv, dW, (int64_t)HV * K, dG, (int64_t)HV * gs, ws);
}

/* The chunk walk of the backward for sequence n, head hv on one thread (FN(use_walk)): the
 * forward's walk (each chunk's prep, then its state step, storing the states), then the chunks in
 * reverse, each one's dhu step followed at once by its phase D, which reads the chunk's dV' and
 * dS1 from the cache the step just wrote them to.  ws: phase C's, then phase D's. */
static void FN(walk_bwd)(const FN(bctx) *b, int64_t n, int hv, R *dh0, int fused, R *ws) {
    const FN(ctx) *x = b->x;
    R *dws = ws + FN(state_ws)(x->C, x->K, x->V);
    FN(walk_fwd)(x, n, hv, NULL, NULL, b->Sst, ws);
    bool zero = FN(dhu_begin)(b, n, hv, ws), more = true;
    for (int64_t c = x->pl->seq_chunk[n + 1] - 1; c >= x->pl->seq_chunk[n] && more; c--) {
        more = FN(dhu_step)(b, c, hv, dh0, &zero, ws);
        FN(bwd_chunk)(b, c, hv, fused ? 1 : 2, dws);
        if (!fused) FN(bwd_chunk)(b, c, hv, 3, dws);
    }
    FN(dhu_end)(b, n, hv, dh0, zero, ws);
}

int FN(dg_dr_chunk_bwd)(const dg_dr_shape *s, const dg_dr_variant *var, const R *q, const R *k, const R *v, const R *g,
                        const R *beta, const R *h0, const R *dout, const R *dhT, R *dq, R *dk, R *dv, R *dg, R *dbeta,
                        R *dh0) {
    const char *what = "dr_chunk_bwd";
    dg_drc_plan pl;
    if (FN(check_ptrs)(what, s, q, k, v, g, beta) || dg_drc_plan_init(&pl, s, what, 3)) return -1;
    if (!dout || (dg && !g)) {
        dg_drc_plan_free(&pl);
        dg_error("%s: %s", what, !dout ? "dout is NULL" : "dg given but g is NULL");
        return -1;
    }
    dg_dr_variant dv0 = {1, 1, 1};
    if (!var) var = &dv0;
    FN(ctx) x;
    FN(ctx_init)(&x, s, &pl, q, k, v, g, beta, h0);
    x.blocked = var->solve_tril_blocked;
    FN(bctx) b;
    memset(&b, 0, sizeof b);
    b.x = &x;
    b.dout = dout;
    b.dhT = dhT;
    b.dv = dv;
    b.dg = dg;
    b.dbeta = dbeta;
    b.final_dg = var->gdn_dg_from_final;
    int rc = 0, HV = x.HV, K = x.K, V = x.V, C = x.C, gs = x.gs;
    int64_t rows = pl.rows, nst = pl.nchunks * HV * (int64_t)K * V;
    int fused = var->dw_on_chip;
    int own_dq = !(dq && HV == x.H), own_dk = !(dk && HV == x.H);
    void *bufs[14] = {0};
    int nb = 0;
#define DR_ALLOC(ptr, n)                             \
    do {                                             \
        ptr = malloc(sizeof(R) * (size_t)((n) + 1)); \
        bufs[nb++] = ptr;                            \
        if (!ptr) rc = -1;                           \
    } while (0)
    DR_ALLOC(x.W, rows * HV * K);
    DR_ALLOC(x.U, rows * HV * V);
    DR_ALLOC(x.P, rows * HV * C);
    DR_ALLOC(x.Ai, rows * HV * C);
    DR_ALLOC(x.Mkk, rows * HV * C);
    if (gs) DR_ALLOC(x.Gc, rows * HV * gs);
    if (s->gate == DG_GATE_CHANNEL) DR_ALLOC(x.tabs, pl.nchunks * HV * x.tws);
    DR_ALLOC(b.Sst, nst);
    DR_ALLOC(b.dSst, nst);
    DR_ALLOC(b.dVn, rows * HV * V);
    if (own_dq) DR_ALLOC(b.dqv, rows * HV * K);
    else b.dqv = dq;
    if (own_dk) DR_ALLOC(b.dkv, rows * HV * K);
    else b.dkv = dk;
    if (!fused) {
        DR_ALLOC(b.dWb, rows * HV * K);
        if (gs) DR_ALLOC(b.dGb, rows * HV * gs);
    }
#undef DR_ALLOC
    int64_t wsn = FN(ws_elems)(C, K, V) + 2 * (int64_t)C * K;
    int64_t nitems = pl.nchunks * HV, nseq = pl.nseq * HV;
    int dr_par_ = FN(worth_threads)(&x);
    if (rc == 0 && FN(use_walk)(&x)) {
        DR_PARALLEL_ITEMS(nseq, wsn, FN(walk_bwd)(&b, it / HV, (int)(it % HV), dh0, fused, ws));
    } else if (rc == 0) {
        DR_PARALLEL_ITEMS(nitems, wsn, FN(chunk_prep)(&x, it / HV, (int)(it % HV), ws));
        DR_PARALLEL_ITEMS(nseq, wsn, FN(state_pass)(&x, it / HV, (int)(it % HV), NULL, NULL, b.Sst, ws));
        DR_PARALLEL_ITEMS(nseq, wsn, FN(bwd_dhu)(&b, it / HV, (int)(it % HV), dh0, ws));
        /* dw_on_chip: one pass per chunk; else D1 over all chunks, then D2 */
        DR_PARALLEL_ITEMS(nitems, wsn, FN(bwd_chunk)(&b, it / HV, (int)(it % HV), fused ? 1 : 2, ws));
        if (!fused) DR_PARALLEL_ITEMS(nitems, wsn, FN(bwd_chunk)(&b, it / HV, (int)(it % HV), 3, ws));
    }
    /* GVA: dq, dk of key head h = sum over its value heads */
    if (rc == 0 && (own_dq || own_dk)) {
        int grp = x.grp, H = x.H;
#pragma omp parallel for schedule(static) if (dr_par_)
        for (int64_t r = 0; r < rows; r++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < 2; w++) {
                    R *out = w ? dk : dq;
                    const R *in = w ? b.dkv : b.dqv;
                    if (!out || !(w ? own_dk : own_dq)) continue;
                    R *o = out + (r * H + h) * K;
                    const R *src = in + (r * HV + h * grp) * K;
                    for (int j = 0; j < K; j++) o[j] = src[j];
                    for (int m = 1; m < grp; m++)
                        for (int j = 0; j < K; j++) o[j] += src[(int64_t)m * K + j];
                }
    }
    for (int i = 0; i < nb; i++) free(bufs[i]);
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}

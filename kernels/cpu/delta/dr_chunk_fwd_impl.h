/* Templated body of the chunked forward (and the per-chunk preparation the backward shares).
 * Included after dr_chunk_math.h by dr_chunk_f32.c / dr_chunk_f64.c.
 *
 * Per sequence, value head hv (key head h = hv / (HV/H)) and chunk of L rows, with G the
 * chunk-local cumulative gate and Gamma_ij = exp(G_i - G_j) (per channel for KDA, inside the dot):
 *   Mkk = strictly_lower(K K^T o Gamma),  A = diag(beta) Mkk         (chunk_scaled_dot_kkt)
 *   Ai  = (I + A)^-1                                                 (solve_tril)
 *   W   = Ai diag(beta) (exp(G) o K),  U = Ai diag(beta) V            (WY representation)
 *   P   = scale lower_incl(Q K^T o Gamma)                            (intra-chunk attention)
 * then across the chunks of a sequence, in order, from S = h0 (or 0):
 *   V' = U - W S;   O = scale (exp(G) o Q) S + P V';   S <- exp(G_last) S + (exp(G_last - G) o K)^T V'.
 * Phase A (per chunk and head) computes G, W, U, P (and for KDA the chunk's gate factor table,
 * dr_chunk_gated.h) into per-call buffers; phase B (per sequence and head, chunks in order) runs
 * the state pass; the two schedules over the threads are at FN(use_walk).  Scratch: malloc'd per call (the buffers) and per thread
 * (a chunk-sized workspace); nothing global.  Threads only when the call is worth waking them. */
typedef struct FN(ctx) {
    const dg_dr_shape *s;
    const dg_drc_plan *pl;
    int H, HV, K, V, C, grp, gs; /* grp = HV/H; gs = gate values per token and head (0, 1, K) */
    R scale;
    const R *q, *k, *v, *g, *beta, *h0;
    /* per-token buffers [rows, HV, .] */
    R *Gc;   /* chunk-local cumulative gate, gs per head */
    R *W;    /* K per head */
    R *U;    /* V per head: U, overwritten by V' = U - W S in the state pass */
    R *P;    /* C per head: scale * lower_incl(Q K^T o Gamma) */
    R *Ai;   /* C per head: (I + A)^-1 (backward only) */
    R *Mkk;  /* C per head: strictly_lower(K K^T o Gamma) (backward only) */
    R *tabs; /* CHANNEL: the factor table of every chunk and head, ctab_ws elements each */
    int64_t tws;
    int blocked;
} FN(ctx);

static void FN(ctx_init)(FN(ctx) *x, const dg_dr_shape *s, const dg_drc_plan *pl, const R *q, const R *k, const R *v,
                         const R *g, const R *beta, const R *h0) {
    memset(x, 0, sizeof *x);
    x->s = s;
    x->pl = pl;
    x->H = (int)s->H;
    x->HV = (int)s->HV;
    x->K = (int)s->K;
    x->V = (int)s->V;
    x->C = s->chunk;
    x->grp = (int)(s->HV / s->H);
    x->gs = s->gate == DG_GATE_NONE ? 0 : s->gate == DG_GATE_HEAD ? 1 : (int)s->K;
    x->scale = (R)s->scale;
    x->q = q;
    x->k = k;
    x->v = v;
    x->g = g;
    x->beta = beta;
    x->h0 = h0;
    x->tws = FN(ctab_ws)(x->C, x->K);
}

/* CHANNEL: the factor table of chunk c, head hv: built by chunk_prep, attached by later phases. */
static void FN(cp_table)(const FN(ctx) *x, int64_t c, int hv, FN(cg) *g, FN(ctab) *t, int build) {
    if (g->kind != DG_GATE_CHANNEL) return;
    R *mem = x->tabs + (c * x->HV + hv) * x->tws;
    if (build) FN(cg_table)(g, t, mem);
    else FN(cg_table_attach)(g, t, mem);
}

/* Pointers of chunk c, value head hv. */
typedef struct FN(cp) {
    int L, hv, h;
    int64_t r0;
    const R *q, *k, *v, *beta; /* ld: H*K, H*K, HV*V, HV */
    int64_t ldq, ldv, ldb, ldg, ldc;
    FN(cg) gate; /* G from ctx->Gc (ld HV*gs) */
} FN(cp);

static void FN(cp_init)(const FN(ctx) *x, int64_t c, int hv, FN(cp) *p) {
    p->L = x->pl->len[c];
    p->r0 = x->pl->row0[c];
    p->hv = hv;
    p->h = hv / x->grp;
    p->ldq = (int64_t)x->H * x->K;
    p->ldv = (int64_t)x->HV * x->V;
    p->ldb = x->HV;
    p->ldg = (int64_t)x->HV * x->gs;
    p->ldc = (int64_t)x->HV * x->C;
    p->q = x->q + (p->r0 * x->H + p->h) * x->K;
    p->k = x->k + (p->r0 * x->H + p->h) * x->K;
    p->v = x->v + (p->r0 * x->HV + hv) * x->V;
    p->beta = x->beta + p->r0 * x->HV + hv;
    p->gate.kind = x->s->gate;
    p->gate.L = p->L;
    p->gate.K = x->K;
    p->gate.G = x->gs ? x->Gc + (p->r0 * x->HV + hv) * x->gs : NULL;
    p->gate.ldg = p->ldg;
    p->gate.E = NULL;
    p->gate.tab = NULL;
}

/* Per-thread workspace of every phase (elements): generous and simple. */
static int64_t FN(ws_elems)(int C, int K, int V) {
    return 12 * (int64_t)C * C + 12 * (int64_t)C * K + 8 * (int64_t)C * V + 4 * (int64_t)K * V + FN(gated_ws)(C, K) +
           4 * (int64_t)(C + K + V) + 64;
}

/* Phase A for chunk c, head hv: G (cumsum of g), then W, U, P into the ctx buffers, and Ai, Mkk
 * when those buffers exist. */
static void FN(chunk_prep)(const FN(ctx) *x, int64_t c, int hv, R *ws) {
    FN(cp) p;
    FN(cp_init)(x, c, hv, &p);
    int L = p.L, K = x->K, V = x->V, C = x->C;
    if (x->gs) FN(cumsum_rows)(L, x->gs, x->g + (p.r0 * x->HV + hv) * x->gs, p.ldg, (R *)p.gate.G, p.ldg, 0);
    R *M = ws, *A = M + C * C, *Ai = A + C * C, *Kb = Ai + C * C, *Vb = Kb + C * K, *e = Vb + C * V;
    R *Eh = e + C + K + 8, *gw = Eh + C * C;
    FN(ctab) tab;
    FN(cp_table)(x, c, hv, &p.gate, &tab, 1); /* CHANNEL: the factor table, kept for later phases */
    if (x->gs == 1) {                         /* HEAD: the decay matrix once for both Gram products */
        FN(head_emat)(&p.gate, Eh);
        p.gate.E = Eh;
    }
    int64_t ldm = C, ldai = C;
    if (x->Mkk) {
        M = x->Mkk + (p.r0 * x->HV + hv) * C;
        ldm = p.ldc;
    }
    if (x->Ai) {
        Ai = x->Ai + (p.r0 * x->HV + hv) * C;
        ldai = p.ldc;
    }
    /* Mkk = strictly_lower(K K^T o Gamma);  A = diag(beta) Mkk */
    FN(gated_gram)(&p.gate, p.k, p.ldq, p.k, p.ldq, 1, 1, M, ldm, gw);
    for (int i = 0; i < L; i++) {
        R b = p.beta[i * p.ldb];
        for (int j = 0; j < L; j++) A[i * C + j] = b * M[i * ldm + j];
    }
    /* Ai = (I + A)^-1 */
    FN(tril_inv)(x->blocked, L, A, C, Ai, ldai, gw);
    /* W = Ai (beta o exp(G) o K);  U = Ai (beta o V) */
    FN(gate_rows)(&p.gate, 0, p.k, p.ldq, Kb, K, e);
    for (int i = 0; i < L; i++) {
        R b = p.beta[i * p.ldb];
        for (int j = 0; j < K; j++) Kb[i * K + j] *= b;
        for (int j = 0; j < V; j++) Vb[i * V + j] = b * p.v[i * p.ldv + j];
    }
    FN(gemm_tri)(0, L, K, 1, Ai, ldai, Kb, K, 0, x->W + (p.r0 * x->HV + hv) * K, (int64_t)x->HV * K);
    FN(gemm_tri)(0, L, V, 1, Ai, ldai, Vb, V, 0, x->U + (p.r0 * x->HV + hv) * V, p.ldv);
    /* P = scale lower_incl(Q K^T o Gamma) */
    FN(gated_gram)(&p.gate, p.q, p.ldq, p.k, p.ldq, 0, x->scale, x->P + (p.r0 * x->HV + hv) * C, p.ldc, gw);
}

/* S (K x V) <- exp(G_last) S, per row (CHANNEL) or as a whole (HEAD).  e: K scratch. */
static void FN(decay_state)(const FN(cg) *g, R *S, int V, R *e) {
    if (g->kind == DG_GATE_NONE) return;
    const R *Gl = g->G + (g->L - 1) * g->ldg;
    int n = g->kind == DG_GATE_HEAD ? 1 : g->K;
    for (int c = 0; c < n; c++) e[c] = Gl[c];
    DR_VEXP(n, e, e);
    for (int r = 0; r < g->K; r++) {
        R f = e[g->kind == DG_GATE_HEAD ? 0 : r];
        for (int j = 0; j < V; j++) S[(int64_t)r * V + j] *= f;
    }
}

/* The state pass for sequence n, head hv (phase B), chunk by chunk: state_begin sets up S, the
 * state entering the sequence, state_step takes it through chunk c (in order), state_end hands it
 * out.  V' overwrites U in place; forward: o (and hT) written; backward recompute (Sst != NULL):
 * the state entering each chunk c is stored at Sst[(c*HV + hv)*K*V]; o may be NULL.
 * Products with a state known to be zero (the first chunk's, without h0) are skipped, and so is
 * the state leaving the last chunk when nothing reads it (no hT): on short sequences (MQAR's 128
 * tokens are two chunks) that is half of the pass's products.  Adding a product of zeros adds
 * exact zeros, so the results are the same bits either way (for finite inputs).
 * ws: S (K x V) first, then FN(state_ws) elements in all. */
static int64_t FN(state_ws)(int C, int K, int V) { return (int64_t)K * V + 2 * (int64_t)C * K + C + K + 8; }

/* S = h0 of sequence n (or zeros where they are stored); returns whether S is exactly zero */
static bool FN(state_begin)(const FN(ctx) *x, int64_t n, int hv, R *Sst, R *S) {
    int64_t KV = (int64_t)x->K * x->V;
    if (x->h0) memcpy(S, x->h0 + (n * x->HV + hv) * KV, sizeof(R) * (size_t)KV);
    else if (Sst) memset(S, 0, sizeof(R) * (size_t)KV); /* stored for the backward */
    return !x->h0;
}

/* Chunk c: V', o, and S <- the state leaving c.  Returns false where the pass ends (the state
 * leaving the sequence, unread). */
static bool FN(state_step)(const FN(ctx) *x, int64_t c, int hv, R *o, R *hT, R *Sst, bool *zero, R *ws) {
    int K = x->K, V = x->V, C = x->C, HV = x->HV;
    R *S = ws, *Qg = S + (int64_t)K * V, *Kd = Qg + (int64_t)C * K, *e = Kd + (int64_t)C * K;
    FN(ctab) tab;
    FN(cp) p;
    FN(cp_init)(x, c, hv, &p);
    FN(cp_table)(x, c, hv, &p.gate, &tab, 0);
    int L = p.L;
    int64_t off = p.r0 * HV + hv;
    /* V' = U - W S, over U (nothing reads U after this) */
    R *Vn = x->U + off * V;
    const int64_t ldvn = p.ldv;
    if (Sst) memcpy(Sst + (c * HV + hv) * (int64_t)K * V, S, sizeof(R) * (size_t)K * V);
    if (!*zero) FN(gemm)(0, 0, L, V, K, -1, x->W + off * K, (int64_t)HV * K, S, V, 1, Vn, ldvn);
    /* O = scale (exp(G) o Q) S + P V' */
    if (o) {
        const R *qg = p.q;
        int64_t ldqg = p.ldq;
        if (x->gs && !*zero) {
            FN(gate_rows)(&p.gate, 0, p.q, p.ldq, Qg, K, e);
            qg = Qg;
            ldqg = K;
        }
        if (!*zero) FN(gemm)(0, 0, L, V, K, x->scale, qg, ldqg, S, V, 0, o + off * V, p.ldv);
        FN(gemm_tri)(0, L, V, 1, x->P + off * C, p.ldc, Vn, ldvn, *zero ? 0 : 1, o + off * V, p.ldv);
    }
    if ((x->pl->edge[c] & DR_LAST) && !hT) return false; /* the state leaving the sequence: unread */
    /* S <- exp(G_last) S + (exp(G_last - G) o K)^T V' */
    if (!*zero) FN(decay_state)(&p.gate, S, V, e);
    const R *kd = p.k;
    int64_t ldkd = p.ldq;
    if (x->gs) {
        FN(gate_rows)(&p.gate, 1, p.k, p.ldq, Kd, K, e);
        kd = Kd;
        ldkd = K;
    }
    FN(gemm)(1, 0, K, V, L, 1, kd, ldkd, Vn, ldvn, *zero ? 0 : 1, S, V);
    *zero = false;
    return true;
}

static void FN(state_end)(const FN(ctx) *x, int64_t n, int hv, R *hT, bool zero, R *S) {
    if (!hT) return;
    int64_t KV = (int64_t)x->K * x->V;
    if (zero) memset(S, 0, sizeof(R) * (size_t)KV); /* a sequence without chunks (T = 0) */
    memcpy(hT + (n * x->HV + hv) * KV, S, sizeof(R) * (size_t)KV);
}

static void FN(state_pass)(const FN(ctx) *x, int64_t n, int hv, R *o, R *hT, R *Sst, R *ws) {
    bool zero = FN(state_begin)(x, n, hv, Sst, ws);
    for (int64_t c = x->pl->seq_chunk[n]; c < x->pl->seq_chunk[n + 1]; c++)
        if (!FN(state_step)(x, c, hv, o, hT, Sst, &zero, ws)) break;
    FN(state_end)(x, n, hv, hT, zero, ws);
}

/* The chunk walk of sequence n, head hv on one thread: each chunk's prep (phase A) and then at
 * once its state step (phase B), so that the step reads the chunk's W, U, P (and Ai, Mkk) from
 * the cache the prep just wrote them to.  ws: the state pass's, then the prep's. */
static void FN(walk_fwd)(const FN(ctx) *x, int64_t n, int hv, R *o, R *hT, R *Sst, R *ws) {
    R *pws = ws + FN(state_ws)(x->C, x->K, x->V);
    bool zero = FN(state_begin)(x, n, hv, Sst, ws), more = true;
    for (int64_t c = x->pl->seq_chunk[n]; c < x->pl->seq_chunk[n + 1] && more; c++) {
        FN(chunk_prep)(x, c, hv, pws);
        more = FN(state_step)(x, c, hv, o, hT, Sst, &zero, ws);
    }
    FN(state_end)(x, n, hv, hT, zero, ws);
}

/* Runs the body for it in [0, n) on all threads (only when the local int dr_par_ says the call is
 * big enough to pay for waking them), each thread with its own workspace `ws` of wsn elements;
 * sets rc = -1 if a workspace could not be allocated. */
#define DR_PARALLEL_ITEMS(n, wsn, ...)                                                    \
    do {                                                                                  \
        int fail_ = 0;                                                                    \
        int64_t n_ = (n);                                                                 \
        _Pragma("omp parallel if (n_ > 1 && dr_par_)") {                                  \
            R *ws = malloc(sizeof(R) * (size_t)(wsn));                                    \
            if (!ws) {                                                                    \
                _Pragma("omp atomic write") fail_ = 1;                                    \
            }                                                                             \
            _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < n_; it++) { \
                if (ws) {                                                                 \
                    __VA_ARGS__;                                                          \
                }                                                                         \
            }                                                                             \
            free(ws);                                                                     \
        }                                                                                 \
        if (fail_) rc = -1;                                                               \
    } while (0)

/* The two schedules over the threads.  Phase by phase: each phase over every chunk (A, D) or
 * sequence and head (B, C) before the next begins.  The chunk walk (FN(walk_fwd), and in the
 * backward FN(walk_bwd)): a thread takes a sequence and head through every phase chunk by chunk,
 * each chunk's results read by its next phase from the thread's cache (some 300 KB a chunk at
 * K = V = 128, C = 64), where a phase over the whole batch reads them back from memory (tens of
 * MB at MQAR's 64 x 128 tokens, or at 4 x 4096).  The products and their order are the same
 * either way: the same bits.  The walk is taken when the sequence-heads share evenly among the
 * threads (as many as the threads or a multiple of them, or at least four a thread, and none with
 * more chunks than a thread's share of all); otherwise the phases over chunks keep the threads
 * busy.  DG_DR_CHUNK_SCHEDULE=phases or =walk forces
 * one (the tests compare them). */
static int FN(use_walk)(const FN(ctx) *x) {
    const char *e = getenv("DG_DR_CHUNK_SCHEDULE");
    if (e && strcmp(e, "phases") == 0) return 0;
    if (e && strcmp(e, "walk") == 0) return 1;
    const dg_drc_plan *pl = x->pl;
    int64_t items = pl->nseq * x->HV, nt = omp_get_max_threads(), most = 0;
    for (int64_t n = 0; n < pl->nseq; n++)
        most = pl->seq_chunk[n + 1] - pl->seq_chunk[n] > most ? pl->seq_chunk[n + 1] - pl->seq_chunk[n] : most;
    if (most * nt > pl->nchunks * x->HV) return 0; /* one sequence-head more than a thread's share */
    return items >= 4 * nt || (items >= nt && items % nt == 0);
}

/* Below about 4 MFLOP the forward is done on the calling thread: waking a team costs more. */
static int FN(worth_threads)(const FN(ctx) *x) {
    double f = (double)x->pl->rows * x->HV * ((double)x->C * (2 * x->K + x->V) + 3.0 * x->K * x->V) * 2;
    return f > 4e6;
}

static int FN(check_ptrs)(const char *what, const dg_dr_shape *s, const void *q, const void *k, const void *v,
                          const void *g, const void *beta) {
    if (!q || !k || !v || !beta) {
        dg_error("%s: %s is NULL", what, !q ? "q" : !k ? "k" : !v ? "v" : "beta");
        return -1;
    }
    if ((s->gate == DG_GATE_NONE) != (g == NULL)) {
        dg_error("%s: g is %s but the gate kind is %d", what, g ? "given" : "NULL", (int)s->gate);
        return -1;
    }
    return 0;
}

int FN(dg_dr_chunk_fwd)(const dg_dr_shape *s, const R *q, const R *k, const R *v, const R *g, const R *beta,
                        const R *h0, R *o, R *hT) {
    const char *what = "dr_chunk_fwd";
    dg_drc_plan pl;
    if (FN(check_ptrs)(what, s, q, k, v, g, beta) || dg_drc_plan_init(&pl, s, what, 3)) return -1;
    if (!o) {
        dg_drc_plan_free(&pl);
        dg_error("%s: o is NULL", what);
        return -1;
    }
    FN(ctx) x;
    FN(ctx_init)(&x, s, &pl, q, k, v, g, beta, h0);
    x.blocked = 1; /* the blocked solve_tril: GEMM-based, faster here than forward substitution */
    int rc = 0, HV = x.HV;
    int64_t rows = pl.rows;
    x.W = malloc(sizeof(R) * (size_t)(rows * HV * x.K + 1));
    x.U = malloc(sizeof(R) * (size_t)(rows * HV * x.V + 1));
    x.P = malloc(sizeof(R) * (size_t)(rows * HV * x.C + 1));
    x.Gc = x.gs ? malloc(sizeof(R) * (size_t)(rows * HV * x.gs + 1)) : NULL;
    int chan = s->gate == DG_GATE_CHANNEL;
    x.tabs = chan ? malloc(sizeof(R) * (size_t)(pl.nchunks * HV * x.tws + 1)) : NULL;
    if (!x.W || !x.U || !x.P || (x.gs && !x.Gc) || (chan && !x.tabs)) rc = -1;
    int64_t wsn = FN(ws_elems)(x.C, x.K, x.V);
    int dr_par_ = FN(worth_threads)(&x);
    if (rc == 0 && FN(use_walk)(&x)) {
        DR_PARALLEL_ITEMS(pl.nseq * HV, wsn, FN(walk_fwd)(&x, it / HV, (int)(it % HV), o, hT, NULL, ws));
    } else if (rc == 0) {
        DR_PARALLEL_ITEMS(pl.nchunks * HV, wsn, FN(chunk_prep)(&x, it / HV, (int)(it % HV), ws));
        DR_PARALLEL_ITEMS(pl.nseq * HV, wsn, FN(state_pass)(&x, it / HV, (int)(it % HV), o, hT, NULL, ws));
    }
    free(x.W);
    free(x.U);
    free(x.P);
    free(x.Gc);
    free(x.tabs);
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}

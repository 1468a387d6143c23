/* Body of the token-by-token delta-rule kernels, included by dr_recurrent.c once per real type with
 * REAL (float | double) and SFX (f32 | f64) defined.  Layout and contract: kernels/cpu/delta/delta_rule.h.
 *
 * One task = one (sequence n, value head hv); tasks are independent except that with grouped value
 * heads (G = HV/H > 1) the G value heads of one q/k head all add into the same dq, dk rows.  Those
 * are then written per value head into a scratch [tokens, HV, K] and summed over the group after the
 * parallel loop, so no two threads ever add into one element.
 *
 * Forward, per token t (S [K,V] row major, decay d_i = exp(g_t) for GDN, exp(g_t[i]) for KDA, 1 for
 * DeltaNet):
 *   Sd = Diag(d) S_{t-1}          (decay)
 *   p  = Sd^T k_t                 (what the state predicts for k_t)   [V]
 *   u  = beta_t (v_t - p)         (the delta-rule correction)         [V]
 *   S_t = Sd + k_t u^T
 *   o_t = S_t^T (scale q_t)
 * Backward runs the tokens in reverse with dS = dL/dS_t (starting from dhT); the states S_{t-1} are
 * recomputed: a first forward sweep stores a checkpoint every L tokens, then each segment of L tokens
 * is re-run from its checkpoint into a buffer of L states, and walked backwards.  Memory per task:
 * (ceil(T_n/L) + L + 1) K V reals with L ~ sqrt(T_n).
 * The row reductions of the backward (sum over j of a row of S or dS times a vector) are vectorised
 * with `omp simd reduction`, so their summation order differs from a plain loop's. */

/* Below this many multiply-adds a call runs on one thread: waking a team costs more than it saves
 * for the tiny problems of tests and gradchecks, and much more on a loaded machine. */
#ifndef DR_PAR_MIN_WORK
#define DR_PAR_MIN_WORK 65536
#endif

#define DR_CAT2(a, b) a##_##b
#define DR_CAT(a, b) DR_CAT2(a, b)
#define DR_FN(name) DR_CAT(name, SFX)

/* Token range and offsets of task (n, hv). */
static void DR_FN(dr_task)(const dg_dr_shape *s, int64_t n, int64_t *bos, int64_t *len) {
    if (s->cu_seqlens) {
        *bos = s->cu_seqlens[n];
        *len = s->cu_seqlens[n + 1] - s->cu_seqlens[n];
    } else {
        *bos = n * s->T;
        *len = s->T;
    }
}

/* decay factors of token `tok` (global token index) for value head hv into d[K] */
static inline void DR_FN(dr_decay)(const dg_dr_shape *s, const REAL *g, int64_t tok, int64_t hv, REAL *d) {
    const int64_t K = s->K;
    if (s->gate == DG_GATE_HEAD) {
        REAL e = (REAL)exp((double)g[tok * s->HV + hv]);
        for (int64_t i = 0; i < K; i++) d[i] = e;
    } else if (s->gate == DG_GATE_CHANNEL) {
        const REAL *gt = g + (tok * s->HV + hv) * K;
        for (int64_t i = 0; i < K; i++) d[i] = (REAL)exp((double)gt[i]);
    } else {
        for (int64_t i = 0; i < K; i++) d[i] = 1;
    }
}

/* One forward step in place: S <- S_t from S = S_{t-1}.  Writes o_t (scaled) if o is not NULL.
 * d, p scratch of K and V. */
static void DR_FN(dr_step)(const dg_dr_shape *s, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                           const REAL *beta, int64_t tok, int64_t hv, REAL *S, REAL *o, REAL *d, REAL *p) {
    const int64_t K = s->K, V = s->V, H = s->H, HV = s->HV;
    const int64_t hk = hv / (HV / H);
    const REAL *kt = k + (tok * H + hk) * K;
    const REAL *vt = v + (tok * HV + hv) * V;
    const REAL bt = beta[tok * HV + hv];
    DR_FN(dr_decay)(s, g, tok, hv, d);
    /* Sd = Diag(d) S;  p = Sd^T k */
    for (int64_t j = 0; j < V; j++) p[j] = 0;
    for (int64_t i = 0; i < K; i++) {
        REAL *Si = S + i * V;
        const REAL di = d[i], ki = kt[i];
        for (int64_t j = 0; j < V; j++) {
            Si[j] *= di;
            p[j] += ki * Si[j];
        }
    }
    /* u = beta (v - p), kept in p */
    for (int64_t j = 0; j < V; j++) p[j] = bt * (vt[j] - p[j]);
    /* S_t = Sd + k u^T;  o = S_t^T (scale q) */
    if (o) {
        const REAL *qt = q + (tok * H + hk) * K;
        REAL *ot = o + (tok * HV + hv) * V;
        const REAL sc = (REAL)s->scale;
        for (int64_t j = 0; j < V; j++) ot[j] = 0;
        for (int64_t i = 0; i < K; i++) {
            REAL *Si = S + i * V;
            const REAL ki = kt[i], qi = sc * qt[i];
            for (int64_t j = 0; j < V; j++) {
                Si[j] += ki * p[j];
                ot[j] += qi * Si[j];
            }
        }
    } else {
        for (int64_t i = 0; i < K; i++) {
            REAL *Si = S + i * V;
            const REAL ki = kt[i];
            for (int64_t j = 0; j < V; j++) Si[j] += ki * p[j];
        }
    }
}

int DR_FN(dg_dr_recurrent_fwd)(const dg_dr_shape *s, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                               const REAL *beta, const REAL *h0, REAL *o, REAL *hT) {
    if (!s || s->H <= 0 || s->HV % s->H != 0 || (s->gate != DG_GATE_NONE && !g)) return -2;
    const int64_t K = s->K, V = s->V, HV = s->HV, N = s->N;
    const int64_t KV = K * V;
    const int64_t ntok = s->cu_seqlens ? s->cu_seqlens[N] : s->B * s->T;
    int failed = 0;
#pragma omp parallel for schedule(dynamic) if (ntok * HV * KV >= DR_PAR_MIN_WORK)
    for (int64_t task = 0; task < N * HV; task++) {
        const int64_t n = task / HV, hv = task % HV;
        int64_t bos, len;
        DR_FN(dr_task)(s, n, &bos, &len);
        REAL *S = malloc(sizeof(REAL) * (size_t)(KV + K + V));
        if (!S) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        REAL *d = S + KV, *p = d + K;
        if (h0) memcpy(S, h0 + task * KV, sizeof(REAL) * (size_t)KV);
        else memset(S, 0, sizeof(REAL) * (size_t)KV);
        for (int64_t t = 0; t < len; t++) DR_FN(dr_step)(s, q, k, v, g, beta, bos + t, hv, S, o, d, p);
        if (hT) memcpy(hT + task * KV, S, sizeof(REAL) * (size_t)KV);
        free(S);
    }
    return failed ? -1 : 0;
}

/* One backward step of token tok.  Sp = S_{t-1}; dS = dL/dS_t on entry, dL/dS_{t-1} on exit.
 * dqv, dkv: this value head's contributions to dq_t, dk_t [K] (written).  Scratch w: 3K + 3V. */
static void DR_FN(dr_step_bwd)(const dg_dr_shape *s, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                               const REAL *beta, const REAL *dout, int64_t tok, int64_t hv, const REAL *Sp, REAL *dS,
                               REAL *dqv, REAL *dkv, REAL *dv, REAL *dg, REAL *dbeta, REAL *w) {
    const int64_t K = s->K, V = s->V, H = s->H, HV = s->HV;
    const int64_t hk = hv / (HV / H);
    const REAL *qt = q + (tok * H + hk) * K;
    const REAL *kt = k + (tok * H + hk) * K;
    const REAL *vt = v + (tok * HV + hv) * V;
    const REAL *dot = dout + (tok * HV + hv) * V;
    const REAL bt = beta[tok * HV + hv];
    const REAL sc = (REAL)s->scale;
    REAL *d = w, *dgc = w + K, *dqa = w + 2 * K;
    REAL *p = w + 3 * K, *r = p + V, *dp = r + V;

    DR_FN(dr_decay)(s, g, tok, hv, d);
    /* recompute p = Sd^T k with Sd = Diag(d) Sp; and dqa = Sd do (first part of dq) */
    for (int64_t j = 0; j < V; j++) p[j] = 0;
    for (int64_t i = 0; i < K; i++) {
        const REAL *Si = Sp + i * V;
        const REAL di = d[i], ki = kt[i];
        REAL acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < V; j++) {
            const REAL sd = di * Si[j];
            p[j] += ki * sd;
            acc += sd * dot[j];
        }
        dqa[i] = acc;
    }
    /* r = v - p;  u = beta r (kept in p) */
    REAL udo = 0;
    for (int64_t j = 0; j < V; j++) {
        r[j] = vt[j] - p[j];
        p[j] = bt * r[j];
        udo += p[j] * dot[j];
    }
    /* o = S_t^T (scale q), S_t = Sd + k u^T:  dq = scale S_t do = scale (Sd do + k (u . do)) */
    for (int64_t i = 0; i < K; i++) dqv[i] = sc * (dqa[i] + kt[i] * udo);
    /* o = S_t^T (scale q):  dS_t += (scale q) do^T.
     * S_t = Sd + k u^T:  dk = dS_t u,  du = dS_t^T k,  dSd = dS_t (below). */
    REAL dbt = 0;
    for (int64_t j = 0; j < V; j++) dp[j] = 0; /* dp accumulates du = dS^T k here */
    for (int64_t i = 0; i < K; i++) {
        REAL *dSi = dS + i * V;
        const REAL qi = sc * qt[i], ki = kt[i];
        REAL acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < V; j++) {
            dSi[j] += qi * dot[j];
            acc += dSi[j] * p[j];
            dp[j] += dSi[j] * ki;
        }
        dkv[i] = acc;
    }
    /* u = beta r, r = v - p:  dbeta = du . r,  dv = beta du,  dp = -beta du */
    for (int64_t j = 0; j < V; j++) {
        const REAL duj = dp[j];
        dbt += duj * r[j];
        if (dv) dv[(tok * HV + hv) * V + j] = bt * duj;
        dp[j] = -bt * duj;
    }
    if (dbeta) dbeta[tok * HV + hv] = dbt;
    /* p = Sd^T k:  dSd = dS_t + k dp^T,  dk += Sd dp.
     * Sd = Diag(d) Sp:  dd_i = sum_j dSd_ij Sp_ij,  dg_i = dd_i d_i = sum_j dSd_ij Sd_ij;
     *                   dS_{t-1} = Diag(d) dSd. */
    for (int64_t i = 0; i < K; i++) {
        REAL *dSi = dS + i * V;
        const REAL *Si = Sp + i * V;
        const REAL di = d[i], ki = kt[i];
        REAL acck = 0, accg = 0;
#pragma omp simd reduction(+ : acck, accg)
        for (int64_t j = 0; j < V; j++) {
            const REAL sd = di * Si[j];
            const REAL dsd = dSi[j] + ki * dp[j];
            acck += sd * dp[j];
            accg += dsd * sd;
            dSi[j] = di * dsd;
        }
        dkv[i] += acck;
        dgc[i] = accg;
    }
    if (dg) {
        if (s->gate == DG_GATE_HEAD) {
            REAL acc = 0;
            for (int64_t i = 0; i < K; i++) acc += dgc[i];
            dg[tok * HV + hv] = acc;
        } else if (s->gate == DG_GATE_CHANNEL) {
            memcpy(dg + (tok * HV + hv) * K, dgc, sizeof(REAL) * (size_t)K);
        }
    }
}

int DR_FN(dg_dr_recurrent_bwd)(const dg_dr_shape *s, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                               const REAL *beta, const REAL *h0, const REAL *dout, const REAL *dhT, REAL *dq, REAL *dk,
                               REAL *dv, REAL *dg, REAL *dbeta, REAL *dh0) {
    if (!s || s->H <= 0 || s->HV % s->H != 0 || (s->gate != DG_GATE_NONE && !g) || !dout) return -2;
    if (s->gate == DG_GATE_NONE) dg = NULL;
    const int64_t K = s->K, V = s->V, H = s->H, HV = s->HV, N = s->N;
    const int64_t G = HV / H, KV = K * V;
    const int64_t ntok = s->cu_seqlens ? s->cu_seqlens[N] : s->B * s->T;
    /* per value head dq, dk when heads are grouped (or when the caller does not want them) */
    REAL *sq = NULL, *sk = NULL;
    const int direct = (G == 1);
    if (!direct && (dq || dk)) {
        sq = malloc(sizeof(REAL) * (size_t)(ntok * HV * K) * 2);
        if (!sq) return -1;
        sk = sq + ntok * HV * K;
    }
    int failed = 0;
#pragma omp parallel for schedule(dynamic) if (ntok * HV * KV >= DR_PAR_MIN_WORK)
    for (int64_t task = 0; task < N * HV; task++) {
        const int64_t n = task / HV, hv = task % HV, hk = hv / G;
        int64_t bos, len;
        DR_FN(dr_task)(s, n, &bos, &len);
        int64_t L = 1;
        while (L * L < len) L++;
        if (L > 256) L = 256;
        const int64_t nseg = len > 0 ? (len + L - 1) / L : 0;
        /* ck: nseg checkpoints (state before the segment's first token); seg: L states S_{t-1};
         * S, dS: the running state and its gradient; w: vectors */
        const size_t nreal = (size_t)((nseg + L + 2) * KV + 5 * K + 3 * V);
        REAL *buf = malloc(sizeof(REAL) * nreal);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        REAL *ck = buf, *seg = ck + nseg * KV, *S = seg + L * KV, *dS = S + KV, *w = dS + KV;
        REAL *dqv = w + 3 * K + 3 * V, *dkv = dqv + K;
        /* forward sweep, keeping a checkpoint at the start of every segment */
        if (h0) memcpy(S, h0 + task * KV, sizeof(REAL) * (size_t)KV);
        else memset(S, 0, sizeof(REAL) * (size_t)KV);
        for (int64_t t = 0; t < len; t++) {
            if (t % L == 0) memcpy(ck + (t / L) * KV, S, sizeof(REAL) * (size_t)KV);
            if (t + 1 < len) /* the last token's output state is never needed */
                DR_FN(dr_step)(s, q, k, v, g, beta, bos + t, hv, S, NULL, w, w + K);
        }
        /* dS_T = dhT (or 0) */
        if (dhT) memcpy(dS, dhT + task * KV, sizeof(REAL) * (size_t)KV);
        else memset(dS, 0, sizeof(REAL) * (size_t)KV);
        for (int64_t sg = nseg - 1; sg >= 0; sg--) {
            const int64_t t0 = sg * L, t1 = (t0 + L < len) ? t0 + L : len;
            /* re-run the segment, storing S_{t-1} for each of its tokens */
            memcpy(S, ck + sg * KV, sizeof(REAL) * (size_t)KV);
            for (int64_t t = t0; t < t1; t++) {
                memcpy(seg + (t - t0) * KV, S, sizeof(REAL) * (size_t)KV);
                if (t + 1 < t1) DR_FN(dr_step)(s, q, k, v, g, beta, bos + t, hv, S, NULL, w, w + K);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const int64_t tok = bos + t;
                DR_FN(dr_step_bwd)
                (s, q, k, v, g, beta, dout, tok, hv, seg + (t - t0) * KV, dS, dqv, dkv, dv, dg, dbeta, w);
                if (direct) {
                    if (dq) memcpy(dq + (tok * H + hk) * K, dqv, sizeof(REAL) * (size_t)K);
                    if (dk) memcpy(dk + (tok * H + hk) * K, dkv, sizeof(REAL) * (size_t)K);
                } else if (sq) {
                    memcpy(sq + (tok * HV + hv) * K, dqv, sizeof(REAL) * (size_t)K);
                    memcpy(sk + (tok * HV + hv) * K, dkv, sizeof(REAL) * (size_t)K);
                }
            }
        }
        if (dh0) memcpy(dh0 + task * KV, dS, sizeof(REAL) * (size_t)KV);
        free(buf);
    }
    if (failed) {
        free(sq);
        return -1;
    }
    /* dq, dk of q/k head hk = sum over its G value heads */
    if (sq) {
#pragma omp parallel for schedule(static) if (ntok * HV * K >= DR_PAR_MIN_WORK)
        for (int64_t r = 0; r < ntok * H; r++) {
            const int64_t tok = r / H, hk = r % H;
            for (int64_t i = 0; i < K; i++) {
                REAL aq = 0, ak = 0;
                for (int64_t gi = 0; gi < G; gi++) {
                    aq += sq[(tok * HV + hk * G + gi) * K + i];
                    ak += sk[(tok * HV + hk * G + gi) * K + i];
                }
                if (dq) dq[r * K + i] = aq;
                if (dk) dk[r * K + i] = ak;
            }
        }
        free(sq);
    }
    return 0;
}

#undef DR_FN
#undef DR_CAT
#undef DR_CAT2

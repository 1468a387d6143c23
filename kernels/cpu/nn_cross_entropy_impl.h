/* Body of the cross-entropy kernels (R, FN, EXP defined by nn_cross_entropy.c).
 * logits [N,C] row major, targets [N]; a row whose target equals `ignore` is not scored.
 *   lse_n = m_n + log sum_c exp(logits[n,c] - m_n),  m_n = max_c logits[n,c]  (stable)
 *   loss  = (1/count) sum_{scored n} (lse_n - logits[n, t_n]),  0 when count = 0 */

/* lse on the scored rows (ignored rows are left alone) */
void FN(dg_nn_cross_entropy_lse)(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,
                                 R *lse) {
#pragma omp parallel for schedule(static) if (N * C >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        if (targets[n] == ignore) continue;
        const R *row = logits + n * C;
        R m = row[0];
#pragma omp simd reduction(max : m)
        for (int64_t c = 1; c < C; c++) m = row[c] > m ? row[c] : m;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++) s += (double)EXP(row[c] - m);
        lse[n] = (R)((double)m + log(s));
    }
}

/* *total += sum_{scored n} (lse_n - logits[n,t_n]) and *count += the scored rows, in row order so
 * that the value does not depend on threads (nor on how a caller cuts the rows into chunks) */
void FN(dg_nn_cross_entropy_sum)(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,
                                 const R *lse, double *total, int64_t *count) {
    double acc = *total;
    int64_t k = *count;
    for (int64_t n = 0; n < N; n++) {
        if (targets[n] == ignore) continue;
        acc += (double)lse[n] - (double)logits[n * C + targets[n]];
        k++;
    }
    *total = acc;
    *count = k;
}

void FN(dg_nn_cross_entropy_fwd)(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore, R *loss,
                                 R *lse, int64_t *count) {
    double total = 0;
    *count = 0;
    FN(dg_nn_cross_entropy_lse)(N, C, logits, targets, ignore, lse);
    FN(dg_nn_cross_entropy_sum)(N, C, logits, targets, ignore, lse, &total, count);
    *loss = *count ? (R)(total / (double)*count) : (R)0;
}

/* forward: loss = (1/count) sum_n (lse_n - logits[n,t_n]) and d lse_n / d logits[n,c] =
 * softmax[n,c], so dlogits[n,c] = dloss/count (softmax[n,c] - [c == t_n]); ignored rows get 0.
 * dlogits may be logits itself (each element is read before it is written, by the same thread). */
void FN(dg_nn_cross_entropy_bwd)(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,
                                 const R *lse, double dloss, int64_t count, R *dlogits) {
    R scale = count ? (R)(dloss / (double)count) : (R)0;
#pragma omp parallel for schedule(static) if (N * C >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        R *drow = dlogits + n * C;
        if (targets[n] == ignore || count == 0) {
            for (int64_t c = 0; c < C; c++) drow[c] = 0;
            continue;
        }
        const R *row = logits + n * C;
        R l = lse[n];
        for (int64_t c = 0; c < C; c++) drow[c] = scale * EXP(row[c] - l);
        drow[targets[n]] -= scale;
    }
}

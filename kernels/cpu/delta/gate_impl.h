/* Body of the gate kernels (gate.h), included by gate.c with REAL and SFX defined. */
#define GT_CAT2(a, b) a##_##b
#define GT_CAT(a, b) GT_CAT2(a, b)
#define GT_FN(name) GT_CAT(name, SFX)

void GT_FN(dg_gate_fwd)(int64_t rows, int64_t HV, int64_t C, const REAL *a, const REAL *A_log, const REAL *dt_bias,
                        REAL *g) {
#pragma omp parallel for schedule(static) if (rows * HV * C >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t h = 0; h < HV; h++) {
            const double negA = -exp((double)A_log[h]);
            const int64_t base = (r * HV + h) * C;
            for (int64_t c = 0; c < C; c++) {
                const double x = (double)a[base + c] + (dt_bias ? (double)dt_bias[h * C + c] : 0.0);
                g[base + c] = (REAL)(negA * dg_softplus_d(x));
            }
        }
    }
}

/* Parallel over heads: each h owns dA_log[h] and ddt_bias[h*C .. h*C+C), so the reductions over
 * rows never race.  Returns 0, or -1 when scratch could not be allocated. */
int GT_FN(dg_gate_bwd)(int64_t rows, int64_t HV, int64_t C, const REAL *a, const REAL *A_log, const REAL *dt_bias,
                       const REAL *dg, REAL *da, REAL *dA_log, REAL *ddt_bias) {
    double *accb = calloc((size_t)(HV * C + 1), sizeof(double));
    if (!accb) return -1;
#pragma omp parallel for schedule(static) if (rows * HV * C >= 32768)
    for (int64_t h = 0; h < HV; h++) {
        const double negA = -exp((double)A_log[h]);
        double accA = 0;
        double *ab = accb + h * C;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t base = (r * HV + h) * C;
            for (int64_t c = 0; c < C; c++) {
                const double x = (double)a[base + c] + (dt_bias ? (double)dt_bias[h * C + c] : 0.0);
                const double dgv = (double)dg[base + c];
                /* g = -exp(A_log) softplus(x):  dA_log += dg g;  dx = dg (-exp(A_log)) softplus'(x) */
                accA += dgv * negA * dg_softplus_d(x);
                const double dx = dgv * negA * dg_softplus_grad_d(x);
                if (da) da[base + c] = (REAL)dx;
                ab[c] += dx;
            }
        }
        if (dA_log) dA_log[h] = (REAL)accA;
        if (ddt_bias)
            for (int64_t c = 0; c < C; c++) ddt_bias[h * C + c] = (REAL)ab[c];
    }
    free(accb);
    return 0;
}

#undef GT_FN
#undef GT_CAT
#undef GT_CAT2

/* Body of the elementwise kernels, included once per real type by elementwise.c with
 * R (the type), SFX (f32/f64) and M(fn) (the math function of that type: expf or exp, ...). */

static inline R CAT(softplus_, SFX)(R x) { /* log(1 + e^x), stable for large |x| */
    return x > (R)20 ? x : M(log1p)(M(exp)(x));
}
static inline R CAT(sigmoid_, SFX)(R x) {
    if (x >= 0) return (R)1 / ((R)1 + M(exp)(-x));
    R e = M(exp)(x);
    return e / ((R)1 + e);
}

void CAT(dg_cpu_unary_, SFX)(dg_unary_op op, double s, int64_t n, const R *x, R *y) {
    R rs = (R)s;
#pragma omp parallel for if (n > 32768) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        R v = x[i], r;
        switch (op) {
        case DG_UN_NEG: r = -v; break;
        case DG_UN_ADD_SCALAR: r = v + rs; break;
        case DG_UN_MUL_SCALAR: r = v * rs; break;
        case DG_UN_POW_SCALAR: r = M(pow)(v, rs); break;
        case DG_UN_EXP: r = M(exp)(v); break;
        case DG_UN_LOG: r = M(log)(v); break;
        case DG_UN_SQRT: r = M(sqrt)(v); break;
        case DG_UN_RSQRT: r = (R)1 / M(sqrt)(v); break;
        case DG_UN_SIGMOID: r = CAT(sigmoid_, SFX)(v); break;
        /* log sigmoid(x) = -softplus(-x) */
        case DG_UN_LOGSIGMOID: r = -CAT(softplus_, SFX)(-v); break;
        case DG_UN_SILU: r = v * CAT(sigmoid_, SFX)(v); break;
        case DG_UN_SOFTPLUS: r = CAT(softplus_, SFX)(v); break;
        case DG_UN_TANH: r = M(tanh)(v); break;
        default: r = 0; break;
        }
        y[i] = r;
    }
}

void CAT(dg_cpu_unary_bwd_, SFX)(dg_unary_op op, double s, int64_t n, const R *x, const R *y, const R *dy, R *dx) {
    R rs = (R)s;
#pragma omp parallel for if (n > 32768) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        R v = x ? x[i] : 0, o = y ? y[i] : 0, d; /* each op reads the one its derivative needs */
        switch (op) {
        case DG_UN_NEG: d = -1; break;
        case DG_UN_ADD_SCALAR: d = 1; break;
        case DG_UN_MUL_SCALAR: d = rs; break;
        case DG_UN_POW_SCALAR: d = rs * M(pow)(v, rs - 1); break; /* y = x^p: p x^(p-1) */
        case DG_UN_EXP: d = o; break;                             /* y = e^x */
        case DG_UN_LOG: d = (R)1 / v; break;
        case DG_UN_SQRT: d = (R)0.5 / o; break;           /* y = sqrt x: 1/(2y) */
        case DG_UN_RSQRT: d = (R)-0.5 * o * o * o; break; /* y = x^-1/2: -y^3/2 */
        case DG_UN_SIGMOID: d = o * ((R)1 - o); break;
        case DG_UN_LOGSIGMOID: d = CAT(sigmoid_, SFX)(-v); break; /* 1 - sigmoid(x) */
        case DG_UN_SILU: {                                        /* s + x s (1 - s) */
            R sg = CAT(sigmoid_, SFX)(v);
            d = sg * ((R)1 + v * ((R)1 - sg));
            break;
        }
        case DG_UN_SOFTPLUS: d = CAT(sigmoid_, SFX)(v); break;
        case DG_UN_TANH: d = (R)1 - o * o; break;
        default: d = 0; break;
        }
        dx[i] = dy[i] * d;
    }
}

/* Outer dims by multi-index, the innermost as a strided loop. */
void CAT(dg_cpu_binary_, SFX)(dg_binary_op op, int ndim, const int64_t *shape, dg_strided a, dg_strided b, R *out) {
    int64_t inner = ndim ? shape[ndim - 1] : 1, outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t as = ndim ? a.stride[ndim - 1] : 0, bs = ndim ? b.stride[ndim - 1] : 0;
    const R *ap = a.p, *bp = b.p;
#pragma omp parallel for if (outer * inner > 32768) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, ao = 0, bo = 0;
        for (int d = ndim - 2; d >= 0; d--) {
            int64_t i = rem % shape[d];
            rem /= shape[d];
            ao += i * a.stride[d];
            bo += i * b.stride[d];
        }
        const R *x = ap + ao, *y = bp + bo;
        R *z = out + o * inner;
        switch (op) {
        case DG_BIN_ADD:
            for (int64_t i = 0; i < inner; i++) z[i] = x[i * as] + y[i * bs];
            break;
        case DG_BIN_SUB:
            for (int64_t i = 0; i < inner; i++) z[i] = x[i * as] - y[i * bs];
            break;
        case DG_BIN_MUL:
            for (int64_t i = 0; i < inner; i++) z[i] = x[i * as] * y[i * bs];
            break;
        case DG_BIN_DIV:
            for (int64_t i = 0; i < inner; i++) z[i] = x[i * as] / y[i * bs];
            break;
        default: break;
        }
    }
}

void CAT(dg_cpu_accumulate_, SFX)(int ndim, const int64_t *shape, R *dst, const int64_t *dst_stride, dg_strided src) {
    int64_t inner = ndim ? shape[ndim - 1] : 1, outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t ds = ndim ? dst_stride[ndim - 1] : 0, ss = ndim ? src.stride[ndim - 1] : 0;
    const R *sp = src.p;
#pragma omp parallel for if (outer * inner > 32768) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, doff = 0, soff = 0;
        for (int d = ndim - 2; d >= 0; d--) {
            int64_t i = rem % shape[d];
            rem /= shape[d];
            doff += i * dst_stride[d];
            soff += i * src.stride[d];
        }
        for (int64_t i = 0; i < inner; i++) dst[doff + i * ds] += sp[soff + i * ss];
    }
}

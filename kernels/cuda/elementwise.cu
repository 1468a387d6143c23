/* Elementwise device kernels: unary maps and their backward maps, binary broadcasting arithmetic
 * over strided inputs, fill, strided copy and dtype casts.  All are memory bound: one grid-stride
 * pass, one read of each input and one write of the output per element.  Math in the storage
 * precision (f32 or f64), with the numerically stable forms of the CPU ops. */
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/nd_index.h"

namespace {

constexpr int kThreads = 256;

/* ---- overloads so that one template body serves f32 and f64 ---- */
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }
__device__ __forceinline__ float d_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double d_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float d_rsqrt(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double d_rsqrt(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float d_pow(float x, float a) { return powf(x, a); }
__device__ __forceinline__ double d_pow(double x, double a) { return pow(x, a); }

/* sigmoid without overflow: exp of a non-positive number only */
template <typename T> __device__ __forceinline__ T d_sigmoid(T x) {
    if (x >= T(0)) return T(1) / (T(1) + d_exp(-x));
    T z = d_exp(x);
    return z / (T(1) + z);
}
/* log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)) */
template <typename T> __device__ __forceinline__ T d_softplus(T x) {
    return (x > T(0) ? x : T(0)) + d_log1p(d_exp(-fabs(x)));
}

template <typename T> __device__ __forceinline__ T unary_f(int op, T x, T a) {
    switch (op) {
    case DG_UN_EXP: return d_exp(x);
    case DG_UN_LOG: return d_log(x);
    case DG_UN_SQRT: return d_sqrt(x);
    case DG_UN_RSQRT: return d_rsqrt(x);
    case DG_UN_SIGMOID: return d_sigmoid(x);
    case DG_UN_LOGSIGMOID: return -d_softplus(-x); /* log sigmoid(x) = -log(1 + exp(-x)) */
    case DG_UN_SILU: return x * d_sigmoid(x);
    case DG_UN_SOFTPLUS: return d_softplus(x);
    case DG_UN_TANH: return d_tanh(x);
    case DG_UN_NEG: return -x;
    case DG_UN_ADD_SCALAR: return x + a;
    case DG_UN_MUL_SCALAR: return a * x;
    default: return d_pow(x, a); /* DG_UN_POW_SCALAR */
    }
}

template <typename T> __global__ void unary_kernel(int op, int64_t n, const T *x, T *y, T a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = unary_f<T>(op, x[i], a);
}

/* gx = gy * f'(x); y = f(x) when given (has_y), else recomputed where the derivative uses it. */
template <typename T>
__global__ void unary_bwd_kernel(int op, int64_t n, const T *x, const T *yin, const T *gy, T *gx, T a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T g = gy[i], xi = x ? x[i] : T(0), r;
        switch (op) {
        case DG_UN_EXP: { /* y = exp(x): dy/dx = y */ T y = yin ? yin[i] : d_exp(xi); r = g * y;
        } break;
        case DG_UN_LOG: r = g / xi; break; /* y = log(x): 1/x */
        case DG_UN_SQRT: { /* y = sqrt(x): 1 / (2 y) */ T y = yin ? yin[i] : d_sqrt(xi); r = g * T(0.5) / y;
        } break;
        case DG_UN_RSQRT: { /* y = x^-1/2: -1/2 x^-3/2 = -y^3 / 2 */
            T y = yin ? yin[i] : d_rsqrt(xi);
            r = T(-0.5) * g * y * y * y;
        } break;
        case DG_UN_SIGMOID: { /* y = sigmoid(x): y (1 - y) */
            T y = yin ? yin[i] : d_sigmoid(xi);
            r = g * y * (T(1) - y);
        } break;
        case DG_UN_LOGSIGMOID: r = g * d_sigmoid(-xi); break; /* 1 - sigmoid(x) */
        case DG_UN_SILU: { /* s (1 + x (1 - s)) */ T s = d_sigmoid(xi); r = g * s * (T(1) + xi * (T(1) - s));
        } break;
        case DG_UN_SOFTPLUS: r = g * d_sigmoid(xi); break;
        case DG_UN_TANH: { /* 1 - y^2 */ T y = yin ? yin[i] : d_tanh(xi); r = g * (T(1) - y * y);
        } break;
        case DG_UN_NEG: r = -g; break;
        case DG_UN_ADD_SCALAR: r = g; break;
        case DG_UN_MUL_SCALAR: r = a * g; break;
        default: /* pow: a x^(a-1); the exponent 0 gives a constant, so 0 (not 0 * inf at x = 0) */
            r = a == T(0) ? T(0) : g * a * d_pow(xi, a - T(1));
            break;
        }
        gx[i] = r;
    }
}

template <typename T, typename IT>
__global__ void binary_kernel(int op, int64_t n, DgNd<2> nd, const T *a, const T *b, T *out) {
    for (IT i = (IT)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (IT)n; i += (IT)gridDim.x * (IT)blockDim.x) {
        IT off[2];
        dg_nd_offsets<IT, 2>(nd, i, off);
        T x = a[off[0]], y = b[off[1]], r;
        switch (op) {
        case DG_BIN_ADD: r = x + y; break;
        case DG_BIN_SUB: r = x - y; break;
        case DG_BIN_MUL: r = x * y; break;
        default: r = x / y; break;
        }
        out[i] = r;
    }
}

template <typename T> __global__ void fill_kernel(int64_t n, T *p, T v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

template <typename U, typename IT> __global__ void copy_kernel(int64_t n, DgNd<2> nd, U *dst, const U *src) {
    for (IT i = (IT)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (IT)n; i += (IT)gridDim.x * (IT)blockDim.x) {
        IT off[2];
        dg_nd_offsets<IT, 2>(nd, i, off);
        dst[off[0]] = src[off[1]];
    }
}

/* casts through double: exact for every source value except int64 beyond 2^53 */
template <typename S> __device__ __forceinline__ double to_d(S s) { return (double)s; }
template <> __device__ __forceinline__ double to_d<__nv_bfloat16>(__nv_bfloat16 s) {
    return (double)__bfloat162float(s);
}
template <> __device__ __forceinline__ double to_d<__half>(__half s) { return (double)__half2float(s); }
template <typename D> __device__ __forceinline__ D from_d(double v) { return (D)v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_d<__nv_bfloat16>(double v) { return __double2bfloat16(v); }
/* one rounding from f64 to nearest even (as dg_f16_from_f64 on the host, core/f16.h) */
template <> __device__ __forceinline__ __half from_d<__half>(double v) { return __double2half(v); }

template <typename D, typename S> __global__ void cast_kernel(int64_t n, D *dst, const S *src) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_d<D>(to_d<S>(src[i]));
}

template <typename D> int cast_from(int64_t n, D *dst, dg_dtype src_dt, const void *src) {
    unsigned grid = dg_grid_for(n, kThreads);
    cudaStream_t st = dg_cuda_stream();
    switch (src_dt) {
    case DG_F32: cast_kernel<D, float><<<grid, kThreads, 0, st>>>(n, dst, (const float *)src); break;
    case DG_F64: cast_kernel<D, double><<<grid, kThreads, 0, st>>>(n, dst, (const double *)src); break;
    case DG_BF16: cast_kernel<D, __nv_bfloat16><<<grid, kThreads, 0, st>>>(n, dst, (const __nv_bfloat16 *)src); break;
    case DG_F16: cast_kernel<D, __half><<<grid, kThreads, 0, st>>>(n, dst, (const __half *)src); break;
    case DG_I32: cast_kernel<D, int32_t><<<grid, kThreads, 0, st>>>(n, dst, (const int32_t *)src); break;
    case DG_I64: cast_kernel<D, int64_t><<<grid, kThreads, 0, st>>>(n, dst, (const int64_t *)src); break;
    default: dg_error("cuda cast: source dtype %d is not supported", (int)src_dt); return -1;
    }
    return DG_LAUNCHED("cast");
}

bool float_dtype(const char *who, dg_dtype dt) {
    if (dt == DG_F32 || dt == DG_F64) return true;
    dg_error("%s: dtype %s is not supported on CUDA (f32 or f64)", who, dg_dtype_name(dt));
    return false;
}

bool check_ndim(const char *who, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > DG_ND_MAX) {
        dg_error("%s: %d dims, at most %d are supported", who, ndim, DG_ND_MAX);
        return false;
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            dg_error("%s: negative size %lld in dim %d", who, (long long)shape[d], d);
            return false;
        }
    return true;
}

} // namespace

extern "C" {

int dg_cuda_unary(dg_dtype dt, dg_unary_op op, int64_t n, const void *x, void *y, double a) {
    if (!float_dtype("cuda unary", dt)) return -1;
    if ((int)op < 0 || op >= DG_UN_COUNT) {
        dg_error("cuda unary: unknown op %d", (int)op);
        return -1;
    }
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kThreads);
    if (dt == DG_F32)
        unary_kernel<float><<<grid, kThreads, 0, dg_cuda_stream()>>>(op, n, (const float *)x, (float *)y, (float)a);
    else unary_kernel<double><<<grid, kThreads, 0, dg_cuda_stream()>>>(op, n, (const double *)x, (double *)y, a);
    return DG_LAUNCHED("unary");
}

int dg_cuda_unary_bwd(dg_dtype dt, dg_unary_op op, int64_t n, const void *x, const void *y, const void *gy, void *gx,
                      double a) {
    if (!float_dtype("cuda unary_bwd", dt)) return -1;
    if ((int)op < 0 || op >= DG_UN_COUNT) {
        dg_error("cuda unary_bwd: unknown op %d", (int)op);
        return -1;
    }
    bool y_suffices =
        op == DG_UN_EXP || op == DG_UN_SQRT || op == DG_UN_RSQRT || op == DG_UN_SIGMOID || op == DG_UN_TANH;
    bool constant = op == DG_UN_NEG || op == DG_UN_ADD_SCALAR || op == DG_UN_MUL_SCALAR;
    if (!x && !constant && !(y_suffices && y)) {
        dg_error("cuda unary_bwd: op %d needs its input x%s", (int)op, y_suffices ? " or output y" : "");
        return -1;
    }
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kThreads);
    if (dt == DG_F32)
        unary_bwd_kernel<float><<<grid, kThreads, 0, dg_cuda_stream()>>>(op, n, (const float *)x, (const float *)y,
                                                                         (const float *)gy, (float *)gx, (float)a);
    else
        unary_bwd_kernel<double><<<grid, kThreads, 0, dg_cuda_stream()>>>(op, n, (const double *)x, (const double *)y,
                                                                          (const double *)gy, (double *)gx, a);
    return DG_LAUNCHED("unary_bwd");
}

int dg_cuda_binary(dg_dtype dt, dg_binary_op op, int ndim, const int64_t *shape, const void *a, const int64_t *astride,
                   const void *b, const int64_t *bstride, void *out) {
    if (!float_dtype("cuda binary", dt) || !check_ndim("cuda binary", ndim, shape)) return -1;
    if ((int)op < 0 || op >= DG_BIN_COUNT) {
        dg_error("cuda binary: unknown op %d", (int)op);
        return -1;
    }
    DgNd<2> nd;
    const int64_t *st[2] = {astride, bstride};
    int64_t n = dg_nd_make<2>(&nd, ndim, shape, st);
    if (n == 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kThreads);
    bool small = n < INT32_MAX && dg_nd_span(&nd) < INT32_MAX;
    cudaStream_t s = dg_cuda_stream();
    if (dt == DG_F32) {
        if (small)
            binary_kernel<float, int32_t>
                <<<grid, kThreads, 0, s>>>(op, n, nd, (const float *)a, (const float *)b, (float *)out);
        else
            binary_kernel<float, int64_t>
                <<<grid, kThreads, 0, s>>>(op, n, nd, (const float *)a, (const float *)b, (float *)out);
    } else {
        if (small)
            binary_kernel<double, int32_t>
                <<<grid, kThreads, 0, s>>>(op, n, nd, (const double *)a, (const double *)b, (double *)out);
        else
            binary_kernel<double, int64_t>
                <<<grid, kThreads, 0, s>>>(op, n, nd, (const double *)a, (const double *)b, (double *)out);
    }
    return DG_LAUNCHED("binary");
}

int dg_cuda_fill(dg_dtype dt, int64_t n, void *p, double value) {
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kThreads);
    cudaStream_t s = dg_cuda_stream();
    switch (dt) {
    case DG_F32: fill_kernel<float><<<grid, kThreads, 0, s>>>(n, (float *)p, (float)value); break;
    case DG_F64: fill_kernel<double><<<grid, kThreads, 0, s>>>(n, (double *)p, value); break;
    case DG_BF16:
        fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(n, (__nv_bfloat16 *)p, __double2bfloat16(value));
        break;
    case DG_F16: fill_kernel<__half><<<grid, kThreads, 0, s>>>(n, (__half *)p, __double2half(value)); break;
    case DG_I32: fill_kernel<int32_t><<<grid, kThreads, 0, s>>>(n, (int32_t *)p, (int32_t)value); break;
    case DG_I64: fill_kernel<int64_t><<<grid, kThreads, 0, s>>>(n, (int64_t *)p, (int64_t)value); break;
    default: dg_error("cuda fill: dtype %d is not supported", (int)dt); return -1;
    }
    return DG_LAUNCHED("fill");
}

int dg_cuda_copy_strided(size_t elem_size, int ndim, const int64_t *shape, void *dst, const int64_t *dst_stride,
                         const void *src, const int64_t *src_stride) {
    if (!check_ndim("cuda copy_strided", ndim, shape)) return -1;
    DgNd<2> nd;
    const int64_t *st[2] = {dst_stride, src_stride};
    int64_t n = dg_nd_make<2>(&nd, ndim, shape, st);
    if (n == 0) return 0;
    if (dg_cuda_init()) return -1;
    unsigned grid = dg_grid_for(n, kThreads);
    bool small = n < INT32_MAX && dg_nd_span(&nd) < INT32_MAX;
    cudaStream_t s = dg_cuda_stream();
#define DG_COPY(U)                                                                                     \
    do {                                                                                               \
        if (small) copy_kernel<U, int32_t><<<grid, kThreads, 0, s>>>(n, nd, (U *)dst, (const U *)src); \
        else copy_kernel<U, int64_t><<<grid, kThreads, 0, s>>>(n, nd, (U *)dst, (const U *)src);       \
    } while (0)
    switch (elem_size) {
    case 1: DG_COPY(uint8_t); break;
    case 2: DG_COPY(uint16_t); break;
    case 4: DG_COPY(uint32_t); break;
    case 8: DG_COPY(uint64_t); break;
    default: dg_error("cuda copy_strided: element size %zu is not 1, 2, 4 or 8", elem_size); return -1;
    }
#undef DG_COPY
    return DG_LAUNCHED("copy_strided");
}

int dg_cuda_cast(int64_t n, dg_dtype dst_dt, void *dst, dg_dtype src_dt, const void *src) {
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    switch (dst_dt) {
    case DG_F32: return cast_from<float>(n, (float *)dst, src_dt, src);
    case DG_F64: return cast_from<double>(n, (double *)dst, src_dt, src);
    case DG_BF16: return cast_from<__nv_bfloat16>(n, (__nv_bfloat16 *)dst, src_dt, src);
    case DG_F16: return cast_from<__half>(n, (__half *)dst, src_dt, src);
    case DG_I32: return cast_from<int32_t>(n, (int32_t *)dst, src_dt, src);
    case DG_I64: return cast_from<int64_t>(n, (int64_t *)dst, src_dt, src);
    default: dg_error("cuda cast: destination dtype %d is not supported", (int)dst_dt); return -1;
    }
}

} // extern "C"

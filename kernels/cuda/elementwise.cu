/* Elementwise device kernels: unary maps and their backward maps, binary broadcasting arithmetic
 * over strided inputs, fill, strided copy and dtype casts.  All are memory bound: one grid-stride
 * pass, one read of each input and one write of the output per element.
 *
 * Precision: f32 and f64 compute in their own precision, with the numerically stable forms of the
 * CPU ops.  bf16 is a storage dtype: each element is loaded to f32, the math runs in f32 and each
 * result is rounded once to bf16.  The unary backward of bf16 recomputes f(x) in f32 from x rather
 * than reading the stored bf16 y (whose rounding 1 - y or y^3 would magnify).  Binary arithmetic
 * also mixes dtypes (dg_cuda_binary_mixed: each of a, b, out f32 or bf16): the backward of a
 * broadcast bf16 product keeps its terms in f32 until the broadcast sum has rounded once.
 *
 * Contiguous bf16 runs move 8 elements per 16-byte load and store when every pointer is 16-byte
 * aligned (activations are [tokens, width] tensors of millions of elements); so do contiguous f32
 * binary arithmetic (the gradient sums of the f32 master weights) and the f32 <-> bf16 casts, 8
 * elements a thread.  The last n mod 8 elements, misaligned views and strided or broadcast
 * operands take the one-element kernels. */
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

/* the derivatives that are functions of the output y (or of sigmoid(x)) */
template <typename T> __device__ __forceinline__ T rsqrt_slope(T y) { return T(-0.5) * y * y * y; } /* -y^3 / 2 */
template <typename T> __device__ __forceinline__ T sigmoid_slope(T y) { return y * (T(1) - y); }
template <typename T> __device__ __forceinline__ T tanh_slope(T y) { return T(1) - y * y; }
/* d/dx x sigmoid(x) = s (1 + x (1 - s)), s = sigmoid(x) */
template <typename T> __device__ __forceinline__ T silu_slope(T x) {
    T s = d_sigmoid(x);
    return s * (T(1) + x * (T(1) - s));
}

/* gy f'(x) for one element.  With has_y, y = f(x) is used where the derivative is a function of
 * it; otherwise f is recomputed from x. */
template <typename T> __device__ __forceinline__ T unary_grad(int op, T g, T xi, bool has_y, T yi, T a) {
    switch (op) {
    case DG_UN_EXP: return g * (has_y ? yi : d_exp(xi));            /* y = exp(x): dy/dx = y */
    case DG_UN_LOG: return g / xi;                                  /* y = log(x): 1/x */
    case DG_UN_SQRT: return g * T(0.5) / (has_y ? yi : d_sqrt(xi)); /* y = sqrt(x): 1 / (2 y) */
    case DG_UN_RSQRT: return g * rsqrt_slope(has_y ? yi : d_rsqrt(xi));
    case DG_UN_SIGMOID: return g * sigmoid_slope(has_y ? yi : d_sigmoid(xi));
    case DG_UN_LOGSIGMOID: return g * d_sigmoid(-xi); /* 1 - sigmoid(x) */
    case DG_UN_SILU: return g * silu_slope(xi);
    case DG_UN_SOFTPLUS: return g * d_sigmoid(xi);
    case DG_UN_TANH: return g * tanh_slope(has_y ? yi : d_tanh(xi));
    case DG_UN_NEG: return -g;
    case DG_UN_ADD_SCALAR: return g;
    case DG_UN_MUL_SCALAR: return a * g;
    default: /* pow: a x^(a-1); the exponent 0 gives a constant, so 0 (not 0 * inf at x = 0) */
        return a == T(0) ? T(0) : g * a * d_pow(xi, a - T(1));
    }
}

template <typename T> __device__ __forceinline__ T binary_f(int op, T x, T y) {
    switch (op) {
    case DG_BIN_ADD: return x + y;
    case DG_BIN_SUB: return x - y;
    case DG_BIN_MUL: return x * y;
    default: return x / y;
    }
}

/* ---- storage and arithmetic: f32 and f64 compute in their own precision; bf16 is loaded to f32
 * and each result is rounded once to bf16 (to nearest even) when stored ---- */
template <typename T> struct Compute { typedef T type; };
template <> struct Compute<__nv_bfloat16> { typedef float type; };
__device__ __forceinline__ float to_c(float v) { return v; }
__device__ __forceinline__ double to_c(double v) { return v; }
__device__ __forceinline__ float to_c(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void put(float *p, float v) { *p = v; }
__device__ __forceinline__ void put(double *p, double v) { *p = v; }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* 8 bf16 = 16 bytes: one vector load or store (the pointer must be 16-byte aligned) */
constexpr int kVec = 8;
struct alignas(16) Bf16x8 {
    __nv_bfloat16 e[kVec];
};
__device__ __forceinline__ Bf16x8 load8(const __nv_bfloat16 *p) { return *reinterpret_cast<const Bf16x8 *>(p); }
__device__ __forceinline__ void store8(__nv_bfloat16 *p, const Bf16x8 &v) { *reinterpret_cast<Bf16x8 *>(p) = v; }

template <typename T> __global__ void unary_kernel(int op, int64_t n, const T *x, T *y, typename Compute<T>::type a) {
    typedef typename Compute<T>::type C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        put(&y[i], unary_f<C>(op, to_c(x[i]), a));
}

/* gx = gy * f'(x); y = f(x) when given, else f is recomputed where the derivative uses it. */
template <typename T>
__global__ void unary_bwd_kernel(int op, int64_t n, const T *x, const T *yin, const T *gy, T *gx,
                                 typename Compute<T>::type a) {
    typedef typename Compute<T>::type C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        C xi = x ? to_c(x[i]) : C(0), yi = yin ? to_c(yin[i]) : C(0);
        put(&gx[i], unary_grad<C>(op, to_c(gy[i]), xi, yin != nullptr, yi, a));
    }
}

/* bf16, contiguous and 16-byte aligned: vector i covers elements [8 i, 8 i + 8). */
__global__ void unary_bf16x8_kernel(int op, int64_t nvec, const __nv_bfloat16 *x, __nv_bfloat16 *y, float a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        Bf16x8 in = load8(x + i * kVec), out;
#pragma unroll
        for (int k = 0; k < kVec; k++) out.e[k] = __float2bfloat16_rn(unary_f<float>(op, __bfloat162float(in.e[k]), a));
        store8(y + i * kVec, out);
    }
}

/* x and y may each be NULL (as in unary_bwd_kernel); gy and gx are not. */
__global__ void unary_bwd_bf16x8_kernel(int op, int64_t nvec, const __nv_bfloat16 *x, const __nv_bfloat16 *yin,
                                        const __nv_bfloat16 *gy, __nv_bfloat16 *gx, float a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        Bf16x8 g = load8(gy + i * kVec), xv = {}, yv = {}, out;
        if (x) xv = load8(x + i * kVec);
        if (yin) yv = load8(yin + i * kVec);
#pragma unroll
        for (int k = 0; k < kVec; k++) {
            float xi = x ? __bfloat162float(xv.e[k]) : 0.0f, yi = yin ? __bfloat162float(yv.e[k]) : 0.0f;
            out.e[k] = __float2bfloat16_rn(unary_grad<float>(op, __bfloat162float(g.e[k]), xi, yin != nullptr, yi, a));
        }
        store8(gx + i * kVec, out);
    }
}

/* Any mix of f32 and bf16 operands and result (f32 arithmetic), or f64 throughout. */
template <typename TA, typename TB, typename TO, typename IT>
__global__ void binary_kernel(int op, int64_t n, DgNd<2> nd, const TA *a, const TB *b, TO *out) {
    typedef typename Compute<TO>::type C;
    for (IT i = (IT)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (IT)n; i += (IT)gridDim.x * (IT)blockDim.x) {
        IT off[2];
        dg_nd_offsets<IT, 2>(nd, i, off);
        put(&out[i], binary_f<C>(op, (C)to_c(a[off[0]]), (C)to_c(b[off[1]])));
    }
}

/* bf16 operands and result, all contiguous over the same elements and 16-byte aligned. */
__global__ void binary_bf16x8_kernel(int op, int64_t nvec, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                                     __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        Bf16x8 x = load8(a + i * kVec), y = load8(b + i * kVec), r;
#pragma unroll
        for (int k = 0; k < kVec; k++)
            r.e[k] = __float2bfloat16_rn(binary_f<float>(op, __bfloat162float(x.e[k]), __bfloat162float(y.e[k])));
        store8(out + i * kVec, r);
    }
}

/* f32 operands and result, all contiguous over the same elements and 16-byte aligned: 8 a thread
 * (two 16-byte loads of each operand, as the bf16 kernel's one). */
struct alignas(16) F32x4 {
    float e[4];
};
__global__ void binary_f32x8_kernel(int op, int64_t nvec, const float *a, const float *b, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        const F32x4 *pa = reinterpret_cast<const F32x4 *>(a + i * kVec),
                    *pb = reinterpret_cast<const F32x4 *>(b + i * kVec);
        F32x4 x0 = pa[0], x1 = pa[1], y0 = pb[0], y1 = pb[1], r0, r1;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            r0.e[k] = binary_f<float>(op, x0.e[k], y0.e[k]);
            r1.e[k] = binary_f<float>(op, x1.e[k], y1.e[k]);
        }
        F32x4 *po = reinterpret_cast<F32x4 *>(out + i * kVec);
        po[0] = r0;
        po[1] = r1;
    }
}

/* f32 <-> bf16 over 8 contiguous, 16-byte aligned elements a thread (the mixed-precision step casts
 * every weight and its gradient: hundreds of MB a step).  f32 -> bf16 rounds to nearest even, as
 * the one-element cast through f64 does (an f32 is exact in f64). */
__global__ void cast_f32_bf16x8_kernel(int64_t nvec, __nv_bfloat16 *dst, const float *src) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        const F32x4 *ps = reinterpret_cast<const F32x4 *>(src + i * kVec);
        F32x4 x0 = ps[0], x1 = ps[1];
        Bf16x8 r;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            r.e[k] = __float2bfloat16_rn(x0.e[k]);
            r.e[4 + k] = __float2bfloat16_rn(x1.e[k]);
        }
        store8(dst + i * kVec, r);
    }
}
__global__ void cast_bf16_f32x8_kernel(int64_t nvec, float *dst, const __nv_bfloat16 *src) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nvec; i += (int64_t)gridDim.x * blockDim.x) {
        Bf16x8 x = load8(src + i * kVec);
        F32x4 r0, r1;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            r0.e[k] = __bfloat162float(x.e[k]);
            r1.e[k] = __bfloat162float(x.e[4 + k]);
        }
        F32x4 *pd = reinterpret_cast<F32x4 *>(dst + i * kVec);
        pd[0] = r0;
        pd[1] = r1;
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

/* The dtypes of unary and binary arithmetic: f32 and f64, and bf16 storage (f32 arithmetic). */
bool arith_dtype(const char *who, dg_dtype dt) {
    if (dt == DG_F32 || dt == DG_F64 || dt == DG_BF16) return true;
    dg_error("%s: dtype %s is not supported on CUDA (f32, f64 or bf16)", who, dg_dtype_name(dt));
    return false;
}

bool aligned16(const void *p) { return p == nullptr || ((uintptr_t)p & 15u) == 0; }

/* The 8-wide kernels cover the first n - n % 8 elements; the scalar kernels the rest, from `done`. */
int64_t vector_part(int64_t n, bool aligned) { return aligned ? n / kVec : 0; }

template <typename TA, typename TB, typename TO>
void launch_binary(int op, int64_t n, const DgNd<2> &nd, bool small, const void *a, const void *b, void *out) {
    unsigned grid = dg_grid_for(n, kThreads);
    cudaStream_t s = dg_cuda_stream();
    if (small)
        binary_kernel<TA, TB, TO, int32_t>
            <<<grid, kThreads, 0, s>>>(op, n, nd, (const TA *)a, (const TB *)b, (TO *)out);
    else
        binary_kernel<TA, TB, TO, int64_t>
            <<<grid, kThreads, 0, s>>>(op, n, nd, (const TA *)a, (const TB *)b, (TO *)out);
}

/* the 8-wide kernel of T's same-dtype binary arithmetic */
void launch_x8(int op, int64_t nvec, const __nv_bfloat16 *a, const __nv_bfloat16 *b, __nv_bfloat16 *out) {
    binary_bf16x8_kernel<<<dg_grid_for(nvec, kThreads), kThreads, 0, dg_cuda_stream()>>>(op, nvec, a, b, out);
}
void launch_x8(int op, int64_t nvec, const float *a, const float *b, float *out) {
    binary_f32x8_kernel<<<dg_grid_for(nvec, kThreads), kThreads, 0, dg_cuda_stream()>>>(op, nvec, a, b, out);
}

/* a, b and out of one dtype T (bf16 or f32) over the same n contiguous elements: 8 a thread where
 * every pointer is 16-byte aligned, the rest (the last n mod 8, or all of a misaligned view) one a
 * thread; small as for launch_binary */
template <typename T> void launch_flat(int op, int64_t n, bool small, const void *a, const void *b, void *out) {
    const T *at = (const T *)a, *bt = (const T *)b;
    T *ot = (T *)out;
    const int64_t nvec = vector_part(n, aligned16(a) && aligned16(b) && aligned16(out)), done = nvec * kVec;
    if (nvec) launch_x8(op, nvec, at, bt, ot);
    if (done == n) return;
    DgNd<2> tail;
    int64_t rest = n - done;
    const int64_t *unit[2] = {nullptr, nullptr};
    dg_nd_make<2>(&tail, 1, &rest, unit);
    launch_binary<T, T, T>(op, rest, tail, small, at + done, bt + done, ot + done);
}

/* f32 arithmetic with each of a, b and out f32 or bf16 */
template <typename TA, typename TB>
void launch_binary_out(dg_dtype out_dt, int op, int64_t n, const DgNd<2> &nd, bool small, const void *a, const void *b,
                       void *out) {
    if (out_dt == DG_BF16) launch_binary<TA, TB, __nv_bfloat16>(op, n, nd, small, a, b, out);
    else launch_binary<TA, TB, float>(op, n, nd, small, a, b, out);
}
template <typename TA>
void launch_binary_b(dg_dtype b_dt, dg_dtype out_dt, int op, int64_t n, const DgNd<2> &nd, bool small, const void *a,
                     const void *b, void *out) {
    if (b_dt == DG_BF16) launch_binary_out<TA, __nv_bfloat16>(out_dt, op, n, nd, small, a, b, out);
    else launch_binary_out<TA, float>(out_dt, op, n, nd, small, a, b, out);
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
    if (!arith_dtype("cuda unary", dt)) return -1;
    if ((int)op < 0 || op >= DG_UN_COUNT) {
        dg_error("cuda unary: unknown op %d", (int)op);
        return -1;
    }
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    cudaStream_t s = dg_cuda_stream();
    if (dt == DG_F32)
        unary_kernel<float>
            <<<dg_grid_for(n, kThreads), kThreads, 0, s>>>(op, n, (const float *)x, (float *)y, (float)a);
    else if (dt == DG_F64)
        unary_kernel<double><<<dg_grid_for(n, kThreads), kThreads, 0, s>>>(op, n, (const double *)x, (double *)y, a);
    else {
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x;
        __nv_bfloat16 *yb = (__nv_bfloat16 *)y;
        int64_t nvec = vector_part(n, aligned16(x) && aligned16(y)), done = nvec * kVec;
        if (nvec) unary_bf16x8_kernel<<<dg_grid_for(nvec, kThreads), kThreads, 0, s>>>(op, nvec, xb, yb, (float)a);
        if (done < n)
            unary_kernel<__nv_bfloat16>
                <<<dg_grid_for(n - done, kThreads), kThreads, 0, s>>>(op, n - done, xb + done, yb + done, (float)a);
    }
    return DG_LAUNCHED("unary");
}

int dg_cuda_unary_bwd(dg_dtype dt, dg_unary_op op, int64_t n, const void *x, const void *y, const void *gy, void *gx,
                      double a) {
    if (!arith_dtype("cuda unary_bwd", dt)) return -1;
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
    cudaStream_t s = dg_cuda_stream();
    if (dt == DG_F32)
        unary_bwd_kernel<float><<<dg_grid_for(n, kThreads), kThreads, 0, s>>>(op, n, (const float *)x, (const float *)y,
                                                                              (const float *)gy, (float *)gx, (float)a);
    else if (dt == DG_F64)
        unary_bwd_kernel<double><<<dg_grid_for(n, kThreads), kThreads, 0, s>>>(
            op, n, (const double *)x, (const double *)y, (const double *)gy, (double *)gx, a);
    else {
        /* bf16: f' from x in f32 when x is given (the stored y carries a bf16 rounding, which
         * 1 - y or y^3 would magnify), from y only without x */
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x, *yb = x ? nullptr : (const __nv_bfloat16 *)y;
        const __nv_bfloat16 *gyb = (const __nv_bfloat16 *)gy;
        __nv_bfloat16 *gxb = (__nv_bfloat16 *)gx;
        int64_t nvec = vector_part(n, aligned16(xb) && aligned16(yb) && aligned16(gy) && aligned16(gx));
        int64_t done = nvec * kVec;
        if (nvec)
            unary_bwd_bf16x8_kernel<<<dg_grid_for(nvec, kThreads), kThreads, 0, s>>>(op, nvec, xb, yb, gyb, gxb,
                                                                                     (float)a);
        if (done < n)
            unary_bwd_kernel<__nv_bfloat16><<<dg_grid_for(n - done, kThreads), kThreads, 0, s>>>(
                op, n - done, xb ? xb + done : nullptr, yb ? yb + done : nullptr, gyb + done, gxb + done, (float)a);
    }
    return DG_LAUNCHED("unary_bwd");
}

int dg_cuda_binary_mixed(dg_dtype a_dt, dg_dtype b_dt, dg_dtype out_dt, dg_binary_op op, int ndim, const int64_t *shape,
                         const void *a, const int64_t *astride, const void *b, const int64_t *bstride, void *out) {
    if (!arith_dtype("cuda binary", a_dt) || !arith_dtype("cuda binary", b_dt) || !arith_dtype("cuda binary", out_dt) ||
        !check_ndim("cuda binary", ndim, shape))
        return -1;
    bool f64 = a_dt == DG_F64 || b_dt == DG_F64 || out_dt == DG_F64;
    if (f64 && !(a_dt == DG_F64 && b_dt == DG_F64 && out_dt == DG_F64)) {
        dg_error("cuda binary: operands %s and %s with result %s: f64 does not mix with other dtypes",
                 dg_dtype_name(a_dt), dg_dtype_name(b_dt), dg_dtype_name(out_dt));
        return -1;
    }
    if ((int)op < 0 || op >= DG_BIN_COUNT) {
        dg_error("cuda binary: unknown op %d", (int)op);
        return -1;
    }
    DgNd<2> nd;
    const int64_t *st[2] = {astride, bstride};
    int64_t n = dg_nd_make<2>(&nd, ndim, shape, st);
    if (n == 0) return 0;
    if (dg_cuda_init()) return -1;
    bool small = n < INT32_MAX && dg_nd_span(&nd) < INT32_MAX;
    bool all_bf16 = a_dt == DG_BF16 && b_dt == DG_BF16 && out_dt == DG_BF16;
    bool all_f32 = a_dt == DG_F32 && b_dt == DG_F32 && out_dt == DG_F32;
    /* one dim left with unit strides: a, b and out run over the same n contiguous elements */
    bool flat = nd.ndim == 1 && nd.stride[0][0] == 1 && nd.stride[1][0] == 1;
    if (all_bf16 && flat) launch_flat<__nv_bfloat16>(op, n, small, a, b, out);
    else if (all_f32 && flat) launch_flat<float>(op, n, small, a, b, out);
    else if (f64) launch_binary<double, double, double>(op, n, nd, small, a, b, out);
    else if (a_dt == DG_BF16) launch_binary_b<__nv_bfloat16>(b_dt, out_dt, op, n, nd, small, a, b, out);
    else launch_binary_b<float>(b_dt, out_dt, op, n, nd, small, a, b, out);
    return DG_LAUNCHED("binary");
}

int dg_cuda_binary(dg_dtype dt, dg_binary_op op, int ndim, const int64_t *shape, const void *a, const int64_t *astride,
                   const void *b, const int64_t *bstride, void *out) {
    return dg_cuda_binary_mixed(dt, dt, dt, op, ndim, shape, a, astride, b, bstride, out);
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
    const bool down = dst_dt == DG_BF16 && src_dt == DG_F32, up = dst_dt == DG_F32 && src_dt == DG_BF16;
    const int64_t nvec = vector_part(n, (down || up) && aligned16(dst) && aligned16(src)), done = nvec * kVec;
    if (nvec) {
        const unsigned grid = dg_grid_for(nvec, kThreads);
        if (down)
            cast_f32_bf16x8_kernel<<<grid, kThreads, 0, dg_cuda_stream()>>>(nvec, (__nv_bfloat16 *)dst,
                                                                            (const float *)src);
        else
            cast_bf16_f32x8_kernel<<<grid, kThreads, 0, dg_cuda_stream()>>>(nvec, (float *)dst,
                                                                            (const __nv_bfloat16 *)src);
        if (DG_LAUNCHED("cast")) return -1;
        if (done == n) return 0;
        /* the last n mod 8 elements below */
        n -= done;
        dst = (char *)dst + done * (int64_t)dg_dtype_size(dst_dt);
        src = (const char *)src + done * (int64_t)dg_dtype_size(src_dt);
    }
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

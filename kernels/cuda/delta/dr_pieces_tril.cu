/* chunk_scaled_dot_kkt and solve_tril on the device (dr_pieces_cuda.h): one block per (chunk,
 * head), the chunk's C x C matrices in shared memory (dynamic, C <= 64; f64 needs the opt-in
 * above 48 KiB).  Row i, column j of a chunk matrix is position i, j inside the chunk (L <= C rows).
 *
 * kkt forward:  M_ij = sum_c k_ic k_jc e_ijc  (j < i),  e_ijc = exp(G_ic - G_jc) (CHANNEL),
 *               exp(G_i - G_j) (HEAD), 1 (NONE);  A_ij = beta_i M_ij, 0 for j >= i.
 * kkt backward (block per (chunk, key head h), the value heads of h in order, so dk sums over
 * them without atomics): D_ij = beta_i dA_ij (j < i),
 *   dbeta_i  = sum_{j<i} dA_ij M_ij
 *   r_ic     = sum_{j<i} D_ij k_jc e_ijc,   co_ic = sum_{j>i} D_ji k_jc e_jic
 *   dk_ic   += r_ic + co_ic;   CHANNEL dG_ic = k_ic (r_ic - co_ic)
 *   HEAD     dG_i = sum_{j<i} D_ij M_ij - sum_{j>i} D_ji M_ji.
 * solve_tril forward, Y = (I + A)^-1 with A strictly lower:
 *   substitution: thread per column c, Y_ic = [i = c] - sum_{c<=j<i} A_ij Y_jc;
 *   blocked: the 16 x 16 diagonal blocks by substitution, then block row I from the rows above:
 *   Y_IJ = -Y_II sum_{J<=M<I} A_IM Y_MJ (tmp = A_I,<I Y_<I,<I first, then Y_II tmp).
 * solve_tril backward: W = lower(dY) Y^T, dA_ik = -sum_{m>=i} Y_mi W_mk for k < i. */
#include "kernels/cuda/delta/dr_pieces_chunks.cuh"
#include "kernels/cuda/nn_util.h"

namespace {

constexpr int kThreads = 256;

/* e_ijc of the gate (rows i, j given as global rows ri, rj) */
template <typename T>
__device__ __forceinline__ T kkt_decay(int gate, const T *g, int64_t HV, int64_t K, int64_t hv, int64_t ri, int64_t rj,
                                       int64_t c) {
    if (gate == DG_GATE_NONE) return T(1);
    if (gate == DG_GATE_HEAD) return nn_exp(g[ri * HV + hv] - g[rj * HV + hv]);
    return nn_exp(g[(ri * HV + hv) * K + c] - g[(rj * HV + hv) * K + c]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    kkt_fwd_kernel(int64_t HV, int64_t H, int64_t K, int C, int gate, const int64_t *row0, const int *len, const T *k,
                   const T *beta, const T *g, T *A) {
    const int64_t c = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H), r0 = row0[c];
    const int L = len[c];
    for (int p = threadIdx.x; p < L * C; p += blockDim.x) {
        int i = p / C, j = p % C;
        T val = 0;
        if (j < i) {
            const T *ki = k + ((r0 + i) * H + h) * K, *kj = k + ((r0 + j) * H + h) * K;
            for (int64_t x = 0; x < K; x++) val += ki[x] * kj[x] * kkt_decay(gate, g, HV, K, hv, r0 + i, r0 + j, x);
            val *= beta[(r0 + i) * HV + hv];
        }
        A[((r0 + i) * HV + hv) * C + j] = val;
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    kkt_bwd_kernel(int64_t HV, int64_t H, int64_t K, int C, int gate, const int64_t *row0, const int *len, const T *k,
                   const T *beta, const T *g, const T *dA, T *dk, T *dbeta, T *dg) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *Ms = (T *)smem_raw, *Ds = Ms + C * C;
    const int64_t grp = HV / H, c = blockIdx.x / H, h = blockIdx.x % H, r0 = row0[c];
    const int L = len[c];
    for (int64_t m = 0; m < grp; m++) {
        const int64_t hv = h * grp + m;
        __syncthreads(); /* the previous head is done with Ms, Ds */
        for (int p = threadIdx.x; p < L * L; p += blockDim.x) {
            int i = p / L, j = p % L;
            T Mv = 0, Dv = 0;
            if (j < i) {
                const T *ki = k + ((r0 + i) * H + h) * K, *kj = k + ((r0 + j) * H + h) * K;
                for (int64_t x = 0; x < K; x++) Mv += ki[x] * kj[x] * kkt_decay(gate, g, HV, K, hv, r0 + i, r0 + j, x);
                Dv = beta[(r0 + i) * HV + hv] * dA[((r0 + i) * HV + hv) * C + j];
            }
            Ms[i * C + j] = Mv;
            Ds[i * C + j] = Dv;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < L; i += blockDim.x) {
            const int64_t at = (r0 + i) * HV + hv;
            if (dbeta) {
                T sb = 0;
                for (int j = 0; j < i; j++) sb += dA[at * C + j] * Ms[i * C + j];
                dbeta[at] = sb;
            }
            if (dg && gate == DG_GATE_HEAD) {
                T s = 0;
                for (int j = 0; j < i; j++) s += Ds[i * C + j] * Ms[i * C + j];
                for (int j = i + 1; j < L; j++) s -= Ds[j * C + i] * Ms[j * C + i];
                dg[at] = s;
            }
        }
        if (!dk && !(dg && gate == DG_GATE_CHANNEL)) continue;
        for (int64_t p = threadIdx.x; p < (int64_t)L * K; p += blockDim.x) {
            int i = (int)(p / K);
            int64_t x = p % K, ri = r0 + i;
            T rs = 0, co = 0;
            for (int j = 0; j < i; j++)
                rs += Ds[i * C + j] * k[((r0 + j) * H + h) * K + x] * kkt_decay(gate, g, HV, K, hv, ri, r0 + j, x);
            for (int j = i + 1; j < L; j++)
                co += Ds[j * C + i] * k[((r0 + j) * H + h) * K + x] * kkt_decay(gate, g, HV, K, hv, r0 + j, ri, x);
            if (dk) {
                T *o = dk + (ri * H + h) * K + x;
                *o = (m == 0 ? T(0) : *o) + rs + co; /* the same thread owns (i, x) for every m */
            }
            if (dg && gate == DG_GATE_CHANNEL) dg[(ri * HV + hv) * K + x] = k[(ri * H + h) * K + x] * (rs - co);
        }
    }
}

/* Y (C x C, lower, unit diagonal) of the L x L strictly lower a, both in shared memory. */
template <typename T> __device__ void tril_inverse(int L, int C, int blocked, const T *a, T *y, T *tmp) {
    constexpr int BS = 16;
    const int nb = blocked ? (L + BS - 1) / BS : 1, bs = blocked ? BS : L;
    /* substitution inside each diagonal block (the whole matrix when not blocked): thread per column */
    for (int q = threadIdx.x; q < nb * bs; q += blockDim.x) {
        int b = q / bs, col = b * bs + q % bs, end = min(L, (b + 1) * bs);
        if (col >= L) continue;
        for (int i = b * bs; i < end; i++) {
            T v = i == col ? T(1) : T(0);
            for (int j = col; j < i; j++) v -= a[i * C + j] * y[j * C + col];
            y[i * C + col] = i < col ? T(0) : v;
        }
    }
    __syncthreads();
    for (int I = 1; I < nb; I++) {
        const int r0 = I * BS, r1 = min(L, r0 + BS), w = r0; /* columns 0 .. r0-1 */
        for (int p = threadIdx.x; p < (r1 - r0) * w; p += blockDim.x) {
            int r = r0 + p / w, col = p % w;
            T s = 0;
            for (int m = col; m < r0; m++) s += a[r * C + m] * y[m * C + col];
            tmp[r * C + col] = s;
        }
        __syncthreads();
        for (int p = threadIdx.x; p < (r1 - r0) * w; p += blockDim.x) {
            int r = r0 + p / w, col = p % w;
            T s = 0;
            for (int q = r0; q <= r; q++) s += y[r * C + q] * tmp[q * C + col];
            y[r * C + col] = -s;
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    tril_fwd_kernel(int64_t HV, int C, int blocked, const int64_t *row0, const int *len, const T *A, T *Ainv) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *a = (T *)smem_raw, *y = a + C * C, *tmp = y + C * C;
    const int64_t c = blockIdx.x / HV, hv = blockIdx.x % HV, r0 = row0[c];
    const int L = len[c];
    for (int p = threadIdx.x; p < L * L; p += blockDim.x) {
        int i = p / L, j = p % L;
        a[i * C + j] = j < i ? A[((r0 + i) * HV + hv) * C + j] : T(0);
    }
    __syncthreads();
    tril_inverse(L, C, blocked, a, y, tmp);
    __syncthreads();
    for (int p = threadIdx.x; p < L * C; p += blockDim.x) {
        int i = p / C, j = p % C;
        Ainv[((r0 + i) * HV + hv) * C + j] = j <= i ? y[i * C + j] : T(0);
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    tril_bwd_kernel(int64_t HV, int C, const int64_t *row0, const int *len, const T *Ainv, const T *dAinv, T *dA) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *y = (T *)smem_raw, *dy = y + C * C, *w = dy + C * C;
    const int64_t c = blockIdx.x / HV, hv = blockIdx.x % HV, r0 = row0[c];
    const int L = len[c];
    for (int p = threadIdx.x; p < L * L; p += blockDim.x) {
        int i = p / L, j = p % L;
        int64_t at = ((r0 + i) * HV + hv) * C + j;
        y[i * C + j] = j <= i ? Ainv[at] : T(0); /* the upper part is zero by definition */
        dy[i * C + j] = j <= i ? dAinv[at] : T(0);
    }
    __syncthreads();
    for (int p = threadIdx.x; p < L * L; p += blockDim.x) { /* W_ik = sum_{j <= min(i,k)} dY_ij Y_kj */
        int i = p / L, kk = p % L;
        T s = 0;
        for (int j = 0; j <= min(i, kk); j++) s += dy[i * C + j] * y[kk * C + j];
        w[i * C + kk] = s;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < L * C; p += blockDim.x) {
        int i = p / C, kk = p % C;
        T s = 0;
        if (kk < i)
            for (int m = i; m < L; m++) s += y[m * C + i] * w[m * C + kk];
        dA[((r0 + i) * HV + hv) * C + kk] = -s;
    }
}


/* shape checks shared by the entry points; builds the chunk table */
int pieces_setup(const char *what, dg_dtype dt, const dg_dr_shape *s, bool heads, DrpChunks *ch) {
    if (!nn_float_dt(what, dt)) return -1;
    if (!s) {
        dg_error("%s: shape is NULL", what);
        return -1;
    }
    if (heads && (s->H < 1 || s->HV < s->H || s->HV % s->H != 0 || s->K < 1)) {
        dg_error("%s: H = %lld, HV = %lld, K = %lld (HV must be a multiple of H >= 1, K >= 1)", what, (long long)s->H,
                 (long long)s->HV, (long long)s->K);
        return -1;
    }
    if (!heads && s->HV < 1) {
        dg_error("%s: HV = %lld (need >= 1)", what, (long long)s->HV);
        return -1;
    }
    if (dg_cuda_init()) return -1;
    return drp_chunks_init(ch, what, s->B, s->T, s->cu_seqlens, s->N, s->chunk);
}

template <typename T>
int kkt_fwd(const dg_dr_shape *s, const DrpChunks &ch, const T *k, const T *beta, const T *g, T *A) {
    kkt_fwd_kernel<T><<<(unsigned)(ch.n * s->HV), kThreads, 0, dg_cuda_stream()>>>(
        s->HV, s->H, s->K, s->chunk, (int)s->gate, ch.row0, ch.len, k, beta, g, A);
    return DG_LAUNCHED("chunk_scaled_dot_kkt fwd");
}

template <typename T>
int kkt_bwd(const dg_dr_shape *s, const DrpChunks &ch, const T *k, const T *beta, const T *g, const T *dA, T *dk,
            T *dbeta, T *dg) {
    size_t smem = 2 * sizeof(T) * (size_t)s->chunk * (size_t)s->chunk;
    if (drp_smem_optin(kkt_bwd_kernel<T>, smem)) return -1;
    kkt_bwd_kernel<T><<<(unsigned)(ch.n * s->H), kThreads, smem, dg_cuda_stream()>>>(
        s->HV, s->H, s->K, s->chunk, (int)s->gate, ch.row0, ch.len, k, beta, g, dA, dk, dbeta, dg);
    return DG_LAUNCHED("chunk_scaled_dot_kkt bwd");
}

template <typename T> int tril_fwd(const dg_dr_shape *s, const DrpChunks &ch, int blocked, const T *A, T *Ainv) {
    size_t smem = 3 * sizeof(T) * (size_t)s->chunk * (size_t)s->chunk;
    if (drp_smem_optin(tril_fwd_kernel<T>, smem)) return -1;
    tril_fwd_kernel<T><<<(unsigned)(ch.n * s->HV), kThreads, smem, dg_cuda_stream()>>>(s->HV, s->chunk, blocked,
                                                                                       ch.row0, ch.len, A, Ainv);
    return DG_LAUNCHED("solve_tril fwd");
}

template <typename T> int tril_bwd(const dg_dr_shape *s, const DrpChunks &ch, const T *Ainv, const T *dAinv, T *dA) {
    size_t smem = 3 * sizeof(T) * (size_t)s->chunk * (size_t)s->chunk;
    if (drp_smem_optin(tril_bwd_kernel<T>, smem)) return -1;
    tril_bwd_kernel<T><<<(unsigned)(ch.n * s->HV), kThreads, smem, dg_cuda_stream()>>>(s->HV, s->chunk, ch.row0, ch.len,
                                                                                       Ainv, dAinv, dA);
    return DG_LAUNCHED("solve_tril bwd");
}

} // namespace

extern "C" int dg_cuda_chunk_scaled_dot_kkt_fwd(dg_dtype dt, const dg_dr_shape *s, const void *k, const void *beta,
                                                const void *g, void *A) {
    const char *what = "cuda chunk_scaled_dot_kkt";
    if (!k || !beta || !A || (s && (s->gate == DG_GATE_NONE) != (g == NULL))) {
        dg_error("%s: %s", what,
                 !k      ? "k is NULL"
                 : !beta ? "beta is NULL"
                 : !A    ? "A is NULL"
                         : "g does not match the gate kind");
        return -1;
    }
    DrpChunks ch;
    if (pieces_setup(what, dt, s, true, &ch)) return -1;
    if (ch.n == 0) return 0;
    int rc = dt == DG_F32
                 ? kkt_fwd<float>(s, ch, (const float *)k, (const float *)beta, (const float *)g, (float *)A)
                 : kkt_fwd<double>(s, ch, (const double *)k, (const double *)beta, (const double *)g, (double *)A);
    drp_chunks_free(&ch);
    return rc;
}

extern "C" int dg_cuda_chunk_scaled_dot_kkt_bwd(dg_dtype dt, const dg_dr_shape *s, const void *k, const void *beta,
                                                const void *g, const void *dA, void *dk, void *dbeta, void *dg) {
    const char *what = "cuda chunk_scaled_dot_kkt bwd";
    if (!k || !beta || !dA || (s && (s->gate == DG_GATE_NONE) != (g == NULL)) || (dg && !g)) {
        dg_error("%s: %s", what,
                 !k      ? "k is NULL"
                 : !beta ? "beta is NULL"
                 : !dA   ? "dA is NULL"
                         : "g does not match the gate kind");
        return -1;
    }
    DrpChunks ch;
    if (pieces_setup(what, dt, s, true, &ch)) return -1;
    if (ch.n == 0) return 0;
    int rc = dt == DG_F32 ? kkt_bwd<float>(s, ch, (const float *)k, (const float *)beta, (const float *)g,
                                           (const float *)dA, (float *)dk, (float *)dbeta, (float *)dg)
                          : kkt_bwd<double>(s, ch, (const double *)k, (const double *)beta, (const double *)g,
                                            (const double *)dA, (double *)dk, (double *)dbeta, (double *)dg);
    drp_chunks_free(&ch);
    return rc;
}

extern "C" int dg_cuda_solve_tril_fwd(dg_dtype dt, const dg_dr_shape *s, int blocked, const void *A, void *Ainv) {
    const char *what = "cuda solve_tril";
    if (!A || !Ainv) {
        dg_error("%s: %s is NULL", what, !A ? "A" : "Ainv");
        return -1;
    }
    DrpChunks ch;
    if (pieces_setup(what, dt, s, false, &ch)) return -1;
    if (ch.n == 0) return 0;
    int rc = dt == DG_F32 ? tril_fwd<float>(s, ch, blocked, (const float *)A, (float *)Ainv)
                          : tril_fwd<double>(s, ch, blocked, (const double *)A, (double *)Ainv);
    drp_chunks_free(&ch);
    return rc;
}

extern "C" int dg_cuda_solve_tril_bwd(dg_dtype dt, const dg_dr_shape *s, const void *Ainv, const void *dAinv,
                                      void *dA) {
    const char *what = "cuda solve_tril bwd";
    if (!Ainv || !dAinv || !dA) {
        dg_error("%s: %s is NULL", what, !Ainv ? "Ainv" : !dAinv ? "dAinv" : "dA");
        return -1;
    }
    DrpChunks ch;
    if (pieces_setup(what, dt, s, false, &ch)) return -1;
    if (ch.n == 0) return 0;
    int rc = dt == DG_F32 ? tril_bwd<float>(s, ch, (const float *)Ainv, (const float *)dAinv, (float *)dA)
                          : tril_bwd<double>(s, ch, (const double *)Ainv, (const double *)dAinv, (double *)dA);
    drp_chunks_free(&ch);
    return rc;
}

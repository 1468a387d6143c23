/* The optimiser's device kernels (optim_cuda.h, nn_cuda.h): the AdamW update of one tensor, the
 * multi-tensor step (global norm, clip and AdamW in two launches), and the sums of squares behind
 * the host-side gradient norm.
 *
 * AdamW is written with the round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...): nvcc would
 * otherwise fuse a multiply and an add into one FMA (one rounding instead of two), while the CPU
 * build (ISO C11: no contraction) rounds each operation.  sqrt and division are IEEE correctly
 * rounded in both.  So the device update equals the CPU update bit for bit; the multi-tensor step
 * runs the same element function, so it equals the per-tensor update given the same scalars.
 *
 * The sum of squares of a tensor of n elements: nb = min(ceil(n / 2048), 1024) blocks (from n
 * alone), block b's threads reading elements b * 256 + tid, stepping by nb * 256, each square
 * added in double (one fma), the 256 thread sums added by a fixed tree; then the nb block sums
 * are added in block order.  The host path (dg_cuda_sumsq_many) and the multi-tensor step cut
 * every tensor the same way and add in the same order, so both give the same norm bit for bit.
 *
 * The step's scalars are computed on the device, in double, by the last block of the first launch:
 * t comes from the device step count (a skipped step does not advance it, and the host does not
 * know which steps were skipped without reading), so the bias corrections 1 - b^t cannot be
 * precomputed on the host.  They use CUDA's pow (within 2 ulp of the host's); the products and
 * quotients use the _rn intrinsics so that none of them is contracted into an FMA, and are the
 * host's operations in the host's order. */
#include "kernels/cuda/nn_util.h"
#include "kernels/cuda/optim_cuda.h"

namespace {

constexpr int kSumBlocks = 1024;                 /* most blocks summing one tensor */
constexpr int64_t kSumPerBlock = kNnThreads * 8; /* elements a summing block starts from */
constexpr int64_t kUpdateChunk = kNnThreads * 16;

int64_t sum_blocks_for(int64_t n) {
    if (n <= 0) return 0;
    int64_t b = (n + kSumPerBlock - 1) / kSumPerBlock;
    return b < kSumBlocks ? b : kSumBlocks;
}

/* The per-optimiser f32 constants of the update (the per-step ones come separately). */
struct AdamwConsts {
    float eps, b1, b2, c1, c2; /* c1 = 1 - b1, c2 = 1 - b2 */
};

/* One element of AdamW, the gradient first scaled by clip:
 *   g = g clip;  m = b1 m + c1 g;  v = b2 v + (c2 g) g;  p = p shrink - (step_size m) / (sqrt(v) / bc2_sqrt + eps) */
__device__ __forceinline__ float adamw_element(int64_t j, float *p, const float *g, float *m, float *v, float clip,
                                               float shrink, float step_size, float bc2_sqrt, const AdamwConsts &k) {
    float gj = __fmul_rn(g[j], clip);
    float mj = __fadd_rn(__fmul_rn(k.b1, m[j]), __fmul_rn(k.c1, gj));
    float vj = __fadd_rn(__fmul_rn(k.b2, v[j]), __fmul_rn(__fmul_rn(k.c2, gj), gj));
    m[j] = mj;
    v[j] = vj;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vj), bc2_sqrt), k.eps);
    float pj = __fsub_rn(__fmul_rn(p[j], shrink), __fdiv_rn(__fmul_rn(step_size, mj), denom));
    p[j] = pj;
    return pj;
}

__global__ void adamw_kernel(int64_t n, float *p, const float *g, float *m, float *v, float clip, float shrink,
                             float step_size, float bc2_sqrt, AdamwConsts k) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x)
        adamw_element(j, p, g, m, v, clip, shrink, step_size, bc2_sqrt, k);
}

/* Block `block` of nblocks summing x's squares (the cut of the file head); the sum is returned to
 * thread 0.  smem: kNnThreads doubles.  Every thread of the block must call it. */
template <typename T>
__device__ double block_sumsq(int64_t n, const T *x, int64_t block, int64_t nblocks, double *smem) {
    double acc = 0;
    for (int64_t i = block * blockDim.x + threadIdx.x; i < n; i += nblocks * blockDim.x) {
        double xi = (double)x[i];
        acc = __fma_rn(xi, xi, acc);
    }
    smem[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kNnThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) smem[threadIdx.x] += smem[threadIdx.x + half];
        __syncthreads();
    }
    return smem[0];
}

template <typename T> __global__ void __launch_bounds__(kNnThreads) sumsq_kernel(int64_t n, const T *x, double *part) {
    __shared__ double smem[kNnThreads];
    double s = block_sumsq(n, x, blockIdx.x, gridDim.x, smem);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* The device tables of a multi-tensor step.  Launch 1 has nsum blocks: block b sums block
 * b - sum_first[t] of the sum_first[t + 1] - sum_first[t] blocks of tensor t = sum_tensor[b].
 * Launch 2 has nupd blocks: block b updates chunk b - upd_first[t] (kUpdateChunk elements) of
 * tensor t = upd_tensor[b]. */
struct PlanTables {
    const dg_cuda_adamw_param *prm;
    int count;
    int64_t nsum, nupd;
    const int *sum_tensor, *upd_tensor;
    const int64_t *sum_first, *upd_first;
    double *part;   /* [nsum] block sums */
    double *totals; /* [count] tensor sums */
};

/* Thread 0 of the last block: the norm, the decision and the scalars of the step (file head). */
__device__ void finish_step(const PlanTables &tb, dg_cuda_adamw_state *st, const dg_cuda_adamw_args &a) {
    double ss = 0;
    for (int t = 0; t < tb.count; t++) ss += tb.totals[t];
    double norm = sqrt(ss);
    bool finite = isfinite(norm);
    if (a.loss) finite = finite && isfinite(a.loss_f64 ? *(const double *)a.loss : (double)*(const float *)a.loss);
    st->norm = norm;
    if (a.norm_out) {
        if (a.norm_f64) *(double *)a.norm_out = norm;
        else *(float *)a.norm_out = (float)norm;
    }
    st->applied = finite;
    if (!finite) {
        st->skipped += 1;
        return;
    }
    double lr = a.lr_dev ? *a.lr_dev : a.lr;
    int64_t t = st->step + 1;
    st->step = t;
    double bc1 = __dadd_rn(1.0, -pow(a.beta1, (double)t)), bc2 = __dadd_rn(1.0, -pow(a.beta2, (double)t));
    st->step_size = __double2float_rn(__ddiv_rn(lr, bc1));
    st->bc2_sqrt = __double2float_rn(__dsqrt_rn(bc2));
    st->shrink = __double2float_rn(__dadd_rn(1.0, -__dmul_rn(lr, a.weight_decay)));
    st->clip =
        a.max_norm > 0 && norm > a.max_norm ? __double2float_rn(__ddiv_rn(a.max_norm, __dadd_rn(norm, 1e-6))) : 1.0f;
}

__global__ void __launch_bounds__(kNnThreads)
    clip_norm_kernel(PlanTables tb, dg_cuda_adamw_state *st, dg_cuda_adamw_args a) {
    __shared__ double smem[kNnThreads];
    __shared__ bool last;
    int64_t b = blockIdx.x;
    if (b < tb.nsum) { /* the same for the whole block */
        int t = tb.sum_tensor[b];
        int64_t first = tb.sum_first[t];
        double s = block_sumsq(tb.prm[t].n, tb.prm[t].g, b - first, tb.sum_first[t + 1] - first, smem);
        if (threadIdx.x == 0) tb.part[b] = s;
    }
    if (threadIdx.x == 0) {
        __threadfence(); /* the block sum is visible to every block before this block is counted */
        last = atomicAdd(&st->arrivals, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    /* the last block: every block sum is written; read them past the (incoherent) L1 */
    for (int t = threadIdx.x; t < tb.count; t += blockDim.x) {
        double tot = 0;
        for (int64_t q = tb.sum_first[t]; q < tb.sum_first[t + 1]; q++) tot += __ldcg(tb.part + q);
        tb.totals[t] = tot;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        finish_step(tb, st, a);
        st->arrivals = 0; /* ready for the next step */
    }
}

__global__ void adamw_multi_kernel(PlanTables tb, const dg_cuda_adamw_state *st, AdamwConsts k) {
    if (!st->applied) return;
    int t = tb.upd_tensor[blockIdx.x];
    const dg_cuda_adamw_param q = tb.prm[t];
    int64_t start = (blockIdx.x - tb.upd_first[t]) * kUpdateChunk;
    int64_t end = start + kUpdateChunk < q.n ? start + kUpdateChunk : q.n;
    float clip = st->clip, shrink = q.decay ? st->shrink : 1.0f, step_size = st->step_size, bc2 = st->bc2_sqrt;
    __nv_bfloat16 *shadow = (__nv_bfloat16 *)q.shadow;
    for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x) {
        float pj = adamw_element(j, q.p, q.g, q.m, q.v, clip, shrink, step_size, bc2, k);
        if (shadow) shadow[j] = __float2bfloat16_rn(pj);
    }
}

} // namespace

extern "C" int dg_cuda_adamw_f32(int64_t n, float *p, const float *g, float *m, float *v, float clip, float shrink,
                                 float step_size, float bc2_sqrt, float eps, float b1, float b2, float c1, float c2) {
    if (n <= 0) return 0;
    if (dg_cuda_init()) return -1;
    AdamwConsts k = {eps, b1, b2, c1, c2};
    adamw_kernel<<<dg_grid_for(n, kNnThreads), kNnThreads, 0, dg_cuda_stream()>>>(n, p, g, m, v, clip, shrink,
                                                                                  step_size, bc2_sqrt, k);
    return DG_LAUNCHED("adamw");
}

/* ---- the multi-tensor step ------------------------------------------------------------------- */

struct dg_cuda_adamw_plan {
    PlanTables tb;
    void *alloc[7]; /* the device allocations behind tb */
};

extern "C" void dg_cuda_adamw_plan_free(dg_cuda_adamw_plan *plan) {
    if (!plan) return;
    for (void *p : plan->alloc) dg_cuda_free(p);
    free(plan);
}

/* a device copy of n bytes of host memory into plan->alloc[slot] (at least one byte allocated) */
static void *upload(dg_cuda_adamw_plan *plan, int slot, const void *host, size_t n) {
    void *d = dg_cuda_malloc(n ? n : 1);
    plan->alloc[slot] = d;
    if (d && host && n && dg_cuda_memcpy(d, host, n, 0)) return NULL;
    return d;
}

extern "C" dg_cuda_adamw_plan *dg_cuda_adamw_plan_new(int count, const dg_cuda_adamw_param *params) {
    if (count < 0 || (count > 0 && !params)) {
        dg_error("cuda adamw plan: bad parameter list (count %d)", count);
        return NULL;
    }
    if (dg_cuda_init()) return NULL;
    dg_cuda_adamw_plan *plan = (dg_cuda_adamw_plan *)calloc(1, sizeof *plan);
    int64_t *sum_first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(count + 1));
    int64_t *upd_first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(count + 1));
    int *sum_tensor = NULL, *upd_tensor = NULL;
    bool ok = plan && sum_first && upd_first;
    if (ok) {
        sum_first[0] = upd_first[0] = 0;
        for (int t = 0; t < count; t++) {
            int64_t n = params[t].n > 0 ? params[t].n : 0;
            sum_first[t + 1] = sum_first[t] + sum_blocks_for(n);
            upd_first[t + 1] = upd_first[t] + (n + kUpdateChunk - 1) / kUpdateChunk;
        }
        plan->tb.count = count;
        plan->tb.nsum = sum_first[count];
        plan->tb.nupd = upd_first[count];
        if (plan->tb.nsum >= INT32_MAX || plan->tb.nupd >= INT32_MAX) {
            dg_error("cuda adamw plan: %lld parameter elements are too many for one grid",
                     (long long)(plan->tb.nupd * kUpdateChunk));
            ok = false;
        }
    }
    if (ok) {
        sum_tensor = (int *)malloc(sizeof(int) * (size_t)(plan->tb.nsum ? plan->tb.nsum : 1));
        upd_tensor = (int *)malloc(sizeof(int) * (size_t)(plan->tb.nupd ? plan->tb.nupd : 1));
        ok = sum_tensor && upd_tensor;
        if (!ok) dg_error("cuda adamw plan: out of host memory for the tables of %d tensors", count);
    } else if (!plan || !sum_first || !upd_first) {
        dg_error("cuda adamw plan: out of host memory for the tables of %d tensors", count);
    }
    if (ok) {
        for (int t = 0; t < count; t++) {
            for (int64_t b = sum_first[t]; b < sum_first[t + 1]; b++) sum_tensor[b] = t;
            for (int64_t b = upd_first[t]; b < upd_first[t + 1]; b++) upd_tensor[b] = t;
        }
        size_t c1 = (size_t)count + 1;
        PlanTables &tb = plan->tb;
        tb.prm = (const dg_cuda_adamw_param *)upload(plan, 0, params, sizeof *params * (size_t)count);
        tb.sum_first = (const int64_t *)upload(plan, 1, sum_first, sizeof(int64_t) * c1);
        tb.upd_first = (const int64_t *)upload(plan, 2, upd_first, sizeof(int64_t) * c1);
        tb.sum_tensor = (const int *)upload(plan, 3, sum_tensor, sizeof(int) * (size_t)tb.nsum);
        tb.upd_tensor = (const int *)upload(plan, 4, upd_tensor, sizeof(int) * (size_t)tb.nupd);
        tb.part = (double *)upload(plan, 5, NULL, sizeof(double) * (size_t)tb.nsum);
        tb.totals = (double *)upload(plan, 6, NULL, sizeof(double) * (size_t)count);
        ok = tb.prm && tb.sum_first && tb.upd_first && tb.sum_tensor && tb.upd_tensor && tb.part && tb.totals;
    }
    free(sum_first);
    free(upd_first);
    free(sum_tensor);
    free(upd_tensor);
    if (!ok) {
        dg_cuda_adamw_plan_free(plan);
        return NULL;
    }
    return plan;
}

extern "C" int dg_cuda_adamw_plan_step(const dg_cuda_adamw_plan *plan, dg_cuda_adamw_state *state,
                                       const dg_cuda_adamw_args *a) {
    if (dg_cuda_init()) return -1;
    cudaStream_t st = dg_cuda_stream();
    const PlanTables &tb = plan->tb;
    unsigned grid1 = (unsigned)(tb.nsum > 0 ? tb.nsum : 1);
    clip_norm_kernel<<<grid1, kNnThreads, 0, st>>>(tb, state, *a);
    if (DG_LAUNCHED("adamw clip norm")) return -1;
    if (tb.nupd == 0) return 0;
    AdamwConsts k = {(float)a->eps, (float)a->beta1, (float)a->beta2, (float)(1.0 - a->beta1), (float)(1.0 - a->beta2)};
    adamw_multi_kernel<<<(unsigned)tb.nupd, kNnThreads, 0, st>>>(tb, state, k);
    return DG_LAUNCHED("adamw multi-tensor");
}

/* ---- sums of squares for the host-side norm ---------------------------------------------------- */

extern "C" int dg_cuda_sumsq_many(int count, const dg_dtype *dt, const int64_t *n, const void *const *x, double *out) {
    for (int t = 0; t < count; t++) {
        out[t] = 0;
        if (!nn_float_dt("cuda sumsq", dt[t])) return -1;
    }
    if (count <= 0) return 0;
    if (dg_cuda_init()) return -1;
    /* per tensor: block sums into part, then (one thread, in block order) the total into totals[t] */
    double *part = dg_cuda_scratch<double>((size_t)kSumBlocks);
    double *totals = dg_cuda_scratch<double>((size_t)count);
    cudaStream_t st = dg_cuda_stream();
    int rc = part && totals ? dg_cuda_memset0(totals, sizeof(double) * (size_t)count) : -1;
    for (int t = 0; rc == 0 && t < count; t++) {
        int64_t blocks = sum_blocks_for(n[t]);
        if (blocks == 0) continue;
        if (dt[t] == DG_F32)
            sumsq_kernel<float><<<(unsigned)blocks, kNnThreads, 0, st>>>(n[t], (const float *)x[t], part);
        else sumsq_kernel<double><<<(unsigned)blocks, kNnThreads, 0, st>>>(n[t], (const double *)x[t], part);
        rc = DG_LAUNCHED("sumsq");
        if (rc == 0)
            rc = dg_cuda_nn_colsum(DG_F64, blocks, 1, part, totals + t); /* stream order: part is reused after */
    }
    if (rc == 0) rc = dg_cuda_memcpy(out, totals, sizeof(double) * (size_t)count, 1);
    dg_cuda_free(part);
    dg_cuda_free(totals);
    return rc;
}

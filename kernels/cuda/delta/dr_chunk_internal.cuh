/* Internal to the chunked delta-rule CUDA kernels (dr_chunk*.cu): the chunk geometry, scalar and
 * warp-level helpers (bf16 conversions, ldmatrix, mma.sync), scratch and launch helpers.  C++.
 *
 * Storage types T of q, k, v, beta, o and their gradients: float; uint16_t holding bf16 bits; f16bits
 * holding IEEE binary16 bits (fp16).  The kernels read and write them through ldx / stx only, which
 * convert to and from f32 (every kernel computes in f32).
 *
 * Built two ways: for the GPU by nvcc (the library), or, with DRC_EMU defined, as plain C++ for the
 * host emulation in dr_chunk_emu.h (kernels run as host threads; see there), which lets the
 * kernels be tested on a machine without a GPU.
 *
 * Chunks (as in kernels/cpu/delta/chunk_pieces.h): each sequence is cut into chunks of C rows (16, 32,
 * 64) from its start; the last may be partial (L < C rows).  Without cu_seqlens sequence n is batch
 * row n and has cps = ceil(T / C) chunks; with cu_seqlens a table (row0, len per chunk; first chunk
 * per sequence; the sequences longest first) is built on the host and copied to the device once per
 * call.  A "row" is the flattened token index b*T + t of the [B,T,...] arrays. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_INTERNAL_CUH
#define DG_KERNELS_CUDA_DR_CHUNK_INTERNAL_CUH

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef DRC_EMU
#include "kernels/cuda/delta/dr_chunk_emu.h"
extern "C" {
#include "core/internal.h"
#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cuda/cuda_kernels.h" /* the per-kernel timer's marks (tests/emu/cuda_runtime_host.c) */
}
#else
#include "kernels/cuda/cuda_util.h"
#endif
#include "kernels/cuda/delta/dr_chunk_cuda.h"
#include "core/f16.h"

namespace drc {

constexpr int SMEM_MAX = 232448; /* bytes of dynamic shared memory a block may have on sm_90 */

/* ---- geometry ---- */
struct Geom {
    int64_t T;                   /* tokens per batch row (the total when cu_seqlens) */
    int64_t N;                   /* sequences */
    int64_t nchunks;             /* chunks over all sequences */
    int64_t rows;                /* B*T */
    int H, HV, grp, K, V, C, gs; /* grp = HV/H; gs = gate values per token and head: 0, 1, K */
    int gate;                    /* dg_gate_kind */
    int cps;                     /* chunks per sequence (batched) */
    int64_t maxc;                /* chunks of the longest sequence (cps when batched) */
    /* value heads in a row that share beta and the gate (the R heads of one head split by
     * dr_chunk_vsplit.cu, on the head-gate and KDA families), whose prep and fused qkwy blocks take
     * all of them (dr_chunk_mma_fwd.cu, dr_chunk_mma_bwd.cu, dr_chunk_kda_mma_*.cu); beta, the gate
     * and what KDA's prep makes that does not depend on V are stored once for them (shared_row);
     * else 1 */
    int vsh;
    float scale;
    /* device, cu_seqlens only: [nchunks] row0, [nchunks] len, [N+1] first chunk, [N] the sequences
     * by chunks, most first (chain_seq) */
    const int64_t *tab;
};

/* the heads a row of an array that the G.vsh heads of a split head share, [rows, HV / vsh, .]:
 * beta, the gate g (the caller's, not repeated), KDA's prep outputs that do not depend on V
 * (dr_chunk_kda_mma_fwd.cu) */
__host__ __device__ __forceinline__ int shared_heads(const Geom &G) { return G.HV / G.vsh; }
/* the row of such an array that row r (or chunk r) and value head hv read */
__host__ __device__ __forceinline__ int64_t shared_row(const Geom &G, int64_t r, int hv) {
    return r * shared_heads(G) + hv / G.vsh;
}

struct Chunk {
    int64_t r0;
    int L;
};

/* chunk j of batch row n (batched: no cu_seqlens) */
__host__ __device__ __forceinline__ Chunk chunk_in_row(const Geom &G, int64_t n, int64_t j) {
    Chunk ch;
    ch.r0 = n * G.T + j * G.C;
    const int64_t rem = G.T - j * G.C;
    ch.L = rem < G.C ? (int)rem : G.C;
    return ch;
}

__host__ __device__ __forceinline__ Chunk chunk_at(const Geom &G, int64_t c) {
    if (!G.tab) return chunk_in_row(G, c / G.cps, c % G.cps);
    Chunk ch;
    ch.r0 = G.tab[c];
    ch.L = (int)G.tab[G.nchunks + c];
    return ch;
}

/* chunks [c0, c1) of sequence n */
__host__ __device__ __forceinline__ void seq_chunks(const Geom &G, int64_t n, int64_t &c0, int64_t &c1) {
    if (G.tab) {
        c0 = G.tab[2 * G.nchunks + n];
        c1 = G.tab[2 * G.nchunks + n + 1];
    } else {
        c0 = n * G.cps;
        c1 = c0 + G.cps;
    }
}

/* the sequence of the state passes' b-th chain (their blocks b * HV * tiles ...): with cu_seqlens the
 * longest first, so that the blocks of the longest chains, which set the pass's time, are started
 * first (blocks start in index order as earlier ones end) rather than behind the short ones;
 * batched, b */
__host__ __device__ __forceinline__ int64_t chain_seq(const Geom &G, int64_t b) {
    return G.tab ? G.tab[2 * G.nchunks + G.N + 1 + b] : b;
}

/* chunk c of sequence n, whose first chunk is c0 (seq_chunks): chunk_at without its 64-bit
 * division.  The state passes step through a sequence's chunks one after another (128 steps at
 * S2); chunk_at's c / cps and c % cps on every step were ~10 % of f_state's stall samples there
 * (ncu source counters, H100, delta_rule S2) */
__host__ __device__ __forceinline__ Chunk seq_chunk(const Geom &G, int64_t n, int64_t c0, int64_t c) {
    return G.tab ? chunk_at(G, c) : chunk_in_row(G, n, c - c0);
}

/* the block of a grid over (chunk, value head), blockIdx.x = c HV + hv: its chunk c (rows r0 ..
 * r0 + L - 1), value head hv and key head h */
struct ChunkHead {
    int64_t c, r0;
    int hv, h, L;
};
__device__ __forceinline__ ChunkHead chunk_head(const Geom &G) {
    ChunkHead b;
    b.c = blockIdx.x / G.HV, b.hv = (int)(blockIdx.x % G.HV), b.h = b.hv / G.grp;
    const Chunk ch = chunk_at(G, b.c);
    b.r0 = ch.r0, b.L = ch.L;
    return b;
}

/* ---- scalars ---- */
__host__ __device__ __forceinline__ float bf2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float((uint32_t)h << 16);
#else
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
/* round to nearest even (NaN stays NaN) */
__host__ __device__ __forceinline__ uint16_t f2bf(float f) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
#endif
}
__host__ __device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}

/* fp16 storage: IEEE binary16 bits (1 sign, 5 exponent, 10 fraction bits; core/f16.h), wrapped in a
 * type of its own so that overloads and templates tell it from bf16 bits (uint16_t).  Same size and
 * alignment as the uint16_t arrays the C entry points take. */
struct f16bits {
    uint16_t x;
};
/* exact */
__host__ __device__ __forceinline__ float h2f(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return dg_f16_to_f32(h);
#endif
}
/* round to nearest even, subnormals kept, |f| >= 65520 to inf, NaN stays NaN */
__host__ __device__ __forceinline__ uint16_t f2h(float f) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    return dg_f16_from_f32(f);
#endif
}

/* storage types: float, uint16_t holding bf16 bits, f16bits holding fp16 bits */
__host__ __device__ __forceinline__ float ldx(const float *p) { return *p; }
__host__ __device__ __forceinline__ float ldx(const uint16_t *p) { return bf2f(*p); }
__host__ __device__ __forceinline__ float ldx(const f16bits *p) { return h2f(p->x); }
__host__ __device__ __forceinline__ void stx(float *p, float v) { *p = v; }
__host__ __device__ __forceinline__ void stx(uint16_t *p, float v) { *p = f2bf(v); }
__host__ __device__ __forceinline__ void stx(f16bits *p, float v) { p->x = f2h(v); }
/* bf16 storage (else fp16: the kernels' second builds, fast_h and kda_h, or f32) */
template <typename T> struct is_bf16 { static constexpr bool value = false; };
template <> struct is_bf16<uint16_t> { static constexpr bool value = true; };

/* ---- block and warp primitives ---- */
#ifdef DRC_EMU
#define DRC_SMEM(type, name) type *name = reinterpret_cast<type *>(drc_emu::g_launch->smem.data())
__forceinline__ void bsync() { drc_emu::syncthreads(); }
__forceinline__ bool bsync_or(int p) { return drc_emu::syncthreads_or(p) != 0; }
__forceinline__ void wsync() { drc_emu::syncwarp(); }
__forceinline__ void nsync(int id, int n) { drc_emu::named_sync(id, n); }
__forceinline__ void mbar_init(uint64_t *b, int count) { drc_emu::mbar_init(b, count); }
__forceinline__ void mbar_arrive(uint64_t *b) { drc_emu::mbar_arrive(b); }
__forceinline__ void mbar_wait(uint64_t *b, int parity) { drc_emu::mbar_wait(b, parity); }
__forceinline__ float shfl_xor(float v, int off) { return drc_emu::shfl(v, drc_emu::lane() ^ off); }
__forceinline__ float shfl_idx(float v, int src) { return drc_emu::shfl(v, src); }
__forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *p) { drc_emu::ldmatrix_x4(r, p, false); }
__forceinline__ void ldsm_x4_t(uint32_t r[4], const uint16_t *p) { drc_emu::ldmatrix_x4(r, p, true); }
__forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) { drc_emu::mma16816(c, a, b); }
__forceinline__ void mma16816_f16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    drc_emu::mma16816_f16(c, a, b);
}
__forceinline__ uint32_t tf32(float x) { return drc_emu::tf32_bits(x); }
__forceinline__ void mma1688_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    drc_emu::mma1688_tf32(c, a, b);
}
/* the emulation copies at once (a later wait has nothing to wait for) */
__forceinline__ void cp_async16(void *s, const void *g, bool valid) {
    if (valid) memcpy(s, g, 16);
    else memset(s, 0, 16);
}
__forceinline__ void cp_async4(void *s, const void *g) { memcpy(s, g, 4); }
__forceinline__ void cp_async_commit() {}
__forceinline__ void cp_async_wait_all() {}
__forceinline__ void cp_async_wait_1() {}
__forceinline__ int tid_fresh() { return (int)threadIdx.x; }
#else
#define DRC_SMEM(type, name)              \
    extern __shared__ float4 drc_smem_[]; \
    type *name = reinterpret_cast<type *>(drc_smem_)
__device__ __forceinline__ void bsync() { __syncthreads(); }
/* bsync, returning whether any thread of the block passed p != 0 */
__device__ __forceinline__ bool bsync_or(int p) { return __syncthreads_or(p) != 0; }
__device__ __forceinline__ void wsync() { __syncwarp(); }
/* Named barriers, for blocks whose warps work as groups: the n threads (a multiple of 32, whole
 * warps) of one group wait at barrier id (1..15; 0 is bsync's) until all n have arrived, all at
 * the same nsync (bar.sync is .aligned).  Shared-memory writes before it are visible after it. */
__device__ __forceinline__ void nsync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* mbarriers, for one group of threads handing shared memory to another (producer / consumer):
 * an 8-byte word of shared memory, set up by one thread (mbar_init: count arrivals complete a
 * phase; then a bsync before any use).  mbar_arrive counts this thread in (release: its earlier
 * shared-memory accesses, cp.async copies it has waited for included, happen before what a
 * waiter does after its wait); mbar_wait(b, p) returns once the phase of parity p has completed
 * (acquire): phase 0 completes with the first count arrivals, phase 1 with the next, and so on. */
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(b))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(b);
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ float shfl_xor(float v, int off) { return __shfl_xor_sync(0xffffffffu, v, off); }
__device__ __forceinline__ float shfl_idx(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const uint16_t *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* the same with IEEE fp16 operands (f32 accumulation) */
__device__ __forceinline__ void mma16816_f16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* x rounded to TF32, the operand word of mma1688_tf32: 10 mantissa bits, the magnitude to nearest
 * with ties away from zero, as cvt.rna.tf32.f32 rounds finite values, in two integer instructions
 * (cvt.rna is a sequence of about ten on sm_90: ncu, the TF32 state pass at S3).  A magnitude within
 * half a step of the largest finite float rounds to infinity, as it should; a NaN whose payload lies
 * in the low 13 bits only becomes infinity. */
__device__ __forceinline__ uint32_t tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
/* c += A B, A 16 x 8 and B 8 x 8 TF32, f32 accumulation (fragments: dr_chunk_emu.h, mma1688_tf32) */
__device__ __forceinline__ void mma1688_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* 16 bytes from global to shared memory without passing through registers (cp.async, sm_80+);
 * valid false: the 16 bytes are zero-filled and g is not read.  The copies of a thread complete
 * at its cp_async_wait_all; a barrier after it makes them visible to the block. */
__device__ __forceinline__ void cp_async16(void *s, const void *g, bool valid) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(valid ? 16 : 0) : "memory");
}
/* 4 bytes, as cp_async16 (always read) */
__device__ __forceinline__ void cp_async4(void *s, const void *g) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
/* every group of this thread's copies but the most recently committed one complete */
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
/* threadIdx.x, read again where it is used (volatile asm: not hoisted out of a loop), so that
 * offsets derived from it are made where needed instead of being kept live across a loop's body:
 * f_state kept store_raw's, spilled them (64 bytes at 128 registers) and waited on their reload
 * from local memory every chunk step (ncu: 12 % of its stall samples, H100, S1) */
__device__ __forceinline__ int tid_fresh() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}
#endif

__device__ __forceinline__ float warp_sum(float x) {
    for (int off = 16; off > 0; off >>= 1) x += shfl_xor(x, off);
    return x;
}
/* inclusive prefix sum over the lanes of a warp (every lane calls it) */
__device__ __forceinline__ float warp_scan(float x, int lane) {
    for (int d = 1; d < 32; d <<= 1) {
        const float y = shfl_idx(x, lane >= d ? lane - d : lane);
        if (lane >= d) x += y;
    }
    return x;
}

/* ---- host side: scratch, copies, launches ---- */
#ifdef DRC_EMU
template <typename T> T *scratch(size_t n) {
    size_t bytes = (n ? n : 1) * sizeof(T);
    void *p = malloc(bytes);
    if (p) memset(p, 0xff, bytes); /* NaN: reads of unwritten scratch show */
    else dg_error("emu: out of memory");
    return (T *)p;
}
inline void release(void *p) { free(p); }
inline int upload(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
    return 0;
}
inline int zero(void *p, size_t n) {
    memset(p, 0, n);
    return 0;
}
#define DRC_LAUNCH(name, kern, grid, nt, smem, ...)                                                     \
    (dg_cuda_ktime_mark((name), 0),                                                                     \
     drc_emu::launch(dim3((unsigned)(grid)), dim3((unsigned)(nt)), (smem), [&] { kern(__VA_ARGS__); }), \
     dg_cuda_ktime_mark((name), 1), 0)
#else
template <typename T> T *scratch(size_t n) { return dg_cuda_scratch<T>(n ? n : 1); }
inline void release(void *p) { dg_cuda_free(p); }
inline int upload(void *dst, const void *src, size_t n) { return dg_cuda_memcpy(dst, src, n, 0); }
inline int zero(void *p, size_t n) { return dg_cuda_memset0(p, n); }

template <typename... P, typename... A>
int launch(const char *name, void (*kern)(P...), int64_t grid, int nt, size_t smem, A... args) {
    if (grid <= 0) return 0;
    if (grid > 0x7fffffff) {
        dg_error("%s: grid of %lld blocks is too large", name, (long long)grid);
        return -1;
    }
    /* more than 48 KB of shared memory: raise the block's limit, and ask for the largest shared
     * memory carveout so that two blocks of up to ~113 KB share a multiprocessor (the default
     * carveout may leave room for only one) */
    if (smem > 48 * 1024) {
        DG_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        DG_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       (int)cudaSharedmemCarveoutMaxShared));
    }
    const bool timed = dg_cuda_ktime_on(); /* a benchmark's per-kernel times (kernel_timer.cu) */
    if (timed) dg_cuda_ktime_mark(name, 0);
    kern<<<(unsigned)grid, nt, smem, dg_cuda_stream()>>>(args...);
    const int rc = DG_LAUNCHED(name);
    if (timed) dg_cuda_ktime_mark(name, 1);
    return rc;
}
#define DRC_LAUNCH(name, kern, grid, nt, smem, ...) drc::launch(name, kern, grid, nt, smem, __VA_ARGS__)
#endif

/* Validated shapes and the chunk table (host side of a call). */
struct Plan {
    Geom G;
    int64_t *tab_dev; /* owned scratch or NULL */
};
/* Checks the shape and pointers (names `who` in messages) and makes the geometry (G.nchunks
 * included; G.tab NULL); 0 or -1.  shape_only: the pointers are not checked (for sizes). */
int plan_init(const char *who, const dg_dr_shape *s, const void *q, const void *k, const void *v, const void *g,
              const void *beta, Plan *p, bool shape_only = false);
/* the chunk table of a cu_seqlens call on the device (G.tab), which the kernels' launches read;
 * nothing without cu_seqlens.  Made only by the call that launches them: a padded or value-split
 * call's outer plan does not, its inner call does. */
int plan_table(const char *who, const dg_dr_shape *s, Plan *p);
void plan_free(Plan *p);

/* Pointers of one call; T = float, uint16_t (bf16 bits) or f16bits (fp16 bits) for q, k, v, beta, o
 * and their gradients; gates and states are float. */
template <typename T> struct Io {
    const T *q, *k, *v, *beta, *dout;
    const float *g, *h0, *dhT;
    T *o, *dq, *dk, *dv, *dbeta;
    float *hT, *dg, *dh0;
    /* backward, 16-bit storage: NULL, or q, k are L2-normalised rows and these their 1/|x| [rows, H];
     * dq, dk are then the gradients of the raw rows (the norm's backward applied: the tensor-core
     * head-gate kernels fold it into their stores, the other paths run it after) */
    const float *rq, *rk;
    /* backward: NULL, or dbeta [rows, HV] in f32 instead of dbeta's words (the value-head split
     * sums the heads' dbeta before its one rounding: dr_chunk_vsplit.cu) */
    float *dbeta32;
    /* forward with the L2 norm in it (dr_chunk_l2norm.cuh): l2k NULL, or q and k are raw rows and
     * the kernels normalise them: the normalised rows of k go to l2k (the later kernels read them
     * there) and those of q to l2q, their 1/|x| [rows, H] to l2rk, l2rq (each of these three may be
     * NULL: not wanted); l2eps the norm's eps */
    T *l2q, *l2k;
    float *l2rq, *l2rk, l2eps;
};

/* Buffers of one call carved out of one allocation, each at a multiple of 256 bytes from its start.  With base NULL
 * it only counts (off is then the size): the same sequence of takes first sizes, then places. */
struct Carve {
    char *base;
    size_t off;
    template <typename T> T *take(int64_t n) {
        T *p = base ? reinterpret_cast<T *>(base + off) : nullptr;
        off += ((size_t)n * sizeof(T) + 255) & ~(size_t)255;
        return p;
    }
};
/* place(cv) lays a call's buffers out in cv; the bytes it takes */
template <class F> size_t carve_bytes(F place) {
    Carve cv{nullptr, 0};
    place(cv);
    return cv.off;
}
/* place(cv) into `given` when it is set (a kept working set), else into new scratch, which is
 * returned for the caller to release (NULL, with *ok false, when it cannot be had) */
template <class F> char *carve_into(void *given, F place, bool *ok) {
    char *own = given ? nullptr : scratch<char>(carve_bytes(place));
    *ok = given || own;
    Carve cv{given ? (char *)given : own, 0};
    if (*ok) place(cv);
    return own;
}

/* the generic path (dr_chunk_generic.cuh, _fwd.cu, _bwd.cu): f32 arithmetic, every gate and chunk size */
/* TC: the TF32 family (the generic kernels with their products on TF32 tensor cores; 16-bit T).
 * keep (or NULL): device memory of k256_kept_bytes for the working set, *kept set to whether the
 * forward filled it (where its kernels are the 16-bit ones at K = 256 throughout); kept: that set,
 * given to the backward of the same call, which then skips the recompute where its own kernels are
 * the 16-bit ones too (else it recomputes, as without it) */
template <typename T, bool TC = false> int generic_fwd(const Plan &p, const Io<T> &io, void *keep, bool *kept);
template <typename T, bool TC = false>
int generic_bwd(const Plan &p, const dg_dr_variant &var, const Io<T> &io, const void *kept);
/* the tensor-core path (dr_chunk_mma_fwd.cu, dr_chunk_mma_bwd.cu): 16-bit storage, gate NONE or HEAD, C = 64, K and
 * V in {64, 128}; fast_ok says whether a shape qualifies.  Two builds of the same kernels
 * (dr_chunk_mma.cuh, DRC_OPERAND_F16): fast:: takes bf16 bits, fast_h:: fp16 bits (the f16bits of
 * the caller passed as uint16_t: io_bits) */
bool fast_ok(const Geom &G);
/* The forward's working set (the gate's cumsum, W, U, V', the states, the inverse) can be kept for
 * the backward (dr_chunk_cuda.h, dg_cuda_dr_chunk_kept_bytes): *_kept_bytes is its size; the
 * forward given `keep` (that many bytes) fills it, the backward given it as `kept` skips the
 * recompute (prep and the state pass).  keep / kept NULL: each call makes its own. */
size_t fast_kept_bytes(const Geom &G);
/* The heads a block of the head-gate or KDA family's backward qkwy sums (dq, dk, dbeta, dg; the WY
 * part once for them), vsh the call's Geom::vsh: the fused kernel vsh, the unfused pair one */
inline int qkwy_heads(int vsh, const dg_dr_variant &var) { return var.dw_on_chip ? vsh : 1; }
namespace fast {
int fwd(const Plan &p, const Io<uint16_t> &io, void *keep);
int bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept);
} // namespace fast
namespace fast_h {
int fwd(const Plan &p, const Io<uint16_t> &io, void *keep);
int bwd(const Plan &p, const dg_dr_variant &var, const Io<uint16_t> &io, const void *kept);
} // namespace fast_h
/* The TF32 family's prep and state pass at K = 256 on 16-bit tensor cores (dr_chunk_k256.cu; the
 * per-channel gate's prep in dr_chunk_k256_chan.cu): gate NONE, HEAD or CHANNEL, chunk 64, V a
 * multiple of 64, q, k, v 16-byte aligned (k256_ok; the environment
 * variable DG_DRC_K256_OFF set to anything but 0 turns them off, for comparisons with the TF32
 * kernels).  They write the TF32 kernels' buffers (dr_chunk_generic.cuh), in f32 but for W: the
 * gate's cumsum Gc, W as 16-bit words (a plain operand wherever it is read, Plain<GATE>; in the
 * first half of the TF32 family's f32 buffer, so only the 16-bit kernels read it: a call takes
 * either the 16-bit prep, state pass and dhu or none of them), U and V' over it (plain operands,
 * 16-bit words where only the 16-bit output pass and dqkwg read them), P, and where non-NULL Ai and
 * Mkk (prep), the states entering each chunk (state pass; 16-bit words where only the 16-bit
 * kernels read them, K256Plain) and hT, from h0.  fast:: takes bf16 words, fast_h:: fp16 (io_bits). */
struct Words { /* a buffer of f32, holding f32 or (w16) 16-bit words in its first half */
    float *f;
    bool w16;
};
/* an f32 buffer of n elements as two planes of n 16-bit words: the hi words, then the lo words of
 * x = hi + lo (the 16-bit kernels' dW at K = 256, in the TF32 family's f32 scratch) */
struct Planes {
    uint16_t *hi, *lo;
};
inline Planes planes_in(float *f, int64_t n) { return Planes{(uint16_t *)f, (uint16_t *)f + n}; }
/* The K = 256 kernels' states enter their products as plain 16-bit words, as FLA's kernels read h
 * and dh: S entering each chunk and dS leaving it are stored as one plane of 16-bit words for the
 * output pass and dqkwg (whose two sets of tiles fit in shared memory only so), and where Chain,
 * the state passes' own products W S and K dS read them plain too.  The passes carry the states in
 * f32.  Against the f64 recurrence on FLA's benchmark inputs (bench/fla_side_by_side.py --f64) both
 * sides were measured, ours below FLA's error (docs/PERF_KERNELS.md, which also has the short
 * sequences where plain states are weakest). */
struct K256Plain {
    static constexpr bool Chain = true;
    /* and, as FLA's dhu and dqkwg read them: dhu's right factors of dS's update Q^T (scale e^G o dO)
     * - W^T dV'; dV' in dqkwg's dW = -dV' S0^T (it enters wy's products split); with the head gate,
     * P in dhu's P^T dO (without a gate, plain P put dbeta at T = 1 above FLA's error: P^T dO
     * reaches dV' and dbeta directly) */
    static constexpr bool DhuRight = true, DwDvn = true;
    /* wy's dMkk o Gamma in dk's (dMkk o Gamma) K + (dMkk o Gamma)^T K (it reaches dk only, and dg
     * through dk) */
    static constexpr bool WyDmkk = true;
    static constexpr bool dhu_p(int gate) { return gate == DG_GATE_HEAD; }
};
/* The 16-bit kernels' working set at K = 256 (a call whose forward and output pass are all 16-bit,
 * and the backward that reads it): Gc [rows, HV, gs] (HEAD, CHANNEL), W [rows, HV, K] and V' [rows, HV, V] as
 * 16-bit words, P, Ai, Mkk [rows, HV, 64] in f32, the states entering each chunk [nchunks, HV, K, V]
 * in 16-bit words (Sh, K256Plain); with the per-channel gate also Kd = K o e^{G_last - G} and Qg =
 * scale Q o e^G [rows, HV, K] in 16-bit words (plain, as KPlain has them at K <= 128), which the
 * state passes and the output pass read instead of k and q.  for_bwd false (a forward that keeps
 * nothing): no Ai, Mkk.  k256_kept_bytes: its size with for_bwd, where the shape is one the 16-bit
 * kernels take (0 otherwise): what a forward keeps for its backward, which then skips the
 * recompute of prep and the state pass. */
struct K256Bufs {
    float *Gc, *P, *Ai, *Mkk;
    uint16_t *W, *Vn, *Sh, *Kd, *Qg;
};
void k256_carve(const Geom &G, Carve &cv, K256Bufs &b, bool for_bwd);
size_t k256_kept_bytes(const Geom &G);
struct K256Out {
    float *Gc;
    uint16_t *W;
    Words U;
    float *P, *Ai, *Mkk;
    Words Hst;
    const float *h0;
    float *hT;
    uint16_t *Kd, *Qg; /* CHANNEL: prep writes them, the state pass reads Kd */
};
/* and the backward state pass (the TF32 family's dhu) where k256_ok takes the call and dO is 16-byte
 * aligned: from prep's Gc, W (16-bit), P and io.q, io.k, io.dout (CHANNEL: prep's Qg, Kd for q, k),
 * it writes dVn (dV' [rows, HV, V]), dS leaving each chunk (the states' layout) in 16-bit words
 * (dSh, K256Plain) and, where non-NULL, dh0, from dhT */
struct K256Dhu {
    const float *Gc;
    const uint16_t *W;
    const float *P, *dhT;
    float *dVn;
    uint16_t *dSh;
    float *dh0;
    const uint16_t *Kd, *Qg;
};
bool k256_ok(const Geom &G, const void *q, const void *k, const void *v);
/* whether the K = 256 backward stores the gradient d (dq or dk, given) itself (K256Bwd::dq, dk) */
inline bool k256_direct(const Geom &G, const void *d) { return d && G.grp == 1 && ((uintptr_t)d & 15) == 0; }
namespace fast {
int k256_prep_state(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked);
int k256_dhu(const Plan &p, const Io<uint16_t> &io, const K256Dhu &d);
/* and the output pass (o 4-byte aligned): o from q (CHANNEL: prep's Qg), prep's Gc and P, V' (over U)
 * and the states (16-bit) */
int k256_out(const Plan &p, const Io<uint16_t> &io, const float *Gc, const float *P, const uint16_t *Vn16,
             const uint16_t *Hst16, const uint16_t *Qg);
/* the per-channel gate's prep (dr_chunk_k256_chan.cu), which k256_prep_state runs */
int k256_chan_prep(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked);
} // namespace fast
namespace fast_h {
int k256_prep_state(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked);
int k256_dhu(const Plan &p, const Io<uint16_t> &io, const K256Dhu &d);
/* and the output pass (o 4-byte aligned): o from q (CHANNEL: prep's Qg), prep's Gc and P, V' (over U)
 * and the states (16-bit) */
int k256_out(const Plan &p, const Io<uint16_t> &io, const float *Gc, const float *P, const uint16_t *Vn16,
             const uint16_t *Hst16, const uint16_t *Qg);
/* the per-channel gate's prep (dr_chunk_k256_chan.cu), which k256_prep_state runs */
int k256_chan_prep(const Plan &p, const Io<uint16_t> &io, const K256Out &o, int blocked);
} // namespace fast_h
/* The TF32 family's backward dqkwg and wy on 16-bit tensor cores where k256_ok takes the call
 * (dr_chunk_k256_bwd.cu): from the working set (K256Bufs: V' and the states in 16-bit words; Gc
 * NULL without a gate) and dhu's dV' (f32) and dS (16-bit words) to dq, dk per value head
 * (f32 [rows, HV, K]), dv, dbeta (or dbetaf), dg; dW [rows, HV, K] (hi and lo planes of 16-bit
 * words) and dG [rows, HV] (HEAD) are the scratch between the two kernels.  With the per-channel
 * gate dG is [rows, HV, K], and a third kernel (k256_chan_gamma, dr_chunk_k256_chan_bwd.cu) adds
 * wy's products with the gate inside them, from wy's dMkk, and makes dg.  16-bit words bf16 in
 * fast::, fp16 in fast_h::. */
struct K256Bwd {
    const uint16_t *q, *k, *v, *beta, *dout, *Vn16, *Sh, *dSh;
    const float *Gc, *P, *Ai, *Mkk, *dVn;
    float *dqv, *dkv, *dG;
    uint16_t *dWh, *dWl, *dv, *dbeta;
    float *dMkk; /* CHANNEL: [rows, HV, 64] f32, from wy to k256_chan_gamma */
    float *dbetaf, *dg;
    int final_dg;
    /* HV == H (and the output 16-byte aligned): dq, dk stored by the kernels themselves in 16-bit
     * words, with the L2 norm's backward where rq, rk are given (1/|x| [rows, H]: q, k are the
     * normalised rows); else NULL, and heads_sum makes them from dqv, dkv */
    uint16_t *dq, *dk;
    const float *rq, *rk;
};
namespace fast {
int k256_dqkwg_wy(const Plan &p, const K256Bwd &a);
int k256_chan_gamma(const Plan &p, const K256Bwd &a);
} // namespace fast
namespace fast_h {
int k256_dqkwg_wy(const Plan &p, const K256Bwd &a);
int k256_chan_gamma(const Plan &p, const K256Bwd &a);
} // namespace fast_h
/* A value head of V = R Vs columns as R heads of Vs (dr_chunk_vsplit.cu, which says why that is
 * exact; dr_chunk.cu decides): the moves around the kernels of the split shape.  states: [NH, K, R,
 * Vs] -> [NH, R, K, Vs] (to_split), else back (the gradients' sums: heads_sum).  who names the
 * launches. */
enum { VS_BF16, VS_F16, VS_F32 }; /* words of an output: bf16, fp16, f32 */
int vsplit_states(const char *who, bool to_split, int64_t NH, int K, int R, int Vs, const float *src, float *dst);
/* Zero padding of K and V (dr_chunk_pad.cu, which says why it is exact; dr_chunk.cu decides): dst
 * [A, Bd, Cd] from src [A, Bs, Cs], src's entry where b < Bs and c < Cs, else 0 (padding when Bd >=
 * Bs and Cd >= Cs, cropping when Bd <= Bs and Cd <= Cs); elt 2 or 4 bytes; who names the launches. */
int pad_copy(const char *who, int64_t A, int Bs, int Cs, int Bd, int Cd, size_t elt, const void *src, void *dst);
/* out [rows, H, K] (words of fmt) from f32 per-head values in [rows, H grp, K], summed over each
 * group of grp heads (dq, dk over the value heads of a key head; dbeta, dg over the split heads of a
 * value head, dr_chunk_vsplit.cu), then, where r (1/|x| [rows, H]) is given, the L2 norm's backward
 * with xn (the normalised rows, words of fmt), in f32 before one rounding (dr_chunk_heads.cu).
 * K <= 256. */
int heads_sum(const char *who, int64_t rows, int H, int grp, int K, const float *in, const void *xn, const float *r,
              int fmt, void *out);
/* the same pointers as 16-bit words (the tensor-core kernels of both formats take them so; bf16
 * bits already are) */
inline const Io<uint16_t> &io_bits(const Io<uint16_t> &io) { return io; }
inline Io<uint16_t> io_bits(const Io<f16bits> &io) {
    Io<uint16_t> b;
    b.q = &io.q->x, b.k = &io.k->x, b.v = &io.v->x, b.beta = &io.beta->x;
    b.dout = io.dout ? &io.dout->x : nullptr;
    b.g = io.g, b.h0 = io.h0, b.dhT = io.dhT;
    b.o = io.o ? &io.o->x : nullptr, b.dq = io.dq ? &io.dq->x : nullptr, b.dk = io.dk ? &io.dk->x : nullptr;
    b.dv = io.dv ? &io.dv->x : nullptr, b.dbeta = io.dbeta ? &io.dbeta->x : nullptr;
    b.hT = io.hT, b.dg = io.dg, b.dh0 = io.dh0;
    b.rq = io.rq, b.rk = io.rk, b.dbeta32 = io.dbeta32;
    b.l2q = io.l2q ? &io.l2q->x : nullptr, b.l2k = io.l2k ? &io.l2k->x : nullptr;
    b.l2rq = io.l2rq, b.l2rk = io.l2rk, b.l2eps = io.l2eps;
    return b;
}

} // namespace drc

#endif

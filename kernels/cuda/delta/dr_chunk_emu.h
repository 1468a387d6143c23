/* Host emulation of the small part of CUDA that the chunked delta-rule kernels use, so that they
 * can be run and debugged on a machine without a GPU.  Only compiled when DRC_EMU is defined (the
 * .cu files then build as plain C++ with g++: `g++ -x c++ -std=c++17 -DDRC_EMU ...`; x86-64
 * only); the library build never sees it.
 *
 * Model: a launch runs its blocks one after the other, in one host thread; each CUDA thread of a
 * block is a fiber (its own stack, switched by a few instructions), run until it reaches a
 * barrier, so per-thread registers, barriers and warp collectives behave as on the device:
 *   __syncthreads      waits until every live thread of the block has arrived;
 *   warp collectives   (shuffles, ldmatrix, mma.sync) exchange through a per-warp buffer between
 *                      two warp barriers, with the fragment layouts of the PTX ISA;
 *   shared memory      one buffer, filled with 0xff (NaN) before every block, so a read of shared
 *                      memory that the block did not write shows up as NaN;
 *   a deadlock (threads waiting at different barriers) aborts with a message.
 * Blocks must have a multiple of 32 threads. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_EMU_H
#define DG_KERNELS_CUDA_DR_CHUNK_EMU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <functional>
#include <vector>

#include "core/f16.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
/* CUDA's reciprocal square root (the device's is within 2 ulp; here correctly rounded 1/sqrt) */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

extern "C" void drc_emu_switch(void **save_sp, void *load_sp);
#ifndef DRC_EMU_SWITCH_DEFINED
#define DRC_EMU_SWITCH_DEFINED
/* saves the callee-saved registers and the stack pointer in *save_sp, continues on load_sp */
asm(".text\n"
    ".weak drc_emu_switch\n"
    ".type drc_emu_switch,@function\n"
    "drc_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n");
#endif

namespace drc_emu {

enum { RUN, WAIT_BLOCK, WAIT_WARP, WAIT_NAMED, WAIT_MBAR, DONE };

struct Fiber {
    void *sp;
    int state;
    int bar;          /* WAIT_NAMED: the named barrier it waits at */
    const void *mbar; /* WAIT_MBAR: the mbarrier it waits on */
    std::vector<unsigned char> stack;
};

struct Launch {
    int nt = 0, cur = 0, alive = 0, arrived = 0;
    int or_in = 0, or_out = 0; /* __syncthreads_or: gathered at the barrier, read after it */
    int warp_arrived[32];
    int named_arrived[16]; /* bar.sync id, n: arrivals so far at each id */
    std::vector<Fiber> f;
    void *sched_sp = nullptr;
    const std::function<void()> *body = nullptr;
    alignas(16) unsigned char xchg[32][32][64]; /* [warp][lane][bytes] */
    std::vector<unsigned char> smem;
};
inline Launch *g_launch = nullptr;

inline int lane() { return (int)(threadIdx.x & 31u); }
inline int warp() { return (int)(threadIdx.x >> 5); }
inline unsigned char *slot(int l) { return g_launch->xchg[warp()][l]; }

inline void yield_to_sched() {
    Launch &L = *g_launch;
    drc_emu_switch(&L.f[L.cur].sp, L.sched_sp);
}

inline void syncthreads() {
    Launch &L = *g_launch;
    L.f[L.cur].state = WAIT_BLOCK;
    if (++L.arrived == L.alive) {
        for (auto &x : L.f)
            if (x.state == WAIT_BLOCK) x.state = RUN;
        L.arrived = 0;
    }
    yield_to_sched();
}

/* __syncthreads_or: the barrier of syncthreads, returning whether any thread passed p != 0; the
 * last thread to arrive publishes the result, which every thread reads as it resumes (before it
 * can reach another barrier) */
inline int syncthreads_or(int p) {
    Launch &L = *g_launch;
    L.or_in |= p != 0;
    L.f[L.cur].state = WAIT_BLOCK;
    if (++L.arrived == L.alive) {
        for (auto &x : L.f)
            if (x.state == WAIT_BLOCK) x.state = RUN;
        L.arrived = 0;
        L.or_out = L.or_in, L.or_in = 0;
    }
    yield_to_sched();
    return L.or_out;
}

inline void syncwarp() {
    Launch &L = *g_launch;
    const int w = warp();
    L.f[L.cur].state = WAIT_WARP;
    if (++L.warp_arrived[w] == 32) {
        for (int t = 32 * w; t < 32 * w + 32; t++)
            if (L.f[t].state == WAIT_WARP) L.f[t].state = RUN;
        L.warp_arrived[w] = 0;
    }
    yield_to_sched();
}

/* Named barriers (PTX bar.sync a, n): n threads (a multiple of 32) wait at barrier a (1..15; 0 is
 * the block barrier's) until the n-th arrives, which starts the barrier afresh.  Arrivals left
 * over when the block ends abort (the counts of the kernel do not match), as does a block whose
 * threads all wait. */
inline void named_sync(int id, int n) {
    Launch &L = *g_launch;
    if (id < 1 || id > 15 || n <= 0 || n % 32 || n > L.nt) {
        fprintf(stderr, "emu: named barrier %d with %d threads (need id 1..15, a multiple of 32 <= %d)\n", id, n, L.nt);
        abort();
    }
    L.f[L.cur].state = WAIT_NAMED;
    L.f[L.cur].bar = id;
    if (++L.named_arrived[id] == n) {
        for (auto &x : L.f)
            if (x.state == WAIT_NAMED && x.bar == id) x.state = RUN;
        L.named_arrived[id] = 0;
    }
    yield_to_sched();
}

/* mbarriers (PTX mbarrier.init / arrive / try_wait.parity): the 8-byte word holds the arrivals
 * that complete a phase, the arrivals so far and the current phase's parity */
struct Mbar {
    uint32_t expected;
    uint16_t arrived, phase;
};
inline void mbar_init(uint64_t *b, int count) {
    const Mbar m{(uint32_t)count, 0, 0};
    memcpy(b, &m, sizeof m);
}
inline void mbar_arrive(uint64_t *b) {
    Mbar m;
    memcpy(&m, b, sizeof m);
    if (++m.arrived == m.expected) {
        m.arrived = 0, m.phase ^= 1;
        for (auto &x : g_launch->f)
            if (x.state == WAIT_MBAR && x.mbar == b) x.state = RUN;
    }
    memcpy(b, &m, sizeof m);
}
/* returns once the phase of parity p has completed: the current phase's parity is not p */
inline void mbar_wait(uint64_t *b, int p) {
    Launch &L = *g_launch;
    for (;;) {
        Mbar m;
        memcpy(&m, b, sizeof m);
        if (m.phase != (uint16_t)(p & 1)) return;
        L.f[L.cur].state = WAIT_MBAR;
        L.f[L.cur].mbar = b;
        yield_to_sched();
    }
}

inline void fiber_entry() {
    Launch &L = *g_launch;
    (*L.body)();
    L.f[L.cur].state = DONE;
    L.alive--;
    if (L.arrived > 0 && L.arrived == L.alive) { /* a barrier that waited only for this thread */
        for (auto &x : L.f)
            if (x.state == WAIT_BLOCK) x.state = RUN;
        L.arrived = 0;
        L.or_out = L.or_in, L.or_in = 0;
    }
    drc_emu_switch(&L.f[L.cur].sp, L.sched_sp);
    abort(); /* never resumed */
}

/* The order in which runnable threads are resumed: DRC_EMU_ORDER = fwd (default), rev, or rand
 * (a new permutation every pass).  A missing barrier shows as results that depend on it. */
inline int order(int u, int nt) {
    static int mode = -1;
    static uint64_t seed = 88172645463325252ull;
    static int perm[1024], left = 0;
    if (mode < 0) {
        const char *e = getenv("DRC_EMU_ORDER");
        mode = !e || !strcmp(e, "fwd") ? 0 : !strcmp(e, "rev") ? 1 : 2;
    }
    if (mode == 0) return u;
    if (mode == 1) return nt - 1 - u;
    if (u == 0 || left != nt) { /* new random permutation at the start of each pass */
        for (int i = 0; i < nt; i++) perm[i] = i;
        for (int i = nt - 1; i > 0; i--) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            int j = (int)(seed % (uint64_t)(i + 1)), x = perm[i];
            perm[i] = perm[j], perm[j] = x;
        }
        left = nt;
    }
    return perm[u];
}

inline void launch_impl(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body) {
    static Launch L; /* one launch at a time */
    const size_t stack_bytes = 256 * 1024;
    if (block.x % 32 || block.x > 1024 || block.y != 1 || block.z != 1) {
        fprintf(stderr, "emu: block of %u threads (need a multiple of 32, 1-d)\n", block.x);
        abort();
    }
    L.nt = (int)block.x;
    L.f.resize((size_t)L.nt);
    for (auto &x : L.f)
        if (x.stack.size() != stack_bytes) x.stack.assign(stack_bytes, 0);
    L.smem.assign(smem_bytes ? smem_bytes : 1, 0xff);
    L.body = &body;
    g_launch = &L;
    gridDim = grid;
    blockDim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                memset(L.smem.data(), 0xff, L.smem.size());
                L.alive = L.nt, L.arrived = 0;
                memset(L.warp_arrived, 0, sizeof L.warp_arrived);
                memset(L.named_arrived, 0, sizeof L.named_arrived);
                for (int t = 0; t < L.nt; t++) {
                    Fiber &fb = L.f[(size_t)t];
                    uintptr_t top = ((uintptr_t)(fb.stack.data() + fb.stack.size())) & ~(uintptr_t)15;
                    void **sp = (void **)top;
                    *--sp = nullptr;                             /* fake return address of fiber_entry */
                    *--sp = (void *)&fiber_entry;                /* where the first switch returns to */
                    for (int r = 0; r < 6; r++) *--sp = nullptr; /* callee-saved registers */
                    fb.sp = sp;
                    fb.state = RUN;
                }
                for (;;) {
                    bool any = false, live = false;
                    for (int u = 0; u < L.nt; u++) {
                        const int t = order(u, L.nt);
                        if (L.f[(size_t)t].state != DONE) live = true;
                        if (L.f[(size_t)t].state != RUN) continue;
                        any = true;
                        L.cur = t;
                        threadIdx = dim3((unsigned)t);
                        drc_emu_switch(&L.sched_sp, L.f[(size_t)t].sp);
                    }
                    if (!live) break;
                    if (!any) {
                        fprintf(stderr, "emu: deadlock in block %u (%d alive, %d at the block barrier)\n", x, L.alive,
                                L.arrived);
                        for (int id = 1; id < 16; id++)
                            if (L.named_arrived[id])
                                fprintf(stderr, "emu:   %d at named barrier %d\n", L.named_arrived[id], id);
                        int at_mbar = 0;
                        for (auto &fb : L.f) at_mbar += fb.state == WAIT_MBAR;
                        if (at_mbar) fprintf(stderr, "emu:   %d waiting on mbarriers\n", at_mbar);
                        abort();
                    }
                }
                for (int id = 1; id < 16; id++)
                    if (L.named_arrived[id]) {
                        fprintf(stderr, "emu: block %u ended with %d arrivals at named barrier %d\n", x,
                                L.named_arrived[id], id);
                        abort();
                    }
            }
    g_launch = nullptr;
}

template <class F> void launch(dim3 grid, dim3 block, size_t smem_bytes, F body) {
    std::function<void()> fn(body);
    launch_impl(grid, block, smem_bytes, fn);
}

template <class T> T shfl(T v, int src) {
    static_assert(sizeof(T) <= 64, "slot");
    memcpy(slot(lane()), &v, sizeof v);
    syncwarp();
    T r;
    memcpy(&r, slot(src & 31), sizeof r);
    syncwarp();
    return r;
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the row address of row l%8 of
 * matrix l/8; register m of lane l holds, of matrix m, the elements (row l/4, cols 2(l%4), +1)
 * (non-trans) or (rows 2(l%4), +1, col l/4) (trans), the first in the low half. */
inline void ldmatrix_x4(uint32_t r[4], const uint16_t *p, bool trans) {
    memcpy(slot(lane()), &p, sizeof p);
    syncwarp();
    const int l = lane();
    for (int m = 0; m < 4; m++) {
        const uint16_t *a, *b;
        if (!trans) {
            const uint16_t *row;
            memcpy(&row, slot(m * 8 + l / 4), sizeof row);
            a = row + 2 * (l % 4), b = a + 1;
        } else {
            const uint16_t *r0, *r1;
            memcpy(&r0, slot(m * 8 + 2 * (l % 4)), sizeof r0);
            memcpy(&r1, slot(m * 8 + 2 * (l % 4) + 1), sizeof r1);
            a = r0 + l / 4, b = r1 + l / 4;
        }
        r[m] = (uint32_t)*a | ((uint32_t)*b << 16);
    }
    syncwarp();
}

inline float bf16_bits_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (to_f32: the 16-bit operand
 * format's conversion), g = l/4, t = l%4:
 * a0: A[g][2t..2t+1]  a1: A[g+8][2t..]  a2: A[g][2t+8..]  a3: A[g+8][2t+8..]
 * b0: B[2t..2t+1][g]  b1: B[2t+8..][g]
 * c0, c1: C[g][2t], C[g][2t+1]  c2, c3: C[g+8][2t], C[g+8][2t+1] */
template <float (*to_f32)(uint16_t)> inline void mma16816_as(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    memcpy(slot(lane()), mine, sizeof mine);
    syncwarp();
    const int g = lane() / 4, t = lane() % 4;
    auto lo = [](uint32_t x) { return to_f32((uint16_t)(x & 0xffffu)); };
    auto hi = [](uint32_t x) { return to_f32((uint16_t)(x >> 16)); };
    float A[2][16], B[2][16]; /* my two rows of A, my two columns of B */
    for (int l = 0; l < 32; l++) {
        uint32_t r[6];
        memcpy(r, slot(l), sizeof r);
        int gl = l / 4, tl = l % 4;
        if (gl == g) {
            A[0][2 * tl] = lo(r[0]), A[0][2 * tl + 1] = hi(r[0]);
            A[1][2 * tl] = lo(r[1]), A[1][2 * tl + 1] = hi(r[1]);
            A[0][2 * tl + 8] = lo(r[2]), A[0][2 * tl + 9] = hi(r[2]);
            A[1][2 * tl + 8] = lo(r[3]), A[1][2 * tl + 9] = hi(r[3]);
        }
        for (int q = 0; q < 2; q++)
            if (gl == 2 * t + q) {
                B[q][2 * tl] = lo(r[4]), B[q][2 * tl + 1] = hi(r[4]);
                B[q][2 * tl + 8] = lo(r[5]), B[q][2 * tl + 9] = hi(r[5]);
            }
    }
    syncwarp();
    for (int q = 0; q < 4; q++) {
        float s = c[q];
        for (int k = 0; k < 16; k++) s += A[q >> 1][k] * B[q & 1][k];
        c[q] = s;
    }
}
inline void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) { mma16816_as<bf16_bits_to_float>(c, a, b); }
/* x rounded to TF32 as the kernels round it (dr_chunk_internal.cuh, tf32): 10 mantissa bits, the
 * magnitude to nearest with ties away from zero (the low 13 bits of the word zero) */
inline uint32_t tf32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u + 0x1000u) & 0xffffe000u;
}

/* mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, g = l/4, t = l%4 (each register one tf32
 * word): a0: A[g][t]  a1: A[g+8][t]  a2: A[g][t+4]  a3: A[g+8][t+4];  b0: B[t][g]  b1: B[t+4][g];
 * c as mma16816's */
inline void mma1688_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    memcpy(slot(lane()), mine, sizeof mine);
    syncwarp();
    const int g = lane() / 4, t = lane() % 4;
    auto f = [](uint32_t x) {
        float y;
        memcpy(&y, &x, 4);
        return y;
    };
    float A[2][8], B[2][8]; /* my two rows of A, my two columns of B */
    for (int l = 0; l < 32; l++) {
        uint32_t r[6];
        memcpy(r, slot(l), sizeof r);
        const int gl = l / 4, tl = l % 4;
        if (gl == g) {
            A[0][tl] = f(r[0]), A[1][tl] = f(r[1]);
            A[0][tl + 4] = f(r[2]), A[1][tl + 4] = f(r[3]);
        }
        for (int q = 0; q < 2; q++)
            if (gl == 2 * t + q) B[q][tl] = f(r[4]), B[q][tl + 4] = f(r[5]);
    }
    syncwarp();
    for (int q = 0; q < 4; q++) {
        float s = c[q];
        for (int k = 0; k < 8; k++) s += A[q >> 1][k] * B[q & 1][k];
        c[q] = s;
    }
}

inline void mma16816_f16(float c[4], const uint32_t a[4], const uint32_t b[2]) { mma16816_as<dg_f16_to_f32>(c, a, b); }

} // namespace drc_emu

#endif

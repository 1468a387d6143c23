/* The chunked delta-rule CUDA kernels (kernels/cuda/delta/dr_chunk_cuda.h) against the CPU kernels on
 * the same random inputs (kernels/cpu/delta/delta_rule.h):
 *  - f32: forward (o, hT) and every gradient against the f64 recurrence, relative error norm
 *    ||x - ref|| / ||ref|| <= 1e-5; the CPU f32 chunked kernel's own error is printed beside it;
 *  - bf16 storage (q, k, v, beta, o, dout and their gradients; f32 gates and states): against the
 *    f64 recurrence on the same rounded inputs, <= 5e-3; both the tensor-core path (gate NONE or
 *    HEAD, chunk 64, K, V in {64, 128}) and the generic kernels, and the two against each other;
 *  - fp16 storage (the same arrays as IEEE binary16): against the f64 recurrence on the same
 *    fp16-rounded inputs, <= F16_TOL (6e-4, derived there) on the generic kernels and
 *    <= F16_MMA_TOL on the tensor-core ones (every gate at their shapes), the two paths against
 *    each other;
 *  - value heads of V = 192, 256, 320 on the tensor-core kernels as 3, 2, 5 heads of 64 or 128
 *    columns (kernels/cuda/delta/dr_chunk_vsplit.cu), bf16 and fp16, KDA too;
 *  - 128 < K <= 256 on the TF32 family (every gate, V up to 512), bf16 and fp16, against the
 *    reference with the tensor-core bounds and against the generic kernels;
 *  - K and V the tensor-core kernels do not take, zero-padded to theirs (K = 32, 96, 100, 160, 200;
 *    V = 40, 48, 80, 96, 200), and views not aligned for their vector loads (aligned copies);
 *  - every gate kind, grouped value heads, cu_seqlens with an empty sequence, h0/hT present or
 *    absent, partial last chunks, T = 1, chunk 16/32/64, V tiles with a partial tile, NULL
 *    gradient pointers;
 *  - short sequences over many random draws (T = 1 and 130, with and without a gate): the worst
 *    error of each output over the draws <= 5e-3, the margin of the plain bf16 intermediates;
 *  - every backward variant (GDN dg from final dq/dk or partial terms; KDA fused or unfused;
 *    blocked or forward-substitution inverse): each against the reference and all against each
 *    other; the backward run twice gives identical bits;
 *  - bad arguments are rejected with a message naming them (these run without a GPU too).
 * Outputs are poisoned with NaN before each run, so an element left unwritten fails.  The GPU
 * tests skip where dg_cuda_device_count() is 0.  DG_TEST_FILTER selects tests by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deltagrad.h"
#include "tests/support/test_support.h"

#ifdef DG_HAVE_CUDA
#include "tests/dr_chunk_cases.h"

static const dg_dr_variant var_default = {1, 1, 1};
static const dg_dr_variant var_all[8] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                         {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};

/* whether fp16 calls of this case take tensor cores (dr_chunk_cuda.h): every chunk-64 call (the mma
 * or KDA kernels, K and V padded to their shapes, V = 192, 256 ... as heads of 64 or 128 columns;
 * at 128 < K <= 256 the 16-bit K = 256 kernels), or the TF32 family at 128 < K <= 256, whose
 * intermediates round to 2^-11 as the fp16 mma kernels' do (F16_MMA_TOL's derivation holds for all) */
static int f16_mma(const cfg *c) { return c->chunk == 64 || (c->K > 128 && c->K <= 256); }

/* one case: GPU against the f64 recurrence; f32 runs print the CPU f32 chunked error too.
 * all_variants: every variant against the reference and against {1,1,1}. */
static void run_case(const cfg *c, int st, int all_variants) {
    data d;
    make(c, st, &d);
    res ref, got, base;
    res_alloc(c, &d, &ref), res_alloc(c, &d, &base);
    ref_f64(&d, &ref);
    const double tol = st == S_BF16 ? 5e-3 : st == S_F16 ? (f16_mma(c) ? F16_MMA_TOL : F16_TOL) : 1e-5;
    char what[160];
    if (st == S_F32) {
        res cpu;
        res_alloc(c, &d, &cpu);
        cpu_chunk_f32(&d, &var_default, &cpu);
        snprintf(what, sizeof what, "%s: CPU f32 chunked", c->name);
        printf("  %-44s", what);
        for (int a = 0; a < R_N; a++)
            if (ref.x[a]) printf(" %s %.1e", r_names[a], dg_test_rel_err_norm(cpu.x[a], ref.x[a], ref.n[a]));
        printf("\n");
        res_free(&cpu);
    }
    run_gpu(&d, st, &var_default, &base);
    snprintf(what, sizeof what, "%s: %s", c->name, st_names[st]);
    check(what, &base, &ref, tol);
    for (int vi = 0; all_variants && vi < 7; vi++) {
        const dg_dr_variant *v = &var_all[vi];
        res_alloc(c, &d, &got);
        run_gpu(&d, st, v, &got);
        snprintf(what, sizeof what, "%s: %s var %d%d%d", c->name, st_names[st], v->gdn_dg_from_final, v->dw_on_chip,
                 v->solve_tril_blocked);
        check(what, &got, &ref, tol);
        snprintf(what, sizeof what, "  ... against var 111");
        check(what, &got, &base, st == S_BF16 ? 2e-3 : st == S_F16 ? 2 * tol : 1e-5);
        res_free(&got);
    }
    res_free(&ref), res_free(&base), data_free(&d);
}

static const cfg f32_cases[] = {
    {"none, GVA, C16", 2, 37, 2, 4, 32, 24, DG_GATE_NONE, 16, 0, {0}, 1, 1, 0},
    {"head, C32", 2, 37, 1, 2, 64, 64, DG_GATE_HEAD, 32, 0, {0}, 1, 0, 0},
    {"channel, GVA, C64", 2, 70, 2, 4, 32, 40, DG_GATE_CHANNEL, 64, 0, {0}, 0, 1, 0},
    {"channel, varlen, C16", 1, 77, 1, 2, 48, 40, DG_GATE_CHANNEL, 16, 5, {0, 5, 5, 50, 77}, 1, 1, 0},
    {"head, K=V=128, T=300, C64", 1, 300, 1, 2, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, K=200, some grads, C32", 1, 40, 1, 1, 200, 33, DG_GATE_NONE, 32, 0, {0}, 1, 1, 1},
    {"channel, T=1, C16", 3, 1, 1, 1, 16, 8, DG_GATE_CHANNEL, 16, 0, {0}, 1, 1, 0},
    {"head, K=8, V=300, GVA, C64", 1, 70, 1, 3, 8, 300, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
};

static const cfg variant_cases[] = {
    {"head, varlen, C32 (variants)", 1, 90, 1, 2, 32, 48, DG_GATE_HEAD, 32, 4, {0, 33, 40, 90}, 1, 1, 0},
    {"channel, GVA, C64 (variants)", 1, 100, 1, 2, 32, 32, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"none, C16 (variants)", 2, 40, 1, 1, 24, 16, DG_GATE_NONE, 16, 0, {0}, 0, 1, 0},
};

/* bf16: the first four take the tensor-core path, the rest the generic kernels */
static const cfg bf16_cases[] = {
    {"head, GVA, K=V=128 (mma)", 2, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=V=64 (mma)", 1, 200, 1, 2, 64, 64, DG_GATE_NONE, 64, 5, {0, 64, 64, 130, 200}, 1, 1, 0},
    {"head, K=64, V=128, T=1 (mma)", 3, 1, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"head, K=128 V=64, some grads (mma)", 1, 129, 1, 1, 128, 64, DG_GATE_HEAD, 64, 0, {0}, 0, 0, 1},
    {"channel, GVA, C32", 2, 50, 1, 2, 64, 32, DG_GATE_CHANNEL, 32, 0, {0}, 1, 1, 0},
    {"head, C16", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 16, 0, {0}, 1, 1, 0},
};

static void test_dr_chunk_f32(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof f32_cases / sizeof f32_cases[0]; i++) run_case(&f32_cases[i], 0, 0);
}

static void test_dr_chunk_f32_variants(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof variant_cases / sizeof variant_cases[0]; i++) run_case(&variant_cases[i], 0, 1);
}

static void test_dr_chunk_bf16(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof bf16_cases / sizeof bf16_cases[0]; i++)
        run_case(&bf16_cases[i], S_BF16, i == 0 || i == 4);
}

/* case c with storage st as the call takes it and with the generic kernels forced, same inputs:
 * the two within tol of each other (what names the comparison) */
static void paths_compare(const cfg *c, int st, const char *what_kind, double tol) {
    data d;
    make(c, st, &d);
    res fast, gen;
    res_alloc(c, &d, &fast), res_alloc(c, &d, &gen);
    run_gpu(&d, st, &var_default, &fast);
    g_force_generic = true;
    run_gpu(&d, st, &var_default, &gen);
    g_force_generic = false;
    char what[160];
    snprintf(what, sizeof what, "%s: %s %s", c->name, st_names[st], what_kind);
    check(what, &fast, &gen, tol);
    res_free(&fast), res_free(&gen), data_free(&d);
}

/* the tensor-core path and the generic kernels on the same bf16 inputs */
static void test_dr_chunk_bf16_paths_agree(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < 2; i++) paths_compare(&bf16_cases[i], S_BF16, "mma vs generic", 5e-3);
}

/* Value heads wider than the tensor-core kernels take (V = R Vs, Vs in {64, 128}: R heads of Vs
 * columns on those kernels, kernels/cuda/delta/dr_chunk_vsplit.cu): against the f64 recurrence, the
 * first two against the generic kernels forced too, and the launches show that the split and the
 * tensor-core kernels ran (not the generic ones).  The first in every backward variant: the fused
 * qkwy runs once for the R heads of a head (Geom::vsh), the unfused pair per split head. */
static const cfg vsplit_cases[] = {
    {"head, GVA, K=64, V=256 (2 x 128)", 2, 130, 1, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=64, V=192 (3 x 64)", 1, 150, 1, 1, 64, 192, DG_GATE_NONE, 64, 4, {0, 70, 70, 150}, 1, 1, 0},
    {"channel, K=64, V=256 (2 x 128)", 1, 100, 1, 1, 64, 256, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"head, K=128, V=320, some grads (5 x 64)", 1, 70, 1, 1, 128, 320, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 1},
};

static int launches_of(const dg_cuda_ktime *kt, int m, const char *name) {
    for (int j = 0; j < m; j++)
        if (!strcmp(kt[j].name, name)) return kt[j].launches;
    return 0;
}

static void test_dr_chunk_vsplit(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof vsplit_cases / sizeof vsplit_cases[0]; i++) {
        const cfg *c = &vsplit_cases[i];
        for (int st = S_BF16; st <= S_F16; st++) {
            if (st == S_F16 && c->gate == DG_GATE_CHANNEL) continue; /* (KDA in fp16: test_cuda_dr_chunk_kda.c) */
            dg_cuda_ktime kt[32];
            int dropped = -1;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            run_case(c, st, i == 0);
            const int m = dg_cuda_ktime_end(kt, 32, &dropped);
            assert_int_equal(dropped, 0);
            const char *prep = c->gate == DG_GATE_CHANNEL ? "dr_chunk kda prep" : "dr_chunk mma prep";
            if (launches_of(kt, m, "dr_chunk vsplit") == 0 || launches_of(kt, m, prep) == 0)
                fail_msg("%s %s: the split (%d launches) or %s (%d) did not run", c->name, st_names[st],
                         launches_of(kt, m, "dr_chunk vsplit"), prep, launches_of(kt, m, prep));
        }
        if (i < 2) paths_compare(c, S_BF16, "split mma vs generic", 5e-3);
    }
}

/* 128 < K <= 256 in 16-bit storage: the TF32 family (the generic kernels' structure on TF32 tensor
 * cores, dr_chunk_blk_mm.cuh), every gate, against the f64 recurrence in bf16 and fp16 (the
 * tensor-core bounds), every backward variant in bf16 (the fused one runs the pair of kernels where
 * dW and dG do not fit in shared memory: K > 128), against the generic
 * kernels forced; the launches show the TF32 kernels ran, with prep and the state passes (forward
 * and backward; dr_chunk_k256.cu), the output pass and the backward's dqkwg and wy
 * (dr_chunk_k256_bwd.cu) on 16-bit tensor cores where the call's chunk is 64 (K = 192, V = 72 padded
 * to 256 and 128: dr_chunk_pad.cu). */
static const cfg tf32_cases[] = {
    {"tf32: head, GVA, K=256, V=64", 1, 130, 1, 2, 256, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"tf32: none, varlen, K=192, V=72", 1, 100, 1, 1, 192, 72, DG_GATE_NONE, 64, 4, {0, 33, 33, 100}, 1, 1, 0},
    {"tf32: channel, K=256, V=32, C32", 1, 70, 1, 1, 256, 32, DG_GATE_CHANNEL, 32, 0, {0}, 1, 1, 0},
    {"tf32: head, K=256, V=512, T=3, some grads", 2, 3, 1, 1, 256, 512, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 1},
    {"tf32: none, varlen, K=256, V=128", 1, 150, 1, 1, 256, 128, DG_GATE_NONE, 64, 4, {0, 70, 70, 150}, 1, 1, 0},
};

/* whether the TF32 family runs c's prep, state pass, dqkwg and wy on 16-bit tensor cores (k256_ok):
 * chunk 64, K and V padded to K = 256 and a multiple of 64 where they are not (dr_chunk_pad.cu) */
static int k256_case(const cfg *c) { return c->K > 128 && c->chunk == 64; }

/* the backward's dqkwg and wy of the launches kt[0, m): the 16-bit ones (dr_chunk_k256_bwd.cu) in a
 * k256 case and no TF32 ones, else the reverse (the TF32 pair or the fused kernel) */
static void k256_bwd_ran(const cfg *c, int st, const dg_cuda_ktime *kt, int m) {
    const int k16 = launches_of(kt, m, "dr_chunk k256 dqkwg") + launches_of(kt, m, "dr_chunk k256 wy");
    const int k32 = launches_of(kt, m, "dr_chunk tf32 dqkwg") + launches_of(kt, m, "dr_chunk tf32 wy") +
                    launches_of(kt, m, "dr_chunk tf32 bwd fused");
    if (k256_case(c) ? (launches_of(kt, m, "dr_chunk k256 dqkwg") == 0 || launches_of(kt, m, "dr_chunk k256 wy") == 0 ||
                        k32 != 0)
                     : (k16 != 0 || k32 == 0))
        fail_msg("%s %s: dqkwg and wy ran %d times on 16-bit tensor cores, %d on TF32 (k256 case: %d)", c->name,
                 st_names[st], k16, k32, k256_case(c));
}

static void test_dr_chunk_tf32(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof tf32_cases / sizeof tf32_cases[0]; i++) {
        const cfg *c = &tf32_cases[i];
        for (int st = S_BF16; st <= S_F16; st++) {
            dg_cuda_ktime kt[32];
            int dropped = -1;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            run_case(c, st, st == S_BF16 && i < 3);
            const int m = dg_cuda_ktime_end(kt, 32, &dropped);
            assert_int_equal(dropped, 0);
            /* the state passes, forward and backward, and the output pass: the 16-bit kernel or the TF32 one */
            static const char *const passes[][2] = {{"dr_chunk k256 state", "dr_chunk tf32 state"},
                                                    {"dr_chunk k256 dhu", "dr_chunk tf32 dhu"},
                                                    {"dr_chunk k256 out", "dr_chunk tf32 out"}};
            for (int ps = 0; ps < 3; ps++) {
                const char *want = passes[ps][!k256_case(c)], *other = passes[ps][k256_case(c)];
                if (launches_of(kt, m, want) == 0 || launches_of(kt, m, other) != 0)
                    fail_msg("%s %s: %s did not run (%d), or %s did (%d)", c->name, st_names[st], want,
                             launches_of(kt, m, want), other, launches_of(kt, m, other));
            }
            if (launches_of(kt, m, "dr_chunk state") != 0 || launches_of(kt, m, "dr_chunk dhu") != 0 ||
                launches_of(kt, m, "dr_chunk out") != 0)
                fail_msg("%s %s: a generic pass ran (state %d, dhu %d, out %d)", c->name, st_names[st],
                         launches_of(kt, m, "dr_chunk state"), launches_of(kt, m, "dr_chunk dhu"),
                         launches_of(kt, m, "dr_chunk out"));
            k256_bwd_ran(c, st, kt, m);
            if ((launches_of(kt, m, "dr_chunk pad") != 0) != (k256_case(c) && (c->K != 256 || c->V % 64 != 0)))
                fail_msg("%s %s: the padding ran %d times", c->name, st_names[st], launches_of(kt, m, "dr_chunk pad"));
        }
        paths_compare(c, S_BF16, "tf32 vs generic", 5e-3);
    }
}

/* The forward of c (bf16) with q, o and the gate g as views that start qoff, ooff, goff elements
 * into their buffers: family fam runs it, the kernel want among its launches, and o, hT stay within
 * the bf16 bound of the f64 recurrence. */
static void fwd_offset_views(const cfg *c, int qoff, int ooff, int goff, int fam, const char *want) {
    data d;
    make(c, S_BF16, &d);
    res ref, got;
    res_alloc(c, &d, &ref), res_alloc(c, &d, &got);
    ref_f64(&d, &ref);
    uint16_t *hq = malloc(sizeof(uint16_t) * (size_t)(d.nq + qoff)),
             *ho = malloc(sizeof(uint16_t) * (size_t)(d.nv + ooff));
    for (int64_t i = 0; i < d.nq; i++) hq[i + qoff] = dg_bf16_from_f32((float)d.q[i]);
    uint16_t *q1 = dput(hq, d.nq + qoff, 2), *o1 = dput(NULL, d.nv + ooff, 2);
    void *k = dput_as(d.k, d.nq, S_BF16), *v = dput_as(d.v, d.nv, S_BF16), *beta = dput_as(d.beta, d.nb, S_BF16);
    float *hg = malloc(sizeof(float) * (size_t)(d.ng + goff));
    for (int64_t i = 0; i < d.ng; i++) hg[i + goff] = (float)d.g[i];
    float *g1 = dput(hg, d.ng + goff, 4), *h0 = dput_as(d.h0, d.nh, S_F32), *hT = dput(NULL, d.nh, 4);
    dg_delta_call call = {.op = "test",
                          .s = d.s,
                          .dtype = DG_BF16,
                          .device = DG_CUDA,
                          .q = q1 + qoff,
                          .k = k,
                          .v = v,
                          .g = g1 + goff,
                          .beta = beta,
                          .h0 = h0,
                          .o = o1 + ooff,
                          .hT = hT};
    assert_int_equal(drc_family_of(&call), fam);
    dg_cuda_ktime kt[32];
    int dropped = -1;
    assert_int_equal(dg_cuda_ktime_begin(), 0);
    assert_int_equal(drc_fwd(&call), 0);
    const int m = dg_cuda_ktime_end(kt, 32, &dropped);
    assert_int_equal(dropped, 0);
    if (launches_of(kt, m, want) == 0) fail_msg("%s: %s did not run", c->name, want);
    assert_int_equal(dg_cuda_memcpy(ho, o1, sizeof(uint16_t) * (size_t)(d.nv + ooff), 1), 0);
    for (int64_t i = 0; i < d.nv; i++) got.x[R_O][i] = dg_bf16_to_f32(ho[i + ooff]);
    float *hh = malloc(sizeof(float) * (size_t)d.nh);
    assert_int_equal(dg_cuda_memcpy(hh, hT, sizeof(float) * (size_t)d.nh, 1), 0);
    for (int64_t i = 0; i < d.nh; i++) got.x[R_HT][i] = hh[i];
    double eo = dg_test_rel_err_norm(got.x[R_O], ref.x[R_O], d.nv),
           eh = dg_test_rel_err_norm(got.x[R_HT], ref.x[R_HT], d.nh);
    printf("  %-44s o %.1e hT %.1e\n", c->name, eo, eh);
    if (!(eo <= 5e-3) || !(eh <= 5e-3)) fail_msg("%s: o %.3e, hT %.3e", c->name, eo, eh);
    free(hq), free(ho), free(hh), free(hg);
    dg_cuda_free(q1), dg_cuda_free(o1), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta);
    dg_cuda_free(g1), dg_cuda_free(h0), dg_cuda_free(hT);
    res_free(&ref), res_free(&got), data_free(&d);
}

/* views that start one element into their buffer (not 16-byte aligned) take the tensor-core kernels
 * on aligned copies (dr_chunk_pad.cu), within the same bound; at K = 256 the 16-bit kernels of the
 * TF32 family (an unaligned q would leave the call to its TF32 kernels).  KDA's per-channel gate
 * (f32) is read where it lies: 16-byte copies where aligned, else 4-byte loads (gate_load_async). */
static void test_dr_chunk_bf16_unaligned(void **state) {
    (void)state;
    dg_test_require_cuda();
    const cfg c = {"head, K=V=64, unaligned views", 1, 70, 1, 1, 64, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0};
    fwd_offset_views(&c, 1, 1, 0, DG_DRC_MMA, "dr_chunk pad");
    fwd_offset_views(&c, 1, 1, 0, DG_DRC_MMA, "dr_chunk mma out");
    const cfg w = {"head, K=256, V=64, unaligned views", 1, 70, 1, 1, 256, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0};
    fwd_offset_views(&w, 1, 1, 0, DG_DRC_TF32, "dr_chunk pad");
    fwd_offset_views(&w, 1, 1, 0, DG_DRC_TF32, "dr_chunk k256 out");
    const cfg kg = {"channel, K=V=64, gate view 4 bytes in", 1, 70, 1, 1, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 0};
    fwd_offset_views(&kg, 0, 0, 1, DG_DRC_KDA_MMA, "dr_chunk kda prep");
    fwd_offset_views(&kg, 0, 0, 0, DG_DRC_KDA_MMA, "dr_chunk kda prep");
}

/* y [A, Bd, Cd] from x [A, Bs, Cs]: x's entries where they exist, zeros elsewhere (padding when Bd >=
 * Bs and Cd >= Cs, the leading block when smaller); NULL for NULL */
static double *box(const double *x, int64_t A, int64_t Bs, int64_t Cs, int64_t Bd, int64_t Cd) {
    if (!x) return NULL;
    const int64_t n = A * Bd * Cd;
    double *y = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    for (int64_t a = 0; a < A; a++)
        for (int64_t b = 0; b < Bs && b < Bd; b++)
            for (int64_t c = 0; c < Cs && c < Cd; c++) y[(a * Bd + b) * Cd + c] = x[(a * Bs + b) * Cs + c];
    return y;
}

/* the dimensions [A, B, C] of each input and result of case c with K, V as given (B = 1 but for the
 * states): q, k and the per-channel gate's rows of K, v and dout rows of V, the states K x V */
typedef struct dims3 {
    int64_t A, B, C;
} dims3;
enum { I_Q, I_K, I_V, I_G, I_DOUT, I_H0, I_DHT, I_N };
static dims3 in_dims(const cfg *c, const data *d, int i, int64_t K, int64_t V) {
    const int64_t BT = c->B * c->T, NH = d->s.N * c->HV;
    const int64_t gs = c->gate == DG_GATE_CHANNEL ? K : 1;
    const dims3 t[I_N] = {{BT * c->H, 1, K},  {BT * c->H, 1, K}, {BT * c->HV, 1, V}, {BT * c->HV, 1, gs},
                          {BT * c->HV, 1, V}, {NH, K, V},        {NH, K, V}};
    return t[i];
}
static dims3 res_dims(const cfg *c, const data *d, int a, int64_t K, int64_t V) {
    static const int of[R_N] = {I_V, I_H0, I_Q, I_K, I_V, I_G, -1, I_H0};
    if (of[a] < 0) return (dims3){c->B * c->T * c->HV, 1, 1}; /* dbeta */
    return in_dims(c, d, of[a], K, V);
}

/* K and V the tensor-core kernels do not take as they are, padded with zeros to theirs
 * (kernels/cuda/delta/dr_chunk_pad.cu), every gate and family, bf16 and fp16: the results are the
 * same bits as the unpadded entries of the padded shape's call on the inputs padded by hand (the
 * padding is exact); where the padded shape is K <= 128, against the f64 recurrence too, every
 * backward variant for the first, and the first two against the generic kernels forced.  (At K >
 * 128 the padded shape is K = 256, whose kernels test_dr_chunk_tf32 and test_kda_k256 bound against
 * f64 on their draws; the margin of their dg over other draws: docs/PERF.md, "What is not met".)
 * The launches show the padding and the family's prep (the padded V = 200 of the
 * second as two heads of 128). */
static const cfg pad_cases[] = {
    {"pad: head, GVA, K=96, V=80 (to 128, 128)", 1, 130, 1, 2, 96, 80, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"pad: none, varlen, K=32, V=200 (64, 256)", 1, 150, 1, 1, 32, 200, DG_GATE_NONE, 64, 4, {0, 70, 70, 150}, 1, 1, 0},
    {"pad: channel, K=100, V=48, some grads (to 128, 64)", 1, 100, 1, 1, 100, 48, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 1},
    {"pad: head, K=160, V=96 (to 256, 128)", 1, 100, 1, 1, 160, 96, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"pad: channel, GVA, K=200, V=40 (to 256, 64)", 1, 130, 1, 2, 200, 40, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    /* one of the two padded: the arrays without it are used as they are */
    {"pad: head, K=128, V=96 (V to 128)", 1, 100, 1, 1, 128, 96, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"pad: channel, GVA, K=48, V=128 (K to 64)", 1, 100, 1, 2, 48, 128, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
};

/* case c in storage st through the padding, and its inputs padded by hand to Kp, Vp through the
 * padded shape's own call: the same bits on the unpadded entries */
static void pad_same_bits(const cfg *c, int st, int64_t Kp, int64_t Vp) {
    data d, dp;
    make(c, st, &d);
    cfg cp = *c;
    cp.K = Kp, cp.V = Vp;
    dp = d;
    dp.s.K = Kp, dp.s.V = Vp;
    double *const *src[I_N] = {&d.q, &d.k, &d.v, &d.g, &d.dout, &d.h0, &d.dhT};
    double **dst[I_N] = {&dp.q, &dp.k, &dp.v, &dp.g, &dp.dout, &dp.h0, &dp.dhT};
    for (int i = 0; i < I_N; i++) {
        const dims3 a = in_dims(c, &d, i, c->K, c->V), b = in_dims(c, &d, i, Kp, Vp);
        *dst[i] = box(*src[i], a.A, a.B, a.C, b.B, b.C);
    }
    dp.beta = box(d.beta, d.nb, 1, 1, 1, 1);
    dp.rq = dp.rk = NULL;
    dp.nq = in_dims(c, &d, I_Q, Kp, Vp).A * Kp, dp.nv = in_dims(c, &d, I_V, Kp, Vp).A * Vp;
    dp.ng = c->gate == DG_GATE_CHANNEL ? in_dims(c, &d, I_G, Kp, Vp).A * Kp : d.ng;
    dp.nh = in_dims(c, &d, I_H0, Kp, Vp).A * Kp * Vp;
    res got, want;
    res_alloc(c, &d, &got), res_alloc(&cp, &dp, &want);
    run_gpu(&d, st, &var_default, &got);
    run_gpu(&dp, st, &var_default, &want);
    for (int a = 0; a < R_N; a++) {
        if (!got.x[a]) continue;
        const dims3 u = res_dims(c, &d, a, c->K, c->V), p = res_dims(c, &d, a, Kp, Vp);
        double *w = box(want.x[a], p.A, p.B, p.C, u.B, u.C);
        for (int64_t i = 0; i < got.n[a]; i++)
            if (!(got.x[a][i] == w[i]) && !(isnan(got.x[a][i]) && isnan(w[i])))
                fail_msg("%s %s: %s[%lld] is %.9g padded, %.9g by the padded shape's call", c->name, st_names[st],
                         r_names[a], (long long)i, got.x[a][i], w[i]);
        free(w);
    }
    res_free(&got), res_free(&want), data_free(&d), data_free(&dp);
}

static void test_dr_chunk_pad(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof pad_cases / sizeof pad_cases[0]; i++) {
        const cfg *c = &pad_cases[i];
        const int64_t Kp = c->K <= 64 ? 64 : c->K <= 128 ? 128 : 256, Vp = (c->V + 63) / 64 * 64;
        for (int st = S_BF16; st <= S_F16; st++) {
            dg_cuda_ktime kt[64];
            int dropped = -1;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            pad_same_bits(c, st, Kp, Vp);
            const int m = dg_cuda_ktime_end(kt, 64, &dropped);
            assert_int_equal(dropped, 0);
            const char *prep = c->K > 128                   ? "dr_chunk k256 prep"
                               : c->gate == DG_GATE_CHANNEL ? "dr_chunk kda prep"
                                                            : "dr_chunk mma prep";
            if (launches_of(kt, m, "dr_chunk pad") == 0 || launches_of(kt, m, prep) == 0 ||
                (i == 1 && launches_of(kt, m, "dr_chunk vsplit") == 0))
                fail_msg("%s %s: the padding (%d launches), %s (%d) or the split (%d) did not run", c->name,
                         st_names[st], launches_of(kt, m, "dr_chunk pad"), prep, launches_of(kt, m, prep),
                         launches_of(kt, m, "dr_chunk vsplit"));
            if (c->K <= 128) run_case(c, st, i == 0 && st == S_BF16);
        }
        if (i < 2) paths_compare(c, S_BF16, "padded mma vs generic", 5e-3);
    }
}

/* the tensor-core path over long sequences (the benchmark's S2 has T = 8192): the bf16 error of
 * the outputs and every gradient against the f64 recurrence, the same 5e-3 bound, where the state
 * has been carried across 128 chunks (errors of the stored intermediates accumulate with T) */
static void test_dr_chunk_bf16_long(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg longs[] = {
        {"head, K=V=128, T=8192 (mma)", 1, 8192, 1, 1, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"none, K=V=128, T=8192 (mma)", 1, 8192, 1, 1, 128, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        /* many (sequence, head) pairs: the state passes take 64 value columns a block (fewer
         * take 32, as every case above on a GPU of up to 272 multiprocessors) */
        {"head, H=HV=136, K=V=128, T=70 (mma)", 1, 70, 136, 136, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++) run_case(&longs[i], S_BF16, 0);
    run_case(&longs[0], S_F16, 0); /* the fp16 build of the same kernels */
}

/* Short sequences over many random draws (the tensor-core path, bf16): with T = 1 the outputs are
 * a few values each (dbeta 3), so one unlucky rounding moves the relative error norm most; the
 * plain (single bf16 word) intermediates were chosen by the worst of such draws
 * (dr_chunk_mma.cuh).  The worst error of each output over the draws, printed, must stay <= 5e-3. */
static void test_dr_chunk_bf16_draws(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const struct {
        cfg c;
        int draws;
    } cases[] = {
        {{"head, K=64, V=128, T=1", 3, 1, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 40},
        {{"none, K=64, V=128, T=1", 3, 1, 1, 1, 64, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 40},
        {{"head, K=V=128, T=130", 1, 130, 1, 1, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 12},
        {{"none, K=V=128, T=130", 1, 130, 1, 1, 128, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 12},
        /* two heads of V = 128 (dr_chunk_vsplit.cu): dbeta is their two bf16 words summed and
         * rounded again */
        {{"head, K=64, V=256, T=1 (split)", 3, 1, 1, 1, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 40},
        {{"none, K=64, V=256, T=1 (split)", 3, 1, 1, 1, 64, 256, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 40},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const cfg *c = &cases[ci].c;
        double worst[R_N]; /* -1: not an output of this case */
        for (int a = 0; a < R_N; a++) worst[a] = -1;
        for (int dr = 0; dr < cases[ci].draws; dr++) {
            data d;
            make(c, S_BF16, &d);
            res ref, got;
            res_alloc(c, &d, &ref), res_alloc(c, &d, &got);
            ref_f64(&d, &ref);
            run_gpu(&d, S_BF16, &var_default, &got);
            for (int a = 0; a < R_N; a++) {
                if (!ref.x[a]) continue;
                const double e = dg_test_rel_err_norm(got.x[a], ref.x[a], ref.n[a]);
                if (!isnan(worst[a]) && !(e <= worst[a])) worst[a] = e; /* (a NaN sticks) */
            }
            res_free(&ref), res_free(&got), data_free(&d);
        }
        char msg[256];
        int off = snprintf(msg, sizeof msg, "  %-30s worst of %2d:", c->name, cases[ci].draws);
        for (int a = 0; a < R_N; a++)
            if (worst[a] != -1) off += snprintf(msg + off, sizeof msg - (size_t)off, " %s %.1e", r_names[a], worst[a]);
        printf("%s\n", msg);
        for (int a = 0; a < R_N; a++)
            if (!(worst[a] <= 5e-3))
                fail_msg("%s: %s relative error %.3e > 5e-3 in one of %d draws", c->name, r_names[a], worst[a],
                         cases[ci].draws);
    }
}

/* fp16: every gate kind, chunk 16/32/64, GVA, cu_seqlens with an empty sequence, T = 1, K = 200,
 * a partial V tile, some gradients only.  The first two and the last (K = 8, V = 300 padded to 64
 * and 320, five heads of 64) take the head-gate tensor-core kernels (their fp16 build), the fourth
 * KDA's. */
static const cfg f16_cases[] = {
    {"head, GVA, K=V=128 (bf16 mma shape)", 2, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=V=64 (bf16 mma shape)",
     1,
     200,
     1,
     2,
     64,
     64,
     DG_GATE_NONE,
     64,
     5,
     {0, 64, 64, 130, 200},
     1,
     1,
     0},
    {"channel, varlen, C16", 1, 77, 1, 2, 48, 40, DG_GATE_CHANNEL, 16, 5, {0, 5, 5, 50, 77}, 1, 1, 0},
    {"channel, GVA, K=V=64 (bf16 kda shape)", 1, 100, 1, 2, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"head, C32, some grads", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 32, 0, {0}, 1, 0, 1},
    {"none, K=200, C32", 1, 40, 1, 1, 200, 33, DG_GATE_NONE, 32, 0, {0}, 1, 1, 0},
    {"channel, T=1, C16", 3, 1, 1, 1, 16, 8, DG_GATE_CHANNEL, 16, 0, {0}, 1, 1, 0},
    {"head, K=8, V=300, GVA, C64", 1, 70, 1, 3, 8, 300, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
};

static void test_dr_chunk_f16(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof f16_cases / sizeof f16_cases[0]; i++)
        run_case(&f16_cases[i], S_F16, i == 1 || i == 2);
}

/* fp16 on the tensor-core kernels (head gate, no gate, KDA) and on the generic ones, same inputs:
 * within both bounds */
static void test_dr_chunk_f16_paths(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const int which[3] = {0, 1, 3};
    for (int i = 0; i < 3; i++) paths_compare(&f16_cases[which[i]], S_F16, "mma vs generic", F16_MMA_TOL + F16_TOL);
}

/* The L2 norm's backward taken by the chunk backward (rq, rk given): dq, dk of the raw rows against
 * the f64 reference's dq, dk put through the same formula, dx = r (dy - xn (dy . xn)) with xn the
 * stored q, k and r drawn in [0.5, 2]; bf16 and fp16, on the head-gate tensor-core kernels (folded
 * into their dq, dk stores), with grouped value heads (after the sums over value heads), on the
 * generic kernels, on KDA's (folded into qkwy's stores, fused and unfused the same bits) and at
 * K = 256 (into the kernels' own stores, or after the sums); the same bounds as without it. */
static void test_dr_chunk_l2_fold(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"l2 fold: head, K=V=128 (mma, direct)", 1, 130, 2, 2, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: none, GVA, K=V=64 (mma, after the sums)", 1, 100, 1, 2, 64, 64, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: head, C32 (generic)", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 32, 0, {0}, 1, 1, 0},
        {"l2 fold: channel, K=V=64 (kda)", 1, 100, 1, 1, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
        /* value heads split (dr_chunk_vsplit.cu): the fused qkwy sums the split heads in its
         * accumulators and folds the norm into its stores */
        {"l2 fold: head, K=64, V=256 (split, direct)", 1, 100, 2, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: channel, K=64, V=192 (kda split)", 1, 100, 1, 1, 64, 192, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
        /* K = 256 (dr_chunk_k256_bwd.cu): dqkwg and wy store dq, dk themselves where a key head has
         * one value head, else heads_sum makes them */
        {"l2 fold: head, K=256, V=128 (k256, direct)", 1, 100, 2, 2, 256, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        /* K, V padded (dr_chunk_pad.cu) */
        {"l2 fold: none, GVA, K=32, V=48 (padded)", 1, 130, 2, 4, 32, 48, DG_GATE_NONE, 64, 0, {0}, 0, 0, 0},
        {"l2 fold: none, GVA, K=256, V=64 (k256, after the sums)",
         1,
         70,
         1,
         2,
         256,
         64,
         DG_GATE_NONE,
         64,
         0,
         {0},
         1,
         1,
         0},
    };
    for (int st = S_BF16; st <= S_F16; st++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const cfg *c = &cases[ci];
            data d;
            make(c, st, &d);
            const int64_t nr = c->B * c->T * c->H;
            d.rq = rnd(nr, 0.5, 2), d.rk = rnd(nr, 0.5, 2);
            for (int64_t i = 0; i < nr; i++) d.rq[i] = (float)d.rq[i], d.rk[i] = (float)d.rk[i];
            res ref, got;
            res_alloc(c, &d, &ref), res_alloc(c, &d, &got);
            ref_f64(&d, &ref);
            for (int w = 0; w < 2; w++) { /* the reference's dq, dk of the raw rows */
                double *dy = ref.x[w ? R_DK : R_DQ];
                const double *xn = w ? d.k : d.q, *r = w ? d.rk : d.rq;
                for (int64_t i = 0; dy && i < nr; i++) {
                    double dot = 0;
                    for (int64_t cc = 0; cc < c->K; cc++) dot += dy[i * c->K + cc] * xn[i * c->K + cc];
                    for (int64_t cc = 0; cc < c->K; cc++)
                        dy[i * c->K + cc] = r[i] * (dy[i * c->K + cc] - xn[i * c->K + cc] * dot);
                }
            }
            dg_cuda_ktime kt[64];
            int dropped = -1;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            run_gpu(&d, st, &var_default, &got);
            const int m = dg_cuda_ktime_end(kt, 64, &dropped);
            assert_int_equal(dropped, 0);
            /* at K = 256 the sums over value heads (and the norm's backward with them) run only
             * where a key head has several value heads */
            const int sums = launches_of(kt, m, "dr_chunk gva");
            if (c->K == 256 && (c->HV == c->H) != (sums == 0))
                fail_msg("%s %s: heads_sum ran %d times, H %d, HV %d", c->name, st_names[st], sums, (int)c->H,
                         (int)c->HV);
            char what[160];
            snprintf(what, sizeof what, "%s: %s", c->name, st_names[st]);
            check(what, &got, &ref, st == S_BF16 ? 5e-3 : f16_mma(c) ? F16_MMA_TOL : F16_TOL);
            /* KDA with one value head a key head folds the norm's backward into qkwy's dq and dk
             * stores: the unfused pair of kernels (dqkwg, wy) gives the fused kernel's bits */
            if (c->gate == DG_GATE_CHANNEL && c->H == c->HV && c->V <= 128) {
                static const dg_dr_variant unfused = {1, 0, 1};
                res un;
                res_alloc(c, &d, &un);
                run_gpu(&d, st, &unfused, &un);
                for (int a = 0; a < R_N; a++)
                    for (int64_t i = 0; un.x[a] && i < un.n[a]; i++)
                        if (!(un.x[a][i] == got.x[a][i]))
                            fail_msg("%s: %s[%lld] is %.9g unfused, %.9g fused", what, r_names[a], (long long)i,
                                     un.x[a][i], got.x[a][i]);
                res_free(&un);
            }
            res_free(&ref), res_free(&got), data_free(&d);
        }
}

/* The forward with the L2 norm in it (the call's l2): where the tensor-core kernels normalise k and
 * q as they load them, every output -- o, hT, the normalised q and k, their 1/|x|, the kept working
 * set -- is bit for bit that of the norm's kernel run first (the call's l2_norm_first:
 * dg_cuda_dr_l2norm_*_fwd, then the forward), bf16 and fp16, with
 * grouped value heads (one value head writes a key head's rows), cu_seqlens with an empty sequence
 * and partial chunks, h0, the value split, KDA (whose prep normalises both), and a path that always
 * runs the norm first (the generic kernels at chunk 32).  The normalised rows are also checked against the host: 1/|x| to
 * 1e-6 and each value to one rounding. */
static void test_dr_chunk_l2_fused(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"l2 fused: head, GVA, K=V=128, h0 (mma)", 1, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: none, GVA, varlen, K=V=64 (mma)",
         1,
         200,
         1,
         2,
         64,
         64,
         DG_GATE_NONE,
         64,
         4,
         {0, 70, 70, 200},
         0,
         0,
         0},
        {"l2 fused: head, B2, K=128, V=64 (mma)", 2, 90, 1, 1, 128, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: head, K=64, V=256 (split)", 1, 100, 2, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 0, 0, 0},
        {"l2 fused: none, GVA, K=32, V=48 (padded)", 1, 130, 2, 4, 32, 48, DG_GATE_NONE, 64, 0, {0}, 0, 0, 0},
        {"l2 fused: channel, K=V=64 (kda)", 1, 100, 1, 1, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: channel, GVA, K=V=128 (kda)", 1, 130, 2, 4, 128, 128, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: head, C32, K=64 (generic: norm first)", 1, 70, 1, 1, 64, 48, DG_GATE_HEAD, 32, 0, {0}, 0, 0, 0},
    };
    const double eps = 1e-6;
    for (int st = S_BF16; st <= S_F16; st++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const cfg *c = &cases[ci];
            data d;
            make(c, st, &d);
            for (int64_t i = 0; i < d.nq; i++) d.k[i] = stored(st, 3.0 * d.k[i]); /* raw rows, |k| = 3 */
            const int64_t nr = c->B * c->T * c->H;
            void *q = dput_as(d.q, d.nq, st), *k = dput_as(d.k, d.nq, st), *v = dput_as(d.v, d.nv, st);
            void *beta = dput_as(d.beta, d.nb, st);
            float *g = dput_as(d.g, d.ng, 0), *h0 = dput_as(d.h0, d.nh, 0);
            dg_delta_call fc = {.op = "test",
                                .s = d.s,
                                .dtype = st == S_BF16 ? DG_BF16 : DG_F16,
                                .device = DG_CUDA,
                                .v = v,
                                .g = g,
                                .beta = beta,
                                .h0 = h0,
                                .l2 = {.on = true, .qraw = q, .kraw = k}};
            const int64_t kb = drc_kept_bytes(&fc);
            assert_true(kb >= 0);
            /* [0]: fused, [1]: the norm's kernel first, [2]: fused without qn, rq, rk, keep */
            void *o[3], *qn[3], *kn[3], *keep[3];
            float *hT[3], *rq[3], *rk[3];
            bool kept[3] = {false, false, false};
            for (int r = 0; r < 3; r++) {
                o[r] = dput(NULL, d.nv, 2), hT[r] = dput(NULL, d.nh, 4), kn[r] = dput(NULL, d.nq, 2);
                qn[r] = r < 2 ? dput(NULL, d.nq, 2) : NULL;
                rq[r] = r < 2 ? dput(NULL, nr, 4) : NULL, rk[r] = r < 2 ? dput(NULL, nr, 4) : NULL;
                keep[r] = r < 2 && kb > 0 ? dput(NULL, kb, 1) : NULL;
                fc.q = qn[r], fc.k = kn[r], fc.o = o[r], fc.hT = hT[r], fc.keep = keep[r];
                fc.l2.rq = rq[r], fc.l2.rk = rk[r], fc.l2.for_bwd = r < 2, fc.l2_norm_first = r == 1;
                dg_cuda_ktime kt[32];
                int dropped = -1;
                assert_int_equal(dg_cuda_ktime_begin(), 0);
                const int rc = drc_fwd(&fc);
                const int m = dg_cuda_ktime_end(kt, 32, &dropped);
                kept[r] = fc.kept;
                if (rc) fail_msg("%s (%s), run %d: %s", c->name, st_names[st], r, dg_last_error());
                /* the fused runs launch no norm kernel of their own (the host emulation times it as
                 * "dr_chunk l2norm"; on a GPU the norm's kernel, dr_pieces.cu, is not timed) */
                if (r != 1 && !strstr(c->name, "padded") && !strstr(c->name, "norm first") &&
                    launches_of(kt, m, "dr_chunk l2norm") != 0)
                    fail_msg("%s (%s), run %d: the norm's kernel ran", c->name, st_names[st], r);
            }
            assert_int_equal(dg_cuda_synchronize(), 0);
            assert_int_equal(kept[0], kept[1]);
            struct {
                const char *name;
                void *const *p;
                size_t bytes;
                int runs;
            } out[] = {
                {"o", o, (size_t)d.nv * 2, 3},
                {"hT", (void *const *)hT, (size_t)d.nh * 4, 3},
                {"kn", kn, (size_t)d.nq * 2, 3},
                {"qn", qn, (size_t)d.nq * 2, 2},
                {"rq", (void *const *)rq, (size_t)nr * 4, 2},
                {"rk", (void *const *)rk, (size_t)nr * 4, 2},
                {"keep", keep, (size_t)kb, kb > 0 ? 2 : 0},
            };
            for (size_t a = 0; a < sizeof out / sizeof out[0]; a++) {
                if (out[a].runs == 0) continue;
                void *ref = dget(out[a].p[1], out[a].bytes);
                for (int r = 0; r < out[a].runs; r += r == 0 ? 2 : 1) {
                    void *got = dget(out[a].p[r], out[a].bytes);
                    if (memcmp(got, ref, out[a].bytes))
                        fail_msg("%s (%s): %s of run %d differs from the norm's kernel first", c->name, st_names[st],
                                 out[a].name, r);
                    free(got);
                }
                free(ref);
            }
            /* the normalised rows against the host */
            uint16_t *hq = dget(qn[0], (size_t)d.nq * 2), *hk = dget(kn[0], (size_t)d.nq * 2);
            float *hrq = dget(rq[0], (size_t)nr * 4), *hrk = dget(rk[0], (size_t)nr * 4);
            for (int w = 0; w < 2; w++) {
                const double *x = w ? d.k : d.q;
                const uint16_t *y = w ? hk : hq;
                const float *rr = w ? hrk : hrq;
                for (int64_t i = 0; i < nr; i++) {
                    double n2 = 0;
                    for (int64_t cc = 0; cc < c->K; cc++) n2 += x[i * c->K + cc] * x[i * c->K + cc];
                    const double r = 1.0 / sqrt(n2 + eps);
                    if (fabs(rr[i] - r) > 1e-6 * r)
                        fail_msg("%s: 1/|x| of row %lld: %g, host %g", c->name, (long long)i, rr[i], r);
                    for (int64_t cc = 0; cc < c->K; cc++) {
                        const double want = x[i * c->K + cc] * r, got = from16(st, y[i * c->K + cc]);
                        /* one rounding (a unit in the last place: rsqrtf's own error too), fp16's
                         * subnormals below 2^-14 to 2^-25 */
                        if (fabs(got - want) >
                            (st == S_BF16 ? 0x1p-8 : 0x1p-11) * fabs(want) + (st == S_F16 ? 0x1p-25 : 0))
                            fail_msg("%s (%s): %s[%lld, %lld] = %g, host %g", c->name, st_names[st], w ? "kn" : "qn",
                                     (long long)i, (long long)cc, got, want);
                    }
                }
            }
            free(hq), free(hk), free(hrq), free(hrk);
            for (int r = 0; r < 3; r++)
                dg_cuda_free(o[r]), dg_cuda_free(hT[r]), dg_cuda_free(qn[r]), dg_cuda_free(kn[r]), dg_cuda_free(rq[r]),
                    dg_cuda_free(rk[r]), dg_cuda_free(keep[r]);
            dg_cuda_free(q), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta), dg_cuda_free(g), dg_cuda_free(h0);
            data_free(&d);
        }
}

/* small shapes through every kernel (generic and tensor-core, fused and unfused, both inverses,
 * both dg variants): the test to run under compute-sanitizer */
static void test_dr_chunk_sanitize(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"sanitize: channel, varlen, GVA, C16", 1, 40, 1, 2, 24, 40, DG_GATE_CHANNEL, 16, 4, {0, 7, 7, 40}, 1, 1, 0},
        {"sanitize: head, C32", 1, 40, 1, 1, 16, 72, DG_GATE_HEAD, 32, 0, {0}, 1, 1, 0},
    };
    static const cfg fast[] = {
        /* sequences of four chunks: the backward state pass's two slots are each filled twice */
        {"sanitize: head, varlen, K=V=64 (mma)", 1, 230, 1, 2, 64, 64, DG_GATE_HEAD, 64, 3, {0, 30, 230}, 1, 1, 0},
        {"sanitize: none, K=128, V=64 (mma)", 1, 200, 1, 1, 128, 64, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        /* V = 128: two value tiles per block of the state and output passes */
        {"sanitize: head, B2, K=64, V=128 (mma)", 2, 80, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        /* as many chains as the GPU has SMs (2 x 33 x 128 / 64 >= 132): both state passes in 64
         * value columns a block (state_bv, dhu_bv: U from device memory in f_state), four chunks */
        {"sanitize: head, B2, H33, K=64, V=128 (mma)", 2, 200, 33, 33, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    };
    /* a value head as three of 64 columns (dr_chunk_vsplit.cu: its moves around the kernels) */
    static const cfg split = {"sanitize: head, GVA, varlen, K=64, V=192 (3 x 64)",
                              1,
                              140,
                              1,
                              2,
                              64,
                              192,
                              DG_GATE_HEAD,
                              64,
                              3,
                              {0, 70, 140},
                              1,
                              1,
                              0};
    /* without a gate at K = 64 the qkwy blocks have 8 warps (qkwy_launch): a head each, and a head
     * of three of 64 columns in one fused block (per head in the unfused pair); every variant */
    static const cfg none64[] = {
        {"sanitize: none, GVA, K=V=64 (mma)", 1, 70, 1, 2, 64, 64, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        {"sanitize: none, K=64, V=192 (3 x 64)", 1, 70, 1, 1, 64, 192, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
    };
    /* K and V padded to the tensor-core kernels' (dr_chunk_pad.cu: its copies around the kernels) */
    static const cfg pad = {
        "sanitize: head, GVA, K=96, V=40 (to 128, 64)", 1, 70, 1, 2, 96, 40, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0};
    /* the TF32 family (chunks other than 64): partial tiles of V (40 of 64), a partial chunk, both
     * backward kernels' forms */
    static const cfg tf32[] = {
        {"sanitize: tf32 head, GVA, K=256, V=40, C32", 1, 70, 1, 2, 256, 40, DG_GATE_HEAD, 32, 0, {0}, 1, 1, 0},
        {"sanitize: tf32 channel, varlen, C32", 1, 50, 1, 1, 160, 24, DG_GATE_CHANNEL, 32, 3, {0, 20, 50}, 1, 1, 0},
    };
    static const dg_dr_variant v000 = {0, 0, 0};
    run_case(&tf32[0], S_BF16, 1);
    run_case(&tf32[1], S_F16, 1);
    run_case(&cases[0], S_F16, 0); /* fp16: the generic kernels' f16bits loads and stores */
    run_case(&fast[0], S_F16, 0);  /* and the fp16 build of the tensor-core kernels */
    run_case(&split, S_BF16, 0);
    run_case(&none64[0], S_BF16, 1);
    run_case(&none64[1], S_BF16, 1);
    run_case(&pad, S_BF16, 0);
    for (int i = 0; i < 4; i++) {
        for (int bf = 0; bf < 2; bf++) {
            if (!bf && i >= 2) continue;
            const cfg *c = bf ? &fast[i] : &cases[i];
            data d;
            make(c, bf, &d);
            res ref, got;
            res_alloc(c, &d, &ref);
            ref_f64(&d, &ref);
            for (int vi = 0; vi < 2; vi++) {
                res_alloc(c, &d, &got);
                run_gpu(&d, bf, vi ? &v000 : &var_default, &got);
                char what[160];
                snprintf(what, sizeof what, "%s var %s", c->name, vi ? "000" : "111");
                check(what, &got, &ref, bf ? 5e-3 : 1e-5);
                res_free(&got);
            }
            res_free(&ref), data_free(&d);
        }
    }
}

/* The TF32 family's kernels on 16-bit tensor cores (dr_chunk_k256.cu: prep and the state passes;
 * dr_chunk_k256_bwd.cu: dqkwg and wy), small shapes for compute-sanitizer and the emulator: a
 * partial chunk, an empty sequence, two and nine tiles of 64 value columns, bf16 and fp16, every
 * backward variant in bf16 (the substitution inverse, dg from the partial terms too). */
static void test_dr_chunk_k256_sanitize(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"sanitize: k256 head, GVA, K=256, V=64", 1, 70, 1, 2, 256, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"sanitize: k256 none, varlen, K=256, V=128",
         1,
         90,
         1,
         1,
         256,
         128,
         DG_GATE_NONE,
         64,
         4,
         {0, 20, 20, 90},
         1,
         1,
         0},
        /* nine tiles of 64 value columns: the output pass's blocks take eight, then one */
        {"sanitize: k256 head, K=256, V=576", 1, 70, 1, 1, 256, 576, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    };
    for (int i = 0; i < 3; i++) {
        const int st = i == 1 ? S_F16 : S_BF16;
        dg_cuda_ktime kt[64];
        int dropped = -1;
        assert_int_equal(dg_cuda_ktime_begin(), 0);
        run_case(&cases[i], st, i == 0);
        const int m = dg_cuda_ktime_end(kt, 64, &dropped);
        assert_int_equal(dropped, 0);
        k256_bwd_ran(&cases[i], st, kt, m);
    }
    /* an o not 4-byte aligned: the TF32 output pass, over the 16-bit prep and state pass, which then
     * write U, V' and the states in f32 for it */
    const cfg odd = {"k256 head, K=256, V=64, o unaligned", 1, 70, 1, 1, 256, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0};
    fwd_offset_views(&odd, 0, 1, 0, DG_DRC_TF32, "dr_chunk tf32 out");
    /* and with the per-channel gate (its 16-bit prep writes Gc, which the TF32 output pass reads) */
    const cfg odd_ch = {
        "k256 channel, K=256, V=64, o unaligned", 1, 70, 1, 1, 256, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 0};
    fwd_offset_views(&odd_ch, 0, 1, 0, DG_DRC_TF32, "dr_chunk tf32 out");
}

/* argument checks come before any device work: these run without a GPU too */
static void test_dr_chunk_bad_input(void **state) {
    (void)state;
    float *p = (float *)(uintptr_t)64; /* never dereferenced */
    int64_t cu[3] = {0, 5, 9};
    dg_dr_shape ok = {
        .B = 1, .T = 10, .H = 2, .HV = 4, .K = 16, .V = 16, .N = 1, .gate = DG_GATE_NONE, .scale = 0.25, .chunk = 16};
    struct {
        dg_dr_shape s;
        const char *msg;
    } bad[7];
    for (int i = 0; i < 7; i++) bad[i].s = ok;
    bad[0].s.HV = 3, bad[0].msg = "multiple";
    bad[1].s.K = 300, bad[1].msg = "K = 300";
    bad[2].s.gate = DG_GATE_HEAD, bad[2].msg = "gate";
    bad[3].s.cu_seqlens = cu, bad[3].s.N = 2, bad[3].msg = "cu_seqlens"; /* ends at 9, not 10 */
    bad[4].s.cu_seqlens = cu, bad[4].s.N = 2, bad[4].s.B = 2, bad[4].s.T = 9, bad[4].msg = "B = 2";
    bad[5].s.chunk = 48, bad[5].msg = "chunk";
    bad[6].s.T = -1, bad[6].msg = "T = -1";
    for (int i = 0; i < 7; i++) {
        dg_delta_call c = {
            .op = "test", .s = bad[i].s, .dtype = DG_F32, .device = DG_CUDA, .q = p, .k = p, .v = p, .beta = p, .o = p};
        dg_clear_error();
        assert_int_equal(drc_fwd(&c), -1);
        if (!strstr(dg_last_error(), bad[i].msg)) fail_msg("case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
        dg_delta_call cb = {.op = "test",
                            .s = bad[i].s,
                            .dtype = DG_BF16,
                            .device = DG_CUDA,
                            .q = p,
                            .k = p,
                            .v = p,
                            .beta = p,
                            .dout = p};
        dg_clear_error();
        assert_int_equal(drc_bwd(&cb), -1);
        if (!strstr(dg_last_error(), bad[i].msg))
            fail_msg("bwd case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
        c.dtype = DG_F16;
        dg_clear_error();
        assert_int_equal(drc_fwd(&c), -1);
        if (!strstr(dg_last_error(), bad[i].msg) || !strstr(dg_last_error(), "dr_chunk_fwd_f16"))
            fail_msg("f16 case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
    }
    uint16_t *u = (uint16_t *)p;
    /* the L2 norm: the normalised k is required, and neither normalised row may be a raw one */
    dg_delta_call l2 = {.op = "test",
                        .s = ok,
                        .dtype = DG_BF16,
                        .device = DG_CUDA,
                        .q = u + 16,
                        .v = u,
                        .beta = u,
                        .o = u,
                        .l2 = {.on = true, .qraw = u, .kraw = u + 8, .for_bwd = true}};
    dg_clear_error();
    assert_int_equal(drc_fwd(&l2), -1);
    assert_true(strstr(dg_last_error(), "normalised rows") != NULL && strstr(dg_last_error(), "fwd_bf16") != NULL);
    l2.dtype = DG_F16, l2.q = u, l2.k = u + 16;
    dg_clear_error();
    assert_int_equal(drc_fwd(&l2), -1);
    assert_true(strstr(dg_last_error(), "q overlaps") != NULL);
    /* f32 calls take no fused norm (the backend runs the norm's kernel first) */
    l2.dtype = DG_F32, l2.q = u + 24;
    dg_clear_error();
    assert_int_equal(drc_fwd(&l2), -1);
    assert_true(strstr(dg_last_error(), "L2 norm") != NULL);
    dg_delta_call c = {.op = "test",
                       .s = ok,
                       .dtype = DG_F32,
                       .device = DG_CUDA,
                       .q = p,
                       .k = p,
                       .v = p,
                       .beta = p,
                       .dout = p,
                       .dq = p,
                       .dk = p,
                       .dv = p,
                       .dg = p,
                       .dbeta = p};
    dg_clear_error();
    assert_int_equal(drc_bwd(&c), -1);
    assert_true(strstr(dg_last_error(), "dg") != NULL);
    dg_delta_call f = {.op = "test", .s = ok, .dtype = DG_F32, .device = DG_CUDA, .k = p, .v = p, .beta = p, .o = p};
    dg_clear_error();
    assert_int_equal(drc_fwd(&f), -1);
    assert_true(strstr(dg_last_error(), "q is NULL") != NULL);
    f.q = p, f.o = NULL;
    dg_clear_error();
    assert_int_equal(drc_fwd(&f), -1);
    assert_true(strstr(dg_last_error(), "o is NULL") != NULL);
    /* a family forced on a call it does not take */
    f.o = p;
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd(DG_DRC_MMA, &f), -1);
    assert_true(strstr(dg_last_error(), "do not take this call") != NULL);
    dg_clear_error();
}

/* Each test starts the stream of draws afresh: its draws do not depend on the tests before it (or on
 * DG_TEST_FILTER), so that a case added to one test leaves the others' draws as they were.  (Other
 * draws of the same cases: docs/PERF.md, "What is not met".) */
static int own_draws(void **state) {
    (void)state;
    rs = RS0;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_dr_chunk_bad_input, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_f32, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_f32_variants, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_bf16, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_bf16_paths_agree, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_vsplit, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_tf32, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_bf16_unaligned, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_pad, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_bf16_long, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_bf16_draws, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_f16, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_f16_paths, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_l2_fold, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_l2_fused, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_sanitize, own_draws),
        cmocka_unit_test_setup(test_dr_chunk_k256_sanitize, own_draws),
    };
    return dg_test_run_filtered(tests);
}

#else /* no CUDA backend in this build */

int main(void) { return dg_test_main_without_cuda(); }

#endif

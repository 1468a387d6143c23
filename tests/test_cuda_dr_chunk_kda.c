/* The kda tensor-core path of the chunked delta-rule CUDA kernels (kernels/cuda/delta/dr_chunk_kda.cuh:
 * per-channel gate, bf16 or fp16 storage, chunk 64, K and V in {64, 128}) against the f64 recurrence
 * of the CPU kernels (kernels/cpu/delta/delta_rule.h) on the same rounded inputs:
 *  - output, final state and every gradient: relative error norm ||x - ref|| / ||ref|| <= 5e-3
 *    (bf16), <= F16_MMA_TOL (fp16, tests/dr_chunk_tol.h);
 *  - the fused backward (var 111) and the unfused one (var 101) both against the reference and
 *    against each other; the tensor-core path against the generic kernels (force_generic);
 *  - grouped value heads, cu_seqlens with an empty sequence and partial chunks, T = 1, h0 and dhT
 *    present or absent, dq and dv not asked for (NULL), strong decays (per-token log decays down to -8, so the cumulative gate
 *    of a chunk reaches about -500: a gate folded as e^{G}, e^{-G} into the operands would
 *    overflow; the sub-chunk references must not), gates near the bound of the wide form (one
 *    reference for the whole chunk, dr_chunk_kda.cuh: a span of 80) so that both forms run in one
 *    call, and T = 2048;
 *  - value heads wider than 128 (split in heads of 64 or 128 that share the work that does not
 *    depend on V: dr_chunk_vsplit.cu);
 *  - the same cases in fp16 (the kernels' fp16 build, kda_h), and a value head of V = 256 there
 *    (two heads of 128).
 *  - K = 256 (test_kda_k256, the TF32 family's 16-bit kernels; V = 32 padded to 64), bf16 and fp16,
 *    gates on both sides of the wide form's bound.
 * Outputs are poisoned with NaN before each run (an element left unwritten fails), and every
 * backward runs twice and must give the same bits.  Skips without a GPU.  DG_TEST_FILTER selects
 * tests by name. */
#include "tests/support/dr_shape.h"
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
#include "core/internal.h"
#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cuda/cuda_kernels.h"
#include "core/f16.h"
#include "tests/dr_chunk_call.h"
#include "tests/dr_chunk_tol.h"

static bool g_force_generic; /* run_dev's calls take the generic kernels */
static bool g_f16;           /* the 16-bit arrays are fp16 (else bf16) */

/* a 16-bit word of the run's format, and back */
static uint16_t to16(double x) { return g_f16 ? dg_f16_from_f64(x) : dg_bf16_from_f32((float)x); }
static double from16(uint16_t h) { return g_f16 ? dg_f16_to_f64(h) : dg_bf16_to_f32(h); }
/* the bound on each result's relative error norm against the reference */
static double tol16(void) { return g_f16 ? F16_MMA_TOL : 5e-3; }

#define SEED0 0x9E3779B97F4A7C15ull
static uint64_t seed = SEED0;
static double unif(double lo, double hi) { return lo + (hi - lo) * dg_test_xorshift(&seed); }

/* a case: shape, gate range, h0/dhT */
typedef struct kcase {
    const char *name;
    int64_t B, T, H, HV, K, V;
    int ncu;
    int64_t cu[6];
    double glo, ghi;
    int h0, dhT;
    int some; /* dq and dv not asked for (NULL) */
} kcase;

/* the arrays of one run: inputs (f64, already rounded to what the device holds) and results */
enum { X_Q, X_K, X_V, X_G, X_B, X_H0, X_DO, X_DHT, X_N };
enum { Y_O, Y_HT, Y_DQ, Y_DK, Y_DV, Y_DG, Y_DB, Y_DH0, Y_N };
static const char *const y_name[Y_N] = {"o", "hT", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
static const int y_16[Y_N] = {1, 0, 1, 1, 1, 0, 1, 0};
static const int x_16[X_N] = {1, 1, 1, 0, 1, 0, 1, 0};

typedef struct prob {
    dg_dr_shape s;
    double *x[X_N];
    int64_t nx[X_N], ny[Y_N];
} prob;
typedef struct outs {
    double *y[Y_N];
} outs;

static void prob_make(const kcase *c, prob *p) {
    memset(p, 0, sizeof *p);
    p->s = dg_test_dr_shape(c->B, c->T, c->H, c->HV, c->K, c->V, c->cu, c->ncu, DG_GATE_CHANNEL, 64);
    const int64_t BT = c->B * c->T, nh = p->s.N * c->HV * c->K * c->V;
    const int64_t nx[X_N] = {BT * c->H * c->K, BT * c->H * c->K, BT * c->HV * c->V, BT * c->HV * c->K,
                             BT * c->HV,       c->h0 ? nh : 0,   BT * c->HV * c->V, c->dhT ? nh : 0};
    const double lo[X_N] = {-1, -1, -1, c->glo, 0.1, -1, -1, -1};
    const double hi[X_N] = {1, 1, 1, c->ghi, 0.9, 1, 1, 1};
    for (int a = 0; a < X_N; a++) {
        p->nx[a] = nx[a];
        if (!nx[a] && (a == X_H0 || a == X_DHT)) continue;
        p->x[a] = malloc(sizeof(double) * (size_t)(nx[a] ? nx[a] : 1));
        for (int64_t i = 0; i < nx[a]; i++) p->x[a][i] = unif(lo[a], hi[a]);
    }
    for (int64_t r = 0; r < BT * c->H; r++) { /* unit keys */
        double *kr = p->x[X_K] + r * c->K, n2 = 0;
        for (int64_t i = 0; i < c->K; i++) n2 += kr[i] * kr[i];
        for (int64_t i = 0; i < c->K; i++) kr[i] /= sqrt(n2);
    }
    for (int a = 0; a < X_N; a++)
        for (int64_t i = 0; p->x[a] && i < nx[a]; i++)
            p->x[a][i] = x_16[a] ? from16(to16(p->x[a][i])) : (double)(float)p->x[a][i];
    const int64_t ny[Y_N] = {nx[X_V], nh,      c->some ? 0 : nx[X_Q], nx[X_Q], c->some ? 0 : nx[X_V],
                             nx[X_G], nx[X_B], c->h0 ? nh : 0};
    memcpy(p->ny, ny, sizeof ny);
}
static void prob_free(prob *p) {
    for (int a = 0; a < X_N; a++) free(p->x[a]);
}
static void outs_alloc(const prob *p, outs *o) {
    for (int a = 0; a < Y_N; a++)
        o->y[a] = a >= Y_DQ && !p->ny[a] ? NULL : calloc((size_t)(p->ny[a] ? p->ny[a] : 1), sizeof(double));
}
static void outs_free(outs *o) {
    for (int a = 0; a < Y_N; a++) free(o->y[a]);
}

static void reference(const prob *p, outs *o) {
    double *const *x = p->x;
    double *tmp[Y_N] = {0}; /* gradients the case does not ask for: computed, then dropped */
    for (int a = Y_DQ; a <= Y_DV; a++)
        if (!o->y[a]) o->y[a] = tmp[a] = calloc((size_t)(p->nx[a == Y_DV ? X_V : X_Q] + 1), sizeof(double));
    assert_int_equal(
        dg_dr_recurrent_fwd_f64(&p->s, x[X_Q], x[X_K], x[X_V], x[X_G], x[X_B], x[X_H0], o->y[Y_O], o->y[Y_HT]), 0);
    assert_int_equal(dg_dr_recurrent_bwd_f64(&p->s, x[X_Q], x[X_K], x[X_V], x[X_G], x[X_B], x[X_H0], x[X_DO], x[X_DHT],
                                             o->y[Y_DQ], o->y[Y_DK], o->y[Y_DV], o->y[Y_DG], o->y[Y_DB], o->y[Y_DH0]),
                     0);
    for (int a = Y_DQ; a <= Y_DV; a++)
        if (tmp[a]) free(tmp[a]), o->y[a] = NULL;
}

/* device buffer: a copy of host x (16-bit words of the run's format, w16, or f32), or n elements of
 * NaN (x NULL) */
static void *to_dev(const double *x, int64_t n, int w16) {
    const size_t es = w16 ? 2 : 4, bytes = (size_t)(n ? n : 1) * es;
    unsigned char *h = malloc(bytes);
    memset(h, 0xff, bytes);
    for (int64_t i = 0; x && i < n; i++) {
        if (w16) ((uint16_t *)h)[i] = to16(x[i]);
        else ((float *)h)[i] = (float)x[i];
    }
    void *d = dg_cuda_malloc(bytes);
    assert_non_null(d);
    assert_int_equal(dg_cuda_memcpy(d, h, bytes, 0), 0);
    free(h);
    return d;
}
static void from_dev(double *y, const void *d, int64_t n, int w16) {
    const size_t bytes = (size_t)(n ? n : 1) * (w16 ? 2 : 4);
    unsigned char *h = malloc(bytes);
    assert_int_equal(dg_cuda_memcpy(h, d, bytes, 1), 0);
    for (int64_t i = 0; i < n; i++) y[i] = w16 ? from16(((uint16_t *)h)[i]) : ((float *)h)[i];
    free(h);
}

/* forward and backward twice (same bits required) with variant v; the second forward keeps its
 * working set (the call's keep) and the second backward runs from it; g_force_generic: the generic
 * kernels */
static void run_dev(const prob *p, const dg_dr_variant *v, outs *o) {
    void *x[X_N], *y[Y_N], *y2[Y_N];
    for (int a = 0; a < X_N; a++) x[a] = p->x[a] ? to_dev(p->x[a], p->nx[a], x_16[a]) : NULL;
    for (int a = 0; a < Y_N; a++) {
        y[a] = o->y[a] ? to_dev(NULL, p->ny[a], y_16[a]) : NULL;
        y2[a] = o->y[a] ? to_dev(NULL, p->ny[a], y_16[a]) : NULL;
    }
    const dg_delta_call base = {.op = "test",
                                .s = p->s,
                                .dtype = g_f16 ? DG_F16 : DG_BF16,
                                .device = DG_CUDA,
                                .bwd = drc_flags(v),
                                .q = x[X_Q],
                                .k = x[X_K],
                                .v = x[X_V],
                                .g = x[X_G],
                                .beta = x[X_B],
                                .h0 = x[X_H0],
                                .dout = x[X_DO],
                                .dhT = x[X_DHT],
                                .force_generic = g_force_generic};
    dg_delta_call f1 = base, f2 = base;
    f1.o = y[Y_O], f1.hT = y[Y_HT], f2.o = y2[Y_O], f2.hT = y2[Y_HT];
    const int64_t keep_bytes = drc_kept_bytes(&f1);
    if (keep_bytes < 0) fail_msg("kept_bytes failed: %s", dg_last_error());
    void *keep = keep_bytes > 0 ? dg_cuda_malloc((size_t)keep_bytes) : NULL;
    if (keep_bytes > 0 && !keep) fail_msg("%s", dg_last_error());
    f2.keep = keep;
    if (drc_fwd(&f1) || drc_fwd(&f2)) fail_msg("forward failed: %s", dg_last_error());
    if (keep && !f2.kept) fail_msg("kept_bytes is %lld but the forward kept nothing", (long long)keep_bytes);
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? y2 : y;
        dg_delta_call b = base;
        b.dq = w[Y_DQ], b.dk = w[Y_DK], b.dv = w[Y_DV], b.dg = w[Y_DG], b.dbeta = w[Y_DB], b.dh0 = w[Y_DH0];
        b.keep = rep ? keep : NULL, b.kept = rep && keep;
        if (drc_bwd(&b)) fail_msg("backward failed: %s", dg_last_error());
    }
    assert_int_equal(dg_cuda_synchronize(), 0);
    for (int a = 0; a < Y_N; a++) {
        if (!o->y[a]) continue;
        from_dev(o->y[a], y[a], p->ny[a], y_16[a]);
        if (y2[a]) {
            double *z = malloc(sizeof(double) * (size_t)(p->ny[a] ? p->ny[a] : 1));
            from_dev(z, y2[a], p->ny[a], y_16[a]);
            if (memcmp(z, o->y[a], sizeof(double) * (size_t)p->ny[a]))
                fail_msg("%s differs between two runs%s", y_name[a],
                         keep ? " (the second from the kept working set)" : "");
            free(z);
        }
        dg_cuda_free(y[a]), dg_cuda_free(y2[a]);
    }
    for (int a = 0; a < X_N; a++) dg_cuda_free(x[a]);
    dg_cuda_free(keep);
}

/* every result within tol of ref (relative error norm); prints the errors */
static void compare(const char *what, const prob *p, const outs *got, const outs *ref, double tol) {
    printf("  %-50s", what);
    const char *bad = NULL;
    double worst = 0;
    for (int a = 0; a < Y_N; a++) {
        if (!ref->y[a] || !p->ny[a]) continue;
        double num = 0, den = 0;
        for (int64_t i = 0; i < p->ny[a]; i++) {
            const double d = got->y[a][i] - ref->y[a][i];
            num += d * d, den += ref->y[a][i] * ref->y[a][i];
        }
        const double e = den > 0 ? sqrt(num / den) : sqrt(num);
        printf(" %s %.1e", y_name[a], e);
        if (!(e <= tol) && !bad) bad = y_name[a], worst = e;
    }
    printf("\n");
    if (bad) fail_msg("%s: %s relative error %.3e > %.0e", what, bad, worst, tol);
}

static const dg_dr_variant v_fused = {1, 1, 1}, v_unfused = {1, 0, 1};

/* the tensor-core path, fused and unfused, against the reference and each other; with
 * against_generic, also against the generic kernels on the same inputs */
static void run_kcase(const kcase *c, int against_generic) {
    prob p;
    prob_make(c, &p);
    outs ref, fu, un;
    outs_alloc(&p, &ref), outs_alloc(&p, &fu), outs_alloc(&p, &un);
    reference(&p, &ref);
    char what[160];
    run_dev(&p, &v_fused, &fu);
    const char *fmt = g_f16 ? "f16" : "bf16";
    snprintf(what, sizeof what, "%s %s: fused", fmt, c->name);
    compare(what, &p, &fu, &ref, tol16());
    run_dev(&p, &v_unfused, &un);
    snprintf(what, sizeof what, "%s %s: unfused", fmt, c->name);
    compare(what, &p, &un, &ref, tol16());
    compare("  ... unfused against fused", &p, &un, &fu, 2e-3);
    if (against_generic) {
        outs gen;
        outs_alloc(&p, &gen);
        g_force_generic = true;
        run_dev(&p, &v_fused, &gen);
        g_force_generic = false;
        /* each side rounds its results to 16-bit words on its own: where an exact value lies near the
         * midpoint of two bf16 words, one side may take either (2^-8 = 3.9e-3 apart, relative), and
         * where that element dominates an output (dbeta of a sequence's last row, which dhT's
         * gradient makes about 14x the others at K = 256) the two differ by about that in norm while
         * both are within 5e-3 of f64: hence bf16's bound, 5e-3 + 2^-8 */
        compare("  ... against the generic kernels", &p, &fu, &gen, g_f16 ? F16_MMA_TOL + F16_TOL : 5e-3 + 0x1p-8);
        outs_free(&gen);
    }
    outs_free(&ref), outs_free(&fu), outs_free(&un), prob_free(&p);
}

static const kcase cases[] = {
    {"K=V=128, GVA, h0, dhT", 2, 150, 2, 4, 128, 128, 0, {0}, -1.5, -0.02, 1, 1, 0},
    {"K=V=64, varlen (empty, partial)", 1, 200, 1, 2, 64, 64, 5, {0, 64, 64, 130, 200}, -1.5, -0.02, 1, 1, 0},
    {"K=64, V=128, T=1", 3, 1, 1, 1, 64, 128, 0, {0}, -1.5, -0.02, 1, 0, 0},
    {"K=128, V=64, no h0", 1, 129, 1, 1, 128, 64, 0, {0}, -1.5, -0.02, 0, 1, 0},
    {"K=V=64, strong decays", 1, 192, 1, 1, 64, 64, 0, {0}, -8.0, -0.5, 1, 1, 0},
    {"K=V=128, GVA, dq and dv NULL", 1, 100, 1, 2, 128, 128, 0, {0}, -1.5, -0.02, 1, 0, 1},
    /* chunks on both sides of the wide form's bound (a span of 80 over 64 rows): about -71 on
     * average over a chunk, so some chunks take the wide form and some the sub-chunk one */
    {"K=V=64, gates near the wide form's bound", 1, 1280, 1, 1, 64, 64, 0, {0}, -2.2, -0.02, 1, 1, 0},
    /* enough (sequence, head) pairs that the state passes take 64-column tiles (fast::state_bv:
     * 32 below one block per multiprocessor, as every other case here) */
    {"K=V=128, 68 value heads (64-column state tiles)", 1, 70, 2, 68, 128, 128, 0, {0}, -1.5, -0.02, 1, 1, 0},
    /* the benchmark's sequence length (errors of plain intermediates grow with T) */
    {"K=V=128, T=2048", 1, 2048, 1, 1, 128, 128, 0, {0}, -1.5, -0.02, 1, 1, 0},
    /* value heads split (dr_chunk_vsplit.cu): the fused qkwy and prep take the three heads of 64 of
     * a head together (Geom::vsh), dq and dk summed over two such heads a key head after them */
    {"K=64, V=192, GVA, varlen (three heads of 64 each)", 1, 150, 1, 2, 64, 192, 3, {0, 70, 150}, -1.5, -0.02, 1, 1, 0},
};

/* fp16 (dr_chunk_kda_mma_*_f16.cu): the cases above, and a value head of V = 256 (two heads of 128
 * sharing the key head: dr_chunk_vsplit.cu) */
static const kcase f16_split = {"K=64, V=256 (two heads of 128)", 1, 100, 1, 1, 64, 256, 0, {0}, -1.5, -0.02, 1, 1, 0};

static void test_kda_mma(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_kcase(&cases[i], i < 2);
}

static void test_kda_mma_f16(void **state) {
    (void)state;
    dg_test_require_cuda();
    g_f16 = true;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_kcase(&cases[i], i < 2);
    run_kcase(&f16_split, 1);
    g_f16 = false;
}

/* small shapes through every kda kernel (fused and unfused), bf16 and fp16: the test to run under
 * compute-sanitizer */
static void test_kda_mma_sanitize(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const kcase small[] = {
        {"sanitize: K=V=64, varlen, GVA", 1, 100, 1, 2, 64, 64, 3, {0, 70, 100}, -1.5, -0.02, 1, 1, 0},
        {"sanitize: K=128, V=64", 1, 70, 1, 1, 128, 64, 0, {0}, -1.5, -0.02, 1, 1, 0},
        /* K = V = 128: the fused qkwy's dU goes by cp.async during part A (QkL::PFU) */
        {"sanitize: K=V=128", 1, 70, 1, 1, 128, 128, 0, {0}, -1.5, -0.02, 1, 1, 0},
        /* enough heads that the backward state pass takes 64-column tiles: with its prefetch (V = 64:
         * no more block-steps than the longest chain's on every SM), and without (V = 128) */
        {"sanitize: K=V=64, 68 value heads", 1, 70, 1, 68, 64, 64, 0, {0}, -1.5, -0.02, 1, 1, 0},
        {"sanitize: K=64, V=128, 68 value heads", 1, 70, 1, 68, 64, 128, 0, {0}, -1.5, -0.02, 1, 1, 0},
        /* two heads of 128 a head, taken together by prep and the fused qkwy (Geom::vsh), whose
         * dU goes by cp.async (QkL::PFU) */
        {"sanitize: K=128, V=256, GVA (two heads of 128 each)", 1, 70, 1, 2, 128, 256, 0, {0}, -1.5, -0.02, 1, 1, 0},
        /* K = 256 (dr_chunk_k256*.cu): the wide form, and the f32 sums of steeper gates */
        {"sanitize: K=256, V=64, varlen", 1, 80, 1, 1, 256, 64, 3, {0, 50, 80}, -1.5, -0.02, 1, 1, 0},
        {"sanitize: K=256, V=64, strong decays", 1, 40, 1, 1, 256, 64, 0, {0}, -8.0, -0.5, 1, 1, 0},
    };
    for (int f16 = 0; f16 <= 1; f16++) {
        g_f16 = f16;
        for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) run_kcase(&small[i], 0);
    }
    g_f16 = false;
}

/* the per-kernel timer (dg_cuda_ktime, as `deltagrad bench --device cuda` prints it) names the
 * kernels each variant launches: the fused qkwy, or the dqkwg + wy pair, each timed */
static int ktime_find(const dg_cuda_ktime *kt, int m, const char *name) {
    for (int j = 0; j < m; j++)
        if (!strcmp(kt[j].name, name)) return kt[j].launches > 0 && kt[j].ms > 0.0;
    return -1;
}
static void test_kda_kernel_times(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const kcase c = {"kernel times: K=V=64", 1, 100, 1, 1, 64, 64, 0, {0}, -1.5, -0.02, 1, 1, 0};
    prob p;
    prob_make(&c, &p);
    outs o;
    outs_alloc(&p, &o);
    for (int fused = 1; fused >= 0; fused--) {
        dg_cuda_ktime kt[16];
        int dropped = -1;
        assert_int_equal(dg_cuda_ktime_begin(), 0);
        run_dev(&p, fused ? &v_fused : &v_unfused, &o);
        const int m = dg_cuda_ktime_end(kt, 16, &dropped);
        assert_true(m > 0);
        assert_int_equal(dropped, 0);
        assert_int_equal(ktime_find(kt, m, "dr_chunk kda prep"), 1);
        assert_int_equal(ktime_find(kt, m, "dr_chunk kda dhu"), 1);
        assert_int_equal(ktime_find(kt, m, "dr_chunk kda qkwy"), fused ? 1 : -1);
        assert_int_equal(ktime_find(kt, m, "dr_chunk kda dqkwg"), fused ? -1 : 1);
        assert_int_equal(ktime_find(kt, m, "dr_chunk kda wy"), fused ? -1 : 1);
        assert_false(dg_cuda_ktime_on());
    }
    outs_free(&o), prob_free(&p);
}

/* K = 256: the TF32 family's 16-bit kernels (dr_chunk_k256*.cu), whose gated products take the wide
 * form where a chunk's span allows it, f32 element sums elsewhere: the same checks as the cases
 * above (fused and unfused against the reference and each other; bf16 against the generic
 * kernels), bf16 and fp16, with the 16-bit kernels among the launches and no TF32 ones (V = 32:
 * padded to 64 first, dr_chunk_pad.cu; the TF32 kernels' per-channel gate at chunk 32:
 * test_cuda_dr_chunk.c's test_dr_chunk_tf32).
 * The gates: inside the bound everywhere; near it (a span of about 67 over 64 rows, so that over
 * 256 channels some chunks pass and some do not); strong decays (the element sums only). */
static void test_kda_k256(void **state) {
    (void)state;
    dg_test_require_cuda();
    seed = SEED0; /* its own draws, whichever tests ran before (DG_TEST_FILTER) */
    /* every kernel on 16-bit tensor cores (dr_chunk_k256_chan.cu, dr_chunk_k256.cu, dr_chunk_k256_bwd.cu,
     * dr_chunk_k256_chan_bwd.cu); V = 32 padded to 64.  Near the bound, some chunks take the wide form
     * and some the element sums; the strong decays take the element sums only */
    static const kcase k256[] = {
        {"K=256, V=64, GVA, h0, dhT", 1, 130, 1, 2, 256, 64, 0, {0}, -1.5, -0.02, 1, 1, 0},
        {"K=256, V=64, gates near the wide form's bound", 1, 384, 1, 1, 256, 64, 0, {0}, -2.1, -0.02, 1, 1, 0},
        {"K=256, V=128, varlen, steep, some", 1, 150, 1, 1, 256, 128, 4, {0, 70, 70, 150}, -8.0, -0.5, 0, 1, 1},
        {"K=256, V=32, gates near the bound (padded)", 1, 384, 1, 1, 256, 32, 0, {0}, -2.1, -0.02, 1, 1, 0},
        {"K=256, V=32, strong decays (padded)", 1, 128, 1, 1, 256, 32, 0, {0}, -8.0, -0.5, 1, 1, 0},
    };
    for (int f16 = 0; f16 <= 1; f16++) {
        g_f16 = f16;
        for (size_t i = 0; i < sizeof k256 / sizeof k256[0]; i++) {
            dg_cuda_ktime kt[32];
            int dropped = -1;
            const int padded = k256[i].V % 64 != 0;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            run_kcase(&k256[i], !f16);
            const int m = dg_cuda_ktime_end(kt, 32, &dropped);
            assert_int_equal(dropped, 0);
            /* (the generic kernels' comparison runs the f32 prep, named "dr_chunk prep") */
            static const char *const k16[] = {"prep", "dhu", "out", "dqkwg", "wy", "gamma"};
            static const char *const tf32[] = {"prep", "dhu", "dqkwg", "wy"};
            char name[64];
            for (size_t n = 0; n < sizeof k16 / sizeof k16[0]; n++) {
                snprintf(name, sizeof name, "dr_chunk k256 %s", k16[n]);
                if (ktime_find(kt, m, name) != 1) fail_msg("%s: %s did not run", k256[i].name, name);
            }
            for (size_t n = 0; n < sizeof tf32 / sizeof tf32[0]; n++) {
                snprintf(name, sizeof name, "dr_chunk tf32 %s", tf32[n]);
                if (ktime_find(kt, m, name) != -1) fail_msg("%s: %s ran", k256[i].name, name);
            }
            assert_int_equal(ktime_find(kt, m, "dr_chunk pad"), padded ? 1 : -1);
        }
    }
    g_f16 = false;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kda_mma),          cmocka_unit_test(test_kda_mma_f16),
        cmocka_unit_test(test_kda_mma_sanitize), cmocka_unit_test(test_kda_kernel_times),
        cmocka_unit_test(test_kda_k256),
    };
    return dg_test_run_filtered(tests);
}

#else /* no CUDA backend in this build */

int main(void) { return dg_test_main_without_cuda(); }

#endif

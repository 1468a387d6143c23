/* Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
 * counter-based generator.  Number i of a draw is lane i%4 of philox(key = seed, counter =
 * rng->counter + i/4), so a CUDA kernel that evaluates the same function per element draws the
 * same numbers as the CPU, in any order, and a draw of n numbers advances the counter by ceil(n/4). */
#include "core/internal.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static void philox(uint64_t key, uint64_t ctr, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

dg_rng dg_rng_new(uint64_t seed) { return (dg_rng){seed, 0}; }

static dg_rng global_rng = {0x5EEDull, 0};
void dg_manual_seed(uint64_t seed) { global_rng = dg_rng_new(seed); }
dg_rng *dg_default_rng(void) { return &global_rng; }

/* one number: a whole block is consumed, so scalar draws stay in step with tensor draws */
uint32_t dg_rng_u32(dg_rng *rng) {
    if (!rng) rng = &global_rng;
    uint32_t out[4];
    philox(rng->seed, rng->counter++, out);
    return out[0];
}

static double u32_to_unit(uint32_t x) { return (x >> 8) * (1.0 / 16777216.0); } /* 24 bits, [0,1) */
static double u64_to_unit(uint32_t hi, uint32_t lo) {
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * (1.0 / 9007199254740992.0); /* 53 bits */
}

double dg_rng_uniform(dg_rng *rng) {
    if (!rng) rng = &global_rng;
    uint32_t out[4];
    philox(rng->seed, rng->counter++, out);
    return u64_to_unit(out[0], out[1]);
}

/* kind 0: uniform [lo,hi); kind 1: normal (Box-Muller on lane pairs) */
static dg_tensor *draw(int ndim, const int64_t *shape, dg_dtype dt, dg_rng *rng, int kind, double lo, double hi,
                       const char *op) {
    if (!dg_dtype_is_float(dt)) {
        dg_error("%s: dtype %s is not a float dtype", op, dg_dtype_name(dt));
        return NULL;
    }
    if (!rng) rng = &global_rng;
    dg_tensor *t = dg_empty(ndim, shape, dt);
    if (!t) return NULL;
    int64_t n = dg_numel(t);
    char *p = t->storage->data;
    size_t es = dg_dtype_size(dt);
    bool f64 = dt == DG_F64;
    /* f64 uses two 32-bit lanes per uniform (53-bit mantissa); f32/bf16/f16 use one lane */
    int64_t per_block = f64 ? 2 : 4;
    int64_t blocks = (n + per_block - 1) / per_block;
    /* each block is a function of its counter alone: the threads draw the same numbers as one */
#pragma omp parallel for schedule(static) if (blocks > 65536)
    for (int64_t b = 0; b < blocks; b++) {
        uint32_t o[4];
        philox(rng->seed, rng->counter + (uint64_t)b, o);
        double u[4];
        if (f64) {
            u[0] = u64_to_unit(o[0], o[1]);
            u[1] = u64_to_unit(o[2], o[3]);
        } else
            for (int l = 0; l < 4; l++) u[l] = u32_to_unit(o[l]);
        double val[4];
        for (int l = 0; l < per_block; l += 2) {
            if (kind == 0) {
                val[l] = lo + (hi - lo) * u[l];
                val[l + 1] = lo + (hi - lo) * u[l + 1];
            } else {
                double r = sqrt(-2.0 * log(1.0 - u[l])), th = 6.283185307179586 * u[l + 1];
                val[l] = r * cos(th);
                val[l + 1] = r * sin(th);
            }
        }
        for (int l = 0; l < per_block && b * per_block + l < n; l++)
            dg_store_double(p + (size_t)(b * per_block + l) * es, dt, val[l]);
    }
    rng->counter += (uint64_t)blocks;
    return t;
}

dg_tensor *dg_rand(int ndim, const int64_t *shape, dg_dtype dt, dg_rng *rng) {
    return draw(ndim, shape, dt, rng, 0, 0.0, 1.0, "rand");
}
dg_tensor *dg_rand_range(int ndim, const int64_t *shape, dg_dtype dt, double lo, double hi, dg_rng *rng) {
    return draw(ndim, shape, dt, rng, 0, lo, hi, "rand_range");
}
dg_tensor *dg_randn(int ndim, const int64_t *shape, dg_dtype dt, dg_rng *rng) {
    return draw(ndim, shape, dt, rng, 1, 0.0, 0.0, "randn");
}

/* Small helpers shared by the models/ infrastructure files (data, checkpoints, optimiser,
 * metrics).  Internal: not part of the public API. */
#ifndef DG_MODELS_INFRA_COMMON_H
#define DG_MODELS_INFRA_COMMON_H

#include "core/internal.h"

#include <stdint.h>

/* A host tensor the caller owns (one reference, to dg_release) whether or not a scope is open:
 * inside a scope dg_empty's result belongs to the scope, so take a reference of our own. */
static inline dg_tensor *dgm_owned_zeros(int ndim, const int64_t *shape, dg_dtype dt) {
    dg_tensor *t = dg_zeros(ndim, shape, dt);
    if (t && dg_scope_depth() > 0) dg_keep(t);
    return t;
}

/* Address of element 0 of a host tensor. */
static inline void *dgm_data(const dg_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * dg_dtype_size(t->dtype);
}

/* 64 random bits from two draws, the high word first (two statements: the order of evaluation of
 * the operands of | is unspecified). */
static inline uint64_t dgm_rng_u64(dg_rng *rng) {
    uint64_t hi = dg_rng_u32(rng);
    return (hi << 32) | dg_rng_u32(rng);
}

/* A uniform integer in [0, n), n >= 1, without modulo bias: 64 bits from two draws, rejection of
 * the top partial range (at most half the draws for any n, practically never for small n). */
static inline uint64_t dgm_rng_below(dg_rng *rng, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* accept x < limit, a multiple of n */
    for (;;) {
        uint64_t x = dgm_rng_u64(rng);
        if (x < limit) return x % n;
    }
}

/* splitmix64 finaliser: derives independent seeds from (seed, index) pairs. */
static inline uint64_t dgm_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

#endif

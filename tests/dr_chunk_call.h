/* The chunked CUDA kernels as the backend table runs them (ops/delta/delta_backends.c: the
 * tensor-core families first, the generic kernels for what they do not take), for the kernel tests
 * that call kernels/cuda/delta/dr_chunk_cuda.h directly (they also run on the host emulation,
 * which has the kernels but not the ops' CUDA rows). */
#ifndef DG_TESTS_DR_CHUNK_CALL_H
#define DG_TESTS_DR_CHUNK_CALL_H

#include "kernels/cuda/delta/dr_chunk_cuda.h"

/* the family dg_delta_pick would choose for c */
static inline dg_drc_family drc_family_of(const dg_delta_call *c) {
    if (dg_cuda_dr_chunk_accepts(DG_DRC_KDA_MMA, c)) return DG_DRC_KDA_MMA;
    if (dg_cuda_dr_chunk_accepts(DG_DRC_MMA, c)) return DG_DRC_MMA;
    if (dg_cuda_dr_chunk_accepts(DG_DRC_TF32, c)) return DG_DRC_TF32;
    return DG_DRC_GENERIC;
}
static inline int64_t drc_kept_bytes(const dg_delta_call *c) {
    return dg_cuda_dr_chunk_kept_bytes(drc_family_of(c), c);
}
static inline int drc_fwd(dg_delta_call *c) { return dg_cuda_dr_chunk_fwd(drc_family_of(c), c); }
static inline int drc_bwd(dg_delta_call *c) { return dg_cuda_dr_chunk_bwd(drc_family_of(c), c); }

/* the backward flags of a dg_dr_variant (kernels/cpu/delta/delta_rule.h: each flag 1 for the
 * default), as the tests enumerate the variants */
static inline dg_delta_bwd_flags drc_flags(const dg_dr_variant *v) {
    dg_delta_bwd_flags f = {!v->gdn_dg_from_final, !v->dw_on_chip, !v->solve_tril_blocked};
    return f;
}

#endif

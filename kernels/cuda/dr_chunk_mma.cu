/* The tensor-core path of the chunked delta-rule kernels: not written yet; fast_ok declines
 * every shape, so every call takes the generic kernels (dr_chunk_generic.cu). */
#include "kernels/cuda/dr_chunk_internal.cuh"

namespace drc {
bool fast_ok(const Geom &) { return false; }
int fast_fwd(const Plan &, const Io<uint16_t> &) {
    dg_error("dr_chunk: the tensor-core path is not available");
    return -1;
}
int fast_bwd(const Plan &, const dg_dr_variant &, const Io<uint16_t> &) {
    dg_error("dr_chunk: the tensor-core path is not available");
    return -1;
}
} // namespace drc

/* The fp16 build of the tensor-core kda kernels of dr_chunk_kda_mma_bwd.cu: the same source, every
 * 16-bit word IEEE fp16 and the products on mma.sync f16 (dr_chunk_mma.cuh, DRC_OPERAND_F16), in
 * namespace kda_h (dr_chunk_kda.cuh). */
#define DRC_OPERAND_F16 1
#include "kernels/cuda/delta/dr_chunk_kda_mma_bwd.cu"

/* The fp16 build of dr_chunk_k256_chan_bwd.cu: the same source, every 16-bit word IEEE fp16 but the
 * products' operands (bf16 in both builds) (dr_chunk_mma.cuh, DRC_OPERAND_F16). */
#define DRC_OPERAND_F16 1
#include "kernels/cuda/delta/dr_chunk_k256_chan_bwd.cu"

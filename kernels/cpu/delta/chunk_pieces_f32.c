/* The pieces of the chunked delta-rule kernels (chunk_pieces.h) in float; bodies in
 * dr_chunk_pieces_impl.h. */
#define DR_F32 1
#include "kernels/cpu/delta/dr_chunk_math.h"
#include "kernels/cpu/delta/dr_chunk_pieces_impl.h"

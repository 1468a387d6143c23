/* The chunked (WY-form) delta-rule kernels in double: dg_dr_chunk_fwd_f64, dg_dr_chunk_bwd_f64
 * (declared in delta_rule.h).  The bodies are written once in dr_chunk_*_impl.h. */
#define DR_F32 0
#include "kernels/cpu/delta/dr_chunk_math.h"
#include "kernels/cpu/delta/dr_chunk_fwd_impl.h"
#include "kernels/cpu/delta/dr_chunk_bwd_impl.h"

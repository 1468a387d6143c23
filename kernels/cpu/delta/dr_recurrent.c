/* Token-by-token delta rule (DeltaNet, Gated DeltaNet, KDA), forward and hand-written backward, on
 * the host.  The reference every other path is compared against.  One body (dr_recurrent_impl.h),
 * instantiated for float and double. */
#include "kernels/cpu/delta/delta_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REAL float
#define SFX f32
#include "kernels/cpu/delta/dr_recurrent_impl.h"
#undef REAL
#undef SFX

#define REAL double
#define SFX f64
#include "kernels/cpu/delta/dr_recurrent_impl.h"
#undef REAL
#undef SFX

#include "kernels/cpu/elementwise.h"

#include <math.h>

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#define R float
#define SFX f32
#define M(fn) CAT(fn, f)
#include "kernels/cpu/elementwise_impl.h"
#undef R
#undef SFX
#undef M

#define R double
#define SFX f64
#define M(fn) fn
#include "kernels/cpu/elementwise_impl.h"
#undef R
#undef SFX
#undef M

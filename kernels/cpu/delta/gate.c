/* The GDN / KDA gate g = -exp(A_log) * softplus(a + dt_bias) and its backward (see gate.h). */
#include "kernels/cpu/delta/gate.h"

#include <math.h>
#include <stdlib.h>

/* log(1 + e^x): x itself above 20 (FLA's threshold; the rest is below 2e-9 relative), and
 * max(x, 0) + log1p(e^-|x|) otherwise, which never overflows. */
double dg_softplus_d(double x) {
    if (x > 20.0) return x;
    return (x > 0 ? x : 0.0) + log1p(exp(-fabs(x)));
}

double dg_softplus_grad_d(double x) { return x > 20.0 ? 1.0 : dg_sigmoid_d(x); }

double dg_sigmoid_d(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

#define REAL float
#define SFX f32
#include "kernels/cpu/delta/gate_impl.h"
#undef REAL
#undef SFX

#define REAL double
#define SFX f64
#include "kernels/cpu/delta/gate_impl.h"
#undef REAL
#undef SFX

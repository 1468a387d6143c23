/* embedding on the CPU: gather rows forward, scatter-add rows backward (nn_embedding_impl.h). */
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

float dg_nn_expf_check(float x) { return dg_nn_expf(x); }

int64_t dg_nn_find_bad_index(int64_t N, const int64_t *ids, int64_t V, int allow_skip, int64_t skip) {
    for (int64_t n = 0; n < N; n++) {
        if (allow_skip && ids[n] == skip) continue;
        if (ids[n] < 0 || ids[n] >= V) return n;
    }
    return -1;
}

#define R float
#define FN(name) name##_f32
#include "kernels/cpu/nn_embedding_impl.h"
#undef R
#undef FN

#define R double
#define FN(name) name##_f64
#include "kernels/cpu/nn_embedding_impl.h"
#undef R
#undef FN

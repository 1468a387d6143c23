/* examples/quickstart.c: fit y = 3x - 1 with a linear model, by hand-written gradient descent. */
#include <stdio.h>

#include "deltagrad.h"

int main(void) {
    dg_rng rng = dg_rng_new(0);
    /* parameters live outside scopes: we own them and release them at the end */
    dg_tensor *w = dg_keep(dg_zeros(DG_SHAPE(1, 1), DG_F32));
    dg_tensor *b = dg_keep(dg_zeros(DG_SHAPE(1), DG_F32));
    dg_set_requires_grad(w, true);
    dg_set_requires_grad(b, true);
    for (int step = 0; step < 200; step++) {
        dg_scope_begin(); /* everything made in the step is released at its end */
        dg_tensor *x = dg_randn(DG_SHAPE(32, 1), DG_F32, &rng);
        dg_tensor *y = dg_add_scalar(dg_mul_scalar(x, 3.0), -1.0);
        dg_tensor *pred = dg_linear(x, w, b);
        dg_tensor *err = dg_sub(pred, y);
        dg_tensor *loss = dg_mean_all(dg_mul(err, err));
        if (!loss || dg_backward(loss, NULL) != 0) {
            fprintf(stderr, "error: %s\n", dg_last_error());
            return 1;
        }
        /* SGD on the raw data, outside autograd */
        float *pw = dg_data_ptr(w), *pb = dg_data_ptr(b);
        pw[0] -= 0.1f * *(float *)dg_data_ptr(w->grad);
        pb[0] -= 0.1f * *(float *)dg_data_ptr(b->grad);
        dg_zero_grad(w);
        dg_zero_grad(b);
        if (step % 50 == 0) printf("step %3d  loss %.6f\n", step, dg_item(loss));
        dg_scope_end();
    }
    printf("w = %.4f, b = %.4f\n", dg_item(w), dg_item(b));
    dg_release(w);
    dg_release(b);
    return 0;
}

/* Grad mode (recording on/off, nestable) and anomaly mode (NaN/Inf checks after every op and
 * every backward, as PyTorch's detect_anomaly). */
#include "autograd/autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int no_grad_depth;
static int anomaly = -1; /* -1: not yet read from the environment */

bool dg_grad_enabled(void) { return no_grad_depth == 0; }
void dg_no_grad_begin(void) { no_grad_depth++; }
void dg_no_grad_end(void) {
    if (no_grad_depth > 0) no_grad_depth--;
}

void dg_set_anomaly_mode(bool on) { anomaly = on; }
bool dg_anomaly_mode(void) {
    if (anomaly < 0) {
        const char *e = getenv("DG_DETECT_ANOMALY");
        anomaly = e && *e && strcmp(e, "0") != 0;
    }
    return anomaly == 1;
}

/* Returns "nan", "inf" or NULL for the first non-finite element of a float tensor. */
const char *dg_first_nonfinite(const dg_tensor *t) {
    if (!t || !dg_dtype_is_float(t->dtype) || dg_numel(t) == 0) return NULL;
    const char *found = NULL;
    dg_scope_begin();
    const dg_tensor *h = t->device == DG_CPU ? t : dg_to_device((dg_tensor *)t, DG_CPU);
    if (h) {
        int64_t idx[DG_MAX_DIMS] = {0};
        do {
            double v = dg_get(h, idx);
            if (!isfinite(v)) {
                found = isnan(v) ? "nan" : "inf";
                break;
            }
        } while (dg_next_index(h->ndim, h->shape, idx));
    }
    dg_scope_end();
    return found;
}

/* "a [2,3], b [3]" for messages */
const char *dg_node_inputs_text(const dg_node *n) {
    static _Thread_local char buf[512];
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n->n_in && len < sizeof buf - 64; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s %s", i ? ", " : "",
                                n->op->in_names[i] ? n->op->in_names[i] : "?", n->in[i] ? dg_shp(n->in[i]) : "(none)");
    return buf;
}

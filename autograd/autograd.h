/* Autograd internals shared by the engine, anomaly mode, gradcheck and the comparison. */
#ifndef DG_AUTOGRAD_H
#define DG_AUTOGRAD_H

#include "autograd/node.h"

const char *dg_first_nonfinite(const dg_tensor *t);
const char *dg_node_inputs_text(const dg_node *n);

/* In place dst += src (same shape, dst contiguous).  No autograd. */
int dg_accumulate_(dg_tensor *dst, const dg_tensor *src);

#endif

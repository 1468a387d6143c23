/* Autograd internals shared by the engine, anomaly mode, gradcheck and the comparison. */
#ifndef DG_AUTOGRAD_H
#define DG_AUTOGRAD_H

#include "autograd/node.h"

const char *dg_first_nonfinite(const dg_tensor *t);
const char *dg_node_inputs_text(const dg_node *n);

/* In place dst += src (same shape, dst contiguous).  No autograd. */
int dg_accumulate_(dg_tensor *dst, const dg_tensor *src);

/* The op profiler's brackets (profiler.c): the engine's around each forward, backward and
 * accumulation; regions (dg_profile_region_*) are the same with kind DG_PROF_REGION.  Only the
 * outermost bracket is timed; both are no-ops while the profiler is off. */
typedef enum { DG_PROF_FWD, DG_PROF_BWD, DG_PROF_ACC, DG_PROF_REGION } dg_prof_kind;
void dg_prof_enter(const char *name, dg_prof_kind kind);
void dg_prof_leave(void);

#endif

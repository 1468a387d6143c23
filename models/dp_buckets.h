/* The gradients of a data-parallel step cut into buckets in the order they become final
 * (models/data_parallel.c sends each full bucket through the all-reduce while the backward goes
 * on).  Nothing here touches a device: it decides which pieces of which gradients fill which
 * bucket, and calls launch for each bucket once it is full (and for the last, partial one at the
 * end of the step).
 *
 * Every rank must cut the same buckets, or the all-reduce would add up different gradients without
 * any error.  The cut follows the order in which the parameters are placed; that order comes from
 * the backward's graph, the same on every rank and every step.  The first step's order is recorded
 * and every later step is held to it: a parameter placed out of that order is an error naming
 * both parameters, raised before any bucket that holds it is launched. */
#ifndef DG_MODELS_DP_BUCKETS_H
#define DG_MODELS_DP_BUCKETS_H

#include <stdbool.h>
#include <stdint.h>

/* elements [grad_off, grad_off + n) of parameter param's gradient are bucket[off, off + n) */
typedef struct dg_dp_seg {
    int64_t param, grad_off, off, n;
} dg_dp_seg;

/* Sends the bucket: segs[0..n_segs) fill bucket[0, fill) in order.  0, or -1 with dg_error. */
typedef int (*dg_dp_launch_fn)(void *ctx, const dg_dp_seg *segs, int64_t n_segs, int64_t fill);

typedef struct dg_dp_buckets {
    int64_t n_params, size; /* parameters; elements a bucket holds */
    int64_t *numel;         /* [n_params] */
    bool *placed;           /* [n_params]: in a bucket this step */
    int64_t *order;         /* [n_params]: the first step's order of placement */
    int64_t n_placed;       /* parameters placed this step */
    bool order_known;       /* a step has ended: order holds its order */
    dg_dp_seg *segs;        /* [n_params]: the open bucket's pieces */
    int64_t n_segs, fill;   /* pieces and elements in the open bucket */
    dg_dp_launch_fn launch;
    void *ctx;
} dg_dp_buckets;

/* numel[i] elements of parameter i; buckets of size elements (>= 1).  0, or -1 with dg_error. */
int dg_dp_buckets_init(dg_dp_buckets *b, int64_t n_params, const int64_t *numel, int64_t size, dg_dp_launch_fn launch,
                       void *ctx);
void dg_dp_buckets_free(dg_dp_buckets *b);

/* A new step: no parameter placed, the open bucket empty. */
void dg_dp_buckets_begin(dg_dp_buckets *b);
/* Parameter i's gradient is final: it joins the open bucket, launching each bucket it fills.
 * Placing a parameter twice in a step does nothing.  names (may be NULL) name the parameters in
 * the error of a placement out of the first step's order.  0, or -1 with dg_error. */
int dg_dp_buckets_place(dg_dp_buckets *b, int64_t i, const char *const *names);
/* The end of the step: the parameters not placed yet, in their order, then the last bucket.  The
 * first step's order is recorded here.  0, or -1 with dg_error. */
int dg_dp_buckets_end(dg_dp_buckets *b, const char *const *names);

#endif

/* Autoregressive decoding of a language model (models/lm.h).
 *
 * With the cache (the normal way): the prompt goes through the model once, then each new token is
 * one call with T = 1 that carries every layer's delta-rule state S [1,HV,K,V] (the op's
 * initial_state / final_state) and short-convolution window (the last conv_size-1 inputs), so the
 * prefix is never re-read.  Without it (for tests): every step re-runs the whole sequence. */
#ifndef DG_MODELS_GENERATE_H
#define DG_MODELS_GENERATE_H

#include "models/lm.h"

typedef struct dg_sample_opts {
    double temperature; /* 0: greedy (argmax) */
    int64_t top_k;      /* 0: the whole vocabulary */
    bool use_cache;     /* false: re-run the full sequence at each step */
} dg_sample_opts;

/* Draws a token from one row of logits [V] (f32 or f64 values given as double here). */
int64_t dg_sample_token(const double *logits, int64_t V, const dg_sample_opts *o, dg_rng *rng);

/* Appends up to max_new tokens to prompt[0..n_prompt) (n_prompt >= 1).  out receives the new tokens
 * (max_new of them); logits_out, if not NULL, receives the logits [max_new, V] each token was drawn
 * from (as double).  on_token, if not NULL, is called after each token (streaming).  Returns the
 * number of tokens made, or -1 with dg_error. */
int64_t dg_generate(const dg_lm *lm, const int64_t *prompt, int64_t n_prompt, int64_t max_new, const dg_sample_opts *o,
                    dg_rng *rng, int64_t *out, double *logits_out, void (*on_token)(int64_t token, void *ctx),
                    void *ctx);

#endif

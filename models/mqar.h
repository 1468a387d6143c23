/* MQAR, multi-query associative recall (Zoology, Arora et al. 2023), seeded and deterministic.
 *
 * One sequence of T tokens over a vocabulary of V:
 *   positions 0 .. 2N-1:  k_1 v_1 k_2 v_2 ... k_N v_N     N distinct keys from [1, V/2), N distinct
 *                                                        values from [V/2, V) (token 0 is the filler)
 *   positions 2N .. T-1:  the query region, slots of two tokens (slot s = positions 2N+2s, 2N+2s+1).
 *                         Q of the N keys (Q = N by default: every key once, in random order) are
 *                         placed in Q distinct slots: the key at the slot's first position, its value
 *                         right after it (as in a real recall: "... k_i v_i ..."; that value is the
 *                         input of the next position, so it cannot leak into the prediction).
 *                         Slots are drawn without replacement with P(slot s) ~ (s+1)^(a-1), Zoology's
 *                         power law (a = 0.01 by default: earlier slots likelier; a = 1: uniform).
 *                         Every other position holds the filler token 0 (or, with random_filler, a
 *                         random token from [1, V) that is none of this sequence's keys, so that no
 *                         filler pair can look like a key with a wrong value).
 *   targets:              -100 (ignored) everywhere except at each query key's position, where the
 *                         target is the value paired with that key: the model reads k_i and must
 *                         output v_i.  Accuracy = correct values / Q.
 * This differs from Zoology's generator in two documented ways: the token after a query key is its
 * value rather than a random token, and filler tokens never repeat one of the sequence's keys
 * (Zoology's random fill can, which writes a wrong association with a small vocabulary).
 *
 * Determinism: example i of a set is generated from its own generator seeded by
 * mix(set_seed, i), so it does not depend on the set size; a training batch draws one 64-bit
 * seed per example from the caller's dg_rng (two u32 draws each), so a resumed run that restores
 * the rng state continues with the same examples. */
#ifndef DG_MODELS_MQAR_H
#define DG_MODELS_MQAR_H

#include "deltagrad.h"

#define DG_MQAR_IGNORE (-100)
/* The default held-out set's seed: fixed, independent of the training seed. */
#define DG_MQAR_HELDOUT_SEED 0x4D514152484F4C44ull /* "MQARHOLD" */

typedef struct dg_mqar_config {
    int64_t vocab_size;   /* V, >= 4; default 256 */
    int64_t seq_len;      /* T, >= 2N + 2Q; default 128 */
    int64_t num_kv_pairs; /* N; default 16 */
    int64_t num_queries;  /* Q, 1 .. N; 0 means N; default 0 */
    double power_a;       /* query slot law (s+1)^(a-1), a in (0, 1]; default 0.01 */
    bool random_filler;   /* default false: filler is token 0 */
} dg_mqar_config;

dg_mqar_config dg_mqar_default_config(void);
/* 0, or -1 with dg_error naming the field and the constraint. */
int dg_mqar_validate(const dg_mqar_config *cfg);
/* Q after resolving 0 to N. */
int64_t dg_mqar_num_queries(const dg_mqar_config *cfg);

/* One example from its own seed: inputs[T], targets[T].  0 or -1 (invalid config). */
int dg_mqar_example(const dg_mqar_config *cfg, uint64_t example_seed, int64_t *inputs, int64_t *targets);
/* B fresh training examples from rng (row-major [B,T]).  0 or -1. */
int dg_mqar_fill(const dg_mqar_config *cfg, dg_rng *rng, int64_t batch, int64_t *inputs, int64_t *targets);
/* The same as two i64 tensors [B,T] (autoreleased like any op's result).  0 or -1. */
int dg_mqar_batch(const dg_mqar_config *cfg, dg_rng *rng, int64_t batch, dg_tensor **inputs, dg_tensor **targets);

/* A fixed set of n examples (held-out evaluation): example i = dg_mqar_example(mix(seed, i)). */
typedef struct dg_mqar_set {
    dg_mqar_config cfg;
    uint64_t seed;
    int64_t n;
    int64_t *inputs;  /* [n, T] */
    int64_t *targets; /* [n, T] */
} dg_mqar_set;

dg_mqar_set *dg_mqar_set_new(const dg_mqar_config *cfg, uint64_t seed, int64_t n);
void dg_mqar_set_free(dg_mqar_set *s);
/* Rows [start, start + count) of the set as i64 tensors [count, T] (count is clipped to the set's
 * end).  Returns the number of rows, or -1 with dg_error set. */
int64_t dg_mqar_set_batch(const dg_mqar_set *s, int64_t start, int64_t count, dg_tensor **inputs, dg_tensor **targets);

/* Counts scored positions (targets != ignore) and, among them, predictions equal to the target. */
void dg_count_correct(int64_t n, const int64_t *targets, const int64_t *predictions, int64_t ignore_index,
                      int64_t *correct, int64_t *scored);

#endif

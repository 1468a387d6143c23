/* Byte-level language-modelling data from any file: tokens are the file's bytes (vocabulary 256).
 *
 * The file is read whole.  Split: the first n - floor(n * val_fraction) bytes train, the last
 * floor(n * val_fraction) validate (val_fraction 0.1 by default).  Training batches are random
 * windows [B, T+1] (inputs = window[:, :T], targets = window[:, 1:]): each row's start is drawn
 * uniformly from the split's valid starts with the caller's dg_rng (two u32 draws per row, more
 * only on the rare rejection), so a run is reproducible from its seed and resumable from the rng
 * state.  Evaluation walks the split in order: window w starts at w*T, so consecutive windows
 * overlap by one byte and every byte after the first is predicted exactly once. */
#ifndef DG_MODELS_TEXT_DATA_H
#define DG_MODELS_TEXT_DATA_H

#include "deltagrad.h"

typedef enum { DG_SPLIT_TRAIN, DG_SPLIT_VAL } dg_split;

typedef struct dg_text_data {
    char *path;
    uint8_t *bytes; /* the whole file */
    int64_t n_bytes;
    int64_t n_train; /* train = bytes[0, n_train), validation = bytes[n_train, n_bytes) */
} dg_text_data;

/* Reads path; val_fraction in [0, 1).  NULL with dg_error ("text_data: cannot open 'x': No such
 * file or directory", "... is empty", "... is a directory") on failure. */
dg_text_data *dg_text_load(const char *path, double val_fraction);
void dg_text_free(dg_text_data *d);

const uint8_t *dg_text_split_bytes(const dg_text_data *d, dg_split split, int64_t *n);

/* B random windows of T+1 bytes from the split into out[B*(T+1)] (as int64 token ids).  0, or -1
 * with dg_error when the split is shorter than T+1 bytes. */
int dg_text_sample(const dg_text_data *d, dg_split split, dg_rng *rng, int64_t B, int64_t T, int64_t *out);
/* The same as an i64 tensor [B, T+1] (autoreleased like any op's result), or NULL. */
dg_tensor *dg_text_batch(const dg_text_data *d, dg_split split, dg_rng *rng, int64_t B, int64_t T);

/* Number of evaluation windows of T+1 bytes in the split: floor((n - 1) / T). */
int64_t dg_text_num_windows(const dg_text_data *d, dg_split split, int64_t T);
/* Evaluation windows first .. first+B-1 (clipped to the split's end) into out; returns the number
 * of rows written, or -1 with dg_error. */
int64_t dg_text_windows(const dg_text_data *d, dg_split split, int64_t first, int64_t B, int64_t T, int64_t *out);

#endif

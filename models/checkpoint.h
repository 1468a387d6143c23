/* Checkpoints of a training run, in a directory:
 *
 *   DIR/model.safetensors        the parameters under FLA's state_dict names and shapes (f32), with
 *                                metadata "format" = "pt" (what transformers expects), "config" =
 *                                the model config as FLA's config.json, "deltagrad.step", and
 *                                "deltagrad.train_config" (the run's settings, JSON)
 *   DIR/config.json              the same config for Hugging Face / FLA (from_pretrained(DIR))
 *   DIR/optimizer-STEP.safetensors  AdamW's moments (models/optim.h) and, in its metadata, the step,
 *                                the data generator's state and the run's settings
 *
 * Every file is written atomically (models/atomic_file.h).  A save writes the optimiser file of the
 * new step first, then model.safetensors (whose "deltagrad.step" names the optimiser file that goes
 * with it), then removes older optimiser files: a run killed at any point leaves a model file and the
 * optimiser file of its step, so it resumes from a consistent pair.
 *
 * Loading checks everything before trusting it (the safetensors reader validates the format and the
 * data CRC): the config parses and is valid, every parameter is present with its shape, there is no
 * unknown tensor, the optimiser file matches the model's step.  Any problem is an error naming the
 * file and what is wrong, never a crash. */
#ifndef DG_MODELS_CHECKPOINT_H
#define DG_MODELS_CHECKPOINT_H

#include "models/lm.h"
#include "models/optim.h"

#define DG_CKPT_MODEL_FILE "model.safetensors"

/* Writes DIR/model.safetensors and DIR/config.json (the directory must exist).  train_json may be
 * NULL.  0, or -1 with dg_error. */
int dg_ckpt_save_model(const char *dir, const dg_lm *lm, int64_t step, const char *train_json);

/* Path of the optimiser file of a step: DIR/optimizer-00000123.safetensors (static buffer per call
 * site is not used: writes into buf). */
char *dg_ckpt_optimizer_path(const char *dir, int64_t step, char *buf, size_t n);

/* The whole checkpoint: optimiser state (with n_meta extra metadata pairs) then the model, then older
 * optimiser files are removed.  0, or -1 with dg_error. */
int dg_ckpt_save(const char *dir, const dg_lm *lm, const dg_adamw *opt, int64_t step, const char *train_json,
                 int n_meta, const char *const *keys, const char *const *values);

/* A loaded model file. */
typedef struct dg_ckpt_model {
    dg_lm *lm;
    int64_t step;     /* -1 when the file has no deltagrad.step (e.g. written by PyTorch) */
    char *train_json; /* NULL when absent */
    char *path;       /* the model file read */
} dg_ckpt_model;

/* Reads a model from DIR (DIR/model.safetensors) or from a .safetensors file.  The model config comes
 * from the file's "config" metadata, or else from config.json beside it.  0, or -1 with dg_error. */
int dg_ckpt_load_model(const char *dir_or_file, dg_ckpt_model *out);
void dg_ckpt_model_free(dg_ckpt_model *m);

/* Only the metadata of DIR/model.safetensors (or of that file): the model config, the run's settings
 * (malloc'ed JSON or NULL), the step (-1 if absent) and the path read (malloc'ed); any of the
 * outputs may be NULL.  The whole file is validated.  0, or -1 with dg_error. */
int dg_ckpt_read_meta(const char *dir_or_file, dg_model_config *mc, char **train_json, int64_t *step, char **path);

/* Removes the run in DIR: model.safetensors, config.json, optimizer-*.safetensors, metrics.csv and
 * metrics.svg (other files are left).  0, or -1 with dg_error. */
int dg_ckpt_remove_run(const char *dir);
/* Copies the parameters of a model file into lm (names and shapes must match exactly; a NaN or an
 * infinity in a parameter is an error).  0 or -1. */
int dg_ckpt_load_params(const char *path, dg_lm *lm);

#endif

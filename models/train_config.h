/* The settings of a training run (everything `deltagrad train` takes besides the model config), with
 * defaults and a JSON form stored in checkpoints so that `--resume` and `deltagrad eval` know the
 * task, the data and the schedule of the run. */
#ifndef DG_MODELS_TRAIN_CONFIG_H
#define DG_MODELS_TRAIN_CONFIG_H

#include "deltagrad.h"
#include "models/mqar.h"

typedef enum { DG_TASK_MQAR = 0, DG_TASK_TEXT = 1 } dg_task_kind;

/* The step's precision (models/lm.h, dg_lm_set_precision): auto is bf16 mixed precision on cuda,
 * f32 on the CPU. */
typedef enum { DG_PRECISION_AUTO = 0, DG_PRECISION_F32 = 1, DG_PRECISION_BF16 = 2 } dg_precision;

typedef struct dg_train_config {
    dg_task_kind task;
    dg_mqar_config mqar;   /* task mqar: its sizes (seq_len is mqar.seq_len) */
    int64_t eval_examples; /* mqar: size of the fixed held-out set */
    char data[1024];       /* task text: the file */
    double val_fraction;   /* text: the last fraction of the file validates */
    int64_t seq_len;       /* text: tokens per training window */
    int64_t eval_batches;  /* text: at most this many batches of validation windows per eval */
    int64_t steps, batch;
    double lr, min_lr_ratio;
    int64_t warmup;
    double weight_decay, beta1, beta2, adam_eps, clip;
    uint64_t seed; /* model initialisation and training data */
    dg_device device;
    int64_t eval_every, save_every, log_every;
    double target_acc; /* stop once the held-out accuracy reaches it (0: never) */
    char out_dir[1024];
    dg_delta_algorithm algorithm;
    int chunk_size;    /* chunked algorithm: 16, 32 or 64 */
    char backward[32]; /* delta-rule backward variant ("" = the op's default) */
    int threads;       /* 0: all cores */
    dg_precision precision;
} dg_train_config;

/* The precision a run uses on its device: auto resolved (bf16 on cuda, f32 on the CPU). */
dg_dtype dg_train_precision(const dg_train_config *tc);
const char *dg_precision_name(dg_precision p); /* "auto", "f32", "bf16" */
/* The tokens of one training sequence: the MQAR sequence length for MQAR, else seq_len. */
int64_t dg_train_seq_len(const dg_train_config *tc);

dg_train_config dg_train_default_config(void);
const char *dg_task_name(dg_task_kind k); /* "mqar", "text" */
/* 0, or -1 with dg_error naming the setting. */
int dg_train_config_validate(const dg_train_config *tc);
/* One line of JSON (malloc'ed), or NULL with dg_error. */
char *dg_train_config_to_json(const dg_train_config *tc);
/* Fields present in the JSON replace those of *tc (start from the defaults).  0, or -1. */
int dg_train_config_from_json(const char *json, dg_train_config *tc);

#endif

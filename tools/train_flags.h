/* The options of `deltagrad train` (and the model / task options that eval and generate share):
 * one table of flags over the model config, the training config and the run-time controls, with
 * --help generated from it (defaults shown). */
#ifndef DG_TOOLS_TRAIN_FLAGS_H
#define DG_TOOLS_TRAIN_FLAGS_H

#include "models/model_config.h"
#include "models/train_config.h"

typedef struct dg_train_opts {
    dg_model_config mc;
    dg_train_config tc;
    char resume[1024];
    int64_t stop_at;
    int gpus; /* processes, one a GPU (0: every visible GPU); 1: this process alone */
    bool quiet;
    bool graph;           /* cuda, one GPU: the step as a CUDA graph (models/train_graph.h) */
    bool keep_delta_work; /* the delta op keeps its forward's work for the backward (dg_mixer_opts) */
    bool bf16_all_reduce; /* several GPUs: the gradients are averaged in bf16 (dg_dp_set_grad_dtype) */
    bool overwrite;       /* replace the run already in the output directory */
    bool out_given;       /* --out was on the command line */
    bool model_given;     /* some model option was on the command line */
    bool device_given;    /* --device was on the command line */
} dg_train_opts;

/* The defaults of every option. */
dg_train_opts dg_train_opts_default(void);
/* Finds "--resume DIR" / "--resume=DIR" in argv (NULL if absent) and whether --help is there. */
const char *dg_train_flags_find_resume(int argc, char **argv, bool *help);
/* Applies every option of argv[1..] to o.  0, or -1 with a message on stderr. */
int dg_train_flags_parse(int argc, char **argv, dg_train_opts *o);
/* The usage text with defaults. */
void dg_train_flags_help(FILE *f);

#endif

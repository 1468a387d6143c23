/* `deltagrad train --gpus N`: the process that starts one training process a GPU and watches them
 * (docs/MULTI_GPU.md). */
#ifndef DG_TOOLS_LAUNCH_GPUS_H
#define DG_TOOLS_LAUNCH_GPUS_H

#include "tools/train_flags.h"

/* Seconds between asking the ranks left to stop (SIGTERM) after one of them failed and killing them
 * (SIGKILL). */
#define DG_LAUNCH_GRACE_S 10

/* When o asks for more than one GPU (--gpus N > 1, or 0: every visible GPU, when there are several),
 * runs `deltagrad train` with argv (argv[0] is "train") as N processes, rank r on GPU r, and waits
 * for them; returns true with *status the exit status of the whole run.  A failed rank stops the
 * others; SIGINT and SIGTERM are passed on to every rank, which stop together after the same step
 * with a checkpoint.  false: one GPU, train in this process. */
bool dg_launch_gpus(int argc, char **argv, const dg_train_opts *o, int *status);

#endif

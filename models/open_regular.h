/* Opening an input file that must be a regular file.  A plain fopen of a FIFO blocks until a writer
 * appears (`eval --ckpt some_fifo` would hang), and a device file can stream forever; the readers of
 * checkpoints, configs and text data open through here instead. */
#ifndef DG_MODELS_OPEN_REGULAR_H
#define DG_MODELS_OPEN_REGULAR_H

#include <stdio.h>

/* path opened for reading ("rb") if it is a regular file: opened without blocking, checked with
 * fstat, then switched back to blocking reads.  NULL with dg_error "WHAT: cannot open 'PATH': ..."
 * or "WHAT: 'PATH' is a FIFO|directory|device|..., not a regular file". */
FILE *dg_fopen_regular(const char *path, const char *what);

#endif

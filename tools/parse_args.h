/* Strict parsing of the tools' command-line values, and the look-up of ops by name.
 *
 * Every value is read whole: "--T abc", "--T 12x", "--T 99999999999999999999" and a value out of
 * the flag's range are errors naming the flag and the value, never a silent 0 or a clamp.  Each
 * function prints its message to stderr as "cmd: ..." and returns -1 (or NULL); the commands then
 * exit with status 2. */
#ifndef DG_TOOLS_PARSE_ARGS_H
#define DG_TOOLS_PARSE_ARGS_H

#include "ops/op.h"

#include <stdbool.h>
#include <stdint.h>

/* The value after argv[*i] (a flag), advancing *i; NULL after "cmd: FLAG needs a value". */
const char *dg_arg_value(const char *cmd, int argc, char **argv, int *i);

/* A decimal integer in [lo, hi] into *out; 0, or -1 after the message. */
int dg_arg_int(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out);
/* A decimal unsigned 64-bit integer (a seed) into *out. */
int dg_arg_u64(const char *cmd, const char *flag, const char *value, uint64_t *out);
/* A comma-separated list of 1..max integers in [lo, hi] ("1,4"); the count, or -1. */
int dg_arg_int_list(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out,
                    int max);
/* value as one of the n names in choices: its index, or -1 after a message listing them. */
int dg_arg_choice(const char *cmd, const char *flag, const char *value, const char *const *choices, int n);

/* The registered op called name.  With several_variants, only ops with more than one backward
 * variant are accepted.  NULL after "cmd: no op named 'x' (ops: ...)" listing the valid names. */
const dg_op_def *dg_arg_op(const char *cmd, const char *name, bool several_variants);
/* The names of the registered ops (with several_variants: those with more than one backward
 * variant), ", "-separated, on f. */
void dg_print_op_names(FILE *f, bool several_variants);

/* "cmd: unknown option 'arg' (deltagrad cmd --help)"; returns -1. */
int dg_arg_unknown(const char *cmd, const char *arg);

#endif

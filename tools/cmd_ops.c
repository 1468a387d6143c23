/* deltagrad ops [NAME ...]: the registered ops, one a line (name, inputs, backward variants), or
 * for the ops named: inputs, outputs, backward variants, decomposition, tolerances, samples. */
#include "tools/commands.h"
#include "tools/parse_args.h"

#include <stdlib.h>
#include <string.h>

static void print_names(const char *const *names, int n) {
    for (int k = 0; k < n; k++) printf(" %s", names[k] ? names[k] : "?");
}

static void print_line(const dg_op_def *d) {
    printf("%-22s in:", d->name);
    print_names(d->in_names, d->n_in);
    printf("  backward:");
    for (int v = 0; v < dg_op_variant_count(d); v++) printf(" %s", d->bwd[v].name);
    printf("%s\n", d->decompose ? "  (+decomposition)" : "");
}

static void print_detail(const dg_op_def *d) {
    printf("%s\n  inputs:", d->name);
    print_names(d->in_names, d->n_in);
    printf("\n  outputs:");
    print_names(d->out_names, d->n_out);
    printf("\n  backward variants:");
    for (int v = 0; v < dg_op_variant_count(d); v++) printf(" %s%s", d->bwd[v].name, v == 0 ? " (default)" : "");
    printf("\n  decomposition: %s\n", d->decompose ? "yes (compare runs its autograd graph)" : "no");
    printf("  tolerances: f64 atol %.3g rtol %.3g, f32 atol %.3g rtol %.3g\n", d->atol_f64, d->rtol_f64, d->atol_f32,
           d->rtol_f32);
    int n = 0;
    for (;; n++) {
        dg_scope_begin();
        dg_sample s = {0};
        int more = d->sample ? d->sample(n, DG_F64, 1, &s) : 0;
        if (more > 0) printf("  sample %d: %s\n", n, s.label);
        dg_sample_free(&s);
        dg_scope_end();
        if (more <= 0) break;
    }
    dg_clear_error();
}

int dg_cmd_ops(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: deltagrad ops [NAME ...]\n"
                   "Without names: every registered op with its inputs and backward variants, one a line.\n"
                   "With names: each op's inputs, outputs, backward variants, decomposition, tolerances and\n"
                   "the sampler's samples.  A name that is not an op is an error (exit 2) listing the ops.\n");
            return 0;
        }
        if (argv[i][0] == '-') {
            dg_arg_unknown("ops", argv[i]);
            return 2;
        }
        if (!dg_arg_op("ops", argv[i], false)) return 2;
    }
    if (argc < 2)
        for (int i = 0; i < dg_op_count(); i++) print_line(dg_op_at(i));
    for (int i = 1; i < argc; i++) print_detail(dg_op_find(argv[i]));
    return 0;
}

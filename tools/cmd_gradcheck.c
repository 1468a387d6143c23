/* deltagrad gradcheck [OP ...]: every registered op (or those named), in f64, against central
 * differences; a table, and a non-zero exit on any failure. */
#include "autograd/autograd.h"
#include "tools/commands.h"

#include <stdlib.h>
#include <string.h>

int dg_cmd_gradcheck(int argc, char **argv) {
    uint64_t seed = 1;
    int first_op = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: deltagrad gradcheck [--seed N] [OP ...]\n"
                   "Checks every backward variant of every registered op (or those named) in f64 against\n"
                   "central finite differences, on each op's samples with contiguous and strided inputs.\n"
                   "Prints op, backward variant, input, max abs and rel error; exits 1 on any failure.\n");
            return 0;
        }
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (first_op == argc) first_op = i;
    }
    dg_gradcheck_report rep = {0};
    int unknown = 0;
    if (first_op == argc)
        for (int i = 0; i < dg_op_count(); i++) dg_gradcheck_op(dg_op_at(i), seed, &rep);
    for (int i = first_op; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0) {
            i++;
            continue;
        }
        const dg_op_def *def = dg_op_find(argv[i]);
        if (!def) {
            fprintf(stderr, "gradcheck: no op named '%s' (deltagrad ops lists them)\n", argv[i]);
            unknown++;
            continue;
        }
        dg_gradcheck_op(def, seed, &rep);
    }
    dg_gradcheck_print(&rep, stdout);
    int bad = rep.n_failed || unknown;
    dg_gradcheck_report_free(&rep);
    return bad ? 1 : 0;
}

int dg_cmd_ops(int argc, char **argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *d = dg_op_at(i);
        printf("%-22s in:", d->name);
        for (int k = 0; k < d->n_in && d->in_names[k]; k++) printf(" %s", d->in_names[k]);
        printf("  backward:");
        for (int v = 0; v < dg_op_variant_count(d); v++) printf(" %s", d->bwd[v].name);
        printf("%s\n", d->decompose ? "  (+decomposition)" : "");
    }
    return 0;
}

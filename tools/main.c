/* deltagrad: train, generate, eval, gradcheck, compare, bench, ops. */
#include "deltagrad.h"
#include "ops/op.h"
#include "tools/commands.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

int main(int argc, char **argv) {
    const command cmds[] = {
        {"train", dg_cmd_train, "train a model (default: GatedDeltaNet on MQAR)"},
        {"generate", dg_cmd_generate, "generate text from a byte-level checkpoint"},
        {"eval", dg_cmd_eval, "evaluate a checkpoint on its task"},
        {"gradcheck", dg_cmd_gradcheck, "finite-difference check of every registered op (or those named)"},
        {"compare", dg_cmd_compare, "compare the backward paths of an op against the f64 reference"},
        {"bench", dg_cmd_bench, "time an op (default: the delta ops, GFLOP/s against this machine's GEMM rate)"},
        {"ops", dg_cmd_ops, "list the registered ops (or those named): inputs, outputs, backward variants"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    const char *sub = argc > 1 ? argv[1] : "train";
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        printf("usage: deltagrad [COMMAND] [OPTIONS]   (no command: train)\n\ncommands:\n");
        for (int i = 0; i < n; i++) printf("  %-10s %s\n", cmds[i].name, cmds[i].help);
        printf("\n`deltagrad COMMAND --help` lists a command's options.\n");
        return 0;
    }
    /* DG_BACKWARD is checked once, before any command runs: a misspelled op or variant would
     * otherwise surface only when (and if) that op is applied with no explicit variant. */
    if (dg_op_count() > 0 && dg_op_env_variant(dg_op_at(0)) == -2) {
        fprintf(stderr, "deltagrad: %s\n", dg_last_error());
        return 2;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(sub, cmds[i].name) == 0)
            return argc > 1 ? cmds[i].fn(argc - 1, argv + 1) : cmds[i].fn(1, (char *[]){"train", NULL});
    fprintf(stderr, "deltagrad: unknown command '%s' (try --help)\n", sub);
    return 2;
}

/* The subcommands of `deltagrad`, each in its own tools/cmd_*.c: argv[0] is the command's name;
 * each returns the process exit status (0 ok, 1 a check or run failed, 2 bad arguments). */
#ifndef DG_TOOLS_COMMANDS_H
#define DG_TOOLS_COMMANDS_H

#define DG_COMMAND(name) int dg_cmd_##name(int argc, char **argv);
DG_COMMAND(train)
DG_COMMAND(generate)
DG_COMMAND(eval)
DG_COMMAND(gradcheck)
DG_COMMAND(compare)
DG_COMMAND(bench)
DG_COMMAND(ops)
#undef DG_COMMAND

#include "deltagrad.h"

#include <stdio.h>
#include <string.h>

/* The library's last error on stderr, prefixed "cmd: " unless it says so already (the trainer's
 * own messages name the command). */
static inline void dg_cmd_say_error(const char *cmd) {
    const char *m = dg_last_error();
    const size_t n = strlen(cmd);
    if (strncmp(m, cmd, n) == 0 && m[n] == ':') fprintf(stderr, "%s\n", m);
    else fprintf(stderr, "%s: %s\n", cmd, m);
}

#endif

/* The subcommands of `deltagrad`.  Each lives in its own tools/cmd_*.c; the references are weak so
 * that a command appears as soon as its file is in the build. */
#ifndef DG_TOOLS_COMMANDS_H
#define DG_TOOLS_COMMANDS_H

#define DG_COMMAND(name) int dg_cmd_##name(int argc, char **argv) __attribute__((weak));
DG_COMMAND(train)
DG_COMMAND(generate)
DG_COMMAND(eval)
DG_COMMAND(gradcheck)
DG_COMMAND(compare)
DG_COMMAND(bench)
DG_COMMAND(ops)
#undef DG_COMMAND

#endif

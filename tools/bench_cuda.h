/* `deltagrad bench --device cuda` (tools/bench_cuda.c): the chunked delta-rule CUDA kernels at
 * the benchmark shapes (S1..S4), timed with CUDA events, next to ceilings measured in the same run. */
#ifndef DG_TOOLS_BENCH_CUDA_H
#define DG_TOOLS_BENCH_CUDA_H

/* argv as given to `deltagrad bench` (argv[0] is "bench").  Returns the process exit status:
 * 0, 1 (a kernel failed), 2 (bad arguments or no CUDA in this build / on this machine). */
int dg_bench_cuda(int argc, char **argv);

#endif

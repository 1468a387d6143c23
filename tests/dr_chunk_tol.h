/* The error bounds of fp16 storage in the chunked CUDA kernels' tests (test_cuda_dr_chunk.c,
 * test_cuda_dr_chunk_kda.c): relative error norms against the f64 recurrence on the same
 * fp16-rounded inputs. */
#ifndef DG_TESTS_DR_CHUNK_TOL_H
#define DG_TESTS_DR_CHUNK_TOL_H

/* Bound on ||x - ref|| / ||ref|| for fp16 storage.  The inputs are exact (the reference gets the
 * same fp16 values) and the generic kernels compute in f32, whose error e32 is <= 1e-5 here (the
 * f32 tests, same shapes and kernels).  Each fp16 output and gradient is then rounded once to
 * nearest: |fl(x) - x| <= u |x| with u = 2^-11 = 4.88e-4 (fp16 keeps 11 significant bits) for
 * every normal x, so ||fl(x) - ref|| <= u ||x|| + ||x - ref|| <= u (1 + e32) + e32 = 4.98e-4 of
 * ||ref|| (subnormal results, below 6.1e-5, err by at most 2^-25 each: nothing in these norms).
 * 6e-4 is that plus a margin; two roundings of the same value, or bf16 bits read as fp16, can
 * exceed it.  Typical values are u / sqrt(3)-like, about 2e-4 (the rounding errors are spread
 * uniformly).  Two fp16 runs of different variants differ by at most twice that bound. */
#define F16_TOL 6e-4
/* The same on the tensor-core path (the fp16 builds of the head-gate and KDA kernels): the structure and the
 * plain / split choices of bf16 (whose bound is 5e-3), every intermediate rounding now 2^-11
 * instead of 2^-8 relative: 5e-3 / 8 = 6.25e-4, plus the rounding of each fp16 result (4.9e-4,
 * above), 1.1e-3. */
#define F16_MMA_TOL 1.1e-3

#endif

/* Internal to dr_pieces*.cu (C++): the chunk table of the standalone pieces, built on the host
 * and copied to the device.
 *
 * Chunks of C rows start at every sequence start: batch row b (tokens b*T .. b*T+T-1) without
 * cu_seqlens, tokens cu[n] .. cu[n+1]-1 with it (B = 1).  The last chunk of a sequence may be
 * partial; an empty sequence has no chunk.  Table (device): row0[c] the first row (b*T + t) of
 * chunk c, len[c] its rows (1..C). */
#ifndef DG_KERNELS_CUDA_DR_PIECES_CHUNKS_CUH
#define DG_KERNELS_CUDA_DR_PIECES_CHUNKS_CUH

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/delta/dr_pieces_cuda.h"

#include <stdlib.h>

struct DrpChunks {
    int64_t n = 0;        /* chunks */
    int64_t *row0 = NULL; /* device [n] */
    int *len = NULL;      /* device [n] */
};

static inline void drp_chunks_free(DrpChunks *t) {
    if (t->row0) dg_cuda_free(t->row0);
    if (t->len) dg_cuda_free(t->len);
    t->row0 = NULL;
    t->len = NULL;
}

/* Checks B, T, cu_seqlens (host), N and C (what names the caller in messages) and builds the
 * table.  0 (t->n may be 0: nothing to do), or -1 with dg_error set. */
static inline int drp_chunks_init(DrpChunks *t, const char *what, int64_t B, int64_t T, const int64_t *cu, int64_t N,
                                  int C) {
    t->n = 0;
    t->row0 = NULL;
    t->len = NULL;
    if (C != 16 && C != 32 && C != 64) {
        dg_error("%s: chunk %d is not 16, 32 or 64", what, C);
        return -1;
    }
    if (B < 0 || T < 0 || (cu && (B != 1 || N < 1)) || (!cu && N != B)) {
        dg_error("%s: B = %lld, T = %lld, N = %lld%s do not fit (cu_seqlens needs B = 1; else N = B)", what,
                 (long long)B, (long long)T, (long long)N, cu ? " with cu_seqlens" : "");
        return -1;
    }
    if (cu) {
        if (cu[0] != 0 || cu[N] != T) {
            dg_error("%s: cu_seqlens must run from 0 to T = %lld (got %lld .. %lld)", what, (long long)T,
                     (long long)cu[0], (long long)cu[N]);
            return -1;
        }
        for (int64_t i = 1; i <= N; i++)
            if (cu[i] < cu[i - 1]) {
                dg_error("%s: cu_seqlens decreases at index %lld", what, (long long)i);
                return -1;
            }
    }
    int64_t n = 0;
    for (int64_t q = 0; q < N; q++) {
        int64_t a = cu ? cu[q] : q * T, b = cu ? cu[q + 1] : q * T + T;
        n += (b - a + C - 1) / C;
    }
    if (n == 0) return 0;
    int64_t *r0 = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    int *ln = (int *)malloc(sizeof(int) * (size_t)n);
    if (!r0 || !ln) {
        free(r0);
        free(ln);
        dg_error("%s: out of host memory for the chunk table (%lld chunks)", what, (long long)n);
        return -1;
    }
    int64_t c = 0;
    for (int64_t q = 0; q < N; q++) {
        int64_t a = cu ? cu[q] : q * T, b = cu ? cu[q + 1] : q * T + T;
        for (int64_t s = a; s < b; s += C, c++) {
            r0[c] = s;
            ln[c] = (int)(b - s < C ? b - s : C);
        }
    }
    int rc = 0;
    t->row0 = dg_cuda_scratch<int64_t>((size_t)n);
    t->len = dg_cuda_scratch<int>((size_t)n);
    if (!t->row0 || !t->len) rc = -1;
    /* pageable source: the call returns once the host buffer has been read */
    if (rc == 0)
        rc = DG_CU(cudaMemcpyAsync(t->row0, r0, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice, dg_cuda_stream()));
    if (rc == 0)
        rc = DG_CU(cudaMemcpyAsync(t->len, ln, sizeof(int) * (size_t)n, cudaMemcpyHostToDevice, dg_cuda_stream()));
    if (rc == 0) rc = dg_cuda_synchronize();
    free(r0);
    free(ln);
    if (rc) {
        drp_chunks_free(t);
        return -1;
    }
    t->n = n;
    return 0;
}

/* Dynamic shared memory above 48 KiB needs an opt-in per kernel. */
template <typename K> static inline int drp_smem_optin(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return 0;
    return DG_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

#endif

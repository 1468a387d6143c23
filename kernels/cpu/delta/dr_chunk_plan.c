/* The chunk plan of the chunked delta-rule kernels: shape validation and the list of chunks
 * (see dr_chunk_internal.h). */
#include <stdlib.h>

#include "core/internal.h"
#include "kernels/cpu/delta/dr_chunk_internal.h"

int dg_drc_plan_init(dg_drc_plan *p, const dg_dr_shape *s, const char *what, int need) {
    memset(p, 0, sizeof *p);
    if (!s) {
        dg_error("%s: shape is NULL", what);
        return -1;
    }
    if (s->B < 1 || s->T < 0) {
        dg_error("%s: B = %lld, T = %lld (need B >= 1, T >= 0)", what, (long long)s->B, (long long)s->T);
        return -1;
    }
    if ((need & 1) && (s->H < 1 || s->HV < 1 || s->K < 1 || s->HV % s->H != 0)) {
        dg_error("%s: H = %lld, HV = %lld, K = %lld (need H, K >= 1 and HV a positive multiple of H)", what,
                 (long long)s->H, (long long)s->HV, (long long)s->K);
        return -1;
    }
    if ((need & 2) && s->V < 1) {
        dg_error("%s: V = %lld (need V >= 1)", what, (long long)s->V);
        return -1;
    }
    if (!(need & 1) && s->HV < 1) {
        dg_error("%s: HV = %lld (need HV >= 1)", what, (long long)s->HV);
        return -1;
    }
    if (s->chunk != 16 && s->chunk != 32 && s->chunk != 64) {
        dg_error("%s: chunk is %d but must be 16, 32 or 64", what, s->chunk);
        return -1;
    }
    if (s->gate != DG_GATE_NONE && s->gate != DG_GATE_HEAD && s->gate != DG_GATE_CHANNEL) {
        dg_error("%s: unknown gate kind %d", what, (int)s->gate);
        return -1;
    }
    int64_t N = s->cu_seqlens ? s->N : s->B;
    if (s->cu_seqlens) {
        if (s->B != 1) {
            dg_error("%s: cu_seqlens given with B = %lld (must be 1)", what, (long long)s->B);
            return -1;
        }
        if (N < 1) {
            dg_error("%s: cu_seqlens given with N = %lld sequences (need >= 1)", what, (long long)N);
            return -1;
        }
        const int64_t *cu = s->cu_seqlens;
        if (cu[0] != 0 || cu[N] != s->T) {
            dg_error("%s: cu_seqlens runs from %lld to %lld but must run from 0 to T = %lld", what, (long long)cu[0],
                     (long long)cu[N], (long long)s->T);
            return -1;
        }
        for (int64_t n = 0; n < N; n++)
            if (cu[n + 1] < cu[n]) {
                dg_error("%s: cu_seqlens decreases at %lld (%lld > %lld)", what, (long long)n, (long long)cu[n],
                         (long long)cu[n + 1]);
                return -1;
            }
    } else if (s->N != s->B && s->N != 0) {
        dg_error("%s: N = %lld but B = %lld without cu_seqlens (N must equal B)", what, (long long)s->N,
                 (long long)s->B);
        return -1;
    }
    const int64_t C = s->chunk;
    p->nseq = N;
    p->rows = s->B * s->T;
    p->seq_chunk = malloc(sizeof(int64_t) * (size_t)(N + 1));
    if (!p->seq_chunk) goto oom;
    p->seq_chunk[0] = 0;
    for (int64_t n = 0; n < N; n++) {
        int64_t len = s->cu_seqlens ? s->cu_seqlens[n + 1] - s->cu_seqlens[n] : s->T;
        p->seq_chunk[n + 1] = p->seq_chunk[n] + (len + C - 1) / C;
    }
    p->nchunks = p->seq_chunk[N];
    p->row0 = malloc(sizeof(int64_t) * (size_t)(p->nchunks + 1));
    p->len = malloc(sizeof(int) * (size_t)(p->nchunks + 1));
    p->edge = malloc((size_t)(p->nchunks + 1));
    if (!p->row0 || !p->len || !p->edge) goto oom;
    for (int64_t n = 0; n < N; n++) {
        int64_t bos = s->cu_seqlens ? s->cu_seqlens[n] : n * s->T;
        int64_t eos = s->cu_seqlens ? s->cu_seqlens[n + 1] : (n + 1) * s->T;
        for (int64_t c = p->seq_chunk[n]; c < p->seq_chunk[n + 1]; c++) {
            int64_t r0 = bos + (c - p->seq_chunk[n]) * C;
            p->row0[c] = r0;
            p->len[c] = (int)(eos - r0 < C ? eos - r0 : C);
            p->edge[c] =
                (unsigned char)((c == p->seq_chunk[n] ? DR_FIRST : 0) | (c + 1 == p->seq_chunk[n + 1] ? DR_LAST : 0));
        }
    }
    return 0;
oom:
    dg_drc_plan_free(p);
    dg_error("%s: out of memory for the chunk plan", what);
    return -1;
}

void dg_drc_plan_free(dg_drc_plan *p) {
    free(p->row0);
    free(p->len);
    free(p->seq_chunk);
    free(p->edge);
    memset(p, 0, sizeof *p);
}

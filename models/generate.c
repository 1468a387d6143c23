/* Token-by-token decoding with carried state (models/generate.h). */
#include "models/generate.h"

#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t dg_sample_token(const double *lg, int64_t V, const dg_sample_opts *o, dg_rng *rng) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (lg[v] > lg[best]) best = v;
    if (!o || o->temperature <= 0) return best;
    /* softmax(logits / T) over the top k (all when k is 0), drawn by inverting the CDF */
    int64_t k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    double thresh = -INFINITY;
    if (k < V) { /* the k-th largest value: partial selection on a copy */
        double *tmp = malloc((size_t)V * sizeof *tmp);
        if (!tmp) return best;
        memcpy(tmp, lg, (size_t)V * sizeof *tmp);
        for (int64_t i = 0; i < k; i++) {
            int64_t m = i;
            for (int64_t j = i + 1; j < V; j++)
                if (tmp[j] > tmp[m]) m = j;
            double x = tmp[i];
            tmp[i] = tmp[m];
            tmp[m] = x;
        }
        thresh = tmp[k - 1];
        free(tmp);
    }
    double total = 0;
    for (int64_t v = 0; v < V; v++)
        if (lg[v] >= thresh) total += exp((lg[v] - lg[best]) / o->temperature);
    double u = dg_rng_uniform(rng) * total, acc = 0;
    int64_t last = best;
    for (int64_t v = 0; v < V; v++) {
        if (lg[v] < thresh) continue;
        acc += exp((lg[v] - lg[best]) / o->temperature);
        last = v;
        if (u < acc) return v;
    }
    return last;
}

/* The last row of logits [1,T,V] as doubles into row[V] (a device model's row is copied back). */
static int last_row(dg_tensor *logits, double *row) {
    if (!logits) return -1;
    int64_t T = logits->shape[1], V = logits->shape[2];
    if (logits->device != DG_CPU) {
        logits = dg_to_device(dg_slice(logits, 1, T - 1, T), DG_CPU);
        T = 1;
    }
    dg_tensor *c = dg_contiguous(logits);
    if (!c) return -1;
    for (int64_t v = 0; v < V; v++) {
        int64_t idx[3] = {0, T - 1, v};
        row[v] = dg_get(c, idx);
    }
    return 0;
}

int64_t dg_generate(const dg_lm *lm, const int64_t *prompt, int64_t n_prompt, int64_t max_new, const dg_sample_opts *o,
                    dg_rng *rng, int64_t *out, double *logits_out, void (*on_token)(int64_t, void *), void *ctx) {
    if (n_prompt < 1 || max_new < 0) {
        dg_error("generate: the prompt has %lld tokens (at least 1 is needed) and max_new is %lld", (long long)n_prompt,
                 (long long)max_new);
        return -1;
    }
    int64_t V = lm->cfg.vocab_size;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V) {
            dg_error("generate: prompt token %lld at position %lld is outside the vocabulary [0, %lld)",
                     (long long)prompt[i], (long long)i, (long long)V);
            return -1;
        }
    int64_t *seq = malloc((size_t)(n_prompt + max_new) * sizeof *seq);
    double *row = malloc((size_t)V * sizeof *row);
    dg_lm_cache *cache = o && o->use_cache ? dg_lm_cache_new(lm) : NULL;
    int64_t made = -1;
    if (!seq || !row || (o && o->use_cache && !cache)) {
        dg_error("generate: out of memory");
        goto out;
    }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int64_t n = n_prompt, fed = 0; /* fed: tokens already inside the cache */
    dg_no_grad_begin();
    for (made = 0; made < max_new; made++) {
        dg_scope_begin();
        int64_t start = cache ? fed : 0;
        dg_tensor *ids = dg_from_data(DG_SHAPE(1, n - start), DG_I64, seq + start);
        dg_tensor *logits = dg_lm_forward(lm, ids, cache);
        int rc = logits ? last_row(logits, row) : -1;
        dg_scope_end();
        if (rc) {
            made = -1;
            break;
        }
        fed = n;
        int64_t tok = dg_sample_token(row, V, o, rng);
        if (logits_out) memcpy(logits_out + made * V, row, (size_t)V * sizeof *row);
        out[made] = tok;
        seq[n++] = tok;
        if (on_token) on_token(tok, ctx);
    }
    dg_no_grad_end();
out:
    dg_lm_cache_free(cache);
    free(seq);
    free(row);
    return made;
}

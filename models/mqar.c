/* MQAR generator (layout and determinism in mqar.h). */
#include "models/mqar.h"

#include "models/infra_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* domain separation between the held-out set's per-example seeds and anything else */
#define SET_DOMAIN 0xA5E7D0D1C0FFEE11ull

dg_mqar_config dg_mqar_default_config(void) {
    return (dg_mqar_config){.vocab_size = 256,
                            .seq_len = 128,
                            .num_kv_pairs = 16,
                            .num_queries = 0,
                            .power_a = 0.01,
                            .random_filler = false};
}

int64_t dg_mqar_num_queries(const dg_mqar_config *cfg) {
    return cfg->num_queries ? cfg->num_queries : cfg->num_kv_pairs;
}

int dg_mqar_validate(const dg_mqar_config *cfg) {
    if (!cfg) {
        dg_error("mqar: NULL config");
        return -1;
    }
    int64_t V = cfg->vocab_size, T = cfg->seq_len, N = cfg->num_kv_pairs, Q = dg_mqar_num_queries(cfg);
    if (V < 4 || V > ((int64_t)1 << 31)) {
        dg_error("mqar: vocab_size %lld is outside 4 .. 2^31", (long long)V);
        return -1;
    }
    if (N < 1 || N > V / 2 - 1 || N > V - V / 2) {
        dg_error(
            "mqar: num_kv_pairs %lld must be in 1 .. %lld (distinct keys from [1, %lld), values from [%lld, %lld))",
            (long long)N, (long long)(V / 2 - 1), (long long)(V / 2), (long long)(V / 2), (long long)V);
        return -1;
    }
    if (cfg->num_queries < 0 || Q > N) {
        dg_error("mqar: num_queries %lld must be in 0 .. num_kv_pairs = %lld (0 means all)",
                 (long long)cfg->num_queries, (long long)N);
        return -1;
    }
    if (T < 2 * N + 2 * Q || T > ((int64_t)1 << 31)) {
        dg_error("mqar: seq_len %lld is too short for %lld pairs and %lld queries (needs >= 2N + 2Q = %lld)",
                 (long long)T, (long long)N, (long long)Q, (long long)(2 * N + 2 * Q));
        return -1;
    }
    if (!(cfg->power_a > 0.0 && cfg->power_a <= 1.0)) {
        dg_error("mqar: power_a %g must be in (0, 1] (1 places queries uniformly)", cfg->power_a);
        return -1;
    }
    return 0;
}

/* First k entries of a random permutation of pool[0..n) (partial Fisher-Yates), in place. */
static void partial_shuffle(dg_rng *rng, int64_t *pool, int64_t n, int64_t k) {
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + (int64_t)dgm_rng_below(rng, (uint64_t)(n - i));
        int64_t t = pool[i];
        pool[i] = pool[j];
        pool[j] = t;
    }
}

/* One example; scratch holds max(V/2, slots) int64 and slots doubles. */
static void example(const dg_mqar_config *cfg, uint64_t seed, int64_t *in, int64_t *tg, int64_t *pool, double *w) {
    const int64_t V = cfg->vocab_size, T = cfg->seq_len, N = cfg->num_kv_pairs, Q = dg_mqar_num_queries(cfg);
    const int64_t half = V / 2, ctx = 2 * N, slots = (T - ctx) / 2;
    dg_rng rng = dg_rng_new(seed);

    for (int64_t t = 0; t < T; t++) {
        in[t] = 0;
        tg[t] = DG_MQAR_IGNORE;
    }
    /* keys: N distinct from [1, half) */
    for (int64_t i = 0; i < half - 1; i++) pool[i] = 1 + i;
    partial_shuffle(&rng, pool, half - 1, N);
    for (int64_t i = 0; i < N; i++) in[2 * i] = pool[i];
    /* values: N distinct from [half, V) */
    for (int64_t i = 0; i < V - half; i++) pool[i] = half + i;
    partial_shuffle(&rng, pool, V - half, N);
    for (int64_t i = 0; i < N; i++) in[2 * i + 1] = pool[i];

    /* query slots: Q draws without replacement, P(s) ~ (s+1)^(a-1) among the slots left (the
     * sequential scheme of numpy's choice(replace=False, p=...)) */
    double total = 0;
    for (int64_t s = 0; s < slots; s++) total += w[s] = pow((double)(s + 1), cfg->power_a - 1.0);
    for (int64_t q = 0; q < Q; q++) {
        double u = dg_rng_uniform(&rng) * total, acc = 0;
        int64_t s = -1, last = -1;
        for (int64_t j = 0; j < slots; j++) {
            if (w[j] == 0) continue;
            last = j;
            acc += w[j];
            if (u < acc) {
                s = j;
                break;
            }
        }
        if (s < 0) s = last; /* u landed on the rounding gap at the top */
        total -= w[s];
        w[s] = 0;
        /* query q asks for pair q (the pairs are in random order already) */
        int64_t p = ctx + 2 * s;
        in[p] = in[2 * q];
        in[p + 1] = in[2 * q + 1];
        tg[p] = in[2 * q + 1];
    }

    if (cfg->random_filler) {
        /* filler from [1, V) minus this sequence's keys: draw from the V-1-N allowed tokens (pool,
         * free again, holds >= V/2 >= N entries) */
        int64_t *keys_sorted = pool;
        for (int64_t i = 0; i < N; i++) keys_sorted[i] = in[2 * i];
        for (int64_t i = 1; i < N; i++) /* insertion sort: N is small */
            for (int64_t j = i; j > 0 && keys_sorted[j - 1] > keys_sorted[j]; j--) {
                int64_t t = keys_sorted[j];
                keys_sorted[j] = keys_sorted[j - 1];
                keys_sorted[j - 1] = t;
            }
        for (int64_t t = ctx; t < T; t++) {
            if (in[t] != 0) continue;
            int64_t r = 1 + (int64_t)dgm_rng_below(&rng, (uint64_t)(V - 1 - N));
            /* the r-th allowed token: skip over the keys <= it, in increasing order */
            for (int64_t i = 0; i < N && keys_sorted[i] <= r; i++) r++;
            in[t] = r;
        }
    }
}

static int64_t *scratch_pool(const dg_mqar_config *cfg, double **w) {
    int64_t slots = (cfg->seq_len - 2 * cfg->num_kv_pairs) / 2;
    int64_t n = cfg->vocab_size - cfg->vocab_size / 2;
    if (n < slots) n = slots;
    int64_t *pool = malloc((size_t)n * sizeof *pool);
    *w = malloc((size_t)(slots > 0 ? slots : 1) * sizeof **w);
    if (!pool || !*w) {
        free(pool);
        free(*w);
        dg_error("mqar: out of memory");
        return NULL;
    }
    return pool;
}

int dg_mqar_example(const dg_mqar_config *cfg, uint64_t example_seed, int64_t *inputs, int64_t *targets) {
    if (dg_mqar_validate(cfg)) return -1;
    double *w;
    int64_t *pool = scratch_pool(cfg, &w);
    if (!pool) return -1;
    example(cfg, example_seed, inputs, targets, pool, w);
    free(pool);
    free(w);
    return 0;
}

int dg_mqar_fill(const dg_mqar_config *cfg, dg_rng *rng, int64_t batch, int64_t *inputs, int64_t *targets) {
    if (dg_mqar_validate(cfg)) return -1;
    if (batch < 1) {
        dg_error("mqar: batch size %lld must be >= 1", (long long)batch);
        return -1;
    }
    double *w;
    int64_t *pool = scratch_pool(cfg, &w);
    if (!pool) return -1;
    for (int64_t b = 0; b < batch; b++) {
        uint64_t seed = dgm_rng_u64(rng);
        example(cfg, seed, inputs + b * cfg->seq_len, targets + b * cfg->seq_len, pool, w);
    }
    free(pool);
    free(w);
    return 0;
}

static int make_pair(int64_t B, int64_t T, dg_tensor **inputs, dg_tensor **targets) {
    *inputs = dg_empty(2, (int64_t[]){B, T}, DG_I64);
    *targets = *inputs ? dg_empty(2, (int64_t[]){B, T}, DG_I64) : NULL;
    if (!*targets) {
        if (dg_scope_depth() == 0) dg_release(*inputs);
        *inputs = NULL;
        return -1;
    }
    return 0;
}

int dg_mqar_batch(const dg_mqar_config *cfg, dg_rng *rng, int64_t batch, dg_tensor **inputs, dg_tensor **targets) {
    *inputs = *targets = NULL;
    if (dg_mqar_validate(cfg)) return -1;
    if (batch < 1) {
        dg_error("mqar: batch size %lld must be >= 1", (long long)batch);
        return -1;
    }
    if (make_pair(batch, cfg->seq_len, inputs, targets)) return -1;
    return dg_mqar_fill(cfg, rng, batch, dgm_data(*inputs), dgm_data(*targets));
}

dg_mqar_set *dg_mqar_set_new(const dg_mqar_config *cfg, uint64_t seed, int64_t n) {
    if (dg_mqar_validate(cfg)) return NULL;
    if (n < 1) {
        dg_error("mqar: a set needs >= 1 example, got %lld", (long long)n);
        return NULL;
    }
    dg_mqar_set *s = calloc(1, sizeof *s);
    double *w = NULL;
    int64_t *pool = s ? scratch_pool(cfg, &w) : NULL;
    if (s) {
        s->inputs = malloc((size_t)(n * cfg->seq_len) * sizeof(int64_t));
        s->targets = malloc((size_t)(n * cfg->seq_len) * sizeof(int64_t));
    }
    if (!s || !pool || !s->inputs || !s->targets) {
        dg_error("mqar: out of memory for a set of %lld examples", (long long)n);
        dg_mqar_set_free(s);
        free(pool);
        free(w);
        return NULL;
    }
    s->cfg = *cfg;
    s->seed = seed;
    s->n = n;
    for (int64_t i = 0; i < n; i++)
        example(cfg, dgm_mix64(dgm_mix64(seed ^ SET_DOMAIN) + (uint64_t)i), s->inputs + i * cfg->seq_len,
                s->targets + i * cfg->seq_len, pool, w);
    free(pool);
    free(w);
    return s;
}

void dg_mqar_set_free(dg_mqar_set *s) {
    if (!s) return;
    free(s->inputs);
    free(s->targets);
    free(s);
}

int64_t dg_mqar_set_batch(const dg_mqar_set *s, int64_t start, int64_t count, dg_tensor **inputs, dg_tensor **targets) {
    *inputs = *targets = NULL;
    if (!s || start < 0 || start >= s->n || count < 1) {
        dg_error("mqar: rows [%lld, +%lld) are outside the set of %lld examples", (long long)start, (long long)count,
                 s ? (long long)s->n : 0LL);
        return -1;
    }
    if (count > s->n - start) count = s->n - start;
    int64_t T = s->cfg.seq_len;
    if (make_pair(count, T, inputs, targets)) return -1;
    memcpy(dgm_data(*inputs), s->inputs + start * T, (size_t)(count * T) * sizeof(int64_t));
    memcpy(dgm_data(*targets), s->targets + start * T, (size_t)(count * T) * sizeof(int64_t));
    return count;
}

void dg_count_correct(int64_t n, const int64_t *targets, const int64_t *predictions, int64_t ignore_index,
                      int64_t *correct, int64_t *scored) {
    int64_t c = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] == ignore_index) continue;
        s++;
        c += predictions[i] == targets[i];
    }
    *correct = c;
    *scored = s;
}

/* Memory estimate of a training run and available memory (models/memory_estimate.h). */
#include "models/memory_estimate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* parameters: embedding and head, per layer q/k/v/o/gate projections, beta and decay, the MLP */
static double param_estimate(const dg_model_config *mc) {
    const double d = (double)mc->hidden_size, L = (double)mc->num_hidden_layers, V = (double)mc->vocab_size;
    const double H = (double)mc->num_heads, K = (double)mc->head_dim, HV = (double)dg_model_num_v_heads(mc);
    const double Vd = (double)dg_model_head_v_dim(mc), mlp = (double)dg_model_intermediate_size(mc);
    return V * d * (mc->tie_word_embeddings ? 1 : 2) +
           L * (d * (2 * H * K + 3 * HV * Vd) + 2 * d * HV + 3 * d * mlp + 4 * d);
}

double dg_train_state_bytes(const dg_model_config *mc, bool mixed) { return (mixed ? 18 : 16) * param_estimate(mc); }

double dg_train_activation_floor(const dg_model_config *mc, const dg_train_config *tc, bool mixed) {
    const double T = (double)dg_train_seq_len(tc);
    return (double)tc->batch * T * (double)mc->num_hidden_layers * (double)mc->hidden_size * (mixed ? 2 : 4);
}

double dg_train_memory_estimate(const dg_model_config *mc, const dg_train_config *tc) {
    const double d = (double)mc->hidden_size, L = (double)mc->num_hidden_layers, V = (double)mc->vocab_size;
    const double H = (double)mc->num_heads, K = (double)mc->head_dim, HV = (double)dg_model_num_v_heads(mc);
    const double Vd = (double)dg_model_head_v_dim(mc), mlp = (double)dg_model_intermediate_size(mc);
    /* the recurrent path measures the same as the chunked one (it saves no per-token state) */
    const double C = (double)(tc->chunk_size > 0 ? tc->chunk_size : 64);
    const double T = (double)dg_train_seq_len(tc);
    const double tokens = (double)tc->batch * T;
    const double params = param_estimate(mc);
    /* floats saved per token and layer (fitted to the measured peak of the chunked CPU path):
     * residual stream and norms ~6d, the MLP ~2 mlp, q/k/v and their convolutions ~4 (HK + HV Vd),
     * the state at every chunk boundary 2 HV K Vd / C, chunk-local matrices 2 HV C */
    double per_token_layer = 6 * d + 2 * mlp + 4 * (H * K + HV * Vd) + 2 * HV * K * Vd / C + 2 * HV * C;
    double per_token = L * per_token_layer;
    /* the head's logits: never stored whole (linear_cross_entropy), one chunk of them at a time */
    double head = fmin(4 * tokens * V, (double)DG_LINEAR_CE_CHUNK_BYTES);
    double heldout = tc->task == DG_TASK_MQAR ? 2.0 * 8 * (double)tc->eval_examples * T : 0;
    return 16 * params + 4 * tokens * per_token + head + heldout;
}

/* A number from a one-line file (cgroup limits), or -1 ("max", missing, unreadable). */
static double read_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = {0};
    double v = -1;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3) != 0) {
        char *end;
        double x = strtod(buf, &end);
        if (end != buf && x > 0) v = x;
    }
    fclose(f);
    return v;
}

double dg_memory_available(void) {
    double avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
                avail = (double)kb * 1024;
                break;
            }
        fclose(f);
    }
    /* a container's limit: cgroup v2, then v1 (whose "no limit" is a huge number) */
    double limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
    if (limit < 0) {
        limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        if (limit > 1e18) limit = -1;
    }
    if (limit > 0) {
        double left = limit - (used > 0 ? used : 0);
        if (avail < 0 || left < avail) avail = left > 0 ? left : 0;
    }
    return avail;
}

char *dg_format_bytes(double b, char *buf, size_t n) {
    if (b >= 1e12) snprintf(buf, n, "%.1f TB", b / 1e12);
    else if (b >= 1e9) snprintf(buf, n, "%.1f GB", b / 1e9);
    else snprintf(buf, n, "%.0f MB", b / 1e6);
    return buf;
}

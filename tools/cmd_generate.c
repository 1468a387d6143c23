/* deltagrad generate --ckpt DIR --prompt TEXT [--max-new N] [--temperature T] [--top-k K] [--seed S]:
 * sample bytes from a byte-level checkpoint, decoding token by token with the recurrent and
 * convolution states carried (models/generate.h), printing as it goes. */
#include "models/checkpoint.h"
#include "models/generate.h"
#include "models/train_config.h"
#include "tools/commands.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: deltagrad generate --ckpt DIR --prompt TEXT [options]\n\n"
               "Samples bytes from a byte-level model (trained with --task text), one token at a time with the\n"
               "recurrent state and the short-convolution windows carried from step to step.\n\n"
               "  --ckpt DIR          checkpoint directory (or a model .safetensors file)   [required]\n"
               "  --prompt TEXT       the text to continue (bytes)                          [required]\n"
               "  --max-new N         bytes to generate                                     [200]\n"
               "  --temperature T     sampling temperature; 0 = greedy                      [0.8]\n"
               "  --top-k K           sample among the K most likely bytes; 0 = all         [0]\n"
               "  --seed S            sampling seed                                         [0]\n"
               "  --threads N         CPU threads; 0 = all cores                            [0]\n"
               "  --device D          cpu or cuda                                           [cpu]\n"
               "  --recurrent         token-by-token delta-rule algorithm for the prompt too\n");
}

static void put_byte(int64_t tok, void *ctx) {
    (void)ctx;
    fputc((int)(tok & 0xff), stdout);
    fflush(stdout);
}

static int num(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "generate: %s %s is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int dg_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *device = "cpu";
    double max_new = 200, temp = 0.8, top_k = 0, seed = 0, threads = 0;
    bool recurrent = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--recurrent")) {
            recurrent = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "generate: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        int rc = 0;
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--device")) {
            device = v;
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "generate: --device %s: expected cpu or cuda\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--max-new")) rc = num(a, v, 0, 1e7, &max_new);
        else if (!strcmp(a, "--temperature")) rc = num(a, v, 0, 100, &temp);
        else if (!strcmp(a, "--top-k")) rc = num(a, v, 0, 1e7, &top_k);
        else if (!strcmp(a, "--seed")) rc = num(a, v, 0, 9e15, &seed);
        else if (!strcmp(a, "--threads")) rc = num(a, v, 0, 1024, &threads);
        else {
            fprintf(stderr, "generate: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) return 2;
    }
    if (!ckpt || !prompt) {
        fprintf(stderr, "generate: --ckpt DIR and --prompt TEXT are required (see --help)\n");
        return 2;
    }
    if (threads > 0)
        omp_set_num_threads((int)threads); /* OpenMP's threads run the BLAS products too (kernels/cpu/gemm.c) */
    dg_ckpt_model m;
    if (dg_ckpt_load_model(ckpt, &m)) {
        fprintf(stderr, "generate: %s\n", dg_last_error());
        return 1;
    }
    if (!strcmp(device, "cuda") && (!dg_cuda_available() || dg_lm_to_device(m.lm, DG_CUDA))) {
        fprintf(stderr, "generate: --device cuda: %s\n",
                dg_has_error() ? dg_last_error() : "no CUDA device (or a build without the CUDA backend)");
        dg_ckpt_model_free(&m);
        return 1;
    }
    if (m.lm->cfg.vocab_size != 256) {
        fprintf(stderr, "generate: the model's vocabulary has %lld tokens, not the 256 bytes of a byte-level model\n",
                (long long)m.lm->cfg.vocab_size);
        dg_ckpt_model_free(&m);
        return 1;
    }
    if (m.train_json) {
        dg_train_config tc = dg_train_default_config();
        if (dg_train_config_from_json(m.train_json, &tc) == 0 && tc.task != DG_TASK_TEXT)
            fprintf(stderr, "generate: note: this checkpoint was trained on %s, not on text\n", dg_task_name(tc.task));
    }
    m.lm->mixer_opts.algorithm = recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED;
    size_t np = strlen(prompt);
    int64_t *ids = malloc((np ? np : 1) * sizeof *ids);
    int64_t *out = malloc(((size_t)max_new + 1) * sizeof *out);
    if (!ids || !out) {
        fprintf(stderr, "generate: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < np; i++) ids[i] = (unsigned char)prompt[i];
    if (np == 0) ids[0] = '\n'; /* an empty prompt starts after a newline */
    dg_sample_opts so = {.temperature = temp, .top_k = (int64_t)top_k, .use_cache = true};
    dg_rng rng = dg_rng_new((uint64_t)seed);
    fwrite(prompt, 1, np, stdout);
    fflush(stdout);
    int64_t made = dg_generate(m.lm, ids, np ? (int64_t)np : 1, (int64_t)max_new, &so, &rng, out, NULL, put_byte, NULL);
    fputc('\n', stdout);
    int rc = 0;
    if (made < 0) {
        fprintf(stderr, "generate: %s\n", dg_last_error());
        rc = 1;
    }
    free(ids);
    free(out);
    dg_ckpt_model_free(&m);
    return rc;
}

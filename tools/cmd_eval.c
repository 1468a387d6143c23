/* deltagrad eval --ckpt DIR [--data FILE] [--examples N] [--batch B] [--threads N] [--device D]: evaluate a
 * checkpoint on the task it was trained on (from its metadata): MQAR held-out loss and query
 * accuracy, or byte-level validation loss, bits per byte and next-byte accuracy. */
#include "models/checkpoint.h"
#include "models/trainer.h"
#include "tools/commands.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: deltagrad eval --ckpt DIR [options]\n\n"
               "Evaluates a checkpoint on the task stored in it: MQAR (the fixed held-out set: loss and query\n"
               "accuracy) or byte-level text (the validation split: loss, bits per byte, next-byte accuracy).\n\n"
               "  --ckpt DIR        checkpoint directory (or a model .safetensors file)   [required]\n"
               "  --data FILE       text: another file to evaluate (its last val-fraction)\n"
               "  --examples N      MQAR held-out examples / text windows; 0 = the run's   [0]\n"
               "  --batch B         sequences per forward pass; 0 = the run's              [0]\n"
               "  --threads N       CPU threads; 0 = all cores                             [0]\n"
               "  --device D        cpu or cuda                                            [cpu]\n"
               "  --recurrent       token-by-token delta-rule algorithm\n");
}

int dg_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *device = "cpu";
    long long examples = 0, batch = 0, threads = 0;
    bool recurrent = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--recurrent")) {
            recurrent = true;
            continue;
        }
        static const char *const with_value[] = {"--ckpt", "--data", "--examples", "--batch", "--threads", "--device"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "eval: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "eval: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        bool is_num = *v && !*end && n >= 0;
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda"))) device = v;
        else if (!strcmp(a, "--examples") && is_num) examples = n;
        else if (!strcmp(a, "--batch") && is_num && n <= 1 << 20) batch = n;
        else if (!strcmp(a, "--threads") && is_num && n <= 1024) threads = n;
        else {
            fprintf(stderr, "eval: bad option '%s %s' (see --help)\n", a, v);
            return 2;
        }
    }
    if (!ckpt) {
        fprintf(stderr, "eval: --ckpt DIR is required (see --help)\n");
        return 2;
    }
    dg_model_config mc;
    char *tj = NULL;
    int64_t step = -1;
    if (dg_ckpt_read_meta(ckpt, &mc, &tj, &step, NULL)) {
        dg_cmd_say_error("eval");
        return 1;
    }
    dg_train_config tc = dg_train_default_config();
    if (tj && dg_train_config_from_json(tj, &tc)) {
        dg_cmd_say_error("eval");
        free(tj);
        return 1;
    }
    if (!tj && !data)
        fprintf(stderr, "eval: note: the checkpoint has no training settings; evaluating on default MQAR\n");
    free(tj);
    if (data) {
        tc.task = DG_TASK_TEXT;
        snprintf(tc.data, sizeof tc.data, "%s", data);
    }
    if (batch > 0) tc.batch = batch;
    if (threads > 0) tc.threads = (int)threads;
    if (tc.task == DG_TASK_MQAR && examples > 0) tc.eval_examples = examples;
    tc.algorithm = recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED;
    tc.device = strcmp(device, "cuda") ? DG_CPU : DG_CUDA; /* not the run's: where to evaluate now */
    dg_trainer *t = dg_trainer_open_eval(&tc, ckpt);
    if (!t) {
        dg_cmd_say_error("eval");
        return 1;
    }
    double loss, acc;
    int rc = dg_trainer_eval(t, tc.task == DG_TASK_TEXT ? examples : 0, &loss, &acc);
    if (rc == 0 && !isfinite(loss)) {
        fprintf(stderr, "eval: the loss on %s is %g: the model's outputs are not finite\n", ckpt, loss);
        rc = -1;
    } else if (rc) {
        dg_cmd_say_error("eval");
    } else if (tc.task == DG_TASK_MQAR) {
        printf("checkpoint %s (step %lld): MQAR held-out (%lld examples, seq_len %lld, %lld kv pairs): loss %.4f, "
               "query accuracy %.2f%%\n",
               ckpt, (long long)step, (long long)tc.eval_examples, (long long)tc.mqar.seq_len,
               (long long)tc.mqar.num_kv_pairs, loss, 100 * acc);
    } else {
        printf("checkpoint %s (step %lld): text '%s' validation (last %.0f%%, windows of %lld): loss %.4f, %.4f "
               "bits/byte, "
               "next-byte accuracy %.2f%%\n",
               ckpt, (long long)step, tc.data, 100 * tc.val_fraction, (long long)tc.seq_len, loss, loss / log(2.0),
               100 * acc);
    }
    dg_trainer_free(t);
    return rc ? 1 : 0;
}

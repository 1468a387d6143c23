/* libFuzzer target: the checkpoint loader on arbitrary bytes.  The input is written as a file and
 * read the two ways a checkpoint is read: the safetensors reader alone (8-byte header length, the
 * JSON header, the tensor table and its offsets, dtypes and shapes, the data CRC), then the
 * checkpoint metadata (the model config inside it, the run's training settings).  Every input must
 * give a result or an error message; a crash, a leak or undefined behaviour is a finding.
 * Built and run by fuzz/run.sh (docs/FUZZING.md). */
#include "deltagrad.h"
#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "models/train_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/dg_fuzz_ckpt_XXXXXX", path[256];

/* the input's file and its folder go when the fuzzer exits (libFuzzer ends a run by exit()) */
static void remove_input(void) {
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    if (!mkdtemp(dir)) abort();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    atexit(remove_input);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    dg_st_file *st = dg_st_read(path);
    if (st) {
        for (int i = 0; i < st->n; i++) /* every tensor the reader accepted is whole and named */
            if (!st->tensors[i] || !st->names[i] || !dg_st_get(st, st->names[i])) abort();
        dg_st_free(st);
    } else if (!dg_last_error()[0]) {
        abort(); /* a refusal without a message */
    }
    dg_clear_error();
    dg_model_config mc;
    char *train_json = NULL;
    int64_t step;
    if (dg_ckpt_read_meta(path, &mc, &train_json, &step, NULL) == 0) {
        dg_train_config tc = dg_train_default_config();
        if (train_json) dg_train_config_from_json(train_json, &tc);
        free(train_json);
    } else if (!dg_last_error()[0]) {
        abort();
    }
    dg_clear_error();
    return 0;
}

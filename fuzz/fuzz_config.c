/* libFuzzer target: the config readers on arbitrary text: the strict JSON parser, the model config
 * (FLA's config.json) and the training settings stored in checkpoints.  Every input must give a
 * config or an error message; a crash, a leak or undefined behaviour is a finding.
 * Built and run by fuzz/run.sh (docs/FUZZING.md). */
#include "deltagrad.h"
#include "models/json.h"
#include "models/model_config.h"
#include "models/train_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1); /* the readers take NUL-terminated text */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char err[256];
    err[0] = 0;
    dg_json *j = dg_json_parse(text, size, err, sizeof err);
    if (!j && !err[0]) abort();
    dg_json_free(j);
    dg_model_config mc;
    if (dg_model_config_from_json(text, &mc) == 0) {
        char *back = dg_model_config_to_json(&mc); /* what was accepted writes back out */
        if (!back) abort();
        free(back);
    } else if (!dg_last_error()[0]) {
        abort();
    }
    dg_clear_error();
    dg_train_config tc = dg_train_default_config();
    if (dg_train_config_from_json(text, &tc) != 0 && !dg_last_error()[0]) abort();
    dg_clear_error();
    free(text);
    return 0;
}

/* Strict parsing of command-line values (see parse_args.h). */
#include "tools/parse_args.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dg_arg_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int dg_arg_int(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(value, &end, 10);
    if (end == value || *end != 0) {
        fprintf(stderr, "%s: %s '%s' is not an integer\n", cmd, flag, value);
        return -1;
    }
    if (errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "%s: %s %s is out of range (%" PRId64 " to %" PRId64 ")\n", cmd, flag, value, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int dg_arg_u64(const char *cmd, const char *flag, const char *value, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (value[0] == '-' || value[0] == '+') { /* strtoull would wrap "-1" round to 2^64 - 1 */
        fprintf(stderr, "%s: %s '%s' is not an unsigned integer\n", cmd, flag, value);
        return -1;
    }
    unsigned long long x = strtoull(value, &end, 10);
    if (end == value || *end != 0) {
        fprintf(stderr, "%s: %s '%s' is not an unsigned integer\n", cmd, flag, value);
        return -1;
    }
    if (errno == ERANGE) {
        fprintf(stderr, "%s: %s %s is out of range (0 to %llu)\n", cmd, flag, value, (unsigned long long)UINT64_MAX);
        return -1;
    }
    *out = x;
    return 0;
}

int dg_arg_int_list(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out,
                    int max) {
    char item[64];
    int n = 0;
    for (const char *p = value;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n == max) {
            fprintf(stderr, "%s: %s '%s' has more than %d values\n", cmd, flag, value, max);
            return -1;
        }
        if (len == 0 || len >= sizeof item) {
            fprintf(stderr, "%s: %s '%s' is not a comma-separated list of integers\n", cmd, flag, value);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (dg_arg_int(cmd, flag, item, lo, hi, &out[n]) != 0) return -1;
        n++;
        if (!comma) return n;
        p = comma + 1;
    }
}

int dg_arg_choice(const char *cmd, const char *flag, const char *value, const char *const *choices, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(value, choices[i]) == 0) return i;
    fprintf(stderr, "%s: %s '%s' is not one of:", cmd, flag, value);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", choices[i]);
    fprintf(stderr, "\n");
    return -1;
}

void dg_print_op_names(FILE *f, bool several_variants) {
    int first = 1;
    for (int i = 0; i < dg_op_count(); i++) {
        const dg_op_def *d = dg_op_at(i);
        if (several_variants && dg_op_variant_count(d) < 2) continue;
        fprintf(f, "%s%s", first ? "" : ", ", d->name);
        first = 0;
    }
}

const dg_op_def *dg_arg_op(const char *cmd, const char *name, bool several_variants) {
    const dg_op_def *def = dg_op_find(name);
    if (def && (!several_variants || dg_op_variant_count(def) > 1)) return def;
    if (def)
        fprintf(stderr,
                "%s: %s has one backward variant ('%s'): there is nothing to compare it with. Ops with several: ", cmd,
                def->name, def->bwd[0].name);
    else
        fprintf(stderr, "%s: no op named '%s' (%s: ", cmd, name,
                several_variants ? "ops with several backward variants" : "ops");
    dg_print_op_names(stderr, several_variants);
    fprintf(stderr, "%s\n", def ? "" : ")");
    return NULL;
}

int dg_arg_unknown(const char *cmd, const char *arg) {
    fprintf(stderr, "%s: unknown option '%s' (deltagrad %s --help)\n", cmd, arg, cmd);
    return -1;
}

/* The registry: every op, listed once in ops/registry_list.h.  Each op file defines
 * `const dg_op_def dg_op_<name>`; the table below references every one, so every op is linked
 * into any program that uses the registry (a listed op that is not built is a link error).
 * Also here: the choice of backward variant (a call's own, DG_BACKWARD's, else 0) and dg_apply,
 * which makes that choice and hands the op to the autograd engine. */
#include "ops/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dg_op_def *const all_ops[] = {
#define DG_OP(name) &dg_op_##name,
#include "ops/registry_list.h"
#undef DG_OP
};

#define N_OPS ((int)(sizeof(all_ops) / sizeof(all_ops[0])))

int dg_op_count(void) { return N_OPS; }

const dg_op_def *dg_op_at(int i) { return i >= 0 && i < N_OPS ? all_ops[i] : NULL; }

const dg_op_def *dg_op_find(const char *name) {
    for (int i = 0; i < N_OPS; i++)
        if (strcmp(all_ops[i]->name, name) == 0) return all_ops[i];
    return NULL;
}

int dg_op_variant_find(const dg_op_def *def, const char *name) {
    for (int i = 0; i < dg_op_variant_count(def); i++)
        if (strcmp(def->bwd[i].name, name) == 0) return i;
    return -1;
}

/* The valid variant names of def, ", "-separated, into buf. */
static void variant_names(const dg_op_def *def, char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; i < dg_op_variant_count(def); i++) {
        strncat(buf, i ? ", " : "", cap - strlen(buf) - 1);
        strncat(buf, def->bwd[i].name, cap - strlen(buf) - 1);
    }
}

int dg_op_variant_lookup(const dg_op_def *def, const char *name, const char *who) {
    int v = dg_op_variant_find(def, name);
    if (v >= 0) return v;
    char names[256];
    variant_names(def, names, sizeof names);
    dg_error("%s: backward variant '%s' does not exist (variants: %s)", who, name, names);
    return -1;
}

/* DG_BACKWARD="gated_delta_rule:dg_partial,kda:unfused": every entry is checked, not only this
 * op's, so a misspelling anywhere in the variable is reported by the first op that runs. */
int dg_op_env_variant(const dg_op_def *def) {
    const char *env = getenv("DG_BACKWARD");
    if (!env || !*env) return -1;
    int found = -1;
    for (const char *p = env; p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char entry[128];
        if (len >= sizeof entry) {
            dg_error("DG_BACKWARD: entry '%.*s...' is too long (expected op:variant)", 40, p);
            return -2;
        }
        memcpy(entry, p, len);
        entry[len] = 0;
        p = end ? end + 1 : NULL;
        if (!*entry) continue; /* "a:b," or ",,": empty entries are harmless */
        char *colon = strchr(entry, ':');
        if (!colon) {
            dg_error("DG_BACKWARD: entry '%s' is not op:variant (e.g. DG_BACKWARD=kda:unfused)", entry);
            return -2;
        }
        *colon = 0;
        const dg_op_def *op = dg_op_find(entry);
        if (!op) {
            char names[1024] = "";
            for (int i = 0; i < dg_op_count(); i++)
                if (dg_op_variant_count(dg_op_at(i)) > 1) {
                    strncat(names, names[0] ? ", " : "", sizeof names - strlen(names) - 1);
                    strncat(names, dg_op_at(i)->name, sizeof names - strlen(names) - 1);
                }
            dg_error("DG_BACKWARD: no op named '%s' (ops with backward variants: %s)", entry, names);
            return -2;
        }
        char who[160];
        snprintf(who, sizeof who, "DG_BACKWARD: %s", op->name);
        int v = dg_op_variant_lookup(op, colon + 1, who);
        if (v < 0) return -2;
        if (op == def) found = v;
    }
    return found;
}

int dg_op_default_variant(const dg_op_def *def) {
    int v = dg_op_env_variant(def);
    return v == -2 ? -1 : v < 0 ? 0 : v;
}

int dg_apply(const dg_op_def *def, const void *attrs, dg_tensor *const *in, dg_tensor **out, int variant) {
    if (variant < 0 || variant >= dg_op_variant_count(def)) {
        variant = dg_op_default_variant(def);
        if (variant < 0) return -1; /* DG_BACKWARD names no such op or variant */
    }
    return dg_apply_variant(def, attrs, in, out, variant);
}

dg_tensor *dg_apply1(const dg_op_def *def, const void *attrs, dg_tensor *const *in) {
    dg_tensor *out[DG_MAX_IO] = {0};
    return dg_apply(def, attrs, in, out, -1) == 0 ? out[0] : NULL;
}

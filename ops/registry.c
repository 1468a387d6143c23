/* The registry: every op, listed once.  Each op file defines `const dg_op_def dg_op_<name>`.
 * The references are weak so that the tree links while ops are added in parallel; the test
 * test_registry asserts that every op named here is present, so a missing one fails CI. */
#include "ops/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DG_OP(name) extern const dg_op_def dg_op_##name __attribute__((weak));
#include "ops/registry_list.h"
#undef DG_OP

static const dg_op_def *const all_ops[] = {
#define DG_OP(name) &dg_op_##name,
#include "ops/registry_list.h"
#undef DG_OP
};

static const char *const all_names[] = {
#define DG_OP(name) #name,
#include "ops/registry_list.h"
#undef DG_OP
};

#define N_LISTED ((int)(sizeof(all_ops) / sizeof(all_ops[0])))

static const dg_op_def *present[N_LISTED];
static int n_present = -1;

static void collect(void) {
    if (n_present >= 0) return;
    int n = 0;
    for (int i = 0; i < N_LISTED; i++)
        if (all_ops[i]) present[n++] = all_ops[i];
    n_present = n;
}

int dg_op_count(void) {
    collect();
    return n_present;
}

const dg_op_def *dg_op_at(int i) {
    collect();
    return i >= 0 && i < n_present ? present[i] : NULL;
}

const dg_op_def *dg_op_find(const char *name) {
    collect();
    for (int i = 0; i < n_present; i++)
        if (strcmp(present[i]->name, name) == 0) return present[i];
    return NULL;
}

/* Names listed in the registry whose definition is missing from the build ("" if none). */
const char *dg_op_missing(void) {
    static char buf[1024];
    buf[0] = 0;
    for (int i = 0; i < N_LISTED; i++)
        if (!all_ops[i] && strlen(buf) + strlen(all_names[i]) + 2 < sizeof buf) {
            strcat(buf, all_names[i]);
            strcat(buf, " ");
        }
    return buf;
}

int dg_op_variant_count(const dg_op_def *def) {
    int n = 0;
    while (n < 6 && def->bwd[n].fn) n++;
    return n;
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

/* The registry: every op, listed once.  Each op file defines `const dg_op_def dg_op_<name>`.
 * The references are weak so that the tree links while ops are added in parallel; the test
 * test_registry asserts that every op named here is present, so a missing one fails CI. */
#include "ops/op.h"

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

/* DG_BACKWARD="gated_delta_rule:unfused,kda:unfused" */
int dg_op_default_variant(const dg_op_def *def) {
    const char *env = getenv("DG_BACKWARD");
    if (!env || !*env) return 0;
    size_t nl = strlen(def->name);
    for (const char *p = env; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > nl + 1 && strncmp(p, def->name, nl) == 0 && p[nl] == ':') {
            char vname[64];
            size_t vl = len - nl - 1;
            if (vl >= sizeof vname) vl = sizeof vname - 1;
            memcpy(vname, p + nl + 1, vl);
            vname[vl] = 0;
            int v = dg_op_variant_find(def, vname);
            if (v >= 0) return v;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

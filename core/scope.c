/* Scopes are autorelease pools: every tensor an op returns is owned by the innermost scope, and
 * dg_scope_end releases them.  A training step is one scope, so memory is flat across steps. */
#include "core/internal.h"

#include <stdlib.h>

typedef struct scope {
    dg_tensor **items;
    size_t n, cap;
} scope;

#define MAX_DEPTH 64
static _Thread_local scope stack[MAX_DEPTH];
static _Thread_local int depth;

int dg_scope_depth(void) { return depth; }

void dg_scope_begin(void) {
    if (depth >= MAX_DEPTH) {
        /* a bug in the caller (unbalanced begin/end), not a user input */
        fprintf(stderr, "deltagrad: scopes nested deeper than %d\n", MAX_DEPTH);
        abort();
    }
    stack[depth].n = 0;
    depth++;
}

dg_tensor *dg_autorelease(dg_tensor *t) {
    if (!t || depth == 0) return t;
    scope *s = &stack[depth - 1];
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        dg_tensor **items = realloc(s->items, cap * sizeof *items);
        if (!items) {
            fprintf(stderr, "deltagrad: out of memory growing a scope\n");
            abort();
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = t;
    return t;
}

void dg_scope_end(void) {
    if (depth == 0) {
        fprintf(stderr, "deltagrad: dg_scope_end without dg_scope_begin\n");
        abort();
    }
    scope *s = &stack[depth - 1];
    /* release in reverse order of creation: outputs before the inputs they reference */
    for (size_t i = s->n; i-- > 0;) dg_release(s->items[i]);
    s->n = 0;
    depth--;
    if (depth == 0) {
        for (int i = 0; i < MAX_DEPTH && stack[i].items; i++) {
            free(stack[i].items);
            stack[i].items = NULL;
            stack[i].cap = 0;
        }
    }
}

dg_tensor *dg_scope_return(dg_tensor *t) {
    if (t) dg_retain(t);
    dg_scope_end();
    return dg_autorelease(t);
}

/* Inside a scope the scope keeps its reference and the caller gets one more; with no scope open
 * the caller already holds the only reference, so there is nothing to add.  Either way the caller
 * ends up owning exactly one reference, to dg_release. */
dg_tensor *dg_keep(dg_tensor *t) { return t && depth > 0 ? dg_retain(t) : t; }

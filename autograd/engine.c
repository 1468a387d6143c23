/* The tape: dg_apply_variant records one node per op application; dg_backward walks the recorded
 * nodes in reverse creation order (a valid reverse topological order, since a node's inputs were
 * all made before it), handing each node the gradients of its outputs and accumulating the
 * gradients it returns into the producers of its inputs, or into .grad of leaf tensors.
 *
 * Ownership: an output holds its node; a node holds its inputs and detached copies of what it
 * saved.  Nothing points from a node to its outputs, so there are no cycles and the whole graph
 * goes when the last output does (normally at dg_scope_end of the training step). */
#include "autograd/autograd.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t next_seq;

static void node_release(dg_node *n) {
    if (!n || --n->refcount > 0) return;
    for (int i = 0; i < n->n_in; i++) dg_release(n->in[i]);
    for (int i = 0; i < n->n_saved; i++) dg_release(n->saved[i]);
    for (int i = 0; i < n->n_out; i++) dg_release(n->grad_acc[i]);
    free(n);
}

/* What the tape keeps of input t when the backward reads none of its data (bwd_skips_in): t's
 * shape, strides, dtype and device and its link to its producer, without the storage.  NULL when
 * the header cannot be had (the caller keeps t itself). */
static dg_tensor *input_shell(const dg_tensor *t) {
    dg_tensor *s = dg_tensor_alloc_header();
    if (!s) {
        dg_clear_error();
        return NULL;
    }
    s->dtype = t->dtype;
    s->device = t->device;
    s->ndim = t->ndim;
    memcpy(s->shape, t->shape, sizeof s->shape);
    memcpy(s->stride, t->stride, sizeof s->stride);
    s->requires_grad = t->requires_grad;
    s->node = t->node;
    s->node->refcount++; /* released by dg_release through dg_node_release_hook */
    s->out_index = t->out_index;
    return s;
}

void dg_save(dg_node *n, dg_tensor *t) {
    if (n->n_saved >= DG_MAX_SAVED) {
        fprintf(stderr, "deltagrad: op %s saves more than %d tensors\n", n->op->name, DG_MAX_SAVED);
        abort();
    }
    n->saved[n->n_saved++] = t ? dg_retain(dg_detach(t)) : NULL;
}

static void record_output_meta(dg_node *n, int i, const dg_tensor *t) {
    n->out_ndim[i] = t->ndim;
    memcpy(n->out_shape[i], t->shape, sizeof n->out_shape[i]);
    n->out_dtype[i] = t->dtype;
    n->out_device[i] = t->device;
}

int dg_op_variant_count(const dg_op_def *def) {
    int n = 0;
    while (n < DG_MAX_VARIANTS && def->bwd[n].fn) n++;
    return n;
}

int dg_apply_variant(const dg_op_def *def, const void *attrs, dg_tensor *const *in, dg_tensor **out, int variant) {
    if (def->attrs_size > DG_ATTR_BYTES || def->n_in > DG_MAX_IO || def->n_out > DG_MAX_IO) {
        fprintf(stderr, "deltagrad: op %s exceeds the node limits\n", def->name);
        abort();
    }
    if (variant < 0 || variant >= dg_op_variant_count(def)) {
        dg_error("%s: backward variant %d does not exist (the op has %d)", def->name, variant,
                 dg_op_variant_count(def));
        return -1;
    }
    dg_node *n = calloc(1, sizeof *n);
    if (!n) {
        dg_error("%s: out of host memory for the autograd node", def->name);
        return -1;
    }
    if (!dg_node_release_hook) dg_node_release_hook = node_release;
    n->op = def;
    if (attrs && def->attrs_size) memcpy(n->attrs, attrs, def->attrs_size);
    n->n_in = def->n_in;
    n->n_out = def->n_out;
    bool record = false;
    for (int i = 0; i < def->n_in; i++) {
        n->in[i] = in[i];
        n->needs_grad[i] = in[i] && in[i]->requires_grad && dg_dtype_is_float(in[i]->dtype);
        record |= n->needs_grad[i];
    }
    record = record && dg_grad_enabled();
    n->recording = record;
    n->variant = variant;

    /* forward: grad mode off, temporaries in a scope of their own */
    dg_no_grad_begin();
    dg_scope_begin();
    dg_prof_enter(def->name, DG_PROF_FWD);
    int rc = def->forward(n);
    dg_prof_leave();
    for (int i = 0; i < def->n_out; i++) {
        if (rc == 0 && !n->out[i]) {
            dg_error("%s: forward produced no output %d", def->name, i);
            rc = -1;
        }
        if (n->out[i]) dg_retain(n->out[i]);
    }
    dg_scope_end();
    dg_no_grad_end();

    if (rc == 0 && dg_anomaly_mode())
        for (int i = 0; i < def->n_out && rc == 0; i++) {
            const char *bad = dg_first_nonfinite(n->out[i]);
            if (bad) {
                dg_error("anomaly: op %s produced %s in output %d '%s' %s; inputs: %s", def->name, bad, i,
                         def->out_names[i] ? def->out_names[i] : "out", dg_shp(n->out[i]), dg_node_inputs_text(n));
                rc = -1;
            }
        }
    if (rc != 0) {
        for (int i = 0; i < def->n_out; i++) dg_release(n->out[i]);
        for (int i = 0; i < n->n_saved; i++) dg_release(n->saved[i]);
        free(n);
        for (int i = 0; i < def->n_out; i++) out[i] = NULL;
        if (!dg_has_error()) dg_error("%s: forward failed", def->name);
        return -1;
    }
    if (record) {
        n->seq = atomic_fetch_add(&next_seq, 1);
        /* an input the backward reads only the shape of, produced by another node (a leaf is kept
         * whole: its gradient lives in the tensor), is kept as a shell */
        for (int i = 0; i < def->n_in; i++) {
            dg_tensor *shell = in[i] && in[i]->node && (def->bwd_skips_in >> i & 1u) ? input_shell(in[i]) : NULL;
            n->in[i] = shell ? shell : dg_retain(in[i]);
        }
        n->refcount = 0;
        for (int i = 0; i < def->n_out; i++) {
            dg_tensor *o = n->out[i];
            record_output_meta(n, i, o);
            if (!dg_dtype_is_float(o->dtype)) continue;
            o->node = n;
            o->out_index = i;
            o->requires_grad = true;
            n->refcount++;
        }
        if (n->refcount == 0) node_release((n->refcount = 1, n));
    } else {
        for (int i = 0; i < n->n_saved; i++) dg_release(n->saved[i]);
    }
    for (int i = 0; i < def->n_out; i++) {
        out[i] = dg_autorelease(n->out[i]);
        n->out[i] = NULL;
    }
    if (!record) free(n);
    return 0;
}

void dg_set_requires_grad(dg_tensor *t, bool on) {
    if (t) t->requires_grad = on;
}

void dg_zero_grad(dg_tensor *t) {
    if (t && t->grad) {
        dg_release(t->grad);
        t->grad = NULL;
    }
}

/* ---- backward ---- */

typedef struct node_list {
    dg_node **items;
    size_t n, cap;
} node_list;

static int push(node_list *l, dg_node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        dg_node **p = realloc(l->items, cap * sizeof *p);
        if (!p) return -1;
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = n;
    return 0;
}

static int by_seq_desc(const void *a, const void *b) {
    uint64_t x = (*(dg_node *const *)a)->seq, y = (*(dg_node *const *)b)->seq;
    return x < y ? 1 : (x > y ? -1 : 0);
}

/* A map from pointers to counts, open addressing with linear probing: the set of nodes visited
 * while ordering the graph, and the number of nodes still to run that feed each leaf. */
typedef struct ptr_map {
    const void **keys;
    int64_t *vals;
    size_t cap, used;
} ptr_map;

static void ptr_map_free(ptr_map *m) {
    free(m->keys);
    free(m->vals);
    *m = (ptr_map){0};
}

static size_t ptr_map_probe(const ptr_map *m, const void *key) {
    size_t h = ((uintptr_t)key >> 4) & (m->cap - 1);
    while (m->keys[h] && m->keys[h] != key) h = (h + 1) & (m->cap - 1);
    return h;
}

/* The count of key, or NULL when key is absent. */
static int64_t *ptr_map_find(const ptr_map *m, const void *key) {
    if (!m->cap) return NULL;
    size_t h = ptr_map_probe(m, key);
    return m->keys[h] ? &m->vals[h] : NULL;
}

/* The count of key, inserted as 0 when absent (*fresh says so).  NULL when out of memory. */
static int64_t *ptr_map_at(ptr_map *m, const void *key, bool *fresh) {
    if ((m->used + 1) * 2 > m->cap) { /* grow and rehash */
        ptr_map g = {.cap = m->cap ? m->cap * 2 : 1024};
        g.keys = calloc(g.cap, sizeof *g.keys);
        g.vals = calloc(g.cap, sizeof *g.vals);
        if (!g.keys || !g.vals) {
            ptr_map_free(&g);
            return NULL;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                size_t k = ptr_map_probe(&g, m->keys[i]);
                g.keys[k] = m->keys[i];
                g.vals[k] = m->vals[i];
            }
        g.used = m->used;
        ptr_map_free(m);
        *m = g;
    }
    size_t h = ptr_map_probe(m, key);
    *fresh = !m->keys[h];
    if (*fresh) {
        m->keys[h] = key;
        m->vals[h] = 0;
        m->used++;
    }
    return &m->vals[h];
}

/* All nodes reachable from `root`, each once, newest first. */
static int collect(dg_node *root, node_list *order) {
    node_list stack = {0};
    ptr_map seen = {0};
    int rc = push(&stack, root);
    while (rc == 0 && stack.n) {
        dg_node *n = stack.items[--stack.n];
        bool fresh;
        if (!ptr_map_at(&seen, n, &fresh)) rc = -1;
        if (rc || !fresh) continue;
        if (push(order, n) != 0) rc = -1;
        for (int i = 0; i < n->n_in && rc == 0; i++)
            if (n->needs_grad[i] && n->in[i]->node) rc = push(&stack, n->in[i]->node);
    }
    ptr_map_free(&seen);
    free(stack.items);
    if (rc == 0) qsort(order->items, order->n, sizeof *order->items, by_seq_desc);
    return rc;
}

/* Whether input i of node n is a leaf that takes a gradient. */
static bool leaf_input(const dg_node *n, int i) { return n->needs_grad[i] && n->in[i] && !n->in[i]->node; }

/* pending[leaf] = the number of (node, input) pairs in order that feed the leaf. */
static int count_leaf_uses(const node_list *order, ptr_map *pending) {
    for (size_t k = 0; k < order->n; k++)
        for (int i = 0; i < order->items[k]->n_in; i++) {
            if (!leaf_input(order->items[k], i)) continue;
            bool fresh;
            int64_t *c = ptr_map_at(pending, order->items[k]->in[i], &fresh);
            if (!c) return -1;
            ++*c;
        }
    return 0;
}

/* Node n has run (or had nothing to do): each leaf it fed whose last user it was is final. */
static int leaves_done(const dg_node *n, const ptr_map *pending, dg_leaf_ready_fn ready, void *ctx) {
    for (int i = 0; i < n->n_in; i++) {
        if (!leaf_input(n, i)) continue;
        int64_t *c = ptr_map_find(pending, n->in[i]);
        if (!c) { /* every leaf of the walk was counted before it */
            dg_error("backward: a leaf input of %s was not counted before the walk", n->op->name);
            return -1;
        }
        if (--*c == 0 && ready(n->in[i], ctx)) {
            if (!dg_has_error()) dg_error("backward: the hook on a finished leaf gradient failed");
            return -1;
        }
    }
    return 0;
}

/* A slot's tensor that nothing else holds: in-place writes to it change no other gradient */
static bool held_alone(const dg_tensor *g) { return g->refcount == 1 && g->storage->refcount == 1; }

/* Adds g into the gradient slot of tensor t: its producer's grad_acc, or t->grad for a leaf. */
static int accumulate_into(dg_tensor *t, dg_tensor *g) {
    dg_tensor **slot = t->node ? &t->node->grad_acc[t->out_index] : &t->grad;
    if (!*slot) {
        /* leaves keep a contiguous gradient of their own; inner slots may borrow g */
        dg_tensor *c = t->node ? g : dg_clone(g);
        if (!c) return -1;
        *slot = dg_retain(c);
        return 0;
    }
    /* the bf16 cast of an f32 tensor may take its gradient in f32 (matmul gives it so: ops/matmul.c);
     * bf16 and f32 contributions to one slot add up in f32 */
    bool widen = (*slot)->dtype == DG_BF16 && g->dtype == DG_F32;
    if ((*slot)->dtype == DG_F32 && g->dtype == DG_BF16 && !(g = dg_to_dtype(g, DG_F32))) return -1;
    /* widened, strided, or an inner slot that is shared (it may have borrowed g, which belongs to
     * another slot or is a view of another tensor's storage): a copy of its own before adding in
     * place.  A leaf's gradient is its own from the start (cloned above, or set by its owner: the
     * data-parallel step makes each a view into one flat buffer, models/data_parallel.c), so it is
     * added to in place, as PyTorch's AccumulateGrad does. */
    bool shared = t->node && !held_alone(*slot);
    if (widen || shared || !dg_is_contiguous(*slot)) {
        dg_tensor *c = widen ? dg_to_dtype(*slot, DG_F32) : dg_clone(*slot);
        if (!c) return -1;
        dg_release(*slot);
        *slot = dg_retain(c);
    }
    return dg_accumulate_(*slot, g);
}

dg_tensor *dg_grad_target(dg_node *n, int i, dg_dtype dt, bool *fresh) {
    *fresh = false;
    if (!n || i < 0 || i >= n->n_in || !n->needs_grad[i] || !n->in[i] || dg_anomaly_mode()) return NULL;
    dg_tensor *t = n->in[i];
    const dg_node *p = t->node;
    /* through a cast to the leaf behind it: the cast's backward would pass the gradient on as is */
    if (p && p->op->grad_passes_through && p->needs_grad[0] && p->in[0] && !p->in[0]->node && p->in[0]->dtype == dt)
        t = p->in[0];
    if (t->dtype != dt) return NULL;
    dg_tensor **slot = t->node ? &t->node->grad_acc[t->out_index] : &t->grad;
    if (!*slot) {
        dg_tensor *g = dg_empty_on(t->ndim, t->shape, dt, t->device);
        if (!g) {
            dg_clear_error(); /* the caller falls back to gin[i] */
            return NULL;
        }
        *slot = dg_retain(g);
        *fresh = true;
        return g;
    }
    dg_tensor *g = *slot;
    /* a leaf's gradient is its own (accumulate_into); an inner slot's may be borrowed */
    bool own = !t->node || held_alone(g);
    return own && g->dtype == dt && dg_is_contiguous(g) && dg_same_shape(g, t) ? g : NULL;
}

int dg_backward(dg_tensor *loss, dg_tensor *grad) { return dg_backward_hooked(loss, grad, NULL, NULL); }

int dg_backward_hooked(dg_tensor *loss, dg_tensor *grad, dg_leaf_ready_fn leaf_ready, void *ctx) {
    if (!loss) {
        dg_error("backward: loss is NULL");
        return -1;
    }
    if (!loss->requires_grad) {
        dg_error("backward: loss %s does not require grad (no input of its graph requires grad)", dg_shp(loss));
        return -1;
    }
    if (!grad && dg_numel(loss) != 1) {
        dg_error("backward: loss has shape %s; give a gradient for a loss of more than one element", dg_shp(loss));
        return -1;
    }
    if (grad && (!dg_same_shape(grad, loss) || grad->dtype != loss->dtype)) {
        dg_error("backward: grad has shape %s %s but loss has %s %s", dg_shp(grad), dg_dtype_name(grad->dtype),
                 dg_shp(loss), dg_dtype_name(loss->dtype));
        return -1;
    }
    int rc = 0;
    dg_no_grad_begin();
    dg_scope_begin();
    dg_tensor *seed = grad ? grad : dg_ones(loss->ndim, loss->shape, loss->dtype);
    if (seed && seed->device != loss->device) seed = dg_to_device(seed, loss->device);
    if (!seed) rc = -1;
    if (rc == 0) rc = accumulate_into(loss, seed);
    node_list order = {0};
    if (rc == 0 && loss->node && collect(loss->node, &order) != 0) {
        dg_error("backward: out of memory ordering the graph");
        rc = -1;
    }
    ptr_map pending = {0};
    if (rc == 0 && leaf_ready && count_leaf_uses(&order, &pending)) {
        dg_error("backward: out of memory counting the leaves' uses");
        rc = -1;
    }
    for (size_t k = 0; k < order.n && rc == 0; k++) {
        dg_node *n = order.items[k];
        bool any = false;
        for (int i = 0; i < n->n_out; i++) any |= n->grad_acc[i] != NULL;
        if (!any) {
            if (leaf_ready) rc = leaves_done(n, &pending, leaf_ready, ctx);
            continue;
        }
        dg_scope_begin();
        dg_tensor *gout[DG_MAX_IO] = {0}, *gin[DG_MAX_IO] = {0};
        for (int i = 0; i < n->n_out && rc == 0; i++) {
            /* backward functions may assume contiguous incoming gradients */
            dg_tensor *g = n->grad_acc[i];
            if (!g) gout[i] = dg_zeros_on(n->out_ndim[i], n->out_shape[i], n->out_dtype[i], n->out_device[i]);
            else gout[i] = dg_is_contiguous(g) ? dg_autorelease(dg_retain(g)) : dg_clone(g);
            if (!gout[i]) rc = -1;
        }
        const dg_backward_variant *bv = &n->op->bwd[n->variant];
        dg_prof_enter(n->op->name, DG_PROF_BWD);
        const int brc = rc == 0 ? bv->fn(n, gout, gin) : 0;
        dg_prof_leave();
        if (rc == 0 && brc != 0) {
            if (!dg_has_error()) dg_error("backward of %s (%s) failed", n->op->name, bv->name);
            rc = -1;
        }
        for (int i = 0; i < n->n_in && rc == 0; i++) {
            if (!n->needs_grad[i] || !gin[i]) continue;
            if (!dg_same_shape(gin[i], n->in[i])) {
                dg_error("backward of %s (%s): gradient of input %d '%s' has shape %s but the input has %s",
                         n->op->name, bv->name, i, n->op->in_names[i], dg_shp(gin[i]), dg_shp(n->in[i]));
                rc = -1;
                break;
            }
            if (dg_anomaly_mode()) {
                const char *bad = dg_first_nonfinite(gin[i]);
                if (bad) {
                    dg_error("anomaly: backward of op %s (%s) produced %s in the gradient of input %d '%s'; "
                             "inputs: %s",
                             n->op->name, bv->name, bad, i, n->op->in_names[i], dg_node_inputs_text(n));
                    rc = -1;
                    break;
                }
            }
            dg_prof_enter(n->op->name, DG_PROF_ACC);
            rc = accumulate_into(n->in[i], gin[i]);
            dg_prof_leave();
        }
        for (int i = 0; i < n->n_out; i++) {
            dg_release(n->grad_acc[i]);
            n->grad_acc[i] = NULL;
        }
        dg_scope_end();
        if (rc == 0 && leaf_ready) rc = leaves_done(n, &pending, leaf_ready, ctx);
    }
    ptr_map_free(&pending);
    for (size_t k = 0; k < order.n; k++)
        for (int i = 0; i < order.items[k]->n_out; i++) {
            dg_release(order.items[k]->grad_acc[i]);
            order.items[k]->grad_acc[i] = NULL;
        }
    free(order.items);
    dg_scope_end();
    dg_no_grad_end();
    return rc;
}

/* Data-parallel training across processes (models/data_parallel.h). */
#include "models/data_parallel.h"

#include "core/internal.h"
#include "models/atomic_file.h"
#include "models/dp_buckets.h"
#include "models/metrics.h"
#include "ops/collective.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RENDEZVOUS_MAGIC "deltagrad rendezvous 1\n"

static struct {
    bool active;
    int rank, world;
    dg_comm *comm;
    volatile sig_atomic_t *local_stop;
    volatile sig_atomic_t agreed_stop;
    /* the step's all-reduce (dg_dp_step_begin .. dg_dp_step_finish); the buffers are made at the
     * first step, outside every scope */
    dg_dtype grad_dtype; /* what the gradients travel and are averaged in: f32 (the default) or bf16 */
    dg_tensor *bucket;   /* grad_dtype [DG_DP_BUCKET_MB or less] on the GPU */
    /* from the second step on, f32 gradients only: every parameter's gradient in one flat f32
     * buffer, in the order the gradients become final (the first step's, which every step keeps),
     * each parameter's gradient a view of its piece; a bucket is then a slice of it, averaged in
     * place, with no copy into the bucket buffer and back */
    dg_tensor *flat;
    int64_t *flat_off;   /* [n_params]: where parameter i's piece starts */
    dg_tensor *scalars;  /* f32 [2] on the GPU: the loss, the stop request */
    dg_tensor *stop_req; /* f32 [1] on the GPU: this rank's stop request, written before each step */
    dg_tensor *const *params;
    const char **names; /* [n_params]: the parameters' names, for errors */
    dg_dp_buckets bk;   /* which gradients fill which bucket (models/dp_buckets.h) */
    bool in_step;
} dp = {.world = 1, .grad_dtype = DG_F32};

/* ---- the environment --------------------------------------------------------------------------- */

/* An integer environment variable in [lo, hi]; *out unchanged when absent.  1 present, 0 absent, -1 bad. */
static int env_int(const char *name, long lo, long hi, long *out) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < lo || v > hi) {
        dg_error("data-parallel: %s=%s is not an integer in [%ld, %ld]", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 1;
}

/* A positive number from the environment, or def. */
static double env_positive(const char *name, double def) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    double v = strtod(s, &end);
    return *end || !(v > 0) ? def : v;
}

int dg_dp_env(int *rank, int *world) {
    long w = 1, r = 0;
    int hw = env_int("DG_WORLD", 1, 1 << 16, &w);
    if (hw < 0) return -1;
    if (hw == 0 && getenv("DG_RANK") && *getenv("DG_RANK")) {
        dg_error("data-parallel: DG_RANK=%s is set but DG_WORLD is not", getenv("DG_RANK"));
        return -1;
    }
    int hr = env_int("DG_RANK", 0, w - 1, &r);
    if (hr < 0) return -1;
    if (hw && !hr && w > 1) {
        dg_error("data-parallel: DG_WORLD=%ld is set but DG_RANK is not: each process needs its rank", w);
        return -1;
    }
    *rank = (int)r;
    *world = (int)w;
    return 0;
}

int dg_dp_slice(int64_t batch, int rank, int world, int64_t *start, int64_t *count) {
    if (world < 1 || rank < 0 || rank >= world) {
        dg_error("data-parallel: rank %d of a world of %d", rank, world);
        return -1;
    }
    if (batch < world || batch % world != 0) {
        dg_error("data-parallel: the global batch of %lld sequences does not split into %d equal slices; give a "
                 "--batch that is a multiple of the number of GPUs",
                 (long long)batch, world);
        return -1;
    }
    *count = batch / world;
    *start = (int64_t)rank * *count;
    return 0;
}

/* ---- the rendezvous ---------------------------------------------------------------------------- */

int dg_dp_id_from_hex(const char *hex, unsigned char *id, size_t n) {
    if (!hex || strlen(hex) != 2 * n) {
        dg_error("data-parallel: a communicator id is %zu hex digits; got %zu", 2 * n, hex ? strlen(hex) : 0);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[2 * i + (size_t)k];
            int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (d < 0) {
                dg_error("data-parallel: '%c' at position %zu of a communicator id is not a hex digit", c,
                         2 * i + (size_t)k);
                return -1;
            }
            v = v * 16 + (unsigned)d;
        }
        id[i] = (unsigned char)v;
    }
    return 0;
}

int dg_dp_rendezvous_publish(const char *path, const unsigned char *id, size_t n) {
    dg_atomic_file af = {0};
    if (dg_atomic_open(&af, path, "rendezvous")) return -1;
    fputs(RENDEZVOUS_MAGIC, af.f);
    for (size_t i = 0; i < n; i++) fprintf(af.f, "%02x", id[i]);
    fputc('\n', af.f);
    return dg_atomic_commit(&af, "rendezvous");
}

/* The id in the file at path: 1 read, 0 not there yet, -1 there but malformed (dg_error). */
static int read_id_file(const char *path, unsigned char *id, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return 0;
        dg_error("data-parallel: cannot read the rendezvous file '%s': %s", path, strerror(errno));
        return -1;
    }
    char magic[64] = {0}, *hex = malloc(2 * n + 2);
    int rc = -1;
    if (!hex) {
        dg_error("data-parallel: out of host memory");
    } else if (!fgets(magic, sizeof magic, f) || strcmp(magic, RENDEZVOUS_MAGIC) != 0 ||
               !fgets(hex, (int)(2 * n + 2), f) || strlen(hex) != 2 * n + 1 || hex[2 * n] != '\n') {
        dg_error("data-parallel: '%s' is not a rendezvous file of deltagrad (a first line \"%.*s\", then %zu hex "
                 "digits)",
                 path, (int)strlen(RENDEZVOUS_MAGIC) - 1, RENDEZVOUS_MAGIC, 2 * n);
    } else {
        hex[2 * n] = 0;
        rc = dg_dp_id_from_hex(hex, id, n) ? -1 : 1;
    }
    free(hex);
    fclose(f);
    return rc;
}

int dg_dp_rendezvous_wait(const char *path, unsigned char *id, size_t n, double timeout_s) {
    double deadline = dg_progress_now() + timeout_s;
    for (;;) {
        int r = read_id_file(path, id, n);
        if (r) return r > 0 ? 0 : -1;
        if (dg_progress_now() > deadline) {
            dg_error("data-parallel: no rendezvous file '%s' after %g s: rank 0 did not start, or failed before "
                     "it wrote the file (DG_RENDEZVOUS_TIMEOUT sets the limit)",
                     path, timeout_s);
            return -1;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- joining ----------------------------------------------------------------------------------- */

int dg_dp_init(void) {
    int rank, world;
    if (dg_dp_env(&rank, &world)) return -1;
    if (world == 1 || dp.active) return 0;
    unsigned char id[DG_COMM_ID_BYTES];
    const char *hex = getenv("DG_NCCL_ID"), *path = getenv("DG_RENDEZVOUS");
    if (hex && *hex) {
        if (dg_dp_id_from_hex(hex, id, sizeof id)) return -1;
    } else if (!path || !*path) {
        dg_error("data-parallel: rank %d of %d: neither DG_RENDEZVOUS (a file path) nor DG_NCCL_ID is set, so the "
                 "ranks cannot meet",
                 rank, world);
        return -1;
    } else if (rank == 0) {
        if (dg_comm_unique_id(id) || dg_dp_rendezvous_publish(path, id, sizeof id)) return -1;
    } else if (dg_dp_rendezvous_wait(path, id, sizeof id, env_positive("DG_RENDEZVOUS_TIMEOUT", 60))) {
        return -1;
    }
    dp.comm = dg_comm_init(id, world, rank, env_positive("DG_DP_TIMEOUT", 300));
    /* joined: every rank has read the file; failed: it names a communicator that will not be; either
     * way no stale id is left for a later run */
    if (rank == 0 && !(hex && *hex)) unlink(path);
    if (!dp.comm) return -1;
    dp.active = true;
    dp.rank = rank;
    dp.world = world;
    return 0;
}

bool dg_dp_active(void) { return dp.active; }
int dg_dp_rank(void) { return dp.active ? dp.rank : 0; }
int dg_dp_world(void) { return dp.active ? dp.world : 1; }

static void drop_flat(void) {
    dg_release(dp.flat);
    free(dp.flat_off);
    dp.flat = NULL;
    dp.flat_off = NULL;
}

void dg_dp_shutdown(void) {
    drop_flat();
    dg_release(dp.bucket);
    dg_release(dp.scalars);
    dg_release(dp.stop_req);
    dp.stop_req = NULL;
    dg_dp_buckets_free(&dp.bk);
    free(dp.names);
    dg_comm_free(dp.comm);
    dp.bucket = dp.scalars = NULL;
    dp.names = NULL;
    dp.in_step = false;
    dp.comm = NULL;
    dp.active = false;
    dp.rank = 0;
    dp.world = 1;
}

volatile sig_atomic_t *dg_dp_stop_flag(volatile sig_atomic_t *local) {
    dp.local_stop = local;
    return &dp.agreed_stop;
}

/* ---- the step ---------------------------------------------------------------------------------- */

int dg_dp_take_slice(dg_tensor **in, dg_tensor **tg) {
    if (!dp.active) return 0;
    if (!*in || !*tg) return -1;
    int64_t start, count;
    if (dg_dp_slice((*in)->shape[0], dp.rank, dp.world, &start, &count)) return -1;
    *in = dg_slice(*in, 0, start, start + count);
    *tg = dg_slice(*tg, 0, start, start + count);
    return *in && *tg ? 0 : -1;
}

/* The gradient that enters the all-reduce for parameter p: f32, contiguous, on the GPU, or NULL (none). */
static int check_grad(const dg_tensor *p, int64_t i) {
    const dg_tensor *g = p->grad;
    if (p->device != DG_CUDA) {
        dg_error("data-parallel: parameter %lld (%s) is on %s: training on several GPUs keeps the model on the GPU "
                 "(--device cuda)",
                 (long long)i, p->name ? p->name : "unnamed", dg_device_name(p->device));
        return -1;
    }
    if (g && (g->dtype != DG_F32 || g->device != DG_CUDA || !dg_is_contiguous(g) || dg_numel(g) != dg_numel(p))) {
        dg_error("data-parallel: the gradient of parameter %lld (%s) is %s %s on %s; an f32 contiguous CUDA tensor "
                 "of %lld elements is required",
                 (long long)i, p->name ? p->name : "unnamed", dg_dtype_name(g->dtype), dg_shp(g),
                 dg_device_name(g->device), (long long)dg_numel(p));
        return -1;
    }
    return 0;
}

/* parameter i's gradient g is the view of its piece of the flat buffer */
static bool in_flat(const dg_tensor *g, int64_t i) {
    return dp.flat && g && g->storage == dp.flat->storage && g->offset == dp.flat->offset + dp.flat_off[i];
}

/* A bucket, full or the last of the step, on the side stream (the launch of dp_buckets.h): packed
 * from the gradients (zeros for a parameter without one), averaged over the ranks and unpacked into
 * them, after everything queued so far on the device's stream (which made those gradients).  With
 * the flat buffer the bucket is its slice [start, start + fill), whose pieces are the gradients
 * themselves: only a gradient that is not a view of its piece (none, in a step like the first) is
 * copied in and out.  The backward goes on meanwhile; the device's stream waits for the side
 * stream only at dg_dp_step_end. */
static int launch_bucket(void *ctx, const dg_dp_seg *segs, int64_t n_segs, int64_t fill) {
    (void)ctx;
    dg_tensor *buf = dp.bucket;
    int64_t start = 0;
    if (dp.flat) {
        buf = dp.flat;
        start = dp.flat_off[segs[0].param] + segs[0].grad_off;
        for (int64_t i = 0; i < n_segs; i++)
            if (dp.flat_off[segs[i].param] + segs[i].grad_off != start + segs[i].off) {
                dg_error("data-parallel: bucket piece %lld (parameter %lld) is not where the flat gradients hold it",
                         (long long)i, (long long)segs[i].param);
                return -1;
            }
    }
    dg_tensor *part = start == 0 && fill == dg_numel(buf) ? buf : dg_slice(buf, 0, start, start + fill);
    if (!part || dg_comm_side_begin(dp.comm)) return -1;
    for (int64_t i = 0; i < n_segs; i++) {
        const dg_dp_seg *sg = &segs[i];
        const dg_tensor *g = dp.params[sg->param]->grad;
        if (!in_flat(g, sg->param) && dg_comm_side_copy_(dp.comm, buf, start + sg->off, g, sg->grad_off, sg->n))
            return -1;
    }
    if (dg_comm_side_mean_(dp.comm, part)) return -1;
    for (int64_t i = 0; i < n_segs; i++) {
        const dg_dp_seg *sg = &segs[i];
        dg_tensor *g = dp.params[sg->param]->grad;
        if (g && !in_flat(g, sg->param) && dg_comm_side_copy_(dp.comm, g, sg->grad_off, buf, start + sg->off, sg->n))
            return -1;
    }
    return 0;
}

/* The flat buffer, once the first step has recorded the order (f32 gradients only): each
 * parameter's piece at the sum of the sizes of those finished before it; each gradient copied into
 * its piece and replaced by the view of it (a parameter without a gradient keeps none, and its
 * piece stays zero).  The autograd engine adds into a leaf's gradient in place (autograd/engine.c),
 * and AdamW's launch tables follow the new addresses (ops/optim_step.c), so the views stay the
 * gradients from then on.  The old gradients are freed as they are replaced; the buffer exists
 * beside them only during this one call, before a forward (dg_dp_step_prepare), when no activation
 * is held. */
static int make_flat(void) {
    if (dp.flat || !dp.bk.order_known || dp.grad_dtype != DG_F32 || !dp.params) return 0;
    const int64_t n = dp.bk.n_params;
    dp.flat_off = malloc((size_t)(n ? n : 1) * sizeof *dp.flat_off);
    if (!dp.flat_off) {
        dg_error("data-parallel: out of host memory");
        return -1;
    }
    int64_t total = 0;
    for (int64_t k = 0; k < n; k++) {
        dp.flat_off[dp.bk.order[k]] = total;
        total += dp.bk.numel[dp.bk.order[k]];
    }
    int rc = 0;
    dg_scope_begin();
    dg_tensor *f = dg_zeros_on(DG_SHAPE(total > 0 ? total : 1), DG_F32, DG_CUDA);
    if (!f) rc = -1;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        dg_tensor *p = dp.params[i];
        if (!p->grad) continue;
        dg_tensor *v = dg_reshape(dg_slice(f, 0, dp.flat_off[i], dp.flat_off[i] + dp.bk.numel[i]), p->ndim, p->shape);
        if (!v || dg_copy_(v, p->grad)) {
            rc = -1;
            break;
        }
        dg_release(p->grad);
        p->grad = dg_retain(v);
    }
    if (rc == 0) dp.flat = dg_keep(f);
    dg_scope_end();
    if (rc) {
        free(dp.flat_off);
        dp.flat_off = NULL;
    }
    return rc;
}

/* Makes the step's buffers at the first step (the device buffers outside every scope: they live
 * until shutdown). */
static int make_buffers(int64_t n, dg_tensor *const *params) {
    if (dp.bucket && dp.bk.n_params == n && dp.bucket->dtype == dp.grad_dtype) return 0;
    drop_flat(); /* other parameters, or another dtype: the order is learnt again */
    const int64_t cap = (int64_t)(env_positive("DG_DP_BUCKET_MB", DG_DP_BUCKET_MB_DEFAULT) * (1 << 20)) /
                        (int64_t)dg_dtype_size(dp.grad_dtype);
    int64_t total = 0, *numel = malloc((size_t)(n ? n : 1) * sizeof *numel);
    free(dp.names);
    dp.names = malloc((size_t)(n ? n : 1) * sizeof *dp.names);
    if (!numel || !dp.names) {
        free(numel);
        dg_error("data-parallel: out of host memory");
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        numel[i] = dg_numel(params[i]);
        dp.names[i] = params[i]->name;
        total += numel[i];
    }
    int64_t size = total < cap ? total : cap;
    size = size > 0 ? size : 1;
    dg_dp_buckets_free(&dp.bk);
    const int brc = dg_dp_buckets_init(&dp.bk, n, numel, size, launch_bucket, NULL);
    free(numel);
    if (brc) return -1;
    dg_release(dp.bucket);
    dp.bucket = NULL;
    dg_scope_begin();
    dg_tensor *b = dg_empty_on(DG_SHAPE(size), dp.grad_dtype, DG_CUDA);
    dg_tensor *sc = dp.scalars ? dp.scalars : dg_empty_on(DG_SHAPE(2), DG_F32, DG_CUDA);
    dp.bucket = b ? dg_keep(b) : NULL;
    if (!dp.scalars && sc) dp.scalars = dg_keep(sc);
    dg_scope_end();
    return dp.bucket && dp.scalars ? 0 : -1;
}

int dg_dp_set_grad_dtype(dg_dtype dt) {
    if (dt != DG_F32 && dt != DG_BF16) {
        dg_error("data-parallel: gradients are averaged in f32 or bf16, not %s", dg_dtype_name(dt));
        return -1;
    }
    if (dp.in_step) {
        dg_error("data-parallel: the gradients' dtype cannot change during a step");
        return -1;
    }
    dp.grad_dtype = dt;
    return 0;
}

int dg_dp_step_begin(int64_t n, dg_tensor *const *params, dg_tensor *loss) {
    if (!dp.active) return 0;
    if (dp.in_step) {
        dg_error("data-parallel: a step began before the last one finished");
        return -1;
    }
    if (!loss || dg_numel(loss) != 1) {
        dg_error("data-parallel: the loss must be one number; got %s", loss ? dg_shp(loss) : "none");
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        if (check_grad(params[i], i)) return -1;
    if (make_buffers(n, params)) return -1;
    dp.params = params;
    dg_dp_buckets_begin(&dp.bk);
    /* the loss and the stop request travel first, in their own small collective; both are copied
     * on the device (the request was written there by dg_dp_step_prepare): no host-to-device
     * copy that could wait behind a collective, and nothing a captured step would freeze */
    dg_tensor *l = dg_reshape(dg_to_dtype(loss, DG_F32), DG_SHAPE(1));
    if (!l || !dp.stop_req || dg_copy_(dg_slice(dp.scalars, 0, 0, 1), l) ||
        dg_copy_(dg_slice(dp.scalars, 0, 1, 2), dp.stop_req) || dg_comm_side_begin(dp.comm) ||
        dg_comm_side_mean_(dp.comm, dp.scalars))
        return -1;
    dp.in_step = true;
    return 0;
}

int dg_dp_step_prepare(void) {
    if (!dp.active) return 0;
    if (make_flat()) return -1;
    if (!dp.stop_req) {
        dg_scope_begin();
        dg_tensor *r = dg_empty_on(DG_SHAPE(1), DG_F32, DG_CUDA);
        dp.stop_req = r ? dg_keep(r) : NULL;
        dg_scope_end();
        if (!dp.stop_req) return -1;
    }
    return dg_fill_(dp.stop_req, dp.local_stop && *dp.local_stop ? 1.0 : 0.0);
}

dg_tensor *dg_dp_scalars(void) { return dp.active ? dp.scalars : NULL; }

int dg_dp_mark_step(void) { return dp.active ? dg_comm_mark(dp.comm) : 0; }

int dg_dp_wait(void) { return dp.active ? dg_comm_wait(dp.comm) : 0; }

void dg_dp_note_stop(double mean_request) {
    if (mean_request > 0 && !dp.agreed_stop) /* some rank was asked to stop: all stop after this step */
        dp.agreed_stop = dp.local_stop && *dp.local_stop ? *dp.local_stop : SIGTERM;
}

int dg_dp_leaf_ready(dg_tensor *leaf, void *ctx) {
    (void)ctx;
    if (!dp.active || !dp.in_step) return 0;
    for (int64_t i = 0; i < dp.bk.n_params; i++)
        if (dp.params[i] == leaf) return check_grad(leaf, i) || dg_dp_buckets_place(&dp.bk, i, dp.names) ? -1 : 0;
    return 0; /* a leaf that is not a parameter: not reduced */
}

int dg_dp_step_end(void) {
    if (!dp.active) return 0;
    if (!dp.in_step) {
        dg_error("data-parallel: dg_dp_step_end without dg_dp_step_begin");
        return -1;
    }
    /* the parameters the backward did not report (not reached: no gradient) go last, in their order */
    for (int64_t i = 0; i < dp.bk.n_params; i++)
        if (!dp.bk.placed[i] && check_grad(dp.params[i], i)) return -1;
    dp.in_step = false;
    return dg_dp_buckets_end(&dp.bk, dp.names) || dg_comm_side_join(dp.comm) ? -1 : 0;
}

int dg_dp_step_finish(double *loss) {
    if (!dp.active) return 0;
    float scalars[2];
    if (dg_comm_wait(dp.comm) || dg_copy_to_host(dp.scalars, scalars)) return -1;
    *loss = scalars[0];
    dg_dp_note_stop(scalars[1]);
    return 0;
}

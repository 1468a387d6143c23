/* Data-parallel training across processes (models/data_parallel.h). */
#include "models/data_parallel.h"

#include "core/internal.h"
#include "models/atomic_file.h"
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
    dg_tensor *bucket; /* f32 [DG_DP_BUCKET_FLOATS or less] on the GPU, made at the first all-reduce */
    volatile sig_atomic_t *local_stop;
    volatile sig_atomic_t agreed_stop;
} dp = {.world = 1};

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

/* A positive number of seconds from the environment, or def. */
static double env_seconds(const char *name, double def) {
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
    } else if (dg_dp_rendezvous_wait(path, id, sizeof id, env_seconds("DG_RENDEZVOUS_TIMEOUT", 60))) {
        return -1;
    }
    dp.comm = dg_comm_init(id, world, rank, env_seconds("DG_DP_TIMEOUT", 300));
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

void dg_dp_shutdown(void) {
    dg_release(dp.bucket);
    dg_comm_free(dp.comm);
    dp.bucket = NULL;
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

/* Copies the part [lo, hi) of the concatenation of the gradients (grad 0, grad 1, ...) between the
 * gradients and the bucket, which holds that part from its element 0: into the bucket (to_bucket) or
 * back; a parameter without a gradient gives zeros.  Device copies, queued on the stream: no wait. */
static int copy_part(int64_t n, dg_tensor *const *params, int64_t lo, int64_t hi, bool to_bucket) {
    int64_t off = 0;
    for (int64_t i = 0; i < n && off < hi; i++) {
        int64_t m = dg_numel(params[i]), a = lo > off ? lo : off, z = hi < off + m ? hi : off + m;
        if (a < z) {
            dg_tensor *g = params[i]->grad, *b = dg_slice(dp.bucket, 0, a - lo, z - lo);
            dg_tensor *gs = g ? dg_slice(dg_reshape(g, DG_SHAPE(m)), 0, a - off, z - off) : NULL;
            int rc = !b || (g && !gs) ? -1
                     : to_bucket      ? (gs ? dg_copy_(b, gs) : dg_fill_(b, 0))
                     : gs             ? dg_copy_(gs, b)
                                      : 0;
            if (rc) return -1;
        }
        off += m;
    }
    return 0;
}

int dg_dp_allreduce_grads(int64_t n, dg_tensor *const *params, double *loss) {
    if (!dp.active) return 0;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (check_grad(params[i], i)) return -1;
        total += dg_numel(params[i]);
    }
    if (!dp.bucket) { /* made once, outside every scope */
        dg_scope_begin();
        dg_tensor *b =
            dg_empty_on(DG_SHAPE(total < DG_DP_BUCKET_FLOATS ? total : DG_DP_BUCKET_FLOATS), DG_F32, DG_CUDA);
        dp.bucket = b ? dg_keep(b) : NULL;
        dg_scope_end();
        if (!dp.bucket) return -1;
    }
    /* the loss and the stop request first, in their own small collective: their copy to the device
     * waits for the stream, which must come before any collective is queued (a wait behind a
     * collective whose peer died would never end); they are read back after dg_comm_wait */
    float scalars[2] = {(float)*loss, dp.local_stop && *dp.local_stop ? 1.0f : 0.0f};
    dg_tensor *sc = dg_to_device(dg_from_data(DG_SHAPE(2), DG_F32, scalars), DG_CUDA);
    if (!sc || dg_comm_allreduce_mean_(dp.comm, sc)) return -1;
    int64_t size = dg_numel(dp.bucket);
    for (int64_t lo = 0; lo < total; lo += size) {
        int64_t hi = lo + size < total ? lo + size : total;
        dg_tensor *part = hi - lo == size ? dp.bucket : dg_slice(dp.bucket, 0, 0, hi - lo);
        if (!part || copy_part(n, params, lo, hi, true) || dg_comm_allreduce_mean_(dp.comm, part) ||
            copy_part(n, params, lo, hi, false))
            return -1;
    }
    if (dg_comm_wait(dp.comm) || dg_copy_to_host(sc, scalars)) return -1;
    *loss = scalars[0];
    if (scalars[1] > 0 && !dp.agreed_stop) /* some rank was asked to stop: all stop after this step */
        dp.agreed_stop = dp.local_stop && *dp.local_stop ? *dp.local_stop : SIGTERM;
    return 0;
}

/* The op profiler (deltagrad.h, dg_profile_*): where a step's time goes, by op.
 *
 * The engine brackets each op's forward (dg_apply_variant), each node's backward and each gradient
 * accumulation with dg_prof_enter / dg_prof_leave; callers bracket other work with named regions.
 * Only the outermost bracket is timed (depth 0): an op that calls ops, or ops inside a region, count
 * to the outer name, so the timed spans never overlap and their sum is at most the step.
 *
 * A span is timed twice.  Host: the wall clock from enter to leave, the time spent queueing it (on
 * a GPU run, launch and dispatch cost).  Device: on a CUDA profile, events 2i and 2i+1 of a pool
 * (kernels/cuda/kernel_timer.cu) recorded on the library's stream around span i, read back at
 * dg_profile_flush; on the CPU the host time is the device time.  On CUDA the span also counts
 * the host's waits for the device inside it (dg_cuda_wait_stats): a wait empties the queue, and
 * the device idles while the host queues what follows.  The host times, the waits and the calls
 * go into one total per (name, kind) as each span ends; only a CUDA span's events wait for the
 * flush (a step), which reads their elapsed times.  State is host-side and single-threaded, as the
 * library's stream is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

enum { PROF_MAX_SPANS = 1 << 15, PROF_MAX_KEYS = 512 };

static const char *const KIND_NAME[] = {"forward", "backward", "accumulate", "region"};

typedef struct {
    const char *name;
    dg_prof_kind kind;
    double host_s, dev_ms, wait_s;
    int64_t calls, waits;
} prof_key;

static struct {
    bool on, cuda;
    int depth;
    int n, dropped; /* CUDA spans since the last flush; spans past PROF_MAX_SPANS are not timed */
    int events;     /* CUDA events reserved in the pool (two a span) */
    int open_key;   /* the key of the span being timed (depth > 0) */
    double open_t0, open_wait_s;
    int64_t open_waits;
    int span_key[PROF_MAX_SPANS]; /* the key of CUDA span i, whose events are 2i and 2i+1 */
    int nkeys;
    prof_key keys[PROF_MAX_KEYS];
} P;

static int key_of(const char *name, dg_prof_kind kind) {
    for (int i = 0; i < P.nkeys; i++)
        if (P.keys[i].kind == kind && (P.keys[i].name == name || strcmp(P.keys[i].name, name) == 0)) return i;
    if (P.nkeys == PROF_MAX_KEYS) return -1;
    P.keys[P.nkeys] = (prof_key){.name = name, .kind = kind};
    return P.nkeys++;
}

bool dg_profile_on(void) { return P.on; }

int dg_profile_begin(dg_device device) {
    memset(&P, 0, sizeof P);
    P.cuda = device == DG_CUDA;
#ifdef DG_HAVE_CUDA
    P.events = 2 * 1024;
    if (P.cuda && dg_cuda_evpool_reserve(P.events)) return -1;
#else
    if (P.cuda) {
        dg_error("profile: this build has no CUDA backend");
        return -1;
    }
#endif
    P.on = true;
    return 0;
}

void dg_prof_enter(const char *name, dg_prof_kind kind) {
    if (!P.on || P.depth++ > 0) return;
    P.open_key = key_of(name, kind);
    if (P.open_key < 0 || P.n == PROF_MAX_SPANS) {
        P.open_key = -1;
        P.dropped++;
        return;
    }
#ifdef DG_HAVE_CUDA
    /* a failed record or reserve drops the span; dg_error stays untouched for the caller's work */
    if (P.cuda && 2 * P.n + 2 > P.events && dg_cuda_evpool_reserve(P.events * 2) == 0) P.events *= 2;
    if (P.cuda && (2 * P.n + 2 > P.events || dg_cuda_evpool_record(2 * P.n))) {
        dg_clear_error();
        P.open_key = -1;
        P.dropped++;
        return;
    }
    if (P.cuda) dg_cuda_wait_stats(&P.open_wait_s, &P.open_waits);
#endif
    P.open_t0 = dg_now_s();
}

void dg_prof_leave(void) {
    if (!P.on || P.depth == 0 || --P.depth > 0 || P.open_key < 0) return;
#ifdef DG_HAVE_CUDA
    if (P.cuda && dg_cuda_evpool_record(2 * P.n + 1)) {
        dg_clear_error();
        P.dropped++;
        return;
    }
#endif
    prof_key *k = &P.keys[P.open_key];
    const double host = dg_now_s() - P.open_t0;
    k->host_s += host;
    k->calls++;
#ifdef DG_HAVE_CUDA
    if (P.cuda) {
        double w;
        int64_t c;
        dg_cuda_wait_stats(&w, &c);
        k->wait_s += w - P.open_wait_s;
        k->waits += c - P.open_waits;
        P.span_key[P.n++] = P.open_key; /* its device time at the flush */
        return;
    }
#endif
    k->dev_ms += 1e3 * host; /* on the CPU the host time is the time */
}

void dg_profile_region_begin(const char *name) { dg_prof_enter(name, DG_PROF_REGION); }
void dg_profile_region_end(void) { dg_prof_leave(); }

int dg_profile_flush(void) {
    if (!P.on) return 0;
#ifdef DG_HAVE_CUDA
    for (int i = 0; i < P.n; i++) {
        float ms = 0.0f;
        if (dg_cuda_evpool_elapsed(2 * i, 2 * i + 1, &ms)) return -1;
        P.keys[P.span_key[i]].dev_ms += ms;
    }
#endif
    P.n = 0;
    return 0;
}

static int by_dev_ms(const void *a, const void *b) {
    const prof_key *x = a, *y = b;
    return (x->dev_ms < y->dev_ms) - (x->dev_ms > y->dev_ms);
}

void dg_profile_report(FILE *f, int64_t steps) {
    if (!P.on || steps <= 0) return;
    prof_key *k = malloc(sizeof *k * (size_t)(P.nkeys ? P.nkeys : 1));
    if (!k) return;
    memcpy(k, P.keys, sizeof *k * (size_t)P.nkeys);
    qsort(k, (size_t)P.nkeys, sizeof *k, by_dev_ms);
    double tot_dev = 0, tot_host = 0, tot_wait = 0;
    int64_t tot_waits = 0;
    for (int i = 0; i < P.nkeys; i++)
        tot_dev += k[i].dev_ms, tot_host += k[i].host_s, tot_wait += k[i].wait_s, tot_waits += k[i].waits;
    const double n = (double)steps;
    /* on the CPU the host time is the time and nothing waits: the columns of a GPU run only */
    if (P.cuda) {
        fprintf(f,
                "op profile, per step over %lld steps (device: CUDA events; host: the time spent queueing, of "
                "which waits: for the device)\n",
                (long long)steps);
        fprintf(f, "  %-28s %-10s %8s %11s %7s %10s %7s %9s\n", "name", "kind", "calls", "device ms", "share",
                "host ms", "waits", "wait ms");
    } else {
        fprintf(f, "op profile, per step over %lld steps (CPU: wall time on the calling thread)\n", (long long)steps);
        fprintf(f, "  %-28s %-10s %8s %11s %7s\n", "name", "kind", "calls", "ms", "share");
    }
    for (int i = 0; i <= P.nkeys; i++) {
        const bool all = i == P.nkeys; /* the last row: the sums */
        const prof_key *r = all ? NULL : &k[i];
        const double dev = all ? tot_dev : r->dev_ms, host = all ? tot_host : r->host_s;
        const double waits = all ? (double)tot_waits : (double)r->waits, wait = all ? tot_wait : r->wait_s;
        char calls[32] = "";
        if (!all) snprintf(calls, sizeof calls, "%.1f", (double)r->calls / n);
        fprintf(f, "  %-28s %-10s %8s %11.3f %6.1f%%", all ? "all timed" : r->name, all ? "" : KIND_NAME[r->kind],
                calls, dev / n, tot_dev > 0 ? 100.0 * dev / tot_dev : 0.0);
        if (P.cuda) fprintf(f, " %10.3f %7.1f %9.3f", 1e3 * host / n, waits / n, 1e3 * wait / n);
        fputc('\n', f);
    }
    if (P.dropped) fprintf(f, "  (%d spans not timed: past the profiler's room)\n", P.dropped);
    free(k);
}

void dg_profile_end(void) {
    memset(&P, 0, sizeof P);
#ifdef DG_HAVE_CUDA
    dg_cuda_evpool_free();
#endif
}

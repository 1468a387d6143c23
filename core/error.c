/* Thread-local error message: the first error of a chain wins (dg_error), so a sequence of calls
 * can be checked once at its end; dg_error_force overwrites. */
#include "core/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char message[1024];

const char *dg_last_error(void) { return message; }
void dg_clear_error(void) { message[0] = 0; }
bool dg_has_error(void) { return message[0] != 0; }

void dg_error(const char *fmt, ...) {
    if (message[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
}

void dg_error_force(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
}

/* Notes already printed (their texts' hashes); past the table's room a note prints every time. */
enum { NOTES_MAX = 64 };
static uint64_t notes_seen[NOTES_MAX];
static int notes_n;
static pthread_mutex_t notes_mu = PTHREAD_MUTEX_INITIALIZER;

bool dg_note_once(const char *text) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = text; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    pthread_mutex_lock(&notes_mu);
    bool seen = false;
    for (int i = 0; i < notes_n && !seen; i++) seen = notes_seen[i] == h;
    if (!seen && notes_n < NOTES_MAX) notes_seen[notes_n++] = h;
    pthread_mutex_unlock(&notes_mu);
    if (!seen) fprintf(stderr, "deltagrad: note: %s\n", text);
    return !seen;
}

const char *dg_shape_text(int ndim, const int64_t *shape) {
    static _Thread_local char bufs[8][96];
    static _Thread_local int next;
    char *b = bufs[next++ & 7];
    size_t n = 0;
    n += (size_t)snprintf(b + n, 96 - n, "[");
    for (int i = 0; i < ndim && n < 90; i++)
        n += (size_t)snprintf(b + n, 96 - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    snprintf(b + n, 96 - n, "]");
    return b;
}

const char *dg_shp(const dg_tensor *t) { return t ? dg_shape_text(t->ndim, t->shape) : "(null)"; }

char *dg_shape_str(const dg_tensor *t, char *buf, size_t n) {
    snprintf(buf, n, "%s", dg_shp(t));
    return buf;
}

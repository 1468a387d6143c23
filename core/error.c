/* Thread-local error message: the first error of a chain wins (dg_error), so a sequence of calls
 * can be checked once at its end; dg_error_force overwrites. */
#include "core/internal.h"

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

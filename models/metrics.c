/* CSV metrics log and the console progress display (formats in metrics.h). */
#include "models/metrics.h"

#include "models/atomic_file.h"
#include "models/infra_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* ---- CSV ------------------------------------------------------------------------------------- */

/* The whole file, NUL-terminated; NULL with errno set. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (!got) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        errno = buf ? EIO : ENOMEM;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static char *header_line(int ncols, const char *const *cols) {
    size_t n = 2;
    for (int i = 0; i < ncols; i++) n += strlen(cols[i]) + 1;
    char *h = malloc(n);
    if (!h) return NULL;
    h[0] = 0;
    for (int i = 0; i < ncols; i++) {
        if (i) strcat(h, ",");
        strcat(h, cols[i]);
    }
    return h;
}

/* Counts the steps in (prev, step) as missing in c. */
static void note_gap(dg_csv *c, int64_t prev, int64_t step) {
    if (step <= prev + 1) return;
    if (c->missing_steps == 0) {
        c->missing_from = prev + 1;
        c->missing_to = step - 1;
    }
    c->missing_steps += step - 1 - prev;
}

/* Rewrites path with its header and the rows of step <= resume_step, noting the steps without a
 * row in c; 0 or -1. */
static int truncate_log(dg_csv *c, const char *path, const char *header, int64_t resume_step) {
    size_t len;
    char *text = slurp(path, &len);
    if (!text) {
        dg_error("metrics: cannot read '%s' to resume it: %s", path, strerror(errno));
        return -1;
    }
    size_t hl = strlen(header);
    if (len < hl + 1 || memcmp(text, header, hl) || text[hl] != '\n') {
        char *nl = strchr(text, '\n');
        if (nl) *nl = 0;
        dg_error("metrics: '%s' has the columns \"%.200s\", expected \"%.200s\"; move it away or start a new run", path,
                 text, header);
        free(text);
        return -1;
    }
    dg_atomic_file af;
    if (dg_atomic_open(&af, path, "metrics")) {
        free(text);
        return -1;
    }
    fwrite(text, 1, hl + 1, af.f);
    int64_t prev = 0; /* the last step with a row */
    for (char *line = text + hl + 1; *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break; /* torn last line */
        char *end;
        double step = strtod(line, &end);
        if (end != line && (*end == ',' || end == nl) && step <= (double)resume_step) {
            fwrite(line, 1, (size_t)(nl - line) + 1, af.f);
            if (step > (double)prev && step == (double)(int64_t)step) {
                note_gap(c, prev, (int64_t)step);
                prev = (int64_t)step;
            }
        }
        line = nl + 1;
    }
    note_gap(c, prev, resume_step + 1);
    free(text);
    return dg_atomic_commit(&af, "metrics");
}

dg_csv *dg_csv_open(const char *path, int ncols, const char *const *cols, int64_t resume_step) {
    if (!path || ncols < 1 || !cols) {
        dg_error("metrics: dg_csv_open needs a path and at least one column");
        return NULL;
    }
    for (int i = 0; i < ncols; i++)
        if (!cols[i] || !cols[i][0] || strpbrk(cols[i], ",\"\n\r")) {
            dg_error("metrics: column %d name \"%s\" is empty or holds a comma, quote or newline", i,
                     cols[i] ? cols[i] : "(null)");
            return NULL;
        }
    char *header = header_line(ncols, cols);
    dg_csv *c = calloc(1, sizeof *c);
    if (!header || !c || !(c->path = strdup(path))) {
        dg_error("metrics: out of memory");
        goto fail;
    }
    c->ncols = ncols;
    bool resume = resume_step >= 0 && access(path, F_OK) == 0;
    if (resume && truncate_log(c, path, header, resume_step)) goto fail;
    if (!resume && resume_step > 0) note_gap(c, 0, resume_step + 1); /* the log is gone */
    c->f = fopen(path, resume ? "ab" : "wb");
    if (!c->f) {
        dg_error("metrics: cannot open '%s' for writing: %s", path, strerror(errno));
        goto fail;
    }
    if (!resume) {
        fprintf(c->f, "%s\n", header);
        fflush(c->f);
    }
    free(header);
    return c;
fail:
    free(header);
    dg_csv_close(c);
    return NULL;
}

int dg_csv_row(dg_csv *c, const double *values) {
    if (!c || !c->f) {
        dg_error("metrics: write to a closed CSV log");
        return -1;
    }
    for (int i = 0; i < c->ncols; i++) {
        if (i) fputc(',', c->f);
        if (isfinite(values[i])) fprintf(c->f, "%.10g", values[i]);
    }
    fputc('\n', c->f);
    if (fflush(c->f) != 0 || ferror(c->f)) {
        dg_error("metrics: writing '%s' failed: %s", c->path, strerror(errno));
        return -1;
    }
    return 0;
}

void dg_csv_close(dg_csv *c) {
    if (!c) return;
    if (c->f) fclose(c->f);
    free(c->path);
    free(c);
}

void dg_csv_table_free(dg_csv_table *t) {
    if (!t) return;
    for (int i = 0; i < t->ncols; i++) free(t->cols[i]);
    free(t->cols);
    free(t->data);
    free(t);
}

int dg_csv_column(const dg_csv_table *t, const char *name) {
    for (int i = 0; t && i < t->ncols; i++)
        if (!strcmp(t->cols[i], name)) return i;
    return -1;
}

dg_csv_table *dg_csv_read(const char *path) {
    size_t len;
    char *text = slurp(path, &len);
    if (!text) {
        dg_error("metrics: cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    dg_csv_table *t = calloc(1, sizeof *t);
    char *nl = strchr(text, '\n');
    if (!t) {
        dg_error("metrics: out of memory reading '%s'", path);
        goto fail;
    }
    if (!nl) {
        dg_error("metrics: '%s' has no header line", path);
        goto fail;
    }
    *nl = 0;
    t->ncols = 1;
    for (char *p = text; *p; p++) t->ncols += *p == ',';
    t->cols = calloc((size_t)t->ncols, sizeof *t->cols);
    size_t nlines = 0;
    for (char *p = nl + 1; *p; p++) nlines += *p == '\n';
    t->data = malloc((nlines + 1) * (size_t)t->ncols * sizeof *t->data);
    if (!t->cols || !t->data) {
        dg_error("metrics: out of memory reading '%s'", path);
        goto fail;
    }
    char *field = text;
    for (int i = 0; i < t->ncols; i++) {
        char *comma = strchr(field, ',');
        if (comma) *comma = 0;
        if (!(t->cols[i] = strdup(field))) {
            dg_error("metrics: out of memory");
            goto fail;
        }
        field = comma ? comma + 1 : field;
    }
    int64_t lineno = 1;
    for (char *line = nl + 1; *line;) {
        char *end_line = strchr(line, '\n');
        if (!end_line) break; /* torn last line */
        *end_line = 0;
        lineno++;
        char *p = line;
        for (int i = 0; i < t->ncols; i++) {
            char *comma = strchr(p, ',');
            if ((i < t->ncols - 1) != (comma != NULL)) {
                dg_error("metrics: '%s' line %lld does not have %d fields", path, (long long)lineno, t->ncols);
                goto fail;
            }
            if (comma) *comma = 0;
            double v = NAN;
            if (*p) {
                char *e;
                v = strtod(p, &e);
                if (*e) {
                    dg_error("metrics: '%s' line %lld field %d \"%.40s\" is not a number", path, (long long)lineno,
                             i + 1, p);
                    goto fail;
                }
            }
            t->data[t->nrows * t->ncols + i] = v;
            p = comma ? comma + 1 : p;
        }
        t->nrows++;
        line = end_line + 1;
    }
    free(text);
    return t;
fail:
    free(text);
    dg_csv_table_free(t);
    return NULL;
}

/* ---- progress display ------------------------------------------------------------------------- */

double dg_progress_now(void) { return dg_now_s(); }

char *dg_format_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return buf;
    }
    long long t = (long long)(s + 0.5);
    if (t < 60) snprintf(buf, n, "%llds", t);
    else if (t < 3600) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else if (t < 86400) snprintf(buf, n, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
    else snprintf(buf, n, "%lldd%02lldh", t / 86400, (t % 86400) / 3600);
    return buf;
}

/* 12345 -> "12.3k", 1234567 -> "1.23M" */
static void si(double v, char *buf, size_t n) {
    if (v >= 1e6) snprintf(buf, n, "%.3gM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, n, "%.3gk", v / 1e3);
    else snprintf(buf, n, "%.3g", v);
}

void dg_progress_init(dg_progress *p, FILE *f, dg_progress_mode mode, int64_t start_step, int64_t total_steps,
                      int64_t log_every) {
    memset(p, 0, sizeof *p);
    p->f = f ? f : stderr;
    if (mode == DG_PROGRESS_AUTO) {
        const char *term = getenv("TERM");
        p->tty = isatty(fileno(p->f)) && !(term && !strcmp(term, "dumb"));
    } else p->tty = mode == DG_PROGRESS_TTY;
    p->start_step = start_step;
    p->total_steps = total_steps;
    p->log_every = log_every > 0 ? log_every : 1;
    p->t_start = dg_progress_now();
    p->t_last_draw = -1e30;
    p->columns = 100;
    struct winsize ws;
    if (p->tty && ioctl(fileno(p->f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) p->columns = ws.ws_col;
}

void dg_progress_update(dg_progress *p, int64_t step, double loss, double acc, double tok_per_s) {
    dg_progress_update_at(p, step, loss, acc, tok_per_s, dg_progress_now());
}

void dg_progress_update_at(dg_progress *p, int64_t step, double loss, double acc, double tok_per_s, double now) {
    bool last = step >= p->total_steps;
    double elapsed = now - p->t_start;
    int64_t done = step - p->start_step, left = p->total_steps - step;
    double eta = done > 0 ? elapsed / (double)done * (double)(left > 0 ? left : 0) : NAN;
    char eta_s[24], el_s[24], tps[24];
    dg_format_duration(eta, eta_s, sizeof eta_s);
    dg_format_duration(elapsed, el_s, sizeof el_s);
    if (!p->tty) {
        if (!last && step % p->log_every != 0) return;
        fprintf(p->f, "step %lld/%lld loss %.4f", (long long)step, (long long)p->total_steps, loss);
        if (isfinite(acc)) fprintf(p->f, " acc %.4f", acc);
        if (isfinite(tok_per_s)) fprintf(p->f, " tok/s %.0f", tok_per_s);
        fprintf(p->f, " elapsed %s eta%s %s\n", el_s, p->may_stop_early ? "<=" : "", eta_s);
        fflush(p->f);
        return;
    }
    if (!last && now - p->t_last_draw < 0.1) return;
    p->t_last_draw = now;
    /* the text after the bar, then a bar filling what is left of the line (never wrapping, since
     * a wrapped line cannot be redrawn with \r) */
    char tail[160];
    int k = snprintf(tail, sizeof tail, " | loss %.4f", loss);
    if (isfinite(acc)) k += snprintf(tail + k, sizeof tail - (size_t)k, " | acc %.1f%%", 100.0 * acc);
    if (isfinite(tok_per_s)) {
        si(tok_per_s, tps, sizeof tps);
        k += snprintf(tail + k, sizeof tail - (size_t)k, " | %s tok/s", tps);
    }
    snprintf(tail + k, sizeof tail - (size_t)k, " | %s %s",
             last                ? "took"
             : p->may_stop_early ? "at most"
                                 : "ETA",
             last ? el_s : eta_s);
    char head[64];
    int pct = p->total_steps > 0 ? (int)(100 * step / p->total_steps) : 100;
    snprintf(head, sizeof head, "step %lld/%lld", (long long)step, (long long)p->total_steps);
    int room = p->columns - 1 - (int)strlen(head) - (int)strlen(tail) - 8; /* " [" "] " "100%" */
    int bar = room > 40 ? 40 : room;
    fprintf(p->f, "\r%s", head);
    if (bar >= 10) {
        int fill = p->total_steps > 0 ? (int)((double)bar * (double)step / (double)p->total_steps) : bar;
        if (fill > bar) fill = bar;
        fputs(" [", p->f);
        for (int i = 0; i < bar; i++) fputc(i < fill ? '#' : '.', p->f);
        fprintf(p->f, "] %3d%%", pct);
    }
    fprintf(p->f, "%s\033[K", tail);
    fflush(p->f);
    p->line_open = true;
}

void dg_progress_message(dg_progress *p, const char *fmt, ...) {
    if (p->tty && p->line_open) fputs("\r\033[K", p->f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->f, fmt, ap);
    va_end(ap);
    fputc('\n', p->f);
    fflush(p->f);
    /* the bar is redrawn at the next update */
    p->line_open = false;
    p->t_last_draw = -1e30;
}

void dg_progress_finish(dg_progress *p) {
    if (p->tty && p->line_open) fputc('\n', p->f);
    fflush(p->f);
    p->line_open = false;
}

/* Training metrics: a CSV log flushed line by line, and the console progress display.  The SVG
 * chart of a CSV log is in models/chart.h. */
#ifndef DG_MODELS_METRICS_H
#define DG_MODELS_METRICS_H

#include "deltagrad.h"

/* ---- CSV log --------------------------------------------------------------------------------- */
/* Header line = the column names; each row is one number per column, written with %.10g (NaN
 * or infinity as an empty field, meaning "not measured at this step"), then flushed, so a killed
 * run loses at most the line being written. */
typedef struct dg_csv {
    FILE *f;
    char *path;
    int ncols;
    /* a resumed log: steps 1..resume_step that have no row (a log cut short or edited), and the
     * first such range; 0 when the log is whole */
    int64_t missing_steps, missing_from, missing_to;
} dg_csv;

/* resume_step < 0: a new file (an existing one is replaced).  resume_step >= 0: continue an
 * existing log: its header must equal cols; rows whose first column (the step) is <= resume_step
 * are kept, later rows and a torn last line (a run killed after its last checkpoint) are dropped
 * (the file is rewritten atomically), and new rows are appended.  Steps up to resume_step with no
 * row are counted in missing_steps (the first range in missing_from..missing_to) so that the caller
 * can say the log has a gap.  A missing file starts fresh (all of 1..resume_step missing).
 * NULL with dg_error on failure. */
dg_csv *dg_csv_open(const char *path, int ncols, const char *const *cols, int64_t resume_step);
/* Appends one row of ncols values and flushes.  0, or -1 with dg_error. */
int dg_csv_row(dg_csv *c, const double *values);
void dg_csv_close(dg_csv *c);

/* A whole CSV log read back (for charts and tests): data[r * ncols + c], NaN for empty fields. */
typedef struct dg_csv_table {
    int ncols;
    char **cols;
    int64_t nrows;
    double *data;
} dg_csv_table;
/* NULL with dg_error if the file is missing or a line has the wrong number of fields or a field is
 * not a number.  A torn last line (no newline) is ignored. */
dg_csv_table *dg_csv_read(const char *path);
void dg_csv_table_free(dg_csv_table *t);
int dg_csv_column(const dg_csv_table *t, const char *name); /* index, or -1 */

/* ---- progress display ------------------------------------------------------------------------- */
/* On a terminal: one line redrawn in place with \r, at most 10 times a second:
 *   step 120/1000 [#####.......] 12% | loss 1.2345 | acc 45.6% | 12.3k tok/s | ETA 1m23s
 * Otherwise (a pipe, a file, TERM=dumb): a plain line every log_every steps and at the last step:
 *   step 120/1000 loss 1.2345 acc 0.4560 tok/s 12345 elapsed 10s eta 1m23s
 * ETA = elapsed / (steps done since start) * (steps left).  When the run may stop before its last
 * step (an accuracy target), that is an upper bound and is shown as such: "| at most 1m23s" on a
 * terminal, "eta<= 1m23s" in plain lines. */
typedef enum { DG_PROGRESS_AUTO, DG_PROGRESS_TTY, DG_PROGRESS_PLAIN } dg_progress_mode;

typedef struct dg_progress {
    FILE *f;
    bool tty;
    int64_t start_step, total_steps, log_every;
    double t_start, t_last_draw;
    bool line_open;      /* a \r line is on screen */
    bool may_stop_early; /* the ETA (to total_steps) is an upper bound */
    int columns;         /* terminal width */
} dg_progress;

void dg_progress_init(dg_progress *p, FILE *f, dg_progress_mode mode, int64_t start_step, int64_t total_steps,
                      int64_t log_every);
/* step = steps completed so far; acc or tok_per_s NaN leaves that field out. */
void dg_progress_update(dg_progress *p, int64_t step, double loss, double acc, double tok_per_s);
/* The same at an explicit time (seconds on the monotonic clock of dg_progress_now). */
void dg_progress_update_at(dg_progress *p, int64_t step, double loss, double acc, double tok_per_s, double now);
/* A line of its own (evaluation results, checkpoints) that does not garble the bar. */
void dg_progress_message(dg_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends the bar's line. */
void dg_progress_finish(dg_progress *p);
double dg_progress_now(void);
/* "12s", "3m05s", "1h02m", "2d03h" */
char *dg_format_duration(double seconds, char *buf, size_t n);

#endif

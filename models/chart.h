/* SVG line charts of training curves: panels stacked vertically over a shared x axis, each with
 * its own y axis (linear, or log10 for losses spanning decades), "nice" ticks (1, 2, 5 x 10^k),
 * grid lines, tick labels, axis labels and a legend.  Points with a NaN coordinate are skipped (a
 * line joins the measured points: an evaluation column is NaN between evaluations).  Written
 * atomically (models/atomic_file.h), so a browser refreshing the file never sees half of it. */
#ifndef DG_MODELS_CHART_H
#define DG_MODELS_CHART_H

#include "deltagrad.h"

#define DG_CHART_MAX_SERIES 8

typedef struct dg_chart_series {
    const char *label;
    int64_t n;
    const double *x;
    const double *y;
    int64_t stride; /* distance between consecutive points in x and y (0 means 1) */
} dg_chart_series;

typedef struct dg_chart_panel {
    const char *ylabel;
    int n_series;
    dg_chart_series series[DG_CHART_MAX_SERIES];
    int log_y;        /* 1 log10, 0 linear, -1 automatic (log when all > 0 and max/min > 30) */
    bool fixed_range; /* linear axis over exactly [y_lo, y_hi] (e.g. accuracy 0..1) */
    double y_lo, y_hi;
} dg_chart_panel;

/* 0, or -1 with dg_error. */
int dg_chart_svg(const char *path, const char *title, const char *xlabel, int n_panels, const dg_chart_panel *panels);

/* The chart of a metrics CSV (models/metrics.h): x = the column "step"; a loss panel with every
 * column whose name contains "loss" (automatic log scale) and an accuracy panel with every column
 * whose name contains "acc" (left out if there is none; its axis is 0 .. 1 when the values are).  0, or -1 with dg_error. */
int dg_chart_from_csv(const char *csv_path, const char *svg_path, const char *title);

#endif

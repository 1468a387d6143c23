/* SVG charts of training curves (layout in chart.h). */
#include "models/chart.h"

#include "models/atomic_file.h"
#include "models/infra_common.h"
#include "models/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* geometry, in SVG user units (pixels) */
#define W 960
#define PANEL_H 300
#define LEFT 84
#define RIGHT 24
#define TOP 48
#define GAP 56
#define BOTTOM 56

static const char *const colors[DG_CHART_MAX_SERIES] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                        "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* 1, 2, 5 or 10 times a power of ten, near x (rounded) or at least x */
static double nice(double x, bool round_it) {
    double e = floor(log10(x)), f = x / pow(10, e), nf;
    if (round_it) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return nf * pow(10, e);
}

typedef struct axis {
    double lo, hi; /* in axis units (log10 of the value on a log axis) */
    bool log;
    int n_ticks;
    double ticks[64]; /* axis units */
} axis;

/* Linear axis over [mn, mx] with about `target` nice ticks. */
static void linear_axis(axis *a, double mn, double mx, int target) {
    if (!(mx > mn)) {
        double d = fabs(mn) > 0 ? fabs(mn) * 0.1 : 1;
        mn -= d;
        mx += d;
    }
    double step = nice(nice(mx - mn, false) / (target - 1), true);
    a->lo = floor(mn / step) * step;
    a->hi = ceil(mx / step) * step;
    a->log = false;
    a->n_ticks = 0;
    for (double t = a->lo; t <= a->hi + step * 1e-9 && a->n_ticks < 64; t += step)
        a->ticks[a->n_ticks++] = fabs(t) < step * 1e-9 ? 0 : t;
}

/* log10 axis over [mn, mx] (both > 0): decades, plus 2x and 5x ticks when it spans <= 2 decades */
static void log_axis(axis *a, double mn, double mx) {
    a->log = true;
    a->lo = floor(log10(mn));
    a->hi = ceil(log10(mx));
    if (a->hi <= a->lo) a->hi = a->lo + 1;
    a->n_ticks = 0;
    bool minor = a->hi - a->lo <= 2;
    for (double e = a->lo; e <= a->hi + 1e-9 && a->n_ticks < 60; e += 1) {
        a->ticks[a->n_ticks++] = e;
        if (minor && e < a->hi - 1e-9) {
            a->ticks[a->n_ticks++] = e + log10(2.0);
            a->ticks[a->n_ticks++] = e + log10(5.0);
        }
    }
}

static void tick_label(const axis *a, double t, char *buf, size_t n) {
    double v = a->log ? pow(10, t) : t;
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-3)) snprintf(buf, n, "%.0e", v);
    else snprintf(buf, n, "%.6g", v);
}

static double pt_x(const dg_chart_series *s, int64_t i) { return s->x[i * (s->stride ? s->stride : 1)]; }
static double pt_y(const dg_chart_series *s, int64_t i) { return s->y[i * (s->stride ? s->stride : 1)]; }

int dg_chart_svg(const char *path, const char *title, const char *xlabel, int n_panels, const dg_chart_panel *panels) {
    if (n_panels < 1 || n_panels > 8 || !panels) {
        dg_error("chart: %d panels (1 .. 8 supported)", n_panels);
        return -1;
    }
    /* the shared x range */
    double xmn = INFINITY, xmx = -INFINITY;
    for (int p = 0; p < n_panels; p++)
        for (int s = 0; s < panels[p].n_series && s < DG_CHART_MAX_SERIES; s++)
            for (int64_t i = 0; i < panels[p].series[s].n; i++) {
                double x = pt_x(&panels[p].series[s], i), y = pt_y(&panels[p].series[s], i);
                if (isfinite(x) && isfinite(y)) {
                    xmn = fmin(xmn, x);
                    xmx = fmax(xmx, x);
                }
            }
    if (!isfinite(xmn)) xmn = 0, xmx = 1;
    axis xa;
    linear_axis(&xa, xmn, xmx, 9);
    const int pw = W - LEFT - RIGHT, height = TOP + n_panels * PANEL_H + (n_panels - 1) * GAP + BOTTOM;

    dg_atomic_file af;
    if (dg_atomic_open(&af, path, "chart")) return -1;
    FILE *f = af.f;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n",
            W, height, W, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">", W / 2);
    xml_text(f, title ? title : "training");
    fprintf(f, "</text>\n");

    for (int p = 0; p < n_panels; p++) {
        const dg_chart_panel *pn = &panels[p];
        int ns = pn->n_series < DG_CHART_MAX_SERIES ? pn->n_series : DG_CHART_MAX_SERIES;
        const int top = TOP + p * (PANEL_H + GAP), bottom = top + PANEL_H;
        double ymn = INFINITY, ymx = -INFINITY, ypos = INFINITY;
        for (int s = 0; s < ns; s++)
            for (int64_t i = 0; i < pn->series[s].n; i++) {
                double x = pt_x(&pn->series[s], i), y = pt_y(&pn->series[s], i);
                if (!isfinite(x) || !isfinite(y)) continue;
                ymn = fmin(ymn, y);
                ymx = fmax(ymx, y);
                if (y > 0) ypos = fmin(ypos, y);
            }
        if (!isfinite(ymn)) ymn = 0, ymx = 1;
        bool log_y = pn->log_y == 1 ? isfinite(ypos) : pn->log_y < 0 ? ymn > 0 && ymx / ymn > 30 : false;
        axis ya;
        if (pn->fixed_range && pn->y_hi > pn->y_lo) {
            log_y = false;
            linear_axis(&ya, pn->y_lo, pn->y_hi, 6);
        } else if (log_y) log_axis(&ya, ypos, ymx);
        else linear_axis(&ya, ymn, ymx, 6);
#define MAPX(v) (LEFT + ((v)-xa.lo) / (xa.hi - xa.lo) * pw)
#define MAPY(v) (bottom - ((v)-ya.lo) / (ya.hi - ya.lo) * PANEL_H)
        /* frame, grid, ticks */
        fprintf(f, "<g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", LEFT,
                top, pw, PANEL_H);
        for (int i = 0; i < ya.n_ticks; i++) {
            char lab[32];
            double y = MAPY(ya.ticks[i]);
            bool major = !ya.log || fabs(ya.ticks[i] - round(ya.ticks[i])) < 1e-9;
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", LEFT, LEFT + pw, y, y,
                    major ? "#ddd" : "#eee");
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", LEFT - 5, LEFT, y, y);
            tick_label(&ya, ya.ticks[i], lab, sizeof lab);
            fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" dominant-baseline=\"middle\">%s</text>\n",
                    LEFT - 8, y, lab);
        }
        for (int i = 0; i < xa.n_ticks; i++) {
            char lab[32];
            double x = MAPX(xa.ticks[i]);
            fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, x, top, bottom);
            fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n", x, x, bottom,
                    bottom + 5);
            tick_label(&xa, xa.ticks[i], lab, sizeof lab);
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, bottom + 18, lab);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">", 20,
                top + PANEL_H / 2, 20, top + PANEL_H / 2);
        xml_text(f, pn->ylabel ? pn->ylabel : "");
        if (log_y) fputs(" (log scale)", f);
        fputs("</text>\n", f);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", LEFT + pw / 2, bottom + 38);
        xml_text(f, xlabel ? xlabel : "step");
        fputs("</text>\n", f);
        /* the series: one polyline through the measured points, markers when there are few */
        fprintf(f, "<svg x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" viewBox=\"%d %d %d %d\" overflow=\"hidden\">\n",
                LEFT, top, pw, PANEL_H, LEFT, top, pw, PANEL_H);
        for (int s = 0; s < ns; s++) {
            const dg_chart_series *se = &pn->series[s];
            int64_t finite = 0;
            bool open = false;
            for (int64_t i = 0; i < se->n; i++) {
                double x = pt_x(se, i), y = pt_y(se, i);
                if (!isfinite(x) || !isfinite(y) || (log_y && y <= 0)) continue;
                finite++;
                if (!open)
                    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", colors[s]);
                fprintf(f, "%s%.1f,%.1f", open ? " " : "", MAPX(x), MAPY(log_y ? log10(y) : y));
                open = true;
            }
            if (open) fputs("\"/>\n", f);
            if (finite <= 60)
                for (int64_t i = 0; i < se->n; i++) {
                    double x = pt_x(se, i), y = pt_y(se, i);
                    if (!isfinite(x) || !isfinite(y) || (log_y && y <= 0)) continue;
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", MAPX(x),
                            MAPY(log_y ? log10(y) : y), colors[s]);
                }
        }
        fputs("</svg>\n", f);
        /* legend, top right inside the frame, on a white box so lines under it do not hide it */
        if (ns > 0)
            fprintf(f,
                    "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" fill-opacity=\"0.85\" "
                    "stroke=\"#ccc\"/>\n",
                    LEFT + pw - 158, top + 6, 150, 18 * ns + 4);
        for (int s = 0; s < ns; s++) {
            int ly = top + 16 + 18 * s, lx = LEFT + pw - 150;
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", lx,
                    lx + 22, ly, ly, colors[s]);
            fprintf(f, "<text x=\"%d\" y=\"%d\" dominant-baseline=\"middle\">", lx + 28, ly);
            xml_text(f, pn->series[s].label ? pn->series[s].label : "");
            fputs("</text>\n", f);
        }
        fputs("</g>\n", f);
#undef MAPX
#undef MAPY
    }
    fputs("</svg>\n", f);
    return dg_atomic_commit(&af, "chart");
}

int dg_chart_from_csv(const char *csv_path, const char *svg_path, const char *title) {
    dg_csv_table *t = dg_csv_read(csv_path);
    if (!t) return -1;
    int xc = dg_csv_column(t, "step");
    if (xc < 0) {
        dg_error("chart: '%s' has no \"step\" column", csv_path);
        dg_csv_table_free(t);
        return -1;
    }
    dg_chart_panel panels[2] = {{.ylabel = "loss", .log_y = -1}, {.ylabel = "accuracy", .log_y = 0}};
    for (int c = 0; c < t->ncols; c++) {
        dg_chart_panel *p = strstr(t->cols[c], "loss") ? &panels[0] : strstr(t->cols[c], "acc") ? &panels[1] : NULL;
        if (!p || p->n_series == DG_CHART_MAX_SERIES) continue;
        p->series[p->n_series++] = (dg_chart_series){
            .label = t->cols[c], .n = t->nrows, .x = t->data + xc, .y = t->data + c, .stride = t->ncols};
    }
    bool unit = true; /* accuracies all in [0, 1]: show the whole range */
    for (int s = 0; s < panels[1].n_series; s++)
        for (int64_t r = 0; r < t->nrows; r++) {
            double v = panels[1].series[s].y[r * t->ncols];
            if (isfinite(v) && (v < 0 || v > 1)) unit = false;
        }
    if (unit) {
        panels[1].fixed_range = true;
        panels[1].y_lo = 0;
        panels[1].y_hi = 1;
    }
    int np = panels[1].n_series ? 2 : 1;
    int rc = dg_chart_svg(svg_path, title, "step", np, panels);
    dg_csv_table_free(t);
    return rc;
}

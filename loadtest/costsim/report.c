/* What a run reports: per policy and tier, GPU-slice-hours and their cost,
 * cold starts, p50/p99 wait, served, rejected (gave up waiting, failed when
 * preempted, or still waiting at the end) and SLO attainment. */
#include "costsim.h"

#include <string.h>

static double total_hours(const struct cs_result *r)
{
    return r->slice_hours[0] + r->slice_hours[1] + r->slice_hours[2];
}

static uint64_t lost(const struct cs_result *r, int k)
{
    return r->rejected[k] + r->failed[k];
}

/* Share of the tier's requests served within its target; 1 with none. */
static double attainment(const struct cs_result *r, int k)
{
    uint64_t all = r->served[k] + lost(r, k);
    return all ? (double)r->slo_met[k] / (double)all : 1.0;
}

void cs_report_table(FILE *f, const struct cs_trace *tr, const struct cs_report_row *rows, size_t n,
                     double price)
{
    double slice_price = price / tr->slices_per_gpu;
    fprintf(f,
            "trace %s, seed %llu, %.4g h: %zu models, %zu requests, %u GPUs x %u slices, "
            "$%.2f/GPU-hour\n",
            tr->name, (unsigned long long)tr->seed, tr->horizon / 3600.0, tr->n_models, tr->n_reqs,
            tr->gpus, tr->slices_per_gpu, price);
    fprintf(f, "SLO: wait under %g s (critical), %g s (standard), %g s (batch)\n",
            cs_slo_target_s[0], cs_slo_target_s[1], cs_slo_target_s[2]);
    fprintf(f, "%-12s %-9s %11s %9s %6s %6s %9s %8s %8s %9s %9s %8s\n", "policy", "tier",
            "slice-hours", "cost $", "cold", "ahead", "cold reqs", "p50 s", "p99 s", "served",
            "rejected", "SLO %");
    for (size_t p = 0; p < n; p++) {
        const struct cs_result *r = &rows[p].res;
        for (int k = 0; k < TIER_COUNT; k++) {
            fprintf(f, "%-12s %-9s %11.1f %9.2f %6u %6u %9llu %8.1f %8.1f %9llu %9llu %8.2f\n",
                    rows[p].pol->name, tier_name((enum tier)k), r->slice_hours[k],
                    r->slice_hours[k] * slice_price, r->cold_starts[k], r->ahead_starts[k],
                    (unsigned long long)r->cold_requests[k], r->p50[k], r->p99[k],
                    (unsigned long long)r->served[k], (unsigned long long)lost(r, k),
                    100 * attainment(r, k));
        }
        fprintf(f, "%-12s %-9s %11.1f %9.2f   (replicas taken: %llu evicted, %llu preempted)\n",
                rows[p].pol->name, "all", total_hours(r), total_hours(r) * slice_price,
                (unsigned long long)r->evictions, (unsigned long long)r->preemptions);
    }
}

void cs_report_json(FILE *f, const struct cs_trace *tr, const struct cs_report_row *rows, size_t n,
                    double price)
{
    double slice_price = price / tr->slices_per_gpu;
    for (size_t p = 0; p < n; p++) {
        const struct cs_result *r = &rows[p].res;
        fprintf(f,
                "{\"trace\":\"%s\",\"policy\":\"%s\",\"seed\":%llu,\"hours\":%.4g,"
                "\"models\":%zu,\"requests\":%zu,\"gpus\":%u,\"slices_per_gpu\":%u,"
                "\"gpu_slice_hours\":%.1f,\"cost_usd\":%.2f,\"evictions\":%llu,"
                "\"preemptions\":%llu",
                tr->name, rows[p].pol->name, (unsigned long long)tr->seed, tr->horizon / 3600.0,
                tr->n_models, tr->n_reqs, tr->gpus, tr->slices_per_gpu, total_hours(r),
                total_hours(r) * slice_price, (unsigned long long)r->evictions,
                (unsigned long long)r->preemptions);
        if (rows[p].pol == &cs_thaw || rows[p].pol == &cs_thaw_prewarm) {
            fprintf(f, ",\"warm_budget_slices\":%u", r->warm_budget);
        }
        fprintf(f, ",\"tiers\":{");
        for (int k = 0; k < TIER_COUNT; k++) {
            fprintf(f,
                    "%s\"%s\":{\"gpu_slice_hours\":%.1f,\"cost_usd\":%.2f,\"cold_starts\":%u,"
                    "\"ahead_starts\":%u,\"cold_requests\":%llu,"
                    "\"p50_wait_ms\":%.0f,\"p99_wait_ms\":%.0f,\"served\":%llu,\"rejected\":%llu,"
                    "\"failed\":%llu,\"slo_target_ms\":%.0f,\"slo_attainment\":%.4f}",
                    k ? "," : "", tier_name((enum tier)k), r->slice_hours[k],
                    r->slice_hours[k] * slice_price, r->cold_starts[k], r->ahead_starts[k],
                    (unsigned long long)r->cold_requests[k], r->p50[k] * 1000,
                    r->p99[k] * 1000, (unsigned long long)r->served[k],
                    (unsigned long long)lost(r, k), (unsigned long long)r->failed[k],
                    cs_slo_target_s[k] * 1000, attainment(r, k));
        }
        fprintf(f, "}}\n");
    }
}

int cs_report_svg(const char *path, const struct cs_trace *tr, const struct cs_result *res,
                  const char *title)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        return -1;
    }
    unsigned cap = cs_capacity(tr);
    const int W = 900, H = 360, L = 60, B = 40, T = 30;
    double xs = (double)(W - L - 20) / (double)tr->horizon;
    double ys = (double)(H - B - T) / (cap ? cap : 1);
    static const char *const colors[TIER_COUNT] = {"#d62728", "#1f77b4", "#7f7f7f"};
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
            "height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f,
            "<text x=\"%d\" y=\"18\" font-size=\"14\">%s: GPU slices in use per tier "
            "(capacity %u)</text>\n",
            L, title, cap);
    /* stacked areas: critical at the bottom */
    for (int k = TIER_COUNT - 1; k >= 0; k--) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.8\" points=\"", colors[k]);
        for (size_t i = 0; i < res->plot_n; i++) {
            unsigned top = 0;
            for (int j = 0; j <= k; j++) {
                top += res->plot[j][i];
            }
            fprintf(f, "%.1f,%.1f ", L + (double)i * CS_PLOT_STEP_S * xs, H - B - top * ys);
        }
        fprintf(f, "%.1f,%d %d,%d\"/>\n", L + (double)(res->plot_n - 1) * CS_PLOT_STEP_S * xs,
                H - B, L, H - B);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B,
            W - 20, H - B);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L,
            H - B);
    for (int h = 0; h <= tr->horizon / 3600; h += 3) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%02d:00</text>\n",
                L + h * 3600 * xs, H - B + 16, h % 24);
    }
    unsigned step = cap > 64 ? 32 : 8;
    for (unsigned s = 0; s <= cap; s += step) {
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%u</text>\n", L - 6,
                H - B - s * ys + 4, s);
    }
    for (int k = 0; k < TIER_COUNT; k++) {
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"%d\">%s</text>\n",
                W - 200 + k * 65, T - 4, colors[k], W - 184 + k * 65, T + 6,
                tier_name((enum tier)k));
    }
    fprintf(f, "</svg>\n");
    return fclose(f) ? -1 : 0;
}

/* thaw-costsim: GPU cost, cold starts and waits of thaw against the
 * baselines an operator would otherwise run, on one trace.
 *
 *   thaw-costsim [--trace fleet24|large|bursty-batch|FILE.csv] [--seed N]
 *                [--hours H] [--policy NAME[,NAME...]] [--json]
 *                [--price-per-gpu-hour USD] [--svg FILE] [--write-trace FILE]
 *                [--warm-budget SLICES]
 *
 * Policies: dedicated, static, knative, thaw (all by default, in that
 * order). See costsim.h for the modules and docs/performance.md for what
 * each policy models and the figures. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "costsim.h"

static const struct cs_policy *const all_policies[] = {&cs_dedicated, &cs_static, &cs_knative,
                                                       &cs_thaw, &cs_thaw_prewarm};
#define N_POLICIES (sizeof all_policies / sizeof all_policies[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: thaw-costsim [--trace fleet24|large|bursty-batch|FILE.csv] [--seed N]\n"
               "                    [--hours H] [--policy NAME[,NAME...]] [--json]\n"
               "                    [--price-per-gpu-hour USD] [--svg FILE] [--write-trace FILE]\n"
               "                    [--warm-budget SLICES]\n"
               "policies:\n");
    for (size_t p = 0; p < N_POLICIES; p++) {
        fprintf(f, "  %-10s %s\n", all_policies[p]->name, all_policies[p]->models);
    }
}

/* "thaw,knative" -> the policies, in the order given. 0 or -1. */
static int parse_policies(char *list, const struct cs_policy **out, size_t *n)
{
    *n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t p = 0;
        while (p < N_POLICIES && strcmp(all_policies[p]->name, tok) != 0) {
            p++;
        }
        if (p == N_POLICIES || *n == N_POLICIES) {
            fprintf(stderr, "thaw-costsim: --policy: unknown policy \"%s\" (try --help)\n", tok);
            return -1;
        }
        out[(*n)++] = all_policies[p];
    }
    return *n ? 0 : -1;
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > max) {
        return false;
    }
    *out = v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        return false;
    }
    *out = v;
    return true;
}

static bool is_generator(const char *name)
{
    for (size_t i = 0; cs_trace_names[i]; i++) {
        if (strcmp(cs_trace_names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

static int load_trace(struct cs_trace *tr, const char *name, uint64_t seed, double hours,
                      bool hours_set)
{
    if (is_generator(name)) {
        return cs_trace_generate(tr, name, seed, hours);
    }
    FILE *f = fopen(name, "r");
    if (!f) {
        fprintf(stderr, "thaw-costsim: --trace: %s: %s (or one of fleet24, large, bursty-batch)\n",
                name, strerror(errno));
        return -1;
    }
    char err[256];
    int rc = cs_trace_read(tr, f, name, err, sizeof err);
    fclose(f);
    if (rc) {
        fprintf(stderr, "thaw-costsim: %s\n", err);
        return -1;
    }
    tr->seed = seed;
    if (hours_set) {
        tr->horizon = (int)(hours * 3600);
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t seed = 1, budget = UINT64_MAX;
    bool json = false, hours_set = false;
    double hours = 24, price = 4.0;
    const char *svg = NULL, *trace = "fleet24", *write_to = NULL;
    const struct cs_policy *pols[N_POLICIES];
    size_t n_pols = N_POLICIES;
    memcpy(pols, all_policies, sizeof pols);
    static const struct option opts[] = {
        {"seed", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"hours", required_argument, NULL, 'H'},
        {"price-per-gpu-hour", required_argument, NULL, 'p'},
        {"svg", required_argument, NULL, 'g'},
        {"trace", required_argument, NULL, 't'},
        {"policy", required_argument, NULL, 'P'},
        {"write-trace", required_argument, NULL, 'W'},
        {"warm-budget", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case 's':
            ok = parse_u64(optarg, UINT64_MAX, &seed);
            break;
        case 'j':
            json = true;
            break;
        case 'H':
            ok = parse_double(optarg, 1, 24 * 366, &hours), hours_set = true;
            break;
        case 'p':
            ok = parse_double(optarg, 0, 1e6, &price);
            break;
        case 'g':
            svg = optarg;
            break;
        case 't':
            trace = optarg;
            break;
        case 'P':
            if (parse_policies(optarg, pols, &n_pols)) {
                return 2;
            }
            break;
        case 'W':
            write_to = optarg;
            break;
        case 'w':
            ok = parse_u64(optarg, 100000, &budget);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "thaw-costsim: --%s: bad value \"%s\"\n",
                    o == 's'   ? "seed"
                    : o == 'H' ? "hours"
                    : o == 'p' ? "price-per-gpu-hour"
                               : "warm-budget",
                    optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "thaw-costsim: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    struct cs_trace tr;
    if (load_trace(&tr, trace, seed, hours, hours_set)) {
        return 2;
    }
    if (write_to) {
        FILE *f = fopen(write_to, "w");
        if (!f) {
            fprintf(stderr, "thaw-costsim: --write-trace: %s: %s\n", write_to, strerror(errno));
            cs_trace_free(&tr);
            return 2;
        }
        cs_trace_write(&tr, f);
        fclose(f);
    }
    cs_thaw_warm_budget = budget == UINT64_MAX ? UINT_MAX : (unsigned)budget;
    struct cs_report_row rows[N_POLICIES];
    for (size_t p = 0; p < n_pols; p++) {
        rows[p].pol = pols[p];
        cs_run(pols[p], &tr, &rows[p].res);
    }
    if (json) {
        cs_report_json(stdout, &tr, rows, n_pols, price);
    } else {
        cs_report_table(stdout, &tr, rows, n_pols, price);
    }
    int rc = 0;
    for (size_t p = 0; p < n_pols; p++) {
        if (svg && rows[p].pol == &cs_thaw && cs_report_svg(svg, &tr, &rows[p].res, "thaw")) {
            fprintf(stderr, "thaw-costsim: --svg: cannot write %s\n", svg);
            rc = 1;
        }
        cs_result_free(&rows[p].res);
    }
    cs_trace_free(&tr);
    return rc;
}

/* Traces: generated from a seed, or read from CSV (a real log converted). */
#include "costsim.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const cs_trace_names[] = {"fleet24", "large", "bursty-batch", "office", NULL};

/* xorshift64*: small, seeded, the same everywhere. */
struct rng {
    uint64_t s;
};

static double rnd(struct rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static unsigned poisson(struct rng *r, double lambda)
{
    if (lambda <= 0) {
        return 0;
    }
    if (lambda > 30) { /* normal approximation */
        double u1 = rnd(r), u2 = rnd(r);
        double z = sqrt(-2 * log(u1 + 1e-12)) * cos(2 * M_PI * u2);
        double v = lambda + sqrt(lambda) * z;
        return v < 0 ? 0 : (unsigned)(v + 0.5);
    }
    double l = exp(-lambda), p = 1;
    unsigned k = 0;
    do {
        k++;
        p *= rnd(r);
    } while (p > l);
    return k - 1;
}

int cs_service_s(uint32_t tokens)
{
    int s = (int)ceil(0.5 + tokens / 40.0);
    return s < 1 ? 1 : s;
}

unsigned cs_capacity(const struct cs_trace *tr)
{
    return tr->gpus * tr->slices_per_gpu;
}

size_t cs_trace_add_model(struct cs_trace *tr, const char *name, enum tier t, unsigned slices,
                          int cold_cached_s, int cold_uncached_s)
{
    tr->models = realloc(tr->models, (tr->n_models + 1) * sizeof *tr->models);
    struct cs_model *m = &tr->models[tr->n_models];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->tier = t;
    m->slices = slices ? slices : 1;
    m->cold_cached_s = cold_cached_s > 0 ? cold_cached_s : 1;
    m->cold_uncached_s = cold_uncached_s >= m->cold_cached_s ? cold_uncached_s : m->cold_cached_s;
    return tr->n_models++;
}

void cs_trace_add_request(struct cs_trace *tr, int t, uint32_t model, enum tier tier,
                          uint32_t tokens)
{
    if (tr->n_reqs == tr->cap_reqs) {
        tr->cap_reqs = tr->cap_reqs ? tr->cap_reqs * 2 : 4096;
        tr->reqs = realloc(tr->reqs, tr->cap_reqs * sizeof *tr->reqs);
    }
    tr->reqs[tr->n_reqs++] = (struct cs_request){t, model, (uint8_t)tier, tokens};
}

static int req_cmp(const void *a, const void *b)
{
    const struct cs_request *x = a, *y = b;
    if (x->t != y->t) {
        return x->t < y->t ? -1 : 1;
    }
    return x->model < y->model ? -1 : x->model > y->model;
}

void cs_trace_sort(struct cs_trace *tr)
{
    qsort(tr->reqs, tr->n_reqs, sizeof *tr->reqs, req_cmp);
}

void cs_trace_free(struct cs_trace *tr)
{
    free(tr->models);
    free(tr->reqs);
    memset(tr, 0, sizeof *tr);
}

/* ---- generators ---- */

/* Cold starts by model size, from published measurements of vLLM-style
 * servers: a 7-8B model on one slice ~80 s with its weights cached on the
 * node and ~5 min pulling them; 13-34B on two ~2 / ~7 min; 70B (quantized,
 * a whole GPU) ~4 / ~10 min. Each model's own is within +-25% of these. */
static void add_sized_model(struct cs_trace *tr, struct rng *r, const char *name, enum tier t,
                            unsigned slices)
{
    int cached = slices >= 4 ? 240 : slices >= 2 ? 120 : 80;
    int uncached = slices >= 4 ? 600 : slices >= 2 ? 420 : 300;
    double j = 0.75 + 0.5 * rnd(r);
    cs_trace_add_model(tr, name, t, slices, (int)(cached * j), (int)(uncached * j));
}

struct shape {
    double base_rate; /* requests per second at the daily peak */
    double mean_tokens;
    int burst_start[3], burst_len[3];
    double burst_mult;
    /* office: requests only from open_s to close_s (seconds of the day), on
     * weekdays (the trace starts on a Monday) unless every_day; 0 0: diurnal */
    int open_s, close_s;
    bool every_day;
};

static double day_factor(int t)
{
    double h = fmod((double)t / 3600.0, 24.0);
    double d = sin(M_PI * (h - 6.0) / 12.0); /* peaks at noon, negative at night */
    return d > 0 ? d : 0;
}

#define DAY_S 86400

/* A team's hours: its rate while open, nothing otherwise. */
static double office_rate(const struct shape *sh, int sec)
{
    int tod = sec % DAY_S, weekday = (sec / DAY_S) % 7;
    bool open = tod >= sh->open_s && tod < sh->close_s && (sh->every_day || weekday < 5);
    return open ? sh->base_rate : 0;
}

/* Interactive tiers by day, batch mostly by night. */
static double rate_at(const struct shape *sh, enum tier t, int sec)
{
    if (sh->close_s) {
        return office_rate(sh, sec);
    }
    double f = day_factor(sec);
    double load = t == TIER_BATCH ? 0.25 + 0.75 * (1 - f) : 0.05 + 0.95 * f;
    double r = sh->base_rate * load;
    for (int b = 0; b < 3; b++) {
        if (sec >= sh->burst_start[b] && sec < sh->burst_start[b] + sh->burst_len[b]) {
            r *= sh->burst_mult;
        }
    }
    return r;
}

static void random_shape(struct shape *sh, struct rng *r, double base_rate, int horizon)
{
    sh->base_rate = base_rate;
    sh->mean_tokens = (1.5 + 10 * rnd(r)) * 40; /* 2-12 s a request */
    sh->burst_mult = 3 + 5 * rnd(r);
    for (int b = 0; b < 3; b++) {
        sh->burst_start[b] = (int)(rnd(r) * horizon);
        sh->burst_len[b] = 120 + (int)(rnd(r) * 900);
    }
}

/* Bursts and jobs fall within a day (or the whole run when longer), so a
 * shorter run is the start of the same day. */
static int day_of(const struct cs_trace *tr)
{
    return tr->horizon > DAY_S ? tr->horizon : DAY_S;
}

static uint32_t tokens_of(struct rng *r, const struct shape *sh)
{
    return (uint32_t)(sh->mean_tokens * (0.5 + rnd(r)));
}

/* Poisson arrivals second by second; one stream for all models, so the
 * requests are the same whatever reads them. */
static void arrivals(struct cs_trace *tr, const struct shape *sh, uint64_t seed)
{
    struct rng r = {seed * 0xD1B54A32D192ED03ULL + 7};
    for (int t = 0; t < tr->horizon; t++) {
        for (size_t i = 0; i < tr->n_models; i++) {
            enum tier tier = tr->models[i].tier;
            unsigned k = poisson(&r, rate_at(&sh[i], tier, t));
            for (unsigned a = 0; a < k; a++) {
                cs_trace_add_request(tr, t, (uint32_t)i, tier, tokens_of(&r, &sh[i]));
            }
        }
    }
}

/* 24 models (4 critical, 8 standard, 12 batch) of 7-8B or 13B on 8 GPUs x 4:
 * diurnal load, three bursts each, every fifth model rarely used. */
static void gen_fleet24(struct cs_trace *tr, struct rng *r, struct shape *sh)
{
    tr->gpus = 8;
    tr->slices_per_gpu = 4;
    for (int i = 0; i < 24; i++) {
        enum tier t = i < 4 ? TIER_CRITICAL : i < 12 ? TIER_STANDARD : TIER_BATCH;
        char name[48];
        snprintf(name, sizeof name, "%s-%02d", tier_name(t), i);
        add_sized_model(tr, r, name, t, rnd(r) < 0.3 ? 2 : 1);
        double base = t == TIER_CRITICAL ? 0.4 : t == TIER_STANDARD ? 0.15 : 0.08;
        double rate = base * (0.3 + 1.4 * rnd(r));
        if (i % 5 == 4) {
            rate *= 0.02; /* the long tail */
        }
        random_shape(&sh[i], r, rate, day_of(tr));
    }
}

/* 200 models (10% critical, 30% standard, 60% batch; 75% 7-8B, 20% 13-34B,
 * 5% 70B) on 32 GPUs x 4; popularity by Zipf (s = 1.6): a few models take
 * most requests, most see a few a day. */
static void gen_large(struct cs_trace *tr, struct rng *r, struct shape *sh)
{
    tr->gpus = 32;
    tr->slices_per_gpu = 4;
    int rank[200];
    for (int i = 0; i < 200; i++) {
        rank[i] = i + 1;
    }
    for (int i = 199; i > 0; i--) { /* popularity independent of tier and size */
        int j = (int)(rnd(r) * (i + 1));
        int x = rank[i];
        rank[i] = rank[j];
        rank[j] = x;
    }
    for (int i = 0; i < 200; i++) {
        double u = rnd(r);
        enum tier t = u < 0.1 ? TIER_CRITICAL : u < 0.4 ? TIER_STANDARD : TIER_BATCH;
        double s = rnd(r);
        unsigned slices = s < 0.75 ? 1 : s < 0.95 ? 2 : 4;
        char name[48];
        snprintf(name, sizeof name, "%s-%03d", tier_name(t), i);
        add_sized_model(tr, r, name, t, slices);
        random_shape(&sh[i], r, 0.8 / pow(rank[i], 1.6) * (0.5 + rnd(r)), day_of(tr));
    }
}

/* 24 models (4 critical, 6 standard, 14 batch) on 8 GPUs x 4: light
 * interactive traffic, and batch jobs dropped at once (500-4000 requests
 * each over 2-10 minutes, two or three per batch model, any hour). */
static void gen_bursty(struct cs_trace *tr, struct rng *r, struct shape *sh)
{
    tr->gpus = 8;
    tr->slices_per_gpu = 4;
    for (int i = 0; i < 24; i++) {
        enum tier t = i < 4 ? TIER_CRITICAL : i < 10 ? TIER_STANDARD : TIER_BATCH;
        char name[48];
        snprintf(name, sizeof name, "%s-%02d", tier_name(t), i);
        add_sized_model(tr, r, name, t, rnd(r) < 0.3 ? 2 : 1);
        double base = t == TIER_CRITICAL ? 0.25 : t == TIER_STANDARD ? 0.1 : 0.01;
        random_shape(&sh[i], r, base * (0.3 + 1.4 * rnd(r)), day_of(tr));
    }
}

/* 24 models of teams inside one company on 8 GPUs x 4 (6 critical, 12
 * standard, 6 batch; 7-8B or 13B): each interactive model is used only in
 * its team's working hours (opening 7-10 h, closing 16-19 h, weekdays), a
 * request every 30 s to 5 min while open; each batch model runs a nightly
 * job (an hour from 0-4 h, every day). Nothing else: a pattern that repeats
 * by the clock, as internal assistants, coding and document tools see. */
static void gen_office(struct cs_trace *tr, struct rng *r, struct shape *sh)
{
    tr->gpus = 8;
    tr->slices_per_gpu = 4;
    for (int i = 0; i < 24; i++) {
        enum tier t = i < 6 ? TIER_CRITICAL : i < 18 ? TIER_STANDARD : TIER_BATCH;
        char name[48];
        snprintf(name, sizeof name, "%s-%02d", tier_name(t), i);
        add_sized_model(tr, r, name, t, rnd(r) < 0.3 ? 2 : 1);
        sh[i].mean_tokens = (1.5 + 10 * rnd(r)) * 40;
        if (t == TIER_BATCH) {
            sh[i].open_s = (int)(rnd(r) * 4) * 3600;
            sh[i].close_s = sh[i].open_s + 3600;
            sh[i].every_day = true;
            sh[i].base_rate = 0.2 + 0.3 * rnd(r);
        } else {
            sh[i].open_s = (7 + (int)(rnd(r) * 4)) * 3600;
            sh[i].close_s = (16 + (int)(rnd(r) * 4)) * 3600;
            sh[i].base_rate = 1.0 / (30 + 270 * rnd(r));
        }
    }
}

static void batch_jobs(struct cs_trace *tr, struct rng *r, const struct shape *sh)
{
    for (size_t i = 0; i < tr->n_models; i++) {
        if (tr->models[i].tier != TIER_BATCH) {
            continue;
        }
        int jobs = 2 + (rnd(r) < 0.5);
        for (int j = 0; j < jobs; j++) {
            int start = (int)(rnd(r) * day_of(tr));
            int len = 120 + (int)(rnd(r) * 480);
            unsigned n = 500 + (unsigned)(rnd(r) * 3500);
            for (unsigned k = 0; k < n; k++) {
                int t = start + (int)(rnd(r) * len);
                if (t < tr->horizon) {
                    cs_trace_add_request(tr, t, (uint32_t)i, TIER_BATCH, tokens_of(r, &sh[i]));
                }
            }
        }
    }
}

int cs_trace_generate(struct cs_trace *tr, const char *name, uint64_t seed, double hours)
{
    memset(tr, 0, sizeof *tr);
    snprintf(tr->name, sizeof tr->name, "%s", name);
    tr->seed = seed;
    tr->horizon = (int)(hours * 3600);
    struct rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    struct shape sh[200];
    memset(sh, 0, sizeof sh);
    if (strcmp(name, "fleet24") == 0) {
        gen_fleet24(tr, &r, sh);
    } else if (strcmp(name, "large") == 0) {
        gen_large(tr, &r, sh);
    } else if (strcmp(name, "bursty-batch") == 0) {
        gen_bursty(tr, &r, sh);
    } else if (strcmp(name, "office") == 0) {
        gen_office(tr, &r, sh);
    } else {
        return -1;
    }
    arrivals(tr, sh, seed);
    if (strcmp(name, "bursty-batch") == 0) {
        batch_jobs(tr, &r, sh);
        cs_trace_sort(tr);
    }
    return 0;
}

/* ---- CSV ---- */

void cs_trace_write(const struct cs_trace *tr, FILE *f)
{
    fprintf(f, "# thaw-costsim trace %s, seed %llu, %d s\n", tr->name, (unsigned long long)tr->seed,
            tr->horizon);
    fprintf(f, "# box,%u,%u\n", tr->gpus, tr->slices_per_gpu);
    fprintf(f, "# horizon,%d\n", tr->horizon);
    for (size_t i = 0; i < tr->n_models; i++) {
        const struct cs_model *m = &tr->models[i];
        fprintf(f, "# model,%s,%s,%u,%d,%d\n", m->name, tier_name(m->tier), m->slices,
                m->cold_cached_s, m->cold_uncached_s);
    }
    fprintf(f, "time,model,tier,tokens\n");
    for (size_t i = 0; i < tr->n_reqs; i++) {
        const struct cs_request *q = &tr->reqs[i];
        fprintf(f, "%d,%s,%s,%u\n", q->t, tr->models[q->model].name, tier_name((enum tier)q->tier),
                q->tokens);
    }
}

/* Splits a line on commas in place; returns the field count (at most max). */
static int split(char *line, char **field, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        while (*p == ' ') {
            p++;
        }
        field[n++] = p;
        char *c = strchr(p, ',');
        if (!c) {
            break;
        }
        *c = '\0';
        p = c + 1;
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(field[i]);
        while (l && isspace((unsigned char)field[i][l - 1])) {
            field[i][--l] = '\0';
        }
    }
    return n;
}

static long find_model(const struct cs_trace *tr, const char *name)
{
    for (size_t i = 0; i < tr->n_models; i++) {
        if (strcmp(tr->models[i].name, name) == 0) {
            return (long)i;
        }
    }
    return -1;
}

static bool parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        return false;
    }
    *out = v;
    return true;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        return -1;                                                                                 \
    } while (0)

static int read_directive(struct cs_trace *tr, char **f, int nf, const char *label, long line,
                          char *err, size_t errlen)
{
    double a, b, c;
    if (strcmp(f[0], "box") == 0) {
        if (nf != 3 || !parse_num(f[1], 1, 100000, &a) || !parse_num(f[2], 1, 64, &b)) {
            FAIL("%s:%ld: box: expected \"# box,GPUS,SLICES_PER_GPU\"", label, line);
        }
        tr->gpus = (unsigned)a;
        tr->slices_per_gpu = (unsigned)b;
        return 0;
    }
    if (strcmp(f[0], "horizon") == 0) {
        if (nf != 2 || !parse_num(f[1], 1, 366 * 86400.0, &a)) {
            FAIL("%s:%ld: horizon: expected \"# horizon,SECONDS\"", label, line);
        }
        tr->horizon = (int)a;
        return 0;
    }
    if (strcmp(f[0], "model") == 0) {
        enum tier t;
        if (nf != 6 || !f[1][0] || strlen(f[1]) >= sizeof tr->models[0].name ||
            tier_parse(f[2], strlen(f[2]), &t) || !parse_num(f[3], 1, 64, &a) ||
            !parse_num(f[4], 1, 86400, &b) || !parse_num(f[5], 1, 86400, &c)) {
            FAIL("%s:%ld: model: expected \"# model,NAME,TIER,SLICES,COLD_CACHED_S,"
                 "COLD_UNCACHED_S\"",
                 label, line);
        }
        if (find_model(tr, f[1]) >= 0) {
            FAIL("%s:%ld: model %s described twice", label, line, f[1]);
        }
        cs_trace_add_model(tr, f[1], t, (unsigned)a, (int)b, (int)c);
    }
    return 0; /* other comments are comments */
}

static int read_row(struct cs_trace *tr, char **f, int nf, const char *label, long line, char *err,
                    size_t errlen)
{
    double t, tokens;
    enum tier tier;
    if (nf != 4) {
        FAIL("%s:%ld: expected 4 fields (time,model,tier,tokens), got %d", label, line, nf);
    }
    if (!parse_num(f[0], 0, 366 * 86400.0, &t)) {
        FAIL("%s:%ld: time: expected seconds from the start of the trace", label, line);
    }
    if (!f[1][0] || strlen(f[1]) >= sizeof tr->models[0].name) {
        FAIL("%s:%ld: model: expected a name of 1 to %zu characters", label, line,
             sizeof tr->models[0].name - 1);
    }
    if (tier_parse(f[2], strlen(f[2]), &tier)) {
        FAIL("%s:%ld: tier: expected critical, standard or batch", label, line);
    }
    if (!parse_num(f[3], 0, 1000000, &tokens)) {
        FAIL("%s:%ld: tokens: expected 0 to 1000000", label, line);
    }
    long m = find_model(tr, f[1]);
    if (m < 0) { /* undescribed: a 7-8B model of the first tier it is seen with */
        m = (long)cs_trace_add_model(tr, f[1], tier, 1, 80, 300);
    }
    cs_trace_add_request(tr, (int)t, (uint32_t)m, tier, (uint32_t)tokens);
    return 0;
}

int cs_trace_read(struct cs_trace *tr, FILE *in, const char *label, char *err, size_t errlen)
{
    memset(tr, 0, sizeof *tr);
    snprintf(tr->name, sizeof tr->name, "file");
    tr->gpus = 8;
    tr->slices_per_gpu = 4;
    char buf[512];
    long line = 0;
    int last = 0;
    while (fgets(buf, sizeof buf, in)) {
        line++;
        if (!strchr(buf, '\n') && !feof(in)) {
            FAIL("%s:%ld: line longer than %zu bytes", label, line, sizeof buf - 2);
        }
        char *p = buf;
        while (isspace((unsigned char)*p)) {
            p++;
        }
        if (!*p) {
            continue;
        }
        char *f[8];
        int rc;
        if (*p == '#') {
            p++;
            rc = read_directive(tr, f, split(p, f, 8), label, line, err, errlen);
        } else if (strncmp(p, "time,", 5) == 0) {
            continue; /* the header */
        } else {
            rc = read_row(tr, f, split(p, f, 8), label, line, err, errlen);
        }
        if (rc) {
            return -1;
        }
        if (tr->n_reqs && tr->reqs[tr->n_reqs - 1].t > last) {
            last = tr->reqs[tr->n_reqs - 1].t;
        }
    }
    if (tr->n_reqs == 0) {
        FAIL("%s: no requests", label);
    }
    cs_trace_sort(tr);
    if (tr->horizon <= last) { /* to the end of the hour of the last request */
        tr->horizon = (last / 3600 + 1) * 3600;
    }
    return 0;
}

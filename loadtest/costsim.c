/* thaw-costsim: a day of traffic on a shared GPU box, simulated in seconds,
 * under three policies, linking thaw's real autoscaler and warm pool.
 *
 *   thaw-costsim [--seed N] [--json] [--hours H] [--price-per-gpu-hour USD]
 *                [--svg FILE] [--warm-budget SLICES]
 *
 * The trace (from the seed): 24 models (4 critical, 8 standard, 12 batch) on
 * 8 GPUs x 4 time-sliced slices; diurnal load (interactive by day, batch by
 * night), bursts, a long tail of rarely used models; cold starts from 10 s
 * to 5 min; each request holds a replica slot for its service time.
 *
 * Policies, on the same trace:
 *   dedicated    every model on its own whole GPUs, always on, sized for its
 *                peak (no cold starts, no sharing)
 *   knative      scale to zero on the shared slices; a scale-up that does
 *                not fit evicts the least recently used idle replica of any
 *                model; one FIFO queue per model, no priorities
 *   thaw         the same autoscaler, then thaw's warm pool and admission
 *                (keep warm by priority and value, evict lower priority,
 *                preempt strictly lower priority) and tiered queues
 * Reported per policy: GPU-slice-hours and cost, and per tier: cold starts
 * (a model of that tier woken from zero), p50/p99 queue wait, rejected
 * (waited past the deadline: 10 minutes, an hour for batch). */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/autoscaler.h"
#include "thaw/config.h"
#include "thaw/warmpool.h"

#define N_MODELS 24
#define N_GPUS 8
#define SLICES_PER_GPU 4
#define CAPACITY (N_GPUS * SLICES_PER_GPU)
#define MAX_REPLICAS 8
#define SLOTS 8 /* requests at once per replica */
#define DEADLINE_S 600        /* critical and standard requests give up after 10 min */
#define BATCH_DEADLINE_S 3600 /* batch work waits up to an hour */
#define TICK_S 2
#define GRACE_MS 60000
#define AGING_S 10
#define PLOT_STEP_S 300

enum policy { P_DEDICATED, P_KNATIVE, P_THAW, P_COUNT };
static const char *const policy_names[P_COUNT] = {"dedicated", "knative-like", "thaw"};

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

struct spec {
    enum tier tier;
    unsigned slices;
    double base_rate; /* requests per second at the daily peak */
    double service_s;
    int cold_start_s;
    int burst_start[3], burst_len[3];
    double burst_mult;
};

/* A request waiting: its arrival second. */
struct waitq {
    int *t;
    size_t head, len, cap;
};

static void wq_push(struct waitq *q, int t)
{
    if (q->head + q->len == q->cap) {
        if (q->head > 0) {
            memmove(q->t, q->t + q->head, q->len * sizeof *q->t);
            q->head = 0;
        } else {
            q->cap = q->cap ? q->cap * 2 : 64;
            q->t = realloc(q->t, q->cap * sizeof *q->t);
        }
    }
    q->t[q->head + q->len++] = t;
}

static int wq_front(const struct waitq *q)
{
    return q->t[q->head];
}

static void wq_pop(struct waitq *q)
{
    q->head++;
    q->len--;
}

struct replica {
    bool used;
    int ready_at; /* second it becomes ready */
    int done[SLOTS]; /* completion second per slot; 0: free */
};

struct msim {
    const struct spec *sp;
    struct replica r[MAX_REPLICAS];
    struct waitq q[TIER_COUNT];
    struct as_config asc;
    struct as_state ass;
    int last_used; /* for LRU */
    double rate_ewma;
    unsigned arrivals_window;
};

struct waits {
    float *v;
    size_t n, cap;
};

static void waits_add(struct waits *w, float s)
{
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 1024;
        w->v = realloc(w->v, w->cap * sizeof *w->v);
    }
    w->v[w->n++] = s;
}

static int fcmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double pctl(struct waits *w, double p)
{
    if (w->n == 0) {
        return 0;
    }
    qsort(w->v, w->n, sizeof *w->v, fcmp);
    size_t k = (size_t)((double)(w->n - 1) * p / 100.0 + 0.5);
    return w->v[k];
}

struct result {
    double slice_hours;
    unsigned cold_starts[TIER_COUNT];
    uint64_t served[TIER_COUNT], rejected[TIER_COUNT];
    struct waits waits[TIER_COUNT];
    double p50[TIER_COUNT], p99[TIER_COUNT];
    /* slices in use per tier, every PLOT_STEP_S */
    unsigned *plot[TIER_COUNT];
    size_t plot_n;
};

static double day_factor(int t)
{
    double h = fmod((double)t / 3600.0, 24.0);
    double d = sin(M_PI * (h - 6.0) / 12.0); /* peaks at noon, negative at night */
    return d > 0 ? d : 0;
}

static double rate_at(const struct spec *sp, int t)
{
    double f = day_factor(t);
    double load = sp->tier == TIER_BATCH ? 0.25 + 0.75 * (1 - f) : 0.05 + 0.95 * f;
    double r = sp->base_rate * load;
    for (int b = 0; b < 3; b++) {
        if (t >= sp->burst_start[b] && t < sp->burst_start[b] + sp->burst_len[b]) {
            r *= sp->burst_mult;
        }
    }
    return r;
}

static void make_trace(struct spec *sp, uint64_t seed, int horizon)
{
    struct rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    for (int i = 0; i < N_MODELS; i++) {
        struct spec *s = &sp[i];
        s->tier = i < 4 ? TIER_CRITICAL : i < 12 ? TIER_STANDARD : TIER_BATCH;
        s->slices = rnd(&r) < 0.3 ? 2 : 1;
        double base = s->tier == TIER_CRITICAL ? 0.4 : s->tier == TIER_STANDARD ? 0.15 : 0.08;
        s->base_rate = base * (0.3 + 1.4 * rnd(&r));
        if (i % 5 == 4) {
            s->base_rate *= 0.02; /* the long tail: rarely used models */
        }
        s->service_s = 2 + 10 * rnd(&r);
        s->cold_start_s = (int)(10 * pow(30, rnd(&r))); /* 10 s .. 300 s, log-uniform */
        s->burst_mult = 3 + 5 * rnd(&r);
        for (int b = 0; b < 3; b++) {
            s->burst_start[b] = (int)(rnd(&r) * horizon);
            s->burst_len[b] = 120 + (int)(rnd(&r) * 900);
        }
    }
}

static unsigned replicas_of(const struct msim *m, bool ready_only, int t)
{
    unsigned n = 0;
    for (int i = 0; i < MAX_REPLICAS; i++) {
        if (m->r[i].used && (!ready_only || m->r[i].ready_at <= t)) {
            n++;
        }
    }
    return n;
}

static unsigned busy_slots(const struct msim *m)
{
    unsigned n = 0;
    for (int i = 0; i < MAX_REPLICAS; i++) {
        for (int s = 0; m->r[i].used && s < SLOTS; s++) {
            n += m->r[i].done[s] != 0;
        }
    }
    return n;
}

static size_t queued(const struct msim *m)
{
    return m->q[0].len + m->q[1].len + m->q[2].len;
}

static void start_replica(struct msim *m, int t, struct result *res)
{
    for (int i = 0; i < MAX_REPLICAS; i++) {
        if (!m->r[i].used) {
            if (replicas_of(m, false, t) == 0) {
                res->cold_starts[m->sp->tier]++;
            }
            memset(&m->r[i], 0, sizeof m->r[i]);
            m->r[i].used = true;
            m->r[i].ready_at = t + m->sp->cold_start_s;
            return;
        }
    }
}

/* Stops a replica: starting or idle ones first; a busy one's requests go
 * back to the front of the queue (preemption). */
static void stop_replica(struct msim *m, int t)
{
    int victim = -1, fewest = SLOTS + 1;
    for (int i = 0; i < MAX_REPLICAS; i++) {
        if (!m->r[i].used) {
            continue;
        }
        int busy = 0;
        for (int s = 0; s < SLOTS; s++) {
            busy += m->r[i].done[s] != 0;
        }
        if (m->r[i].ready_at > t) {
            busy = -1; /* still starting: cheapest to stop */
        }
        if (busy < fewest) {
            fewest = busy;
            victim = i;
        }
    }
    if (victim < 0) {
        return;
    }
    for (int s = 0; s < SLOTS; s++) {
        if (m->r[victim].done[s]) {
            wq_push(&m->q[m->sp->tier], t); /* restarts from the queue */
        }
    }
    m->r[victim].used = false;
}

/* Next request to serve: tiered with aging (thaw) or plain FIFO (others). */
static int pick_tier(const struct msim *m, bool tiered)
{
    int best = -1;
    double best_rank = 1e18;
    for (int k = 0; k < TIER_COUNT; k++) {
        if (!m->q[k].len) {
            continue;
        }
        double rank = wq_front(&m->q[k]) + (tiered ? k * AGING_S : 0);
        if (rank < best_rank) {
            best_rank = rank;
            best = k;
        }
    }
    return best;
}

static void dispatch(struct msim *m, int t, bool tiered, struct result *res)
{
    for (int i = 0; i < MAX_REPLICAS; i++) {
        struct replica *r = &m->r[i];
        if (!r->used || r->ready_at > t) {
            continue;
        }
        for (int s = 0; s < SLOTS; s++) {
            if (r->done[s] && r->done[s] <= t) {
                r->done[s] = 0;
                m->last_used = t;
            }
            if (r->done[s]) {
                continue;
            }
            int k = pick_tier(m, tiered);
            if (k < 0) {
                break;
            }
            int arrived = wq_front(&m->q[k]);
            wq_pop(&m->q[k]);
            waits_add(&res->waits[k], (float)(t - arrived));
            res->served[k]++;
            r->done[s] = t + (int)ceil(m->sp->service_s);
            m->last_used = t;
        }
    }
}

static void expire(struct msim *m, int t, struct result *res)
{
    for (int k = 0; k < TIER_COUNT; k++) {
        int deadline = k == TIER_BATCH ? BATCH_DEADLINE_S : DEADLINE_S;
        while (m->q[k].len && t - wq_front(&m->q[k]) > deadline) {
            wq_pop(&m->q[k]);
            res->rejected[k]++;
        }
    }
}

static unsigned slices_used(struct msim *ms)
{
    unsigned u = 0;
    for (int i = 0; i < N_MODELS; i++) {
        u += replicas_of(&ms[i], false, 0) * ms[i].sp->slices;
    }
    return u;
}

static void plan_knative(struct msim *ms, int t, struct result *res)
{
    for (int i = 0; i < N_MODELS; i++) {
        struct msim *m = &ms[i];
        struct as_decision d;
        as_decide(&m->ass, &m->asc, (uint64_t)t * 1000, replicas_of(m, true, t), &d);
        unsigned have = replicas_of(m, false, t);
        while (have > d.desired) {
            stop_replica(m, t);
            have--;
        }
        while (have < d.desired) {
            if (slices_used(ms) + m->sp->slices > CAPACITY) {
                /* Evict the least recently used idle replica, any model. */
                int lru = -1;
                for (int j = 0; j < N_MODELS; j++) {
                    struct msim *o = &ms[j];
                    if (o == m || !replicas_of(o, false, t) || busy_slots(o) || queued(o)) {
                        continue;
                    }
                    if (lru < 0 || o->last_used < ms[lru].last_used) {
                        lru = j;
                    }
                }
                if (lru < 0) {
                    break;
                }
                stop_replica(&ms[lru], t);
                continue;
            }
            start_replica(m, t, res);
            have++;
        }
    }
}

static void plan_thaw(struct msim *ms, int t, unsigned warm_budget, struct result *res)
{
    struct wp_model wm[N_MODELS];
    for (int i = 0; i < N_MODELS; i++) {
        struct msim *m = &ms[i];
        struct as_decision d;
        unsigned ready = replicas_of(m, true, t);
        as_decide(&m->ass, &m->asc, (uint64_t)t * 1000, ready, &d);
        wm[i] = (struct wp_model){
            .name = "m",
            .tier = m->sp->tier,
            .slices = m->sp->slices,
            .current = replicas_of(m, false, t),
            .desired = d.desired,
            .min_replicas = 0,
            .idle = busy_slots(m) == 0 && queued(m) == 0,
            .value = m->rate_ewma * m->sp->cold_start_s,
        };
    }
    struct wp_plan plan;
    warmpool_plan(wm, N_MODELS, CAPACITY, warm_budget, &plan);
    /* Stops before starts, so freed slices are there. */
    for (int i = 0; i < N_MODELS; i++) {
        while (replicas_of(&ms[i], false, t) > wm[i].target) {
            stop_replica(&ms[i], t);
        }
    }
    for (int i = 0; i < N_MODELS; i++) {
        while (replicas_of(&ms[i], false, t) < wm[i].target) {
            start_replica(&ms[i], t, res);
        }
    }
}

static void run(enum policy pol, const struct spec *sp, int horizon, unsigned warm_budget,
                uint64_t seed, struct result *res)
{
    struct msim ms[N_MODELS];
    memset(ms, 0, sizeof ms);
    memset(res, 0, sizeof *res);
    res->plot_n = (size_t)horizon / PLOT_STEP_S + 1;
    for (int k = 0; k < TIER_COUNT; k++) {
        res->plot[k] = calloc(res->plot_n, sizeof *res->plot[k]);
    }
    unsigned dedicated[N_MODELS];
    for (int i = 0; i < N_MODELS; i++) {
        ms[i].sp = &sp[i];
        as_config_defaults(&ms[i].asc, SLOTS * 0.7);
        ms[i].asc.scale_to_zero_grace_ms = GRACE_MS;
        ms[i].asc.max_scale = MAX_REPLICAS;
        as_init(&ms[i].ass, &ms[i].asc);
        /* Dedicated: whole GPUs sized for the model's peak concurrency. */
        double peak = 0;
        for (int t = 0; t < horizon; t += 60) {
            double r = rate_at(&sp[i], t);
            peak = r > peak ? r : peak;
        }
        unsigned need = (unsigned)ceil(peak * sp[i].service_s / SLOTS);
        dedicated[i] = need < 1 ? 1 : need > MAX_REPLICAS ? MAX_REPLICAS : need;
        if (pol == P_DEDICATED) {
            for (unsigned k = 0; k < dedicated[i]; k++) {
                ms[i].r[k].used = true;
                ms[i].r[k].ready_at = 0;
            }
        }
    }
    struct rng r = {seed * 0xD1B54A32D192ED03ULL + 7}; /* same arrivals for every policy */
    for (int t = 0; t < horizon; t++) {
        for (int i = 0; i < N_MODELS; i++) {
            struct msim *m = &ms[i];
            unsigned k = poisson(&r, rate_at(m->sp, t));
            for (unsigned a = 0; a < k; a++) {
                wq_push(&m->q[m->sp->tier], t);
            }
            m->arrivals_window += k;
            if (t % 60 == 59) {
                m->rate_ewma = 0.8 * m->rate_ewma + 0.2 * (m->arrivals_window / 60.0);
                m->arrivals_window = 0;
            }
            if (pol != P_DEDICATED && queued(m) && replicas_of(m, false, t) == 0) {
                /* A request for a cold model pokes at once (both shared policies). */
                as_record(&m->ass, (uint64_t)t * 1000, (double)queued(m));
            }
            dispatch(m, t, pol == P_THAW, res);
            expire(m, t, res);
            as_record(&m->ass, (uint64_t)t * 1000, (double)(busy_slots(m) + queued(m)));
        }
        if (pol != P_DEDICATED) {
            bool cold_demand = false;
            for (int i = 0; i < N_MODELS; i++) {
                cold_demand |= queued(&ms[i]) && replicas_of(&ms[i], false, t) == 0;
            }
            if (t % TICK_S == 0 || cold_demand) {
                if (pol == P_THAW) {
                    plan_thaw(ms, t, warm_budget, res);
                } else {
                    plan_knative(ms, t, res);
                }
            }
        }
        unsigned held[TIER_COUNT] = {0};
        for (int i = 0; i < N_MODELS; i++) {
            unsigned slices = pol == P_DEDICATED ? SLICES_PER_GPU : sp[i].slices;
            held[sp[i].tier] += replicas_of(&ms[i], false, t) * slices;
        }
        for (int k = 0; k < TIER_COUNT; k++) {
            res->slice_hours += held[k] / 3600.0;
            if (t % PLOT_STEP_S == 0) {
                res->plot[k][t / PLOT_STEP_S] = held[k];
            }
        }
    }
    for (int k = 0; k < TIER_COUNT; k++) {
        res->p50[k] = pctl(&res->waits[k], 50);
        res->p99[k] = pctl(&res->waits[k], 99);
    }
    for (int i = 0; i < N_MODELS; i++) {
        for (int k = 0; k < TIER_COUNT; k++) {
            res->rejected[k] += ms[i].q[k].len; /* still waiting at the end of the day */
            free(ms[i].q[k].t);
        }
    }
}

static void write_svg(const char *path, const struct result *res, int horizon)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "thaw-costsim: cannot write %s\n", path);
        return;
    }
    const int W = 900, H = 360, L = 60, B = 40, T = 30;
    double xs = (double)(W - L - 20) / (double)horizon;
    double ys = (double)(H - B - T) / CAPACITY;
    static const char *const colors[TIER_COUNT] = {"#d62728", "#1f77b4", "#7f7f7f"};
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\">thaw: GPU slices in use per tier "
               "over the day (capacity %d)</text>\n",
            L, CAPACITY);
    /* stacked areas: critical at the bottom */
    for (int k = TIER_COUNT - 1; k >= 0; k--) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.8\" points=\"", colors[k]);
        for (size_t i = 0; i < res->plot_n; i++) {
            unsigned top = 0;
            for (int j = 0; j <= k; j++) {
                top += res->plot[j][i];
            }
            fprintf(f, "%.1f,%.1f ", L + (double)i * PLOT_STEP_S * xs, H - B - top * ys);
        }
        fprintf(f, "%.1f,%d %d,%d\"/>\n", L + (double)(res->plot_n - 1) * PLOT_STEP_S * xs, H - B,
                L, H - B);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B,
            W - 20, H - B);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L,
            H - B);
    for (int h = 0; h <= horizon / 3600; h += 3) {
        double x = L + h * 3600 * xs;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%02d:00</text>\n", x,
                H - B + 16, h % 24);
    }
    for (int s = 0; s <= CAPACITY; s += 8) {
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d</text>\n", L - 6,
                H - B - s * ys + 4, s);
    }
    for (int k = 0; k < TIER_COUNT; k++) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">%s</text>\n",
                W - 200 + k * 65, T - 4, colors[k], W - 184 + k * 65, T + 6,
                tier_name((enum tier)k));
    }
    fprintf(f, "</svg>\n");
    fclose(f);
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    bool json = false;
    double hours = 24, price = 4.0;
    unsigned warm_budget = 6;
    const char *svg = NULL;
    static const struct option opts[] = {
        {"seed", required_argument, NULL, 's'},  {"json", no_argument, NULL, 'j'},
        {"hours", required_argument, NULL, 'H'}, {"price-per-gpu-hour", required_argument, NULL, 'p'},
        {"svg", required_argument, NULL, 'g'},   {"warm-budget", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'j': json = true; break;
        case 'H': hours = atof(optarg); break;
        case 'p': price = atof(optarg); break;
        case 'g': svg = optarg; break;
        case 'w': warm_budget = (unsigned)atoi(optarg); break;
        case 'h':
            printf("usage: thaw-costsim [--seed N] [--json] [--hours H] [--price-per-gpu-hour USD]\n"
                   "                    [--svg FILE] [--warm-budget SLICES]\n");
            return 0;
        default: return 2;
        }
    }
    int horizon = (int)(hours * 3600);
    if (horizon < 3600) {
        horizon = 3600;
    }
    struct spec sp[N_MODELS];
    make_trace(sp, seed, horizon);
    struct result res[P_COUNT];
    for (int p = 0; p < P_COUNT; p++) {
        run((enum policy)p, sp, horizon, warm_budget, seed, &res[p]);
    }
    double slice_price = price / SLICES_PER_GPU;
    if (json) {
        for (int p = 0; p < P_COUNT; p++) {
            printf("{\"policy\":\"%s\",\"seed\":%llu,\"hours\":%g,\"gpu_slice_hours\":%.1f,"
                   "\"cost_usd\":%.2f,\"tiers\":{",
                   policy_names[p], (unsigned long long)seed, hours, res[p].slice_hours,
                   res[p].slice_hours * slice_price);
            for (int k = 0; k < TIER_COUNT; k++) {
                printf("%s\"%s\":{\"cold_starts\":%u,\"p50_wait_ms\":%.0f,\"p99_wait_ms\":%.0f,"
                       "\"rejected\":%llu,\"served\":%llu}",
                       k ? "," : "", tier_name((enum tier)k), res[p].cold_starts[k],
                       res[p].p50[k] * 1000, res[p].p99[k] * 1000,
                       (unsigned long long)res[p].rejected[k],
                       (unsigned long long)res[p].served[k]);
            }
            printf("}}\n");
        }
    } else {
        printf("thaw-costsim: seed %llu, %g h, %d models on %d GPUs x %d slices, $%.2f/GPU-hour\n",
               (unsigned long long)seed, hours, N_MODELS, N_GPUS, SLICES_PER_GPU, price);
        printf("%-13s %11s %9s %7s | %-34s | %-34s | %-34s\n", "policy", "slice-hours", "cost $",
               "vs ded", "critical: cold p50 p99 (s) rej", "standard: cold p50 p99 (s) rej",
               "batch: cold p50 p99 (s) rej");
        for (int p = 0; p < P_COUNT; p++) {
            printf("%-13s %11.1f %9.2f %6.0f%%", policy_names[p], res[p].slice_hours,
                   res[p].slice_hours * slice_price,
                   100 * res[p].slice_hours / res[P_DEDICATED].slice_hours);
            for (int k = 0; k < TIER_COUNT; k++) {
                printf(" | %9u %7.1f %7.1f %7llu", res[p].cold_starts[k], res[p].p50[k],
                       res[p].p99[k], (unsigned long long)res[p].rejected[k]);
            }
            printf("\n");
        }
    }
    if (svg) {
        write_svg(svg, &res[P_THAW], horizon);
    }
    for (int p = 0; p < P_COUNT; p++) {
        for (int k = 0; k < TIER_COUNT; k++) {
            free(res[p].waits[k].v);
            free(res[p].plot[k]);
        }
    }
    return 0;
}

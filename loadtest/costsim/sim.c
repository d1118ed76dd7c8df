/* The simulated cluster, second by second: replicas and the GPU slices they
 * hold, each model's queue, dispatch into a replica's slots, clients giving
 * up, and the accounting every policy is judged by. */
#include "costsim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define AGING_S 10 /* thaw's limits.queue_aging_ms: a tier's lead in the queue */

/* Critical and standard clients wait five minutes (Knative's default
 * revision timeout, and thaw's queue timeout), batch an hour. */
const int cs_patience_s[TIER_COUNT] = {300, 300, 3600};
const double cs_slo_target_s[TIER_COUNT] = {1, 30, 3600};

/* ---- queues ---- */

static void jq_push(struct cs_jobq *q, struct cs_job j)
{
    if (q->head + q->len == q->cap) {
        if (q->head > 0) {
            memmove(q->v, q->v + q->head, q->len * sizeof *q->v);
            q->head = 0;
        } else {
            q->cap = q->cap ? q->cap * 2 : 64;
            q->v = realloc(q->v, q->cap * sizeof *q->v);
        }
    }
    q->v[q->head + q->len++] = j;
}

static struct cs_job *jq_front(struct cs_jobq *q)
{
    return &q->v[q->head];
}

static void jq_pop(struct cs_jobq *q)
{
    q->head++;
    q->len--;
}

static void waits_add(struct cs_waits *w, float s)
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

static double pctl(struct cs_waits *w, double p)
{
    if (w->n == 0) {
        return 0;
    }
    size_t k = (size_t)((double)(w->n - 1) * p / 100.0 + 0.5);
    return w->v[k];
}

/* ---- replicas ---- */

unsigned cs_count(const struct cs_msim *m, unsigned mask)
{
    unsigned n = 0;
    for (int i = 0; i < CS_MAX_REPLICAS; i++) {
        n += (mask >> m->r[i].st) & 1u;
    }
    return n;
}

static unsigned inflight(const struct cs_replica *r)
{
    unsigned n = 0;
    for (int s = 0; s < CS_SLOTS; s++) {
        n += r->done[s] != 0;
    }
    return n;
}

unsigned cs_busy(const struct cs_msim *m)
{
    unsigned n = 0;
    for (int i = 0; i < CS_MAX_REPLICAS; i++) {
        if (m->r[i].st == R_READY || m->r[i].st == R_DRAINING) {
            n += inflight(&m->r[i]);
        }
    }
    return n;
}

size_t cs_queued(const struct cs_msim *m)
{
    return m->q[0].len + m->q[1].len + m->q[2].len;
}

unsigned cs_slices_of(const struct cs_sim *s, size_t i)
{
    return s->pol->held_slices ? s->pol->held_slices(s, i) : s->m[i].spec->slices;
}

unsigned cs_free_slices(const struct cs_sim *s)
{
    if (!s->capacity) {
        return UINT32_MAX;
    }
    return s->held < s->capacity ? s->capacity - s->held : 0;
}

static bool holds_slices(enum cs_rstate st)
{
    return st == R_STARTING || st == R_READY || st == R_DRAINING;
}

static void release(struct cs_sim *s, size_t i, struct cs_replica *r)
{
    if (holds_slices(r->st)) {
        s->held -= cs_slices_of(s, i);
    }
    memset(r, 0, sizeof *r);
}

/* In-flight requests of a replica taken away: they fail (Kubernetes) or go
 * back to the head of the queue (none of the policies here). */
static void fail_inflight(struct cs_sim *s, struct cs_replica *r)
{
    for (int k = 0; k < CS_SLOTS; k++) {
        if (r->done[k]) { /* counted as served when it started: it was not */
            int t = r->job[k].tier;
            s->res->failed[t]++;
            s->res->served[t]--;
            s->res->slo_met[t] -= s->res->slo_met[t] && r->job[k].met_slo;
            r->done[k] = 0;
        }
    }
}

/* The replica to give up first: pending, then starting, then the least
 * busy ready one. */
static int cheapest(const struct cs_msim *m)
{
    int best = -1;
    int best_cost = 1 << 30;
    for (int k = 0; k < CS_MAX_REPLICAS; k++) {
        const struct cs_replica *r = &m->r[k];
        int cost = r->st == R_PENDING    ? 0
                   : r->st == R_STARTING ? 1
                   : r->st == R_READY    ? 2 + (int)inflight(r)
                                         : -1;
        if (cost >= 0 && cost < best_cost) {
            best_cost = cost;
            best = k;
        }
    }
    return best;
}

void cs_scale_to(struct cs_sim *s, size_t i, unsigned n)
{
    struct cs_msim *m = &s->m[i];
    if (n > CS_MAX_REPLICAS) {
        n = CS_MAX_REPLICAS;
    }
    unsigned have = cs_count(m, CS_ACTIVE);
    for (int k = 0; k < CS_MAX_REPLICAS && have < n; k++) {
        if (m->r[k].st == R_NONE) {
            m->r[k].st = R_PENDING;
            m->r[k].since = s->t;
            have++;
        }
    }
    while (have > n) {
        int k = cheapest(m);
        struct cs_replica *r = &m->r[k];
        if (r->st == R_READY && inflight(r)) {
            r->st = R_DRAINING; /* finishes what it holds */
        } else {
            release(s, i, r);
        }
        have--;
    }
}

void cs_preempt(struct cs_sim *s, size_t i, size_t k)
{
    struct cs_replica *r = &s->m[i].r[k];
    fail_inflight(s, r);
    release(s, i, r);
    r->st = R_PENDING; /* the ReplicaSet replaces its pod */
    r->since = s->t;
    s->res->preemptions++;
}

static void place(struct cs_sim *s, size_t i, struct cs_replica *r)
{
    struct cs_msim *m = &s->m[i];
    r->st = R_STARTING;
    r->since = s->t;
    r->ready_at = s->t + (m->started_before ? m->spec->cold_cached_s : m->spec->cold_uncached_s);
    m->started_before = true;
    s->held += cs_slices_of(s, i);
}

void cs_schedule(struct cs_sim *s)
{
    for (;;) {
        size_t bi = 0;
        int bk = -1;
        for (size_t i = 0; i < s->n; i++) {
            struct cs_msim *m = &s->m[i];
            for (int k = 0; k < CS_MAX_REPLICAS; k++) {
                if (m->r[k].st != R_PENDING || cs_slices_of(s, i) > cs_free_slices(s)) {
                    continue;
                }
                if (bk < 0 || m->spec->tier < s->m[bi].spec->tier ||
                    (m->spec->tier == s->m[bi].spec->tier &&
                     m->r[k].since < s->m[bi].r[bk].since)) {
                    bi = i;
                    bk = k;
                }
            }
        }
        if (bk < 0) {
            return;
        }
        place(s, bi, &s->m[bi].r[bk]);
    }
}

/* ---- a second of one model ---- */

static int pick_tier(struct cs_msim *m)
{
    int best = -1;
    double best_rank = 1e18;
    for (int k = 0; k < TIER_COUNT; k++) {
        if (!m->q[k].len) {
            continue;
        }
        double rank = jq_front(&m->q[k])->arrived + (m->tiered ? k * AGING_S : 0);
        if (rank < best_rank) {
            best_rank = rank;
            best = k;
        }
    }
    return best;
}

static void serve(struct cs_sim *s, struct cs_msim *m, struct cs_replica *r, int slot)
{
    int k = pick_tier(m);
    struct cs_job j = *jq_front(&m->q[k]);
    jq_pop(&m->q[k]);
    float wait = (float)(s->t - j.arrived);
    waits_add(&s->res->waits[k], wait);
    s->res->served[k]++;
    s->res->slo_met[k] += wait <= cs_slo_target_s[k];
    r->done[slot] = s->t + j.service;
    r->job[slot] = j;
    r->job[slot].met_slo = wait <= cs_slo_target_s[k];
    m->last_used = s->t;
}

static void step_replicas(struct cs_sim *s, size_t i)
{
    struct cs_msim *m = &s->m[i];
    for (int k = 0; k < CS_MAX_REPLICAS; k++) {
        struct cs_replica *r = &m->r[k];
        if (r->st == R_STARTING && r->ready_at <= s->t) {
            if (cs_count(m, 1u << R_READY) == 0) {
                (m->cold_waiting ? s->res->cold_starts : s->res->ahead_starts)[m->spec->tier]++;
                m->cold_waiting = false;
            }
            r->st = R_READY;
        }
        if (r->st != R_READY && r->st != R_DRAINING) {
            continue;
        }
        for (int slot = 0; slot < CS_SLOTS; slot++) {
            if (r->done[slot] && r->done[slot] <= s->t) {
                r->done[slot] = 0;
                m->last_used = s->t;
            }
            if (!r->done[slot] && r->st == R_READY && cs_queued(m)) {
                serve(s, m, r, slot);
            }
        }
        if (r->st == R_DRAINING && !inflight(r)) {
            release(s, i, r);
        }
    }
}

static void give_up(struct cs_sim *s, struct cs_msim *m)
{
    for (int k = 0; k < TIER_COUNT; k++) {
        while (m->q[k].len && s->t - jq_front(&m->q[k])->arrived > s->patience[k]) {
            jq_pop(&m->q[k]);
            s->res->rejected[k]++;
        }
    }
}

static bool cold_demand(const struct cs_sim *s)
{
    for (size_t i = 0; i < s->n; i++) {
        if (cs_queued(&s->m[i]) && cs_count(&s->m[i], CS_ACTIVE) == 0) {
            return true;
        }
    }
    return false;
}

static void account(struct cs_sim *s)
{
    unsigned held[TIER_COUNT] = {0};
    for (size_t i = 0; i < s->n; i++) {
        unsigned n = cs_count(&s->m[i], (1u << R_STARTING) | (1u << R_READY) | (1u << R_DRAINING));
        held[s->m[i].spec->tier] += n * cs_slices_of(s, i);
    }
    for (int k = 0; k < TIER_COUNT; k++) {
        s->res->slice_hours[k] += held[k] / 3600.0;
        if (s->t % CS_PLOT_STEP_S == 0 && (size_t)(s->t / CS_PLOT_STEP_S) < s->res->plot_n) {
            s->res->plot[k][s->t / CS_PLOT_STEP_S] = held[k];
        }
    }
}

static void arrive(struct cs_sim *s, size_t *next)
{
    const struct cs_trace *tr = s->tr;
    while (*next < tr->n_reqs && tr->reqs[*next].t <= s->t) {
        const struct cs_request *q = &tr->reqs[(*next)++];
        struct cs_msim *m = &s->m[q->model];
        jq_push(&m->q[q->tier], (struct cs_job){q->t, cs_service_s(q->tokens), q->tier, false});
        m->arrivals_window++;
        m->arrivals++;
        if (cs_count(m, 1u << R_READY) == 0) {
            m->cold_waiting = true;
            s->res->cold_requests[q->tier]++;
        }
    }
}

static void finish(struct cs_sim *s)
{
    struct cs_result *res = s->res;
    for (size_t i = 0; i < s->n; i++) {
        for (int k = 0; k < TIER_COUNT; k++) {
            res->rejected[k] += s->m[i].q[k].len; /* still waiting at the end */
            free(s->m[i].q[k].v);
        }
    }
    for (int k = 0; k < TIER_COUNT; k++) {
        if (res->waits[k].n) {
            qsort(res->waits[k].v, res->waits[k].n, sizeof *res->waits[k].v, fcmp);
        }
        res->p50[k] = pctl(&res->waits[k], 50);
        res->p99[k] = pctl(&res->waits[k], 99);
    }
}

void cs_run(const struct cs_policy *pol, const struct cs_trace *tr, struct cs_result *res)
{
    memset(res, 0, sizeof *res);
    res->plot_n = (size_t)tr->horizon / CS_PLOT_STEP_S + 1;
    for (int k = 0; k < TIER_COUNT; k++) {
        res->plot[k] = calloc(res->plot_n, sizeof *res->plot[k]);
    }
    struct cs_sim s = {.tr = tr, .pol = pol, .n = tr->n_models, .res = res};
    s.m = calloc(tr->n_models ? tr->n_models : 1, sizeof *s.m);
    s.capacity = pol->unlimited ? 0 : cs_capacity(tr);
    memcpy(s.patience, cs_patience_s, sizeof s.patience);
    for (size_t i = 0; i < s.n; i++) {
        s.m[i].spec = &tr->models[i];
        s.m[i].tiered = pol->tiered;
        as_config_defaults(&s.m[i].asc, CS_SLOTS * 0.7); /* policies set their own */
        as_init(&s.m[i].ass, &s.m[i].asc);
    }
    if (pol->init) {
        pol->init(&s);
    }
    size_t next = 0;
    for (s.t = 0; s.t < tr->horizon; s.t++) {
        arrive(&s, &next);
        for (size_t i = 0; i < s.n; i++) {
            struct cs_msim *m = &s.m[i];
            step_replicas(&s, i);
            give_up(&s, m);
            as_record(&m->ass, (uint64_t)s.t * 1000, (double)(cs_busy(m) + cs_queued(m)));
            if (s.t % 60 == 59) {
                m->rate_ewma = 0.8 * m->rate_ewma + 0.2 * (m->arrivals_window / 60.0);
                m->arrivals_window = 0;
            }
        }
        if (pol->plan && (s.t % CS_TICK_S == 0 || cold_demand(&s))) {
            pol->plan(&s);
        }
        cs_schedule(&s);
        account(&s);
    }
    finish(&s);
    if (pol->done) {
        pol->done(&s);
    }
    free(s.pstate);
    free(s.m);
}

void cs_result_free(struct cs_result *res)
{
    for (int k = 0; k < TIER_COUNT; k++) {
        free(res->waits[k].v);
        free(res->plot[k]);
    }
}

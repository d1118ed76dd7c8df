/* thaw with the defaults it ships: its own autoscaler per model (target
 * max_concurrency x target_utilization_pct, its stable and panic windows,
 * the model's idle_timeout as the grace to zero: 5 minutes, 30 s for batch),
 * then its warm pool and admission over the box (warm budget, eviction of
 * idle warm replicas of lower priority, preemption of strictly lower
 * priority: the victim drains), its tiered queue and its queue timeouts
 * (5 minutes, an hour for batch). Every number comes from thaw's
 * configuration defaults, but the warm budget, which is the chart's.
 *
 * thaw-prewarm is the same with autoscaler.prewarm "on": each model's demand
 * profile (forecast.h) learns from its arrivals, on a clock that starts on
 * a Monday at midnight UTC, and the warm pool warms a model when a request
 * is forecast within its cold start, and lets known-quiet ones go. */
#include "costsim.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/config.h"
#include "thaw/forecast.h"
#include "thaw/warmpool.h"

unsigned cs_thaw_warm_budget = UINT_MAX;

/* charts/thaw/values.yaml config.warm_pool.budget_slices (the e2e test
 * checks they agree); thaw's own default without the chart is 0. */
#define CHART_WARM_BUDGET_SLICES 6

/* Monday 2026-11-30 00:00 UTC: the trace's second 0 on the wall clock. */
#define TRACE_EPOCH_MS 1795996800000ULL

struct thaw_state {
    unsigned warm_budget;
    struct wp_model *wm;
    /* thaw-prewarm: per model */
    struct forecast *fc;
    uint64_t *fc_count;
    uint64_t min_requests, lead_ms, quiet_ms;
};

/* The day starts as a steady day does: what the warm pool keeps through
 * an idle night (critical models first, within the budget) is up already,
 * as Knative's min-scale replicas and static packing are. */
static void warm_from_the_night(struct cs_sim *s, struct thaw_state *st)
{
    for (size_t i = 0; i < s->n; i++) {
        st->wm[i] = (struct wp_model){.name = s->m[i].spec->name,
                                      .tier = s->m[i].spec->tier,
                                      .slices = s->m[i].spec->slices,
                                      .current = 1,
                                      .idle = true};
    }
    struct wp_plan plan;
    warmpool_plan(st->wm, s->n, cs_capacity(s->tr), st->warm_budget, &plan);
    for (size_t i = 0; i < s->n; i++) {
        if (st->wm[i].target && s->m[i].spec->slices <= cs_free_slices(s)) {
            s->m[i].r[0].st = R_READY;
            s->m[i].started_before = true;
            s->held += s->m[i].spec->slices;
        }
    }
}

static void thaw_setup(struct cs_sim *s, bool prewarm)
{
    struct config *cfg = config_new_default();
    struct config_model dm;
    config_model_defaults(&dm, &cfg->limits);
    const struct config_autoscaler *a = &cfg->autoscaler;
    struct thaw_state *st = calloc(1, sizeof *st);
    st->warm_budget =
        cs_thaw_warm_budget != UINT_MAX ? cs_thaw_warm_budget : CHART_WARM_BUDGET_SLICES;
    st->wm = calloc(s->n ? s->n : 1, sizeof *st->wm);
    for (size_t i = 0; i < s->n; i++) {
        struct cs_msim *m = &s->m[i];
        as_config_defaults(&m->asc, (double)CS_SLOTS * (double)a->target_utilization_pct / 100.0);
        m->asc.stable_window_ms = a->stable_window_ms;
        m->asc.panic_window_pct = (double)a->panic_window_pct;
        m->asc.panic_threshold = (double)a->panic_threshold_pct / 100.0;
        m->asc.max_scale_up_rate = (double)a->max_scale_up_rate;
        m->asc.max_scale_down_rate = (double)a->max_scale_down_rate;
        m->asc.scale_down_delay_ms = a->scale_down_delay_ms;
        m->asc.activation_scale = (unsigned)a->activation_scale;
        m->asc.scale_to_zero_grace_ms = config_default_idle_timeout_ms(m->spec->tier);
        m->asc.min_scale = (unsigned)dm.min_replicas;
        m->asc.max_scale = CS_MAX_REPLICAS;
        as_init(&m->ass, &m->asc);
    }
    /* A client waits no longer than thaw's queue timeout for its tier. */
    for (int t = 0; t < TIER_COUNT; t++) {
        uint64_t qt = config_default_queue_timeout_ms((enum tier)t, 0) / 1000;
        if ((uint64_t)s->patience[t] > qt) {
            s->patience[t] = (int)qt;
        }
    }
    if (prewarm) {
        st->fc = malloc((s->n ? s->n : 1) * sizeof *st->fc);
        st->fc_count = calloc(s->n ? s->n : 1, sizeof *st->fc_count);
        for (size_t i = 0; i < s->n; i++) {
            forecast_init(&st->fc[i]);
        }
        st->min_requests = a->prewarm_min_requests;
        st->lead_ms = a->prewarm_lead_ms;
        st->quiet_ms = a->prewarm_quiet_ms;
    }
    s->res->warm_budget = st->warm_budget;
    s->pstate = st;
    warm_from_the_night(s, st);
    config_free(cfg);
}

static void thaw_init(struct cs_sim *s)
{
    thaw_setup(s, false);
}

static void thaw_prewarm_init(struct cs_sim *s)
{
    thaw_setup(s, true);
}

/* As scaler_forecast does: this tick's arrivals into the profile, then the
 * forecast over the model's cold start (at least the lead) and a tick. */
static void forecast_model(struct thaw_state *st, struct cs_sim *s, size_t i, struct wp_model *w)
{
    struct cs_msim *m = &s->m[i];
    uint64_t wall = TRACE_EPOCH_MS + (uint64_t)s->t * 1000;
    forecast_record(&st->fc[i], wall, m->arrivals - st->fc_count[i]);
    st->fc_count[i] = m->arrivals;
    uint64_t cold = (uint64_t)m->spec->cold_cached_s * 1000;
    uint64_t horizon = (cold > st->lead_ms ? cold : st->lead_ms) + CS_TICK_S * 1000;
    bool due = forecast_expected(&st->fc[i], wall, horizon) >= (double)st->min_requests;
    w->prewarm = due;
    uint64_t quiet = st->quiet_ms > horizon ? st->quiet_ms : horizon;
    w->quiet = !due && forecast_known(&st->fc[i], wall, quiet) &&
               forecast_expected(&st->fc[i], wall, quiet) < (double)st->min_requests;
}

static unsigned draining_slices(const struct cs_sim *s)
{
    unsigned n = 0;
    for (size_t i = 0; i < s->n; i++) {
        n += cs_count(&s->m[i], 1u << R_DRAINING) * s->m[i].spec->slices;
    }
    return n;
}

static void count_takes(struct cs_sim *s, const struct wp_plan *plan)
{
    for (size_t k = 0; k < plan->n; k++) {
        if (plan->d[k].action == WP_EVICT) {
            s->res->evictions += plan->d[k].replicas;
        } else if (plan->d[k].action == WP_PREEMPT) {
            s->res->preemptions += plan->d[k].replicas;
        }
    }
}

/* How long the model's oldest waiting request has waited. */
static uint64_t oldest_wait_ms(const struct cs_sim *s, const struct cs_msim *m)
{
    int oldest = s->t;
    for (int t = 0; t < TIER_COUNT; t++) {
        const struct cs_jobq *q = &m->q[t];
        if (q->len && q->v[q->head].arrived < oldest) {
            oldest = q->v[q->head].arrived;
        }
    }
    return (uint64_t)(s->t - oldest) * 1000;
}

static void thaw_plan(struct cs_sim *s)
{
    struct thaw_state *st = s->pstate;
    for (size_t i = 0; i < s->n; i++) {
        struct cs_msim *m = &s->m[i];
        struct as_decision d;
        as_decide(&m->ass, &m->asc, (uint64_t)s->t * 1000, cs_count(m, 1u << R_READY),
                  cs_count(m, CS_ACTIVE), &d);
        st->wm[i] = (struct wp_model){
            .name = m->spec->name,
            .tier = m->spec->tier,
            .slices = m->spec->slices,
            .current = cs_count(m, CS_ACTIVE),
            .desired = d.desired,
            .min_replicas = m->asc.min_scale,
            .idle = cs_busy(m) == 0 && cs_queued(m) == 0,
            .value = m->rate_ewma * m->spec->cold_cached_s,
            .waited_ms = oldest_wait_ms(s, m),
        };
        if (st->fc) {
            forecast_model(st, s, i, &st->wm[i]);
        }
    }
    /* Draining replicas still hold their slices. */
    unsigned cap = cs_capacity(s->tr), draining = draining_slices(s);
    struct wp_plan plan;
    warmpool_plan(st->wm, s->n, cap > draining ? cap - draining : 0, st->warm_budget, &plan);
    count_takes(s, &plan);
    for (size_t i = 0; i < s->n; i++) { /* stops first, so their slices are free */
        if (st->wm[i].target < st->wm[i].current) {
            cs_scale_to(s, i, st->wm[i].target);
        }
    }
    for (size_t i = 0; i < s->n; i++) {
        if (st->wm[i].target > st->wm[i].current) {
            cs_scale_to(s, i, st->wm[i].target);
        }
    }
}

static void thaw_free(struct cs_sim *s)
{
    struct thaw_state *st = s->pstate;
    if (st) {
        free(st->wm);
        free(st->fc);
        free(st->fc_count);
    }
}

const struct cs_policy cs_thaw = {
    .name = "thaw",
    .models = "thaw's autoscaler, warm pool and tiered queues with its shipped defaults",
    .init = thaw_init,
    .plan = thaw_plan,
    .done = thaw_free,
    .tiered = true,
};

const struct cs_policy cs_thaw_prewarm = {
    .name = "thaw-prewarm",
    .models = "thaw as shipped, with autoscaler.prewarm on (warming ahead of forecast demand)",
    .init = thaw_prewarm_init,
    .plan = thaw_plan,
    .done = thaw_free,
    .tiered = true,
};

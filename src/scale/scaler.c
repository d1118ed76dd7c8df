#include "thaw/scaler.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RATE_HALF_LIFE_MS 60000.0

_Static_assert(sizeof(((struct model_stats *)0)->pool_decisions) / sizeof(uint64_t) == WP_ACTIONS,
               "a pool decision counter per warm-pool action");

void scaler_model_init(struct scaler_model *sm, struct model *m, const struct config *cfg,
                       uint64_t target, uint64_t window_ms, unsigned min_replicas,
                       unsigned max_replicas, uint64_t grace_ms, unsigned slices)
{
    memset(sm, 0, sizeof *sm);
    sm->m = m;
    const struct config_autoscaler *a = &cfg->autoscaler;
    double t = target ? (double)target
                      : (double)m->set.max_concurrency * (double)a->target_utilization_pct / 100.0;
    as_config_defaults(&sm->asc, t < 1 ? 1 : t);
    sm->asc.stable_window_ms = window_ms >= 6000 ? window_ms : a->stable_window_ms;
    sm->asc.panic_window_pct = (double)a->panic_window_pct;
    sm->asc.panic_threshold = (double)a->panic_threshold_pct / 100.0;
    sm->asc.max_scale_up_rate = (double)a->max_scale_up_rate;
    sm->asc.max_scale_down_rate = (double)a->max_scale_down_rate;
    sm->asc.scale_down_delay_ms = a->scale_down_delay_ms;
    sm->asc.activation_scale = (unsigned)a->activation_scale;
    sm->asc.scale_to_zero_grace_ms = grace_ms;
    sm->asc.min_scale = min_replicas;
    sm->asc.max_scale = max_replicas;
    sm->min_replicas = min_replicas;
    sm->slices = slices;
    as_init(&sm->ass, &sm->asc);
}

void scaler_model_dispose(struct scaler_model *sm)
{
    free(sm->fc);
    sm->fc = NULL;
}

static uint64_t arrivals(const struct scaler_model *sm)
{
    const struct model_stats *st = &sm->m->stats;
    return st->proxied + st->rejected + st->aborted;
}

/* The profile exists while the mode in force is not off. */
static bool forecast_ready(struct scaler_model *sm, enum prewarm_mode mode)
{
    if (mode == PREWARM_OFF) {
        scaler_model_dispose(sm);
        sm->forecast_due = false;
        sm->expected = 0;
        return false;
    }
    if (!sm->fc) {
        sm->fc = malloc(sizeof *sm->fc);
        if (!sm->fc) {
            return false;
        }
        forecast_init(sm->fc);
        sm->fc_count = arrivals(sm);
    }
    return true;
}

void scaler_forecast(struct scaler_model **sms, size_t n, uint64_t wall_ms,
                     const struct config_autoscaler *a)
{
    for (size_t i = 0; i < n; i++) {
        struct scaler_model *sm = sms[i];
        enum prewarm_mode mode = sm->prewarm == PREWARM_INHERIT ? a->prewarm : sm->prewarm;
        if (!forecast_ready(sm, mode)) {
            continue;
        }
        uint64_t count = arrivals(sm);
        forecast_record(sm->fc, wall_ms, count - sm->fc_count);
        sm->fc_count = count;
        uint64_t cold = sm->m->cold_start_ms;
        sm->horizon_ms = (cold > a->prewarm_lead_ms ? cold : a->prewarm_lead_ms) + a->tick_ms;
        sm->expected = forecast_expected(sm->fc, wall_ms, sm->horizon_ms);
        bool due = sm->expected >= (double)a->prewarm_min_requests;
        if (due != sm->forecast_due && mode == PREWARM_SHADOW) {
            LOGI(due ? "would warm ahead of forecast demand" : "forecast demand over",
                 "model=%s mode=shadow expected_requests=%.1f horizon_s=%llu", sm->m->name,
                 sm->expected, (unsigned long long)(sm->horizon_ms / 1000));
        }
        sm->forecast_due = due;
        uint64_t quiet = a->prewarm_quiet_ms > sm->horizon_ms ? a->prewarm_quiet_ms : sm->horizon_ms;
        sm->forecast_quiet = !due && forecast_known(sm->fc, wall_ms, quiet) &&
                             forecast_expected(sm->fc, wall_ms, quiet) < (double)a->prewarm_min_requests;
        sm->prewarm_on = mode == PREWARM_ON;
    }
}

void scaler_record(struct scaler_model *sm, uint64_t now_ms)
{
    as_record(&sm->ass, now_ms, model_demand(sm->m));
}

static void update_rate(struct scaler_model *sm, uint64_t now_ms)
{
    const struct model_stats *st = &sm->m->stats;
    uint64_t count = st->proxied + st->rejected + st->aborted;
    if (sm->rate_ms && now_ms > sm->rate_ms) {
        double dt = (double)(now_ms - sm->rate_ms);
        double inst = (double)(count - sm->rate_count) * 1000.0 / dt;
        double w = dt / (dt + RATE_HALF_LIFE_MS);
        sm->rate = sm->rate * (1 - w) + inst * w;
    }
    sm->rate_count = count;
    sm->rate_ms = now_ms;
}

/* The plan let an idle replica go because its model's forecast is quiet. */
static bool wm_quiet(const struct scaler_model *sm)
{
    return sm->prewarm_on && sm->forecast_quiet;
}

static const char *node_name(const struct wp_cluster *c, size_t node)
{
    return node < c->n_nodes && c->nodes[node].name ? c->nodes[node].name : "";
}

static const char *tier_of(const struct scaler_model *sm)
{
    return tier_name(sm->m->set.priority);
}

void scaler_plan(struct scaler_model **sms, size_t n, struct wp_cluster *c, unsigned warm_budget,
                 uint64_t now_ms)
{
    if (n == 0) {
        return;
    }
    struct wp_model *wm = calloc(n, sizeof *wm);
    struct wp_plan *plan = malloc(sizeof *plan);
    if (!wm || !plan) {
        free(wm);
        free(plan);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct scaler_model *sm = sms[i];
        update_rate(sm, now_ms);
        /* Requests in flight or waiting now are demand, sampled or not, and
         * so are those served (or cut short) since the last plan: a plan
         * between two samples (a reload's, a wake's) must not take a model
         * serving its first requests for idle, nor samples that each missed
         * a short request a model serving them all along. Refusals (a body
         * too large...) are not demand. */
        uint64_t served = sm->m->stats.proxied + sm->m->stats.aborted;
        if (model_demand(sm->m) > 0 || served != sm->served_seen) {
            as_note_demand(&sm->ass, now_ms, 0);
        }
        sm->served_seen = served;
        as_decide(&sm->ass, &sm->asc, now_ms, sm->ready, sm->current, &sm->last);
        unsigned desired = sm->last.desired, min = sm->min_replicas;
        if ((sm->hold_starts || sm->demand_starts) && desired > sm->current) {
            desired = sm->current;
        }
        if (sm->hold_starts && min > sm->current) {
            min = sm->current; /* a back-off holds min_replicas' starts too */
        }
        struct model *m = sm->m;
        double cold_s = (double)m->cold_start_ms / 1000.0;
        wm[i] = (struct wp_model){
            .name = m->name,
            .tier = m->set.priority,
            .slices = sm->slices,
            .current = sm->current,
            .desired = desired,
            .min_replicas = min,
            .idle = m->inflight == 0 && m->queue.count == 0,
            .waited_ms = m->queue.count ? queue_oldest_age(&m->queue, now_ms) : 0,
            .value = sm->rate * (cold_s > 0 ? cold_s : 1),
            .prewarm = sm->prewarm_on && sm->forecast_due,
            .quiet = sm->prewarm_on && sm->forecast_quiet,
            .gpu_memory = sm->gpu_memory,
            .memory_sleeps = sm->memory_sleeps,
            .eligible = sm->eligible,
            .on_node = sm->on_node,
        };
        memcpy(wm[i].req, sm->req, sizeof wm[i].req);
    }
    warmpool_plan_cluster(wm, n, c, warm_budget, plan);
    for (size_t i = 0; i < n; i++) {
        sms[i]->released_on_node = false;
        sms[i]->target = wm[i].target;
        sms[i]->warm = wm[i].warm > 0;
        sms[i]->m->pool_slices = wm[i].target * wm[i].slices;
        sms[i]->m->replicas_desired = wm[i].target;
        sms[i]->m->pool_warm = wm[i].warm > 0;
    }
    for (size_t i = 0; i < plan->n; i++) {
        const struct wp_decision *d = &plan->d[i];
        struct scaler_model *sm = sms[d->model];
        struct scaler_model *by = sms[d->by];
        const char *on_node = d->node < c->n_nodes ? " on node " : "";
        char why[160];
        switch (d->action) {
        case WP_KEEP_WARM:
            snprintf(why, sizeof why, "idle past its grace; warm budget %u/%u slices",
                     plan->warm_slices, warm_budget);
            break;
        case WP_TO_ZERO:
            if (wm_quiet(sm)) {
                snprintf(why, sizeof why, "idle past its grace; no demand forecast soon");
            } else {
                snprintf(why, sizeof why, "idle past its grace; warm budget full (%u/%u slices)",
                         plan->warm_slices, warm_budget);
            }
            break;
        case WP_ADMIT:
            snprintf(why, sizeof why, "%s", sm->last.why);
            break;
        case WP_PREWARM:
            snprintf(why, sizeof why, "demand forecast within %llus; warm budget %u/%u slices",
                     (unsigned long long)(sm->horizon_ms / 1000), plan->warm_slices, warm_budget);
            break;
        case WP_DENY:
            if (c->cap_slices && plan->used_slices + sm->slices > c->cap_slices) {
                snprintf(why, sizeof why,
                         "warm_pool.capacity_slices reached (%u/%u slices used) and nothing "
                         "of lower priority to take them from",
                         plan->used_slices, c->cap_slices);
            } else if (plan->per_node) {
                snprintf(why, sizeof why,
                         "no node it may use has room for its request and "
                         "nothing of lower priority on one node to take it from");
            } else {
                snprintf(why, sizeof why,
                         "no GPU slices free (%u/%u used) and nothing of lower "
                         "priority to take them from",
                         plan->used_slices, plan->capacity);
            }
            break;
        case WP_EVICT:
            snprintf(why, sizeof why, "idle warm replica evicted for %s (%s)%s%s", by->m->name,
                     tier_of(by), on_node, node_name(c, d->node));
            break;
        case WP_PREEMPT:
            snprintf(why, sizeof why, "shrunk toward min for %s (%s, higher priority)%s%s",
                     by->m->name, tier_of(by), on_node, node_name(c, d->node));
            break;
        }
        /* Each planning step decides again; a decision counts (and is
         * logged) when it differs from the model's last one. */
        if (d->action == WP_EVICT || d->action == WP_PREEMPT) {
            sm->released_on_node = true;
            snprintf(sm->release_reason, sizeof sm->release_reason, "%s", why);
        }
        bool changed = strcmp(sm->last_action, wp_action_name(d->action)) != 0 ||
                       strcmp(sm->last_reason, why) != 0;
        if (changed) {
            sm->m->stats.pool_decisions[d->action]++;
        }
        snprintf(sm->last_action, sizeof sm->last_action, "%s", wp_action_name(d->action));
        snprintf(sm->last_reason, sizeof sm->last_reason, "%s", why);
        if (d->action != WP_ADMIT && changed) {
            LOGI("capacity decision", "model=%s tier=%s action=%s replicas=%u reason=\"%s\"",
                 sm->m->name, tier_of(sm), wp_action_name(d->action), d->replicas, why);
        }
    }
    free(wm);
    free(plan);
}

void scaler_describe(const struct scaler_model *sm, cJSON *out)
{
    cJSON *a = cJSON_AddObjectToObject(out, "autoscaler");
    cJSON_AddNumberToObject(a, "target_per_replica", sm->asc.target);
    cJSON_AddNumberToObject(a, "desired", sm->last.desired);
    cJSON_AddNumberToObject(a, "stable_concurrency", sm->last.stable_avg);
    cJSON_AddNumberToObject(a, "panic_concurrency", sm->last.panic_avg);
    cJSON_AddBoolToObject(a, "panic", sm->last.panic);
    cJSON_AddStringToObject(a, "bound_by", sm->last.why ? sm->last.why : "");
    cJSON_AddNumberToObject(a, "request_rate", sm->rate);
    if (sm->fc) {
        cJSON *f = cJSON_AddObjectToObject(a, "forecast");
        cJSON_AddStringToObject(f, "mode", sm->prewarm_on ? "on" : "shadow");
        cJSON_AddNumberToObject(f, "expected_requests", sm->expected);
        cJSON_AddNumberToObject(f, "horizon_s", (double)sm->horizon_ms / 1000.0);
        cJSON_AddBoolToObject(f, "due", sm->forecast_due);
    }
    cJSON *p = cJSON_AddObjectToObject(out, "pool");
    cJSON_AddNumberToObject(p, "target", sm->target);
    cJSON_AddNumberToObject(p, "slices_held", (double)sm->current * sm->slices);
    cJSON_AddBoolToObject(p, "warm", sm->warm);
    if (sm->last_action[0]) {
        cJSON_AddStringToObject(p, "last_decision", sm->last_action);
        cJSON_AddStringToObject(p, "reason", sm->last_reason);
    }
}

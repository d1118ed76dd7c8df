#include "thaw/admin.h"
#include "thaw/clock.h"
#include "thaw/backend.h"
#include "thaw/coldstart.h"
#include "thaw/conn.h"
#include "thaw/revisions.h"
#include "thaw/runtime.h"
#include "thaw/warmpool.h"

#include <errno.h>
#include <stdint.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define FOR_EACH_MODEL(adm, m)                                                                     \
    for (struct list_node *n_ = (adm)->rt->fleet.models.next;                                          \
         n_ != &(adm)->rt->fleet.models && ((m) = container_of(n_, struct model, node), 1);            \
         n_ = n_->next)

static struct admin_ctx *adm_of(struct conn *c)
{
    return c->ud;
}

/* /metrics is written in pieces of about this size, one per turn of the
 * loop (and only while the client keeps up), so a scrape of many models
 * never holds up proxied requests for long. */
#define METRICS_CHUNK_BYTES (32 * 1024)

/* What /metrics shows of one model, copied when the scrape starts: models
 * may come and go while the answer is written, and every family then
 * shows the same models with the same values. */
struct model_snap {
    const char *name;   /* in metrics_stream.names */
    const char *labels; /* model="name", and namespace="ns" (carries_namespace); in names */
    struct model_stats stats;
    size_t queue_len[TIER_COUNT];
    size_t n_endpoints;
    uint32_t inflight;
    unsigned replicas_desired;
    unsigned pool_slices;
    enum tier priority;
    bool pool_warm;
};

/* Cluster models are named within a namespace, and so are file models given
 * one: the same name may be in two, so their series carry it. */
static bool carries_namespace(const struct model *m)
{
    return m->namespaced || strcmp(m->namespace_, "default") != 0;
}

struct metrics_stream {
    struct admin_ctx *adm;
    struct conn *c;
    struct event *resume; /* renders the next piece on the next turn of the loop */
    struct model_snap *models;
    size_t n_models;
    char *names;
    size_t family;     /* the family being rendered */
    size_t next_model; /* in a per-model family: the next model */
    bool family_begun; /* its HELP/TYPE are out (a piece may end right after them) */
    bool chunked;      /* HTTP/1.1: chunked; else the body ends at close */
    struct buf piece;
};

/* A family is rendered whole by `whole`, or, for one line group per model,
 * by HELP/TYPE then `per_model` for each model in turn. */
struct family {
    const char *name, *type, *help;
    void (*whole)(const struct metrics_stream *ms, struct buf *o);
    void (*per_model)(const struct model_snap *m, struct buf *o);
};

static void render_reload_metrics(const struct reload_status *st, struct buf *o)
{
    metrics_help_type(o, "thaw_config_reloads_total", "counter",
              "Configuration reloads (SIGHUP), by result.");
    buf_printf(o, "thaw_config_reloads_total{result=\"success\"} %llu\n",
               (unsigned long long)st->succeeded);
    buf_printf(o, "thaw_config_reloads_total{result=\"failure\"} %llu\n",
               (unsigned long long)st->failed);
    metrics_help_type(o, "thaw_config_last_reload_successful", "gauge",
              "1 when the last reload (or the start-up load) succeeded.");
    buf_printf(o, "thaw_config_last_reload_successful %d\n", st->last_ok ? 1 : 0);
    metrics_help_type(o, "thaw_config_last_reload_success_timestamp_seconds", "gauge",
              "Unix time of the last successful load of the configuration.");
    buf_printf(o, "thaw_config_last_reload_success_timestamp_seconds %.3f\n",
               st->last_success_unix);
}

static void status_reload(const struct admin_ctx *adm, cJSON *root)
{
    const struct reload_status *st = &adm->rt->reload;
    cJSON *c = cJSON_AddObjectToObject(root, "config");
    cJSON_AddStringToObject(c, "file", adm->rt->cfg->path);
    cJSON_AddNumberToObject(c, "reloads_succeeded", (double)st->succeeded);
    cJSON_AddNumberToObject(c, "reloads_failed", (double)st->failed);
    cJSON_AddStringToObject(c, "last_reload", st->last_attempt_unix == 0 ? "none"
                                              : st->last_ok             ? "success"
                                                                        : "failure");
    cJSON_AddNumberToObject(c, "last_success_unix", st->last_success_unix);
    if (st->last_attempt_unix) {
        cJSON_AddNumberToObject(c, "last_attempt_unix", st->last_attempt_unix);
    }
    if (!st->last_ok) {
        cJSON_AddStringToObject(c, "last_error", st->last_error);
    }
    cJSON_AddNumberToObject(c, "restart_needed", st->restart_needed);
    cJSON *keys = cJSON_AddArrayToObject(c, "restart_needed_keys");
    for (const char *k = st->restart_keys, *nl; keys && (nl = strchr(k, '\n')); k = nl + 1) {
        char one[sizeof st->restart_keys];
        snprintf(one, sizeof one, "%.*s", (int)(nl - k), k);
        cJSON_AddItemToArray(keys, cJSON_CreateString(one));
    }
}

static void requests_totals(const struct metrics_stream *ms, struct buf *o)
{
    const struct admin_ctx *adm = ms->adm;
    const struct server_metrics *sm = &adm->rt->metrics;
    metrics_help_type(o, "thaw_build_info", "gauge", "thaw version.");
    buf_printf(o, "thaw_build_info{version=\"%s\"} 1\n", THAW_VERSION);
    render_reload_metrics(&adm->rt->reload, o);

    metrics_single(o, "thaw_requests_accepted_total", "counter",
                   "Requests thaw started reading on the proxy port.",
                   sm->requests_accepted);
    metrics_single(o, "thaw_requests_proxied_total", "counter",
                   "Requests answered with a replica's response.",
                   sm->requests_proxied);
    metrics_single(o, "thaw_requests_rejected_total", "counter",
                   "Requests answered with an error response from thaw.",
                   sm->requests_rejected);
    metrics_single(o, "thaw_requests_aborted_total", "counter",
                   "Requests ended without a complete response (client gone, replica broke off).",
                   sm->requests_aborted);
    metrics_single(o, "thaw_requests_inflight", "gauge",
                   "Requests accepted and not yet finished.",
                   adm->rt->inflight);
    metrics_single(o, "thaw_buffered_body_bytes", "gauge",
                   "Request body bytes held (reserved by Content-Length or read), against "
                   "limits.max_buffered_body_bytes.",
                   adm->rt->buffered_body_bytes);
}

static void requests_by_code(const struct model_snap *m, struct buf *o)
{
    const struct code_counts *cc = &m->stats.codes;
    for (int i = 0; i < CODE_SLOTS && cc->code[i]; i++) {
        buf_printf(o, "thaw_requests_total{%s,code=\"%u\"} %llu\n", m->labels, cc->code[i],
                   (unsigned long long)cc->n[i]);
    }
}

static void reasons(const struct metrics_stream *ms, struct buf *o)
{
    const struct server_metrics *sm = &ms->adm->rt->metrics;
    metrics_help_type(o, "thaw_unrouted_responses_total", "counter",
              "Responses to requests that matched no model (thaw's own /v1/models, "
              "errors), by status code.");
    for (int i = 0; i < CODE_SLOTS && sm->unrouted_codes.code[i]; i++) {
        buf_printf(o, "thaw_unrouted_responses_total{code=\"%u\"} %llu\n",
                   sm->unrouted_codes.code[i], (unsigned long long)sm->unrouted_codes.n[i]);
    }

    metrics_help_type(o, "thaw_rejections_total", "counter", "Error responses from thaw, by reason.");
    for (int r = 0; r < REJECT_COUNT; r++) {
        buf_printf(o, "thaw_rejections_total{reason=\"%s\"} %llu\n",
                   reject_info((enum reject_reason)r)->name,
                   (unsigned long long)sm->rejections[r]);
    }
    metrics_help_type(o, "thaw_aborts_total", "counter", "Requests ended without a complete response, by reason.");
    for (int a = 0; a < ABORT_COUNT; a++) {
        buf_printf(o, "thaw_aborts_total{reason=\"%s\"} %llu\n",
                   abort_reason_name((enum abort_reason)a), (unsigned long long)sm->aborts[a]);
    }
}

static void queue_depth(const struct model_snap *m, struct buf *o)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        buf_printf(o, "thaw_queue_depth{%s,tier=\"%s\"} %zu\n", m->labels,
                   tier_name((enum tier)t), m->queue_len[t]);
    }
}

static void queue_depth_all(const struct metrics_stream *ms, struct buf *o)
{
    metrics_single(o, "thaw_queue_depth_all", "gauge",
                   "Requests waiting, all models.",
                   ms->adm->rt->qglobal.total);
}

static void upstream_inflight(const struct model_snap *m, struct buf *o)
{
    buf_printf(o, "thaw_upstream_inflight{%s} %u\n", m->labels, m->inflight);
}

static void replicas_ready(const struct model_snap *m, struct buf *o)
{
    buf_printf(o, "thaw_replicas_ready{%s} %zu\n", m->labels, m->n_endpoints);
}

static void replicas_desired(const struct model_snap *m, struct buf *o)
{
    buf_printf(o, "thaw_replicas_desired{%s} %u\n", m->labels, m->replicas_desired);
}

static void upstream_errors(const struct model_snap *m, struct buf *o)
{
    buf_printf(o, "thaw_upstream_errors_total{%s} %llu\n", m->labels,
               (unsigned long long)m->stats.upstream_errors);
}

static void upstream_response_seconds(const struct model_snap *m, struct buf *o)
{
    histogram_render(&m->stats.upstream_ttfb, o, "thaw_upstream_response_seconds", m->labels);
}

static void queue_wait_seconds(const struct model_snap *m, struct buf *o)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        char labels[600];
        snprintf(labels, sizeof labels, "%s,tier=\"%s\"", m->labels,
                 tier_name((enum tier)t));
        histogram_render(&m->stats.queue_wait[t], o, "thaw_queue_wait_seconds", labels);
    }
}

static void cold_start_seconds(const struct model_snap *m, struct buf *o)
{
    histogram_render_in(&m->stats.cold_start, cs_hist_bounds, o, "thaw_cold_start_seconds",
                        m->labels);
}

/* Only the phases a model's replicas went through: a process model has no
 * scheduling, a model never woken none at all. */
static void cold_start_phase_seconds(const struct model_snap *m, struct buf *o)
{
    for (int p = 0; p < CS_PHASES; p++) {
        if (!m->stats.cold_phase[p].count) {
            continue;
        }
        char labels[600];
        snprintf(labels, sizeof labels, "%s,phase=\"%s\"", m->labels,
                 cs_phase_name((enum cs_phase)p));
        histogram_render_in(&m->stats.cold_phase[p], cs_hist_bounds, o,
                            "thaw_cold_start_phase_seconds", labels);
    }
}

static void wake_seconds(const struct model_snap *m, struct buf *o)
{
    histogram_render(&m->stats.wake, o, "thaw_wake_from_sleep_seconds", m->labels);
}

static void sleep_events(const struct model_snap *m, struct buf *o)
{
    const struct model_stats *st = &m->stats;
    const struct {
        const char *event;
        uint64_t n;
    } rows[] = {{"sleep", st->sleeps}, {"sleep_failed", st->sleep_failures},
                {"wake", st->wakes}, {"wake_failed", st->wake_failures}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].n) {
            buf_printf(o, "thaw_sleep_events_total{%s,event=\"%s\"} %llu\n", m->labels,
                       rows[i].event, (unsigned long long)rows[i].n);
        }
    }
}

/* Each backend's own families (the Kubernetes client's, leadership). */
static void backend_families(const struct metrics_stream *ms, struct buf *o)
{
    struct backend *bs[ADMIN_MAX_BACKENDS];
    size_t n = ms->adm->backends(ms->adm->ud, bs);
    for (size_t i = 0; i < n; i++) {
        if (bs[i]->ops->render_metrics) {
            bs[i]->ops->render_metrics(bs[i], o);
        }
    }
}

static void pool_decisions(const struct model_snap *m, struct buf *o)
{
    for (int a = 0; a < WP_ACTIONS; a++) {
        if (m->stats.pool_decisions[a]) {
            buf_printf(o, "thaw_pool_decisions_total{%s,action=\"%s\"} %llu\n", m->labels,
                       wp_action_name((enum wp_action)a),
                       (unsigned long long)m->stats.pool_decisions[a]);
        }
    }
}

static void pool_slices(const struct metrics_stream *ms, struct buf *o)
{
    metrics_help_type(o, "thaw_pool_slices", "gauge",
              "GPU slices held by replicas, by tier and whether only the warm pool keeps them.");
    unsigned held[TIER_COUNT][2] = {{0}};
    for (size_t i = 0; i < ms->n_models; i++) {
        const struct model_snap *m = &ms->models[i];
        held[m->priority][m->pool_warm ? 1 : 0] += m->pool_slices;
    }
    for (int t = 0; t < TIER_COUNT; t++) {
        for (int w = 0; w < 2; w++) {
            buf_printf(o, "thaw_pool_slices{tier=\"%s\",warm=\"%s\"} %u\n", tier_name((enum tier)t),
                       w ? "true" : "false", held[t][w]);
        }
    }
}

static void connections(const struct metrics_stream *ms, struct buf *o)
{
    const struct admin_ctx *adm = ms->adm;
    const struct server_metrics *sm = &adm->rt->metrics;
    metrics_single(o, "thaw_connections", "gauge",
                   "Open client connections on the proxy port.",
                   adm->rt->n_conns);
    metrics_single(o, "thaw_max_connections", "gauge",
                   "Client connections allowed on the proxy port: limits.max_connections, or "
                   "fewer when the file descriptor limit allows fewer.",
                   adm->rt->max_conns);
    metrics_single(o, "thaw_max_fds", "gauge",
                   "The file descriptor limit (RLIMIT_NOFILE) in force.",
                   adm->rt->fds.limit);
    metrics_single(o, "thaw_connections_accepted_total", "counter",
                   "Client connections accepted.",
                   sm->connections_accepted);
    metrics_single(o, "thaw_connections_rejected_total", "counter",
                   "Client connections refused at the connection limit.",
                   sm->connections_rejected);
    metrics_single(o, "thaw_upstream_connects_total", "counter",
                   "New connections opened to replicas.",
                   sm->upstream_connects);
    metrics_single(o, "thaw_upstream_connect_failures_total", "counter",
                   "Connections to replicas that failed before any byte was sent.",
                   sm->upstream_connect_failures);
    metrics_single(o, "thaw_upstream_reused_total", "counter",
                   "Requests sent over a pooled keep-alive connection.",
                   sm->upstream_reused);
    metrics_single(o, "thaw_upstream_stale_retries_total", "counter",
                   "Requests sent again on a new connection after a pooled one failed before any "
                   "response byte.",
                   sm->upstream_stale_retries);
    metrics_single(o, "thaw_upstream_stale_closed_total", "counter",
                   "Pooled connections found closed by the replica when taken for a request.",
                   sm->upstream_stale_closed);
    metrics_single(o, "thaw_upstream_accept_checks_total", "counter",
                   "Health requests on connections of their own, sent to learn whether a replica "
                   "has accepted new connections that have not answered yet.",
                   sm->upstream_accept_checks);
    metrics_single(o, "thaw_upstream_break_holds_total", "counter",
                   "Replicas that reset or closed a connection before its answer ended, and got "
                   "no more requests until a health request on a connection of its own was "
                   "answered.",
                   sm->upstream_break_holds);
    metrics_single(o, "thaw_upstream_connect_stalls_total", "counter",
                   "Connects to replicas made again after 30 ms without an answer to their SYN "
                   "(a full accept queue drops it); each shrinks how many new connections the "
                   "replica gets at once.",
                   sm->upstream_connect_stalls);
    metrics_single(o, "thaw_upstream_budget_closed_total", "counter",
                   "Pooled replica connections closed so a new one stays within the file "
                   "descriptor budget (replica connections share the clients' limit).",
                   sm->upstream_budget_closed);
    metrics_single(o, "thaw_admin_connections", "gauge",
                   "Open connections on the admin port.",
                   adm->rt->n_admin_conns);
    metrics_single(o, "thaw_lingering_connections", "gauge",
                   "Connections in their lingering close (answered, input being discarded).",
                   adm->rt->net.n_lingering);
    metrics_single(o, "thaw_accept_paused_total", "counter",
                   "Times the listeners paused accepting because file descriptors ran out.",
                   sm->accept_paused);
}

/* Per tenant: cardinality is bounded by the tenants configured (ever, over
 * reloads) plus "default". Rejections list only the reasons that happened. */
static void tenant_families(const struct metrics_stream *ms, struct buf *o)
{
    const struct tenants *ts = &ms->adm->rt->tenants;
    metrics_help_type(o, "thaw_tenant_requests_total", "counter",
                      "Finished requests (any outcome), by tenant.");
    for (size_t i = 0; i < ts->n; i++) {
        buf_printf(o, "thaw_tenant_requests_total{tenant=\"%s\"} %llu\n", ts->all[i]->name,
                   (unsigned long long)ts->all[i]->stats.requests);
    }
    metrics_help_type(o, "thaw_tenant_rejections_total", "counter",
                      "Error responses from thaw, by tenant and reason.");
    for (size_t i = 0; i < ts->n; i++) {
        const struct tenant *t = ts->all[i];
        for (int r = 0; r < REJECT_COUNT; r++) {
            if (t->stats.rejections[r]) {
                buf_printf(o, "thaw_tenant_rejections_total{tenant=\"%s\",reason=\"%s\"} %llu\n",
                           t->name, reject_info((enum reject_reason)r)->name,
                           (unsigned long long)t->stats.rejections[r]);
            }
        }
    }
    metrics_help_type(o, "thaw_tenant_queue_wait_seconds", "histogram",
                      "Time requests waited for a replica slot, by tenant.");
    for (size_t i = 0; i < ts->n; i++) {
        char labels[300];
        snprintf(labels, sizeof labels, "tenant=\"%s\"", ts->all[i]->name);
        histogram_render(&ts->all[i]->stats.queue_wait, o, "thaw_tenant_queue_wait_seconds",
                         labels);
    }
}

/* Per model with revisions: each revision's share now, and the rollout's
 * decisions. */
static void revision_families(const struct metrics_stream *ms, struct buf *o)
{
    struct admin_ctx *adm = ms->adm;
    struct model *m;
    metrics_help_type(o, "thaw_revision_traffic_percent", "gauge",
                      "Share of a model's requests its revision gets, in percent.");
    FOR_EACH_MODEL(adm, m)
    {
        char ns[300] = "";
        if (carries_namespace(m)) {
            snprintf(ns, sizeof ns, ",namespace=\"%s\"", m->namespace_);
        }
        for (size_t i = 0; m->revs && i < m->revs->n; i++) {
            buf_printf(o, "thaw_revision_traffic_percent{model=\"%s\"%s,revision=\"%s\"} %u\n",
                       m->name, ns, m->revs->names[i], model_revision_percent(m, i));
        }
    }
    metrics_help_type(o, "thaw_rollout_decisions_total", "counter",
                      "Rollout decisions on a model's canary, by action (step, promote, "
                      "rollback).");
    FOR_EACH_MODEL(adm, m)
    {
        const struct model_revisions *rv = m->revs;
        if (!rv || !rv->rollout) {
            continue;
        }
        const uint64_t n[3] = {rv->steps, rv->promotions, rv->rollbacks};
        const char *const what[3] = {"step", "promote", "rollback"};
        char ns[300] = "";
        if (carries_namespace(m)) {
            snprintf(ns, sizeof ns, ",namespace=\"%s\"", m->namespace_);
        }
        for (int a = 0; a < 3; a++) {
            buf_printf(o, "thaw_rollout_decisions_total{model=\"%s\"%s,revision=\"%s\","
                          "action=\"%s\"} %llu\n",
                       m->name, ns, rv->names[1], what[a], (unsigned long long)n[a]);
        }
    }
}

static const struct family families[] = {
    {.whole = requests_totals},
    {"thaw_requests_total", "counter", "Finished requests by model and status code.", NULL,
     requests_by_code},
    {.whole = reasons},
    {"thaw_queue_depth", "gauge", "Requests waiting for a replica slot, by model and tier.", NULL,
     queue_depth},
    {.whole = queue_depth_all},
    {"thaw_upstream_inflight", "gauge", "Requests at a replica, by model.", NULL,
     upstream_inflight},
    {"thaw_replicas_ready", "gauge", "Replicas ready to take requests, by model.", NULL,
     replicas_ready},
    {"thaw_replicas_desired", "gauge",
     "Replicas thaw wants for a model (its autoscaler and warm pool).", NULL, replicas_desired},
    {"thaw_upstream_errors_total", "counter",
     "Replica failures (bad or cut-off responses, timeouts), by model.", NULL, upstream_errors},
    {"thaw_upstream_response_seconds", "histogram",
     "Time from dispatch to a replica until its response head, by model.", NULL,
     upstream_response_seconds},
    {"thaw_queue_wait_seconds", "histogram",
     "Time requests waited for a replica slot, by model and tier.", NULL, queue_wait_seconds},
    {"thaw_cold_start_seconds", "histogram",
     "Time from waking a model (process start, or scale-up from zero) to its first ready "
     "replica, by model.",
     NULL, cold_start_seconds},
    {"thaw_cold_start_phase_seconds", "histogram",
     "Time replicas spent in each phase of their cold start (scale, schedule, capacity, "
     "image_pull, container_start, load, health), by model and phase.",
     NULL, cold_start_phase_seconds},
    {"thaw_wake_from_sleep_seconds", "histogram",
     "Time from a request finding a model's replica asleep (sleep mode) to that replica "
     "taking requests again, by model; not counted as a cold start.",
     NULL, wake_seconds},
    {"thaw_sleep_events_total", "counter",
     "Sleep mode by model and event (sleep, sleep_failed, wake, wake_failed); a failure "
     "falls back to stopping the replica, or to a cold start.",
     NULL, sleep_events},
    {.whole = backend_families},
    {"thaw_pool_decisions_total", "counter",
     "Capacity decisions by model and action (keep_warm, to_zero, admit, deny, evict, "
     "preempt, prewarm).",
     NULL, pool_decisions},
    {.whole = pool_slices},
    {.whole = revision_families},
    {.whole = tenant_families},
    {.whole = connections},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

/* Copies what /metrics shows of every model. -ENOMEM on failure. */
static int snapshot_models(struct metrics_stream *ms)
{
    struct admin_ctx *adm = ms->adm;
    size_t n = 0, name_bytes = 0;
    struct model *m;
    FOR_EACH_MODEL(adm, m)
    {
        n++;
        name_bytes += 2 * strlen(m->name) + strlen(m->namespace_) + 64;
    }
    ms->models = calloc(n ? n : 1, sizeof *ms->models);
    ms->names = malloc(name_bytes ? name_bytes : 1);
    if (!ms->models || !ms->names) {
        return -ENOMEM;
    }
    char *at = ms->names;
    FOR_EACH_MODEL(adm, m)
    {
        if (m->revs || m->name_taken) {
            continue; /* a routing entry (its revisions have the series), or a
                       * duplicate whose labels the first one's series carry */
        }
        struct model_snap *s = &ms->models[ms->n_models++];
        size_t len = strlen(m->name) + 1;
        memcpy(at, m->name, len);
        s->name = at;
        at += len;
        /* A revision's series carry its model's name and its own. */
        const char *model = m->parent ? m->parent->name : m->name;
        int w = sprintf(at, "model=\"%s\"", model);
        if (carries_namespace(m)) {
            w += sprintf(at + w, ",namespace=\"%s\"", m->namespace_);
        }
        if (m->parent && m->revision) {
            w += sprintf(at + w, ",revision=\"%s\"", m->revision);
        }
        s->labels = at;
        at += w + 1;
        s->stats = m->stats;
        for (int t = 0; t < TIER_COUNT; t++) {
            s->queue_len[t] = m->queue.len[t];
        }
        s->n_endpoints = m->n_endpoints;
        s->inflight = m->inflight + m->inflight_leaving; /* draining replicas too */
        s->replicas_desired = m->replicas_desired;
        s->pool_slices = m->pool_slices;
        s->priority = m->set.priority;
        s->pool_warm = m->pool_warm;
    }
    return 0;
}

static void stream_free(struct metrics_stream *ms)
{
    if (ms->resume) {
        event_free(ms->resume);
    }
    free(ms->models);
    free(ms->names);
    buf_dispose(&ms->piece);
    free(ms);
}

/* Renders into o until it holds at least `want` bytes or everything is
 * rendered. true when everything is. */
static bool render_more(struct metrics_stream *ms, struct buf *o, size_t want)
{
    while (ms->family < N_FAMILIES && o->len < want) {
        const struct family *f = &families[ms->family];
        if (f->whole) {
            f->whole(ms, o);
            ms->family++;
            continue;
        }
        if (!ms->family_begun) {
            metrics_help_type(o, f->name, f->type, f->help);
            ms->family_begun = true;
        }
        while (ms->next_model < ms->n_models && o->len < want) {
            f->per_model(&ms->models[ms->next_model++], o);
        }
        if (ms->next_model == ms->n_models) {
            ms->family++;
            ms->next_model = 0;
            ms->family_begun = false;
        }
    }
    return ms->family == N_FAMILIES;
}

static struct metrics_stream *stream_new(struct admin_ctx *adm, struct conn *c)
{
    struct metrics_stream *ms = calloc(1, sizeof *ms);
    if (!ms) {
        return NULL;
    }
    ms->adm = adm;
    ms->c = c;
    buf_init(&ms->piece);
    if (snapshot_models(ms)) {
        stream_free(ms);
        return NULL;
    }
    return ms;
}

static void on_resume(evutil_socket_t fd, short what, void *arg);

/* Writes the next piece of the answer, then lets the loop go round (or, when
 * the client is behind, waits for its output to drain). */
static void stream_step(struct metrics_stream *ms)
{
    struct conn *c = ms->c;
    struct buf *o = &ms->piece;
    buf_reset(o);
    if (ms->chunked) {
        buf_append_str(o, "0000000000\r\n"); /* room for the chunk size, patched below */
    }
    size_t start = o->len;
    bool done = render_more(ms, o, start + METRICS_CHUNK_BYTES);
    size_t body = o->len - start;
    if (ms->chunked) {
        char size[16];
        int n = snprintf(size, sizeof size, "%zx\r\n", body);
        size_t skip = start - (size_t)n;
        memcpy(o->data + skip, size, (size_t)n);
        o->off = skip;
        if (body == 0) {
            o->len = start; /* a last empty piece: only the end marker below */
            o->off = start;
        } else {
            buf_append_str(o, "\r\n");
        }
        if (done) {
            buf_append_str(o, "0\r\n\r\n");
        }
    }
    if (buf_unread(o) > 0 && conn_write(c, buf_read_ptr(o), buf_unread(o)) != 0) {
        return; /* the connection is going away: admin_on_abort frees the stream */
    }
    if (done) {
        struct request *r = request_of(c->ex);
        r->metrics_stream = NULL;
        stream_free(ms);
        c->on_drain = NULL;
        conn_response_done(c);
        return;
    }
    if (conn_out_pending(c) > CONN_OUT_HIGH_WATER) {
        return; /* on_stream_drain resumes */
    }
    struct timeval zero = {0, 0};
    event_add(ms->resume, &zero);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    stream_step(arg);
}

static void on_stream_drain(struct conn *c)
{
    struct metrics_stream *ms = c->ex ? request_of(c->ex)->metrics_stream : NULL;
    if (ms && !event_pending(ms->resume, EV_TIMEOUT, NULL)) {
        struct timeval zero = {0, 0};
        event_add(ms->resume, &zero);
    }
}

/* GET /metrics: the head now, the body in pieces (chunked for HTTP/1.1,
 * else up to the close). */
static void serve_metrics(struct conn *c, struct request *r)
{
    struct admin_ctx *adm = adm_of(c);
    static const char type[] = "text/plain; version=0.0.4; charset=utf-8";
    bool http11 = r->ex.head.http_major == 1 && r->ex.head.http_minor >= 1;
    bool head_only = r->ex.head.method == HTTP_HEAD;
    struct metrics_stream *ms = head_only ? NULL : stream_new(adm, c);
    if (ms) {
        ms->resume = evtimer_new(adm->rt->base, on_resume, ms);
        if (!ms->resume) {
            stream_free(ms);
            ms = NULL;
        }
    }
    if (!ms && !head_only) {
        static const char oom[] = "{\"error\":{\"type\":\"internal_error\",\"message\":"
                                  "\"thaw ran out of resources\",\"code\":500}}\n";
        conn_respond(c, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    if (!http11 || !r->ex.head.keep_alive || adm->rt->net.draining) {
        c->close_after = true;
    }
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s%s\r\n", type,
                     http11 ? "Transfer-Encoding: chunked\r\n" : "",
                     c->close_after ? "Connection: close\r\n" : "");
    r->ex.state = REQ_ANSWERED;
    r->ex.response_started = true;
    if (head_only) {
        conn_write(c, head, (size_t)n);
        conn_response_done(c);
        return;
    }
    ms->chunked = http11;
    r->metrics_stream = ms;
    c->on_drain = on_stream_drain;
    if (conn_write(c, head, (size_t)n) != 0) {
        return;
    }
    stream_step(ms);
}

static void admin_on_abort(struct conn *c, struct exchange *x, enum abort_reason reason)
{
    struct request *r = request_of(x);
    if (r->metrics_stream) {
        stream_free(r->metrics_stream);
        r->metrics_stream = NULL;
        c->on_drain = NULL;
    }
}

/* The configured tenants (and "default"): settings and totals. */
static void status_tenants(const struct tenants *ts, cJSON *root)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "tenants");
    for (size_t i = 0; i < ts->n; i++) {
        const struct tenant *t = ts->all[i];
        cJSON *jt = cJSON_CreateObject();
        cJSON_AddStringToObject(jt, "name", t->name);
        cJSON_AddStringToObject(jt, "tier", tier_name(t->tier));
        cJSON_AddNumberToObject(jt, "weight", t->weight);
        if (t->max_concurrency != UINT64_MAX) {
            cJSON_AddNumberToObject(jt, "max_concurrency", (double)t->max_concurrency);
        }
        if (t->max_queue != UINT64_MAX) {
            cJSON_AddNumberToObject(jt, "max_queue", (double)t->max_queue);
        }
        cJSON_AddBoolToObject(jt, "removed", t->removed);
        cJSON_AddNumberToObject(jt, "requests", (double)t->stats.requests);
        cJSON_AddItemToArray(arr, jt);
    }
}

/* A model's tenants with requests waiting or running there. */
static void status_rollout(const struct model_revisions *rv, cJSON *jm, uint64_t now)
{
    cJSON *ro = cJSON_AddObjectToObject(jm, "rollout");
    cJSON_AddStringToObject(ro, "stage", rollout_stage_name(rv->state.stage));
    cJSON_AddStringToObject(ro, "canary", rv->names[1]);
    cJSON_AddNumberToObject(ro, "canary_percent", rv->state.canary_percent);
    cJSON_AddNumberToObject(ro, "step_percent", rv->policy.step_percent);
    cJSON_AddNumberToObject(ro, "step_interval_ms", (double)rv->policy.step_interval_ms);
    cJSON_AddNumberToObject(ro, "step_age_ms",
                            now > rv->state.step_started_ms
                                ? (double)(now - rv->state.step_started_ms)
                                : 0);
    cJSON_AddNumberToObject(ro, "steps", (double)rv->steps);
    cJSON_AddNumberToObject(ro, "promotions", (double)rv->promotions);
    cJSON_AddNumberToObject(ro, "rollbacks", (double)rv->rollbacks);
    if (rv->last.why[0]) {
        cJSON_AddStringToObject(ro, "last_action", rollout_action_name(rv->last.action));
        cJSON_AddStringToObject(ro, "last_reason", rv->last.why);
    }
}

/* A model with revisions: its split and rollout; a revision: whose it is. */
static void status_revisions(const struct model *m, cJSON *jm, uint64_t now)
{
    if (m->parent && m->revision) {
        cJSON_AddStringToObject(jm, "model", m->parent->name);
        cJSON_AddStringToObject(jm, "revision", m->revision);
    }
    const struct model_revisions *rv = m->revs;
    if (!rv) {
        return;
    }
    cJSON *list = cJSON_AddArrayToObject(jm, "revisions");
    for (size_t i = 0; i < rv->n; i++) {
        const struct model *r = rv->rev[i];
        cJSON *jr = cJSON_CreateObject();
        cJSON_AddStringToObject(jr, "name", rv->names[i]);
        cJSON_AddNumberToObject(jr, "percent", rv->split.percent[i]);
        cJSON_AddBoolToObject(jr, "stable", i == rv->stable);
        if (r) {
            cJSON_AddStringToObject(jr, "model", r->name);
            cJSON_AddNumberToObject(jr, "replicas_ready", (double)r->n_endpoints);
            cJSON_AddNumberToObject(jr, "requests",
                                    (double)(r->stats.proxied + r->stats.rejected +
                                             r->stats.aborted));
            cJSON_AddNumberToObject(jr, "errors", (double)r->stats.failed);
        }
        cJSON_AddItemToArray(list, jr);
    }
    cJSON_AddBoolToObject(jm, "fallback_to_warm_revision", rv->fallback);
    if (rv->sticky_header) {
        cJSON_AddStringToObject(jm, "sticky_header", rv->sticky_header);
    }
    cJSON_AddBoolToObject(jm, "sticky_tenant", rv->sticky_tenant);
    if (rv->rollout) {
        status_rollout(rv, jm, now);
    }
}

static void status_model_tenants(const struct tenants *ts, const struct model *m, cJSON *jq)
{
    cJSON *obj = cJSON_AddObjectToObject(jq, "tenants");
    for (size_t i = 0; i < ts->n; i++) {
        const struct queue_flow *f = queue_flow(&m->queue, ts->all[i]->id);
        if (f && (f->queued || f->running)) {
            cJSON *jt = cJSON_AddObjectToObject(obj, ts->all[i]->name);
            cJSON_AddNumberToObject(jt, "waiting", (double)f->queued);
            cJSON_AddNumberToObject(jt, "running", (double)f->running);
        }
    }
}

/* The cold start in progress (its phase and how long it has run) and what
 * the model's history expects of it. */
static void status_cold_start(const struct model *m, uint64_t now, cJSON *jm)
{
    const struct coldstart *c = &m->cold;
    uint64_t expected = coldstart_expected_ms(c);
    if (expected) {
        cJSON_AddNumberToObject(jm, "cold_start_expected_ms", (double)expected);
    }
    if (!c->started_ms) {
        return;
    }
    cJSON *jc = cJSON_AddObjectToObject(jm, "cold_start");
    cJSON_AddStringToObject(jc, "phase", cs_phase_name(c->phase));
    cJSON_AddNumberToObject(jc, "elapsed_ms", (double)(now - c->started_ms));
    cJSON_AddNumberToObject(jc, "phase_elapsed_ms",
                            (double)(now > c->phase_since_ms ? now - c->phase_since_ms : 0));
    uint64_t rem;
    if (coldstart_remaining_ms(c, now, &rem)) {
        cJSON_AddNumberToObject(jc, "expected_remaining_ms", (double)rem);
    } else {
        cJSON_AddNullToObject(jc, "expected_remaining_ms");
    }
}

/* What the descriptor limit allows, and what it keeps free of clients. */
static void status_fds(const struct fdbudget *b, cJSON *root)
{
    cJSON *j = cJSON_AddObjectToObject(root, "file_descriptors");
    cJSON_AddNumberToObject(j, "limit", (double)b->limit);
    cJSON_AddNumberToObject(j, "open_at_start", (double)b->in_use);
    cJSON_AddNumberToObject(j, "reserve", (double)b->reserve);
    cJSON_AddNumberToObject(j, "allows_connections", (double)b->max_connections);
}

/* A /status this large gives its memory back when answered. */
#define ADMIN_TRIM_BYTES (1024 * 1024)

static void render_status(struct admin_ctx *adm, struct buf *out)
{
    cJSON *root = cJSON_CreateObject();
    uint64_t now = clock_now_ms();
    cJSON_AddStringToObject(root, "version", THAW_VERSION);
    cJSON_AddNumberToObject(root, "uptime_ms", (double)(now - adm->rt->started_ms));
    status_reload(adm, root);
    cJSON_AddBoolToObject(root, "ready", adm->is_ready(adm->ud));
    cJSON_AddBoolToObject(root, "draining", adm->rt->net.draining);
    cJSON_AddNumberToObject(root, "inflight", (double)adm->rt->inflight);
    cJSON_AddNumberToObject(root, "queued", (double)adm->rt->qglobal.total);
    cJSON_AddNumberToObject(root, "connections", (double)adm->rt->n_conns);
    cJSON_AddNumberToObject(root, "max_connections", (double)adm->rt->max_conns);
    status_fds(&adm->rt->fds, root);
    struct backend *backends[ADMIN_MAX_BACKENDS];
    size_t n_backends = adm->backends(adm->ud, backends);
    for (size_t i = 0; i < n_backends; i++) {
        if (backends[i]->ops->describe_capacity) {
            backends[i]->ops->describe_capacity(backends[i], root);
        }
    }
    status_tenants(&adm->rt->tenants, root);
    cJSON *models = cJSON_AddArrayToObject(root, "models");
    struct model *m;
    FOR_EACH_MODEL(adm, m)
    {
        cJSON *jm = cJSON_CreateObject();
        cJSON_AddStringToObject(jm, "name", m->name);
        cJSON_AddStringToObject(jm, "namespace", m->namespace_);
        cJSON_AddStringToObject(jm, "priority", tier_name(m->set.priority));
        cJSON_AddNumberToObject(jm, "max_concurrency", m->set.max_concurrency);
        cJSON_AddNumberToObject(jm, "inflight", m->inflight + m->inflight_leaving);
        cJSON_AddNumberToObject(jm, "capacity", model_capacity(m));
        status_revisions(m, jm, now);
        if (m->backend) {
            m->backend->ops->describe(m->backend, m, jm);
        }
        status_cold_start(m, now, jm);
        cJSON *q = cJSON_AddObjectToObject(jm, "queue");
        for (int t = 0; t < TIER_COUNT; t++) {
            cJSON_AddNumberToObject(q, tier_name((enum tier)t), (double)m->queue.len[t]);
        }
        cJSON_AddNumberToObject(q, "max", (double)m->queue.max);
        cJSON_AddNumberToObject(q, "oldest_wait_ms", (double)queue_oldest_age(&m->queue, now));
        status_model_tenants(&adm->rt->tenants, m, q);
        cJSON *reps = cJSON_AddArrayToObject(jm, "replicas");
        for (size_t i = 0; i < m->n_endpoints; i++) {
            struct endpoint *ep = m->endpoints[i];
            cJSON *je = cJSON_CreateObject();
            cJSON_AddStringToObject(je, "id", ep->id);
            cJSON_AddStringToObject(je, "address", ep->addr_text);
            cJSON_AddNumberToObject(je, "inflight", ep->inflight);
            cJSON_AddBoolToObject(je, "ejected", ep->ejected_until_ms > now);
            cJSON_AddNumberToObject(je, "requests", (double)ep->requests);
            cJSON_AddNumberToObject(je, "connect_failures", (double)ep->connect_failures);
            cJSON_AddNumberToObject(je, "idle_connections", ep->n_idle);
            cJSON_AddItemToArray(reps, je);
        }
        cJSON_AddItemToArray(models, jm);
    }
    char *s = cJSON_PrintUnformatted(root);
    if (s) {
        /* Names and errors from files and clusters may hold any bytes. */
        buf_append_utf8_repaired(out, s, strlen(s));
        buf_append(out, "\n", 1);
        free(s);
    }
    cJSON_Delete(root);
}

/* The backend that answers GET /demand (one with peers), or NULL. */
static struct backend *demand_backend(struct admin_ctx *adm)
{
    struct backend *bs[ADMIN_MAX_BACKENDS];
    size_t n = adm->backends(adm->ud, bs);
    for (size_t i = 0; i < n; i++) {
        if (bs[i]->ops->demand) {
            return bs[i];
        }
    }
    return NULL;
}

static void admin_on_request(struct conn *c, struct exchange *x)
{
    struct request *r = request_of(x);
    struct admin_ctx *adm = adm_of(c);
    const char *target = http_target(&r->ex.head);
    size_t len = r->ex.head.target_len;
    const char *q = memchr(target, '?', len);
    if (q) {
        len = (size_t)(q - target);
    }
    struct buf body;
    buf_init(&body);
    if (r->ex.head.method != HTTP_GET && r->ex.head.method != HTTP_HEAD) {
        buf_append_str(&body, "{\"error\":{\"type\":\"method_not_allowed\",\"message\":\"the admin "
                              "port is read-only\",\"code\":405}}\n");
        conn_respond(c, 405, "application/json", body.data, body.len, "Allow: GET, HEAD\r\n");
    } else if (http_name_eq(target, len, "/healthz")) {
        conn_respond(c, 200, "application/json", "{\"status\":\"ok\"}\n", 16, NULL);
    } else if (http_name_eq(target, len, "/readyz")) {
        if (adm->is_ready(adm->ud)) {
            conn_respond(c, 200, "application/json", "{\"status\":\"ready\"}\n", 19, NULL);
        } else {
            const char *b = adm->rt->net.draining ? "{\"status\":\"draining\"}\n"
                                          : "{\"status\":\"starting\"}\n";
            conn_respond(c, 503, "application/json", b, strlen(b), NULL);
        }
    } else if (http_name_eq(target, len, "/metrics")) {
        serve_metrics(c, r);
    } else if (http_name_eq(target, len, "/demand") && demand_backend(adm)) {
        struct backend *be = demand_backend(adm);
        cJSON *d = cJSON_CreateObject();
        be->ops->demand(be, d);
        char *js = cJSON_PrintUnformatted(d);
        cJSON_Delete(d);
        conn_respond(c, 200, "application/json", js ? js : "{}", js ? strlen(js) : 2, NULL);
        free(js);
    } else if (http_name_eq(target, len, "/status")) {
        render_status(adm, &body);
        conn_respond(c, 200, "application/json", body.data, body.len, NULL);
        if (body.len > ADMIN_TRIM_BYTES) {
            /* The tree of thousands of models is freed: hand its pages back
             * (as they sit above the heap's live data, they would stay). */
            buf_dispose(&body);
            malloc_trim(0);
        }
    } else {
        buf_append_str(&body, "{\"error\":{\"type\":\"not_found\",\"message\":\"admin paths: "
                              "/healthz /readyz /metrics /status\",\"code\":404}}\n");
        conn_respond(c, 404, "application/json", body.data, body.len, NULL);
    }
    buf_dispose(&body);
}

/* Admin requests come from the same cache as proxy ones; they are not
 * counted as proxy outcomes. */
static struct exchange *admin_new_exchange(struct conn *c)
{
    struct request *r = request_new(&adm_of(c)->rt->requests, c);
    return r ? &r->ex : NULL;
}

static void admin_free_exchange(struct conn *c, struct exchange *x)
{
    request_free(&adm_of(c)->rt->requests, request_of(x));
}

const struct conn_handler admin_conn_handler = {
    .new_exchange = admin_new_exchange,
    .free_exchange = admin_free_exchange,
    .on_request = admin_on_request,
    .on_abort = admin_on_abort,
};

#include "thaw/request.h"
#include "thaw/clock.h"
#include "thaw/conn.h"
#include "thaw/log.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Cached request objects keep buffers up to these sizes. */
#define CACHE_KEEP_HEAD_BYTES (8 * 1024)
#define CACHE_KEEP_BODY_BYTES (64 * 1024)

struct request *request_new(struct request_pool *pool, struct conn *c)
{
    struct request *r;
    struct list_node *n = list_first(&pool->free);
    if (n) {
        list_remove(n);
        pool->n_free--;
        r = container_of(n, struct request, cache_node);
    } else {
        r = calloc(1, sizeof *r);
        if (!r) {
            return NULL;
        }
        http_head_init(&r->ex.head);
        buf_init(&r->ex.body);
        buf_init(&r->fwd.head);
    }
    list_node_init(&r->qi.node);
    list_node_init(&r->cache_node);
    r->conn = c;
    r->fwd.conn = c;
    r->fwd.ex = &r->ex;
    r->model = NULL;
    r->ex.state = REQ_READING;
    r->ex.committed = false;
    r->ex.error_model = NULL;
    r->start_ms = clock_now_ms();
    r->queued_ms = r->fwd.dispatch_ms = 0;
    r->fwd.up = NULL;
    r->fwd.last_ep = NULL;
    r->fwd.tries = 0;
    r->counted = false;
    r->fwd.stale_retried = false;
    r->ex.response_started = false;
    r->model_resolved = false;
    r->fwd.heartbeat = false;
    r->body_seen = 0;
    r->body_reserved = 0;
    r->scan = NULL;
    r->form = NULL;
    r->body_scanned = false;
    r->stream_asked = false;
    r->models_api = false;
    r->asked_model[0] = '\0';
    r->metrics_stream = NULL;
    r->tier = TIER_STANDARD;
    r->has_asked_tier = false;
    r->tenant = NULL;
    r->tenant_running = false;
    r->qi.flow = 0;
    return r;
}

void request_free(struct request_pool *pool, struct request *r)
{
    assert(!list_linked(&r->qi.node));
    assert(r->fwd.up == NULL);
    request_release_tenant_slot(r);
    if (r->model) {
        model_unref(r->model);
        r->model = NULL;
    }
    *pool->buffered_body_bytes -= r->body_reserved;
    r->body_reserved = 0;
    free(r->scan);
    r->scan = NULL;
    free(r->form);
    r->form = NULL;
    if (pool->n_free < REQUEST_CACHE_MAX) {
        http_head_reset(&r->ex.head);
        buf_reset(&r->ex.body);
        buf_reset(&r->fwd.head);
        if (r->ex.head.bytes.cap > CACHE_KEEP_HEAD_BYTES) {
            buf_dispose(&r->ex.head.bytes);
        }
        if (r->ex.body.cap > CACHE_KEEP_BODY_BYTES) {
            buf_dispose(&r->ex.body);
        }
        if (r->fwd.head.cap > CACHE_KEEP_HEAD_BYTES) {
            buf_dispose(&r->fwd.head);
        }
        list_push_front(&pool->free, &r->cache_node);
        pool->n_free++;
        return;
    }
    http_head_dispose(&r->ex.head);
    buf_dispose(&r->ex.body);
    buf_dispose(&r->fwd.head);
    free(r);
}

/* The access log line: the path without its query (queries can carry keys)
 * nor an absolute-form authority (it can carry userinfo). */
static void access_log(const struct request_pool *pool, struct request *r, const char *outcome, int status,
                       const char *reason)
{
    if (!pool->access_log || !log_enabled(LOG_INFO)) {
        return;
    }
    const char *t;
    size_t len;
    http_target_log_path(&r->ex.head, &t, &len);
    char path[200];
    log_quote(path, sizeof path, t, len, 120);
    LOGI("request",
         "model=%s tier=%s method=%s path=%s status=%d outcome=%s reason=%s "
         "ms=%llu client=%s tenant=%s",
         r->model && r->model_resolved ? r->model->name : "-", tier_name(r->tier),
         r->ex.head.method_known ? llhttp_method_name((llhttp_method_t)r->ex.head.method) : "-",
         path, status, outcome, reason, (unsigned long long)(clock_now_ms() - r->start_ms),
         r->conn->peer_ip, r->tenant ? r->tenant->name : "-");
}

void request_hold_tenant_slot(struct request *r)
{
    if (!r->tenant_running && r->tenant && r->model) {
        queue_flow_started(&r->model->queue, r->tenant->id);
        r->tenant_running = true;
    }
}

void request_release_tenant_slot(struct request *r)
{
    if (r->tenant_running) {
        queue_flow_finished(&r->model->queue, r->tenant->id);
        r->tenant_running = false;
    }
}

static void finish(struct request_pool *pool, struct request *r)
{
    assert(!r->counted);
    r->counted = true;
    request_release_tenant_slot(r);
    if (r->tenant) {
        r->tenant->stats.requests++;
    }
    (*pool->inflight)--;
}

/* Its model's series count it: the model is still there. One a reload
 * removes takes its series along, so answers given as it goes (503
 * model_removed) and after (requests that were at its replicas) count as
 * unrouted, or no scrape would ever see them. */
static bool model_counts(const struct request *r)
{
    return r->model && !r->model->removing;
}

void request_count_proxied(struct request_pool *pool, struct request *r, int status)
{
    if (r->counted) {
        return;
    }
    pool->metrics->requests_proxied++;
    if (model_counts(r)) {
        r->model->stats.proxied++;
        r->model->stats.failed += status >= 500;
        code_counts_add(&r->model->stats.codes, status);
    } else {
        code_counts_add(&pool->metrics->unrouted_codes, status); /* GET /v1/models, ... */
    }
    access_log(pool, r, "proxied", status, "-");
    finish(pool, r);
}

void request_count_rejected(struct request_pool *pool, struct request *r, enum reject_reason reason)
{
    if (r->counted) {
        return;
    }
    pool->metrics->requests_rejected++;
    pool->metrics->rejections[reason]++;
    if (r->tenant) {
        r->tenant->stats.rejections[reason]++;
    }
    int status = reject_info(reason)->status;
    if (model_counts(r) && r->model_resolved) {
        r->model->stats.rejected++;
        r->model->stats.rejections[reason]++;
        r->model->stats.failed += status >= 500;
        code_counts_add(&r->model->stats.codes, status);
    } else {
        code_counts_add(&pool->metrics->unrouted_codes, status);
    }
    access_log(pool, r, "rejected", status, reject_info(reason)->name);
    finish(pool, r);
}

void request_count_aborted(struct request_pool *pool, struct request *r, enum abort_reason reason)
{
    if (r->counted) {
        return;
    }
    pool->metrics->requests_aborted++;
    pool->metrics->aborts[reason]++;
    if (r->model && r->model_resolved) {
        r->model->stats.aborted++;
        r->model->stats.failed +=
            reason == ABORT_UPSTREAM_CLOSED || reason == ABORT_UPSTREAM_TIMEOUT;
    }
    access_log(pool, r, "aborted", 0, abort_reason_name(reason));
    finish(pool, r);
}


void request_pool_init(struct request_pool *pool, struct server_metrics *metrics,
                       uint64_t *inflight, uint64_t *buffered_body_bytes)
{
    list_init(&pool->free);
    pool->n_free = 0;
    pool->metrics = metrics;
    pool->inflight = inflight;
    pool->buffered_body_bytes = buffered_body_bytes;
    pool->access_log = false;
}

void request_pool_dispose(struct request_pool *pool)
{
    while (!list_empty(&pool->free)) {
        struct request *r = container_of(list_first(&pool->free), struct request, cache_node);
        list_remove(&r->cache_node);
        http_head_dispose(&r->ex.head);
        buf_dispose(&r->ex.body);
        buf_dispose(&r->fwd.head);
        free(r);
    }
    pool->n_free = 0;
}

#include "thaw/proxy.h"
#include "thaw/clock.h"
#include "thaw/backend.h"
#include "thaw/conn.h"
#include "thaw/log.h"
#include "thaw/server.h"
#include "thaw/upstream.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

/* Requests released per loop turn (see proxy_dispatch). */
#define PROXY_DISPATCH_BATCH 32
/* Connection attempts per request before it is answered 502. */
#define PROXY_MAX_TRIES 16
static struct server *server_of(struct model *m)
{
    return m->fleet->cb_ud;
}

static void on_queue_timer(evutil_socket_t fd, short what, void *arg);

static void arm_queue_timer(struct server *srv, struct model *m)
{
    uint64_t next = queue_next_deadline(&m->queue);
    if (next == UINT64_MAX) {
        if (m->queue_timer) {
            event_del(m->queue_timer);
        }
        return;
    }
    if (!m->queue_timer) {
        m->queue_timer = evtimer_new(srv->base, on_queue_timer, m);
        if (!m->queue_timer) {
            return;
        }
    }
    uint64_t now = clock_now_ms();
    uint64_t wait = next > now ? next - now : 0;
    struct timeval tv = clock_timeval(wait);
    event_add(m->queue_timer, &tv);
}

static void on_queue_timer(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    struct server *srv = server_of(m);
    uint64_t now = clock_now_ms();
    struct queue_item *it;
    while ((it = queue_pop_expired(&m->queue, now))) {
        struct request *r = container_of(it, struct request, qi);
        r->state = REQ_ROUTED;
        LOGI("queue deadline passed", "model=%s tier=%s waited_ms=%llu", m->name,
             tier_name(r->tier), (unsigned long long)(now - r->queued_ms));
        conn_reject(r->conn, REJECT_QUEUE_TIMEOUT, NULL);
    }
    arm_queue_timer(srv, m);
}

/* Reads the thaw-priority header once, at the head, into r->asked_tier.
 * -1 when it is not a tier. */
static int parse_priority(struct request *r)
{
    r->has_asked_tier = false;
    const struct http_header *h = http_head_find(&r->head, "thaw-priority");
    if (!h) {
        return 0;
    }
    if (tier_parse(http_hvalue(&r->head, h), h->value_len, &r->asked_tier)) {
        return -1;
    }
    r->has_asked_tier = true;
    return 0;
}

/* The tier a request runs at: the thaw-priority header as the operator
 * allows it (limits.priority_header), else the model's priority. */
static enum tier effective_tier(const struct server *srv, const struct request *r)
{
    enum tier model_tier = r->model->set.priority;
    enum tier asked = r->asked_tier;
    if (!r->has_asked_tier) {
        return model_tier;
    }
    switch (srv->cfg->limits.priority_header) {
    case PRIORITY_HEADER_IGNORE:
        return model_tier;
    case PRIORITY_HEADER_LOWER_ONLY:
        return asked > model_tier ? asked : model_tier;
    default:
        return asked;
    }
}

static int reserve_body(struct server *srv, struct request *r, uint64_t bytes);

int proxy_on_head(struct conn *c, struct request *r)
{
    struct server *srv = c->srv;
    if (r->head.method == HTTP_CONNECT) {
        return REJECT_METHOD_NOT_ALLOWED;
    }
    if (parse_priority(r) < 0) {
        return REJECT_BAD_PRIORITY;
    }
    enum route_status st = router_resolve_head(&srv->fleet.router, &r->head, &r->route);
    if (st == ROUTE_FOUND) {
        r->model = r->route.target;
        model_ref(r->model);
        r->model_resolved = true;
        r->tier = effective_tier(srv, r);
    } else if (st == ROUTE_NEED_BODY) {
        r->scan = malloc(sizeof *r->scan);
        if (!r->scan) {
            return REJECT_INTERNAL;
        }
        jsonscan_init(r->scan);
    } else if (st != ROUTE_AMBIGUOUS) {
        return REJECT_UNKNOWN_MODEL;
    } /* ambiguous: answered once the body is read (proxy_on_request) */
    /* A declared length is reserved whole at the head, so a body that
     * cannot be held is refused before any of it is read. */
    return r->head.has_length ? reserve_body(srv, r, r->head.content_length) : REJECT_COUNT;
}

/* Grows r's share of the body budget to `bytes`. REJECT_COUNT when it fits;
 * REJECT_BODY_BUFFER_FULL when the bodies held now leave no room for it
 * (worth retrying); REJECT_BODY_TOO_LARGE when it could never fit. */
static int reserve_body(struct server *srv, struct request *r, uint64_t bytes)
{
    uint64_t limit = srv->cfg->limits.max_buffered_body_bytes;
    if (bytes <= r->body_reserved) {
        return REJECT_COUNT;
    }
    if (bytes > limit) {
        return REJECT_BODY_TOO_LARGE;
    }
    uint64_t more = bytes - r->body_reserved;
    if (srv->buffered_body_bytes + more > limit) {
        LOGI("request body over the buffer budget", "held=%llu asked=%llu limit=%llu",
             (unsigned long long)srv->buffered_body_bytes, (unsigned long long)more,
             (unsigned long long)limit);
        return REJECT_BODY_BUFFER_FULL;
    }
    srv->buffered_body_bytes += more;
    r->body_reserved = bytes;
    return REJECT_COUNT;
}

/* 409 naming the models a bare name could mean. */
static void reject_ambiguous(struct conn *c, const char *name, size_t len, bool host)
{
    char candidates[400];
    router_candidates(&c->srv->fleet.router, name, len, host, candidates, sizeof candidates);
    conn_reject(c, REJECT_AMBIGUOUS_MODEL, candidates);
}

/* Takes the model the body named (early, while the body still arrives). */
static void route_by_body(struct server *srv, struct request *r)
{
    r->model = r->route.target;
    model_ref(r->model);
    r->model_resolved = true;
    /* route.path_* still describe the target from the head: origin-form,
     * without an absolute-form scheme and authority. */
    r->tier = effective_tier(srv, r);
}

/* Feeds the body's new bytes to the scan (at_end: the body is complete).
 * Returns false after rejecting the request. */
static bool scan_body(struct conn *c, struct request *r, bool at_end)
{
    struct server *srv = c->srv;
    struct jsonscan *scan = r->scan;
    enum jsonscan_status js = scan->status;
    if (js == JSONSCAN_MORE && r->body.len > r->body_seen) {
        js = jsonscan_feed(scan, r->body.data + r->body_seen, r->body.len - r->body_seen);
    }
    if (js == JSONSCAN_MORE && at_end) {
        js = jsonscan_finish(scan);
    }
    enum route_status st = router_resolve_scan(&srv->fleet.router, js, scan, &r->route);
    if (st == ROUTE_NEED_BODY) {
        return true;
    }
    char why[160];
    if (st == ROUTE_BAD_JSON) {
        jsonscan_error(scan, why, sizeof why);
    }
    if (st == ROUTE_AMBIGUOUS) {
        size_t len;
        const char *name = jsonscan_model(scan, &len);
        reject_ambiguous(c, name, len, false);
        free(r->scan);
        r->scan = NULL;
        return false;
    }
    free(r->scan);
    r->scan = NULL;
    switch (st) {
    case ROUTE_FOUND:
        route_by_body(srv, r);
        return true;
    case ROUTE_BAD_JSON:
        conn_reject(c, REJECT_BAD_JSON, why);
        return false;
    case ROUTE_NO_MODEL_FIELD:
        conn_reject(c, REJECT_NO_MODEL_FIELD, NULL);
        return false;
    default:
        conn_reject(c, REJECT_UNKNOWN_MODEL, NULL);
        return false;
    }
}

bool proxy_on_body(struct conn *c, struct request *r)
{
    if (r->body.len <= r->body_seen) {
        return true;
    }
    /* Chunked bodies (no declared length) are counted as they grow. */
    int rc = reserve_body(c->srv, r, r->body.len);
    if (rc != REJECT_COUNT) {
        conn_reject(c, (enum reject_reason)rc, NULL);
        return false;
    }
    if (r->scan && !scan_body(c, r, false)) {
        return false;
    }
    r->body_seen = r->body.len;
    return true;
}

static void start_at(struct server *srv, struct request *r, struct endpoint *ep)
{
    r->state = REQ_UPSTREAM;
    upstream_start(srv, r, ep);
}

/* Cold-start heartbeats: a streaming client held while its model loads gets
 * the event-stream head at once and an SSE comment every
 * loading_heartbeat_ms, so it (and proxies between) do not time out. */
static const char heartbeat_chunk[] = "b\r\n: loading\n\n\r\n";

static bool wants_stream(const struct request *r)
{
    if (r->body.len == 0 || r->body.len > 1024 * 1024) {
        return false;
    }
    /* A scan, not a parse: no tree for a large body on the loop. */
    struct jsonscan scan;
    jsonscan_init_key(&scan, "stream");
    enum jsonscan_status st = jsonscan_feed(&scan, r->body.data, r->body.len);
    if (st == JSONSCAN_MORE) {
        st = jsonscan_finish(&scan);
    }
    return st == JSONSCAN_NO_MODEL && scan.key_is_true;
}

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    bool any = false;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &m->queue.tiers[t])
        {
            struct request *r = container_of(pos, struct request, qi.node);
            if (r->heartbeat) {
                conn_write(r->conn, heartbeat_chunk, sizeof heartbeat_chunk - 1);
                any = true;
            }
        }
    }
    if (any) {
        uint64_t ms = m->set.loading_heartbeat_ms;
        struct timeval tv = clock_timeval(ms);
        event_add(m->heartbeat_timer, &tv);
    }
}

static void start_heartbeat(struct server *srv, struct request *r)
{
    struct model *m = r->model;
    struct conn *c = r->conn;
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                               "X-Thaw-Cold-Start: 1\r\n\r\n";
    if (!m->heartbeat_timer) {
        m->heartbeat_timer = evtimer_new(srv->base, on_heartbeat, m);
        if (!m->heartbeat_timer) {
            return;
        }
    }
    r->heartbeat = true;
    r->response_started = true;
    conn_write(c, head, sizeof head - 1);
    conn_write(c, heartbeat_chunk, sizeof heartbeat_chunk - 1);
    if (!event_pending(m->heartbeat_timer, EV_TIMEOUT, NULL)) {
        uint64_t ms = m->set.loading_heartbeat_ms;
        struct timeval tv = clock_timeval(ms);
        event_add(m->heartbeat_timer, &tv);
    }
}

/* Places a routed request: straight to a free replica slot when nothing is
 * waiting ahead of it, else into the model's queue. */
static void place(struct server *srv, struct request *r)
{
    struct model *m = r->model;
    uint64_t now = clock_now_ms();
    if (m->removed) {
        /* Routed at its head, then a reload removed the model. */
        conn_reject(r->conn, REJECT_MODEL_REMOVED, NULL);
        return;
    }
    if (m->queue.count == 0) {
        struct endpoint *ep = model_pick_endpoint(m, now);
        if (ep) {
            r->queued_ms = now;
            queue_item_stamp(&r->qi, r->tier, now, now + m->set.queue_timeout_ms);
            histogram_observe(&m->stats.queue_wait[r->tier], 0);
            start_at(srv, r, ep);
            return;
        }
    }
    if (m->n_endpoints == 0 && m->backend) {
        /* Scale from zero now, not at the next tick; one start serves every
         * request that queues behind it. */
        int rc = backend_scale(m->backend, m, 1);
        if (rc == -ENOTSUP) {
            conn_reject(r->conn, REJECT_NO_REPLICAS, NULL);
            return;
        }
        if (rc == -EAGAIN) {
            conn_reject(r->conn, REJECT_START_FAILED, "restarting after a failed start");
            return;
        }
    }
    struct queue_item *displaced = NULL;
    int rc = queue_push(&m->queue, &r->qi, r->tier, now, now + m->set.queue_timeout_ms,
                        &displaced);
    if (rc) {
        conn_reject(r->conn, REJECT_QUEUE_FULL, NULL);
        return;
    }
    r->state = REQ_QUEUED;
    r->queued_ms = now;
    if (m->set.loading_heartbeat_ms && m->n_endpoints == 0 && r->head.http_major == 1 &&
        r->head.http_minor >= 1 && wants_stream(r)) {
        start_heartbeat(srv, r);
    }
    if (displaced) {
        struct request *d = container_of(displaced, struct request, qi);
        d->state = REQ_ROUTED;
        LOGI("queued request displaced", "model=%s tier=batch by=critical", m->name);
        conn_reject(d->conn, REJECT_QUEUE_DISPLACED, NULL);
    }
    arm_queue_timer(srv, m);
}

void proxy_on_request(struct conn *c, struct request *r)
{
    struct server *srv = c->srv;
    if (!proxy_on_body(c, r)) {
        return;
    }
    if (r->scan && !scan_body(c, r, true)) {
        return;
    }
    if (r->route.ambiguous) {
        reject_ambiguous(c, r->route.ambiguous, r->route.ambiguous_len, r->route.ambiguous_host);
        return;
    }
    r->state = REQ_ROUTED;
    place(srv, r);
}

void proxy_on_abort(struct conn *c, struct request *r, enum abort_reason reason)
{
    struct server *srv = c->srv;
    if (r->state == REQ_QUEUED) {
        queue_remove(&r->model->queue, &r->qi);
        LOGD("held request abandoned by client", "model=%s", r->model->name);
        arm_queue_timer(srv, r->model);
    } else if (r->up) {
        upstream_cancel(r->up);
    }
    request_count_aborted(&srv->requests, r, reason);
}

static void on_dispatch_more(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    proxy_dispatch(server_of(m), m);
}

/* Releases waiting requests to free slots, at most PROXY_DISPATCH_BATCH per
 * turn of the loop: when a model wakes with a thousand held requests, the
 * first replies flow back while the rest are still being sent. */
void proxy_dispatch(struct server *srv, struct model *m)
{
    uint64_t now = clock_now_ms();
    unsigned took = 0;
    while (m->queue.count > 0) {
        struct endpoint *ep = model_pick_endpoint(m, now);
        if (!ep) {
            break;
        }
        if (took == PROXY_DISPATCH_BATCH) {
            /* A zero timeout, not event_active: timers run after the next
             * poll for I/O, so replies get through in between. */
            if (!m->dispatch_more) {
                m->dispatch_more = evtimer_new(srv->base, on_dispatch_more, m);
            }
            if (m->dispatch_more) {
                struct timeval zero = {0, 0};
                event_add(m->dispatch_more, &zero);
                break;
            }
        }
        struct queue_item *it = queue_pop(&m->queue);
        struct request *r = container_of(it, struct request, qi);
        histogram_observe(&m->stats.queue_wait[r->tier], (double)(now - r->queued_ms) / 1000.0);
        took++;
        start_at(srv, r, ep);
    }
    if (took) {
        arm_queue_timer(srv, m);
    }
}

void proxy_model_removed(struct server *srv, struct model *m, const char *reason)
{
    /* Requests routed at their head, or early by their body, hold m while
     * their body still arrives: answer them before m goes. */
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->conns)
    {
        struct conn *c = container_of(pos, struct conn, node);
        struct request *r = c->req;
        if (c->kind == LISTENER_PROXY && r && r->state == REQ_READING && r->model == m) {
            conn_reject(c, REJECT_MODEL_REMOVED, reason);
        }
    }
    proxy_flush_queue(srv, m, REJECT_MODEL_REMOVED, reason);
}

void proxy_flush_queue(struct server *srv, struct model *m, enum reject_reason reason,
                       const char *detail)
{
    struct queue_item *it;
    while ((it = queue_pop(&m->queue))) {
        struct request *r = container_of(it, struct request, qi);
        r->state = REQ_ROUTED;
        conn_reject(r->conn, reason, detail);
    }
    if (m->queue_timer) {
        event_free(m->queue_timer);
        m->queue_timer = NULL;
    }
    if (m->dispatch_more) {
        event_free(m->dispatch_more);
        m->dispatch_more = NULL;
    }
    if (m->heartbeat_timer) {
        event_free(m->heartbeat_timer);
        m->heartbeat_timer = NULL;
    }
    if (m->eject_timer) {
        event_free(m->eject_timer);
        m->eject_timer = NULL;
    }
}

unsigned proxy_retry_after_s(const struct request *r)
{
    struct model *m = r->model_resolved ? r->model : NULL;
    if (!m || !m->backend || m->n_endpoints > 0) {
        return 1;
    }
    uint64_t ms = m->backend->ops->retry_after_ms(m->backend, m);
    unsigned s = (unsigned)((ms + 999) / 1000);
    return s ? s : 1;
}

/* Requests that wait because every replica is ejected try again when the
 * first ejection ends (unless a new replica comes sooner). */
static void retry_after_ejection(struct server *srv, struct model *m)
{
    uint64_t now = clock_now_ms();
    uint64_t at = model_next_unejection(m, now);
    if (!at) {
        return;
    }
    if (!m->eject_timer) {
        m->eject_timer = evtimer_new(srv->base, on_dispatch_more, m);
    }
    if (m->eject_timer) {
        uint64_t wait = at - now;
        struct timeval tv = clock_timeval(wait + 1);
        event_add(m->eject_timer, &tv);
    }
}

static void upstream_retry(struct request *r)
{
    struct model *m = r->model;
    struct server *srv = r->conn->srv;
    if (m->removed) {
        r->state = REQ_ROUTED;
        conn_reject(r->conn, REJECT_MODEL_REMOVED, NULL);
        return;
    }
    size_t limit = m->n_endpoints > 1 ? m->n_endpoints : 1;
    if (r->tries >= limit || m->n_endpoints == 0) {
        /* Every replica refused. A backend that can start replicas (its
         * replica may just have died, before thaw reaped it) gets the
         * request back in the queue; it waits for the next replica or its
         * deadline. Static models answer 502. No immediate retry here: a
         * dead replica refuses synchronously and this would recurse. */
        if (r->tries < PROXY_MAX_TRIES && m->backend &&
            backend_scale(m->backend, m, 1) != -ENOTSUP) {
            r->state = REQ_QUEUED;
            queue_push_front(&m->queue, &r->qi);
            arm_queue_timer(srv, m);
            retry_after_ejection(srv, m);
            return;
        }
        r->state = REQ_ROUTED;
        conn_reject(r->conn, REJECT_UPSTREAM_CONNECT, NULL);
        return;
    }
    uint64_t now = clock_now_ms();
    struct endpoint *ep = model_pick_endpoint(m, now);
    if (ep) {
        start_at(srv, r, ep);
        return;
    }
    /* Every slot is busy (or every replica ejected): wait at the front of
     * its tier. */
    r->state = REQ_QUEUED;
    queue_push_front(&m->queue, &r->qi);
    arm_queue_timer(srv, m);
    retry_after_ejection(srv, m);
}

static void upstream_done(struct request *r, int status)
{
    struct conn *c = r->conn;
    request_count_proxied(&c->srv->requests, r, status);
    conn_response_done(c);
}

static void upstream_client_gone(struct request *r)
{
    request_count_aborted(&r->conn->srv->requests, r, ABORT_CLIENT_CLOSED);
    conn_close(r->conn, ABORT_CLIENT_CLOSED);
}

static void upstream_failed(struct request *r, enum reject_reason reason, enum abort_reason abort)
{
    struct conn *c = r->conn;
    if (r->model) {
        r->model->stats.upstream_errors++;
    }
    if (!r->response_started) {
        r->state = REQ_ROUTED;
        conn_reject(c, reason, NULL);
        return;
    }
    request_count_aborted(&c->srv->requests, r, abort);
    conn_close(c, abort);
}

/* A request begins on the proxy port: it counts from here. */
static void proxy_on_start(struct conn *c, struct request *r)
{
    c->srv->metrics.requests_accepted++;
    c->srv->inflight++;
}

static void proxy_on_reject(struct conn *c, struct request *r, enum reject_reason reason)
{
    request_count_rejected(&c->srv->requests, r, reason);
}

/* The 200 event-stream head went out with the loading heartbeats: the error
 * travels as a last SSE event, then the stream ends. */
static bool proxy_reject_in_stream(struct conn *c, struct request *r, const struct buf *body)
{
    if (!r->heartbeat) {
        return false;
    }
    struct buf ev;
    buf_init(&ev);
    size_t n = body->len && body->data[body->len - 1] == '\n' ? body->len - 1 : body->len;
    buf_printf(&ev, "%zx\r\ndata: ", n + 8);
    buf_append(&ev, body->data, n);
    buf_append_str(&ev, "\n\n\r\n0\r\n\r\n");
    conn_write(c, ev.data, ev.len);
    buf_dispose(&ev);
    r->state = REQ_ANSWERED;
    conn_response_done(c);
    return true;
}

const struct conn_handler proxy_conn_handler = {
    .on_start = proxy_on_start,
    .on_head = proxy_on_head,
    .on_body = proxy_on_body,
    .on_request = proxy_on_request,
    .on_abort = proxy_on_abort,
    .on_reject = proxy_on_reject,
    .reject_in_stream = proxy_reject_in_stream,
    .retry_after_s = proxy_retry_after_s,
};

const struct upstream_handler proxy_upstream_handler = {
    .retry = upstream_retry,
    .done = upstream_done,
    .failed = upstream_failed,
    .client_gone = upstream_client_gone,
    .capacity = proxy_dispatch,
};

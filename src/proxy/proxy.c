#include "thaw/proxy.h"
#include "thaw/revisions.h"
#include "thaw/clock.h"
#include "thaw/backend.h"
#include "thaw/conn.h"
#include "thaw/log.h"
#include "thaw/models_api.h"
#include "thaw/runtime.h"
#include "thaw/upstream.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

/* Requests released per loop turn (see proxy_dispatch). */
#define PROXY_DISPATCH_BATCH 32
/* Connection attempts per request before it is answered 502. */
#define PROXY_MAX_TRIES 16
static struct runtime *runtime_of(struct model *m)
{
    return m->fleet->cb_ud;
}

/* The proxy port's connections carry the runtime as their handler context. */
static struct runtime *rt_of(struct conn *c)
{
    return c->ud;
}

static void on_queue_timer(evutil_socket_t fd, short what, void *arg);

static void arm_queue_timer(struct runtime *rt, struct model *m)
{
    uint64_t next = queue_next_deadline(&m->queue);
    if (next == UINT64_MAX) {
        if (m->queue_timer) {
            event_del(m->queue_timer);
        }
        return;
    }
    if (!m->queue_timer) {
        m->queue_timer = evtimer_new(rt->base, on_queue_timer, m);
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
    struct runtime *rt = runtime_of(m);
    uint64_t now = clock_now_ms();
    struct queue_item *it;
    while ((it = queue_pop_expired(&m->queue, now))) {
        struct request *r = container_of(it, struct request, qi);
        r->ex.state = REQ_ROUTED;
        uint64_t held; /* a burst of timeouts would write a line each */
        if (log_limit_pass(&m->queue_timeout_log, now, LOG_LIMIT_MS, &held)) {
            LOGI("queue deadline passed", "model=%s tier=%s waited_ms=%llu suppressed=%llu",
                 m->name, tier_name(r->tier), (unsigned long long)(now - r->queued_ms),
                 (unsigned long long)held);
        }
        conn_reject(r->conn, REJECT_QUEUE_TIMEOUT, NULL);
    }
    arm_queue_timer(rt, m);
}

/* Reads the thaw-priority header once, at the head, into r->asked_tier.
 * -1 when it is not a tier. */
static int parse_priority(struct request *r)
{
    r->has_asked_tier = false;
    const struct http_header *h = http_head_find(&r->ex.head, "thaw-priority");
    if (!h) {
        return 0;
    }
    if (tier_parse(http_hvalue(&r->ex.head, h), h->value_len, &r->asked_tier)) {
        return -1;
    }
    r->has_asked_tier = true;
    return 0;
}

/* The tier a request runs at: the thaw-priority header as the operator
 * allows it (limits.priority_header), else the model's priority. */
static enum tier effective_tier(const struct runtime *rt, const struct request *r)
{
    enum tier model_tier = r->model->set.priority;
    enum tier asked = r->asked_tier;
    if (!r->has_asked_tier) {
        return model_tier;
    }
    switch (rt->cfg->limits.priority_header) {
    case PRIORITY_HEADER_IGNORE:
        return model_tier;
    case PRIORITY_HEADER_LOWER_ONLY:
        return asked > model_tier ? asked : model_tier;
    default:
        return asked;
    }
}

/* ---- tenants ---------------------------------------------------------------- */

/* The credential a request carries: "Authorization: Bearer KEY", else
 * "api-key: KEY" (Azure OpenAI's). false when it has neither. */
static bool request_api_key(const struct request *r, const char **key, size_t *len)
{
    const struct http_head *h = &r->ex.head;
    const struct http_header *x = http_head_find(h, "authorization");
    if (x) {
        const char *v = http_hvalue(h, x);
        size_t n = x->value_len;
        if (n > 7 && strncasecmp(v, "bearer ", 7) == 0) {
            v += 7;
            n -= 7;
            while (n && *v == ' ') {
                v++;
                n--;
            }
            *key = v;
            *len = n;
            return n > 0;
        }
    }
    x = http_head_find(h, "api-key");
    if (x && x->value_len) {
        *key = http_hvalue(h, x);
        *len = x->value_len;
        return true;
    }
    return false;
}

/* Who the request is for: the trusted gateway's header when configured and
 * present, else its API key; unclaimed requests are the default tenant's
 * unless tenants are required. REJECT_COUNT, REJECT_INVALID_API_KEY, or
 * REJECT_TENANTS_NOT_LOADED while required tenants wait for their source. */
static int identify_tenant(struct runtime *rt, struct request *r)
{
    struct tenants *ts = &rt->tenants;
    struct tenant *t = NULL;
    const struct http_header *gw = ts->header ? http_head_find(&r->ex.head, ts->header) : NULL;
    const char *key;
    size_t len;
    if (gw) {
        t = tenants_find_name(ts, http_hvalue(&r->ex.head, gw), gw->value_len);
    } else if (ts->n_keys && request_api_key(r, &key, &len)) {
        t = tenants_find_key(ts, key, len);
    }
    if (!t && ts->required) {
        return ts->awaiting_source ? REJECT_TENANTS_NOT_LOADED : REJECT_INVALID_API_KEY;
    }
    r->tenant = t ? t : ts->all[0];
    return REJECT_COUNT;
}

/* The tier a request runs at, its tenant's ceiling applied. */
static enum tier request_tier(const struct runtime *rt, const struct request *r)
{
    enum tier t = effective_tier(rt, r);
    return r->tenant ? tenant_clamp_tier(r->tenant, t) : t;
}

/* Makes sure r's tenant has its flow at r's model, with its caps there
 * (caps are read again on every request, so a reload applies at once).
 * 0 or -ENOMEM. */
static int tenant_flow_at_model(struct request *r)
{
    const struct tenant *t = r->tenant;
    uint64_t max_running, max_queued;
    /* A tenant's caps name the model, not one of its revisions. */
    const struct model *m = r->model;
    tenant_caps(t, m->parent ? m->parent->name : m->name, &max_running, &max_queued);
    r->qi.flow = t->id;
    return queue_flow_set(&r->model->queue, t->id, t->weight, max_running, max_queued);
}

/* A reload changed the tenants: every model's flows take the new caps and
 * weights, and what a raised cap lets go is dispatched. */
void proxy_tenants_changed(struct runtime *rt)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &rt->fleet.models)
    {
        struct model *m = container_of(pos, struct model, node);
        for (size_t id = 0; id < rt->tenants.n; id++) {
            const struct tenant *t = rt->tenants.all[id];
            if (!queue_flow(&m->queue, t->id)) {
                continue;
            }
            uint64_t max_running, max_queued;
            tenant_caps(t, m->parent ? m->parent->name : m->name, &max_running, &max_queued);
            queue_flow_set(&m->queue, t->id, t->weight, max_running, max_queued);
        }
        proxy_dispatch(rt, m);
    }
}

static int reserve_body(struct runtime *rt, struct request *r, uint64_t bytes);
static int take_model(struct runtime *rt, struct request *r);

/* Keeps the name a request asked for when no model has it, for the error. */
static void note_asked_model(struct request *r, const char *name, size_t len)
{
    if (len == 0 || len >= sizeof r->asked_model || memchr(name, '\0', len)) {
        return;
    }
    memcpy(r->asked_model, name, len);
    r->asked_model[len] = '\0';
    r->ex.error_model = r->asked_model;
}

/* Why a name routed nowhere: "<model>@<revision>" for a model that has no
 * such revision is revision_not_found (as with the thaw-revision header),
 * anything else model_not_found. */
static enum reject_reason unrouted_reason(const struct runtime *rt, const struct request *r)
{
    const char *name = r->asked_model;
    const char *at = strrchr(name, '@');
    const struct model *m =
        at ? router_lookup_name(&rt->fleet.router, name, (size_t)(at - name)) : NULL;
    return m && m->revs ? REJECT_UNKNOWN_REVISION : REJECT_UNKNOWN_MODEL;
}

/* GET or HEAD of /v1/models[/{id}] (after a /models/<name>/ prefix too):
 * thaw answers it, whatever the Host. */
static bool is_models_api(struct request *r)
{
    const struct http_head *h = &r->ex.head;
    if (h->method != HTTP_GET && h->method != HTTP_HEAD) {
        return false;
    }
    char id[JSONSCAN_MODEL_MAX + 1];
    size_t idlen;
    const char *path = http_target(h) + r->route.path_off;
    return router_models_path(path, r->route.path_len, id, sizeof id, &idlen) != ROUTE_MODELS_NONE;
}

/* Starts the body scan that decides the route: JSON, or a multipart form
 * (its boundary from Content-Type). REJECT_COUNT, or why not. */
static int start_body_scan(struct request *r)
{
    const struct http_head *h = &r->ex.head;
    const char *path = http_target(h) + r->route.path_off;
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (http_name_eq(http_hname(h, x), x->name_len, "content-encoding") &&
            !http_name_eq(http_hvalue(h, x), x->value_len, "identity")) {
            return REJECT_ENCODED_BODY; /* a compressed body names no model thaw can read */
        }
    }
    if (router_body_kind(path, r->route.path_len) == ROUTE_BODY_FORM) {
        const struct http_header *ct = http_head_find(h, "content-type");
        char boundary[FORMSCAN_BOUNDARY_MAX + 1];
        size_t blen = ct ? formscan_boundary(http_hvalue(h, ct), ct->value_len, boundary) : 0;
        if (blen == 0) {
            return REJECT_BAD_FORM;
        }
        r->form = malloc(sizeof *r->form);
        if (!r->form) {
            return REJECT_INTERNAL;
        }
        formscan_init_whole(r->form, boundary, blen);
        return REJECT_COUNT;
    }
    r->scan = malloc(sizeof *r->scan);
    if (!r->scan) {
        return REJECT_INTERNAL;
    }
    jsonscan_init_whole(r->scan);
    return REJECT_COUNT;
}

int proxy_on_head(struct conn *c, struct request *r)
{
    struct runtime *rt = rt_of(c);
    if (r->ex.head.method == HTTP_CONNECT) {
        return REJECT_METHOD_NOT_ALLOWED;
    }
    if (parse_priority(r) < 0) {
        return REJECT_BAD_PRIORITY;
    }
    int who = identify_tenant(rt, r);
    if (who != REJECT_COUNT) {
        return who;
    }
    enum route_status st = router_resolve_head(&rt->fleet.router, &r->ex.head, &r->route);
    if (is_models_api(r)) {
        r->models_api = true;
    } else if (st == ROUTE_FOUND) {
        int rc = take_model(rt, r);
        if (rc != REJECT_COUNT) {
            return rc;
        }
    } else if (st == ROUTE_NEED_BODY) {
        int rc = start_body_scan(r);
        if (rc != REJECT_COUNT) {
            return rc;
        }
    } else if (st != ROUTE_AMBIGUOUS) {
        note_asked_model(r, http_target(&r->ex.head) + r->route.asked_off, r->route.asked_len);
        return unrouted_reason(rt, r);
    } /* ambiguous: answered once the body is read (proxy_on_request) */
    /* A declared length is reserved whole at the head, so a body that
     * cannot be held is refused before any of it is read. */
    return r->ex.head.has_length ? reserve_body(rt, r, r->ex.head.content_length) : REJECT_COUNT;
}

/* Grows r's share of the body budget to `bytes`. REJECT_COUNT when it fits;
 * REJECT_BODY_BUFFER_FULL when the bodies held now leave no room for it
 * (worth retrying); REJECT_BODY_TOO_LARGE when it could never fit. */
static int reserve_body(struct runtime *rt, struct request *r, uint64_t bytes)
{
    uint64_t limit = rt->cfg->limits.max_buffered_body_bytes;
    if (bytes <= r->body_reserved) {
        return REJECT_COUNT;
    }
    if (bytes > limit) {
        return REJECT_BODY_TOO_LARGE;
    }
    uint64_t more = bytes - r->body_reserved;
    if (rt->buffered_body_bytes + more > limit) {
        LOGI("request body over the buffer budget", "held=%llu asked=%llu limit=%llu",
             (unsigned long long)rt->buffered_body_bytes, (unsigned long long)more,
             (unsigned long long)limit);
        return REJECT_BODY_BUFFER_FULL;
    }
    rt->buffered_body_bytes += more;
    r->body_reserved = bytes;
    return REJECT_COUNT;
}

/* 409 naming the models a bare name could mean. */
static void reject_ambiguous(struct conn *c, const char *name, size_t len, bool host)
{
    char candidates[400];
    router_candidates(&rt_of(c)->fleet.router, name, len, host, candidates, sizeof candidates);
    conn_reject(c, REJECT_AMBIGUOUS_MODEL, candidates);
}

/* The model a routed request goes to: the route's, or for a model with
 * revisions the revision picked for this request (waking a cold one that a
 * fallback stands in for). REJECT_COUNT, or why not. */
static int take_model(struct runtime *rt, struct request *r)
{
    struct model *m = r->route.target;
    r->ex.error_model = m->name;
    if (m->revs) {
        const char *tenant = r->tenant && r->tenant != rt->tenants.all[0] ? r->tenant->name : NULL;
        struct model *wake;
        enum reject_reason why = REJECT_NO_REPLICAS;
        struct model *rev = model_pick_revision(m, &r->ex.head, tenant, &wake, &why);
        if (!rev) {
            return why;
        }
        if (wake && wake->backend && wake->n_endpoints == 0) {
            backend_scale(wake->backend, wake, 1);
        }
        m = rev;
    }
    r->model = m;
    model_ref(r->model);
    /* The model the request holds: a routing entry may go before it ends. */
    r->ex.error_model = m->name;
    r->model_resolved = true;
    r->tier = request_tier(rt, r);
    return REJECT_COUNT;
}

/* Takes the model the body named (early, while the body still arrives).
 * route.path_* still describe the target from the head: origin-form,
 * without an absolute-form scheme and authority. */
static int route_by_body(struct runtime *rt, struct request *r)
{
    return take_model(rt, r);
}

/* Feeds a scan the body's bytes it has not seen, and the body's end (at_end):
 * its answer. The scans read the whole body, so an answer of MODEL may still
 * turn into a second model or a malformed rest. */
static enum jsonscan_status feed_json(struct request *r, bool at_end)
{
    const char *fresh = r->ex.body.data + r->body_seen;
    enum jsonscan_status js = jsonscan_feed(r->scan, fresh, r->ex.body.len - r->body_seen);
    return at_end && (js == JSONSCAN_MORE || js == JSONSCAN_MODEL) ? jsonscan_finish(r->scan) : js;
}

static enum formscan_status feed_form(struct request *r, bool at_end)
{
    const char *fresh = r->ex.body.data + r->body_seen;
    enum formscan_status fs = formscan_feed(r->form, fresh, r->ex.body.len - r->body_seen);
    return at_end && (fs == FORMSCAN_MORE || fs == FORMSCAN_MODEL) ? formscan_finish(r->form) : fs;
}

static void end_body_scan(struct request *r)
{
    if (r->scan && r->scan->status != JSONSCAN_INVALID) {
        r->body_scanned = true;
        r->stream_asked = r->scan->stream;
    }
    free(r->scan);
    r->scan = NULL;
    free(r->form);
    r->form = NULL;
}

/* The body's declared length is all in: a rejection can wait for the end of
 * the request, so the connection stays open for the next one. */
static bool body_all_in(const struct request *r)
{
    return r->ex.head.has_length && r->ex.body.len >= r->ex.head.content_length;
}

/* The body routed the request; its scan reads on to the end. A second
 * "model" (which the server would read instead of the first) or a
 * malformed rest rejects it. Returns false after rejecting. */
static bool scan_rest(struct conn *c, struct request *r, bool at_end)
{
    char why[160] = "";
    enum reject_reason bad = REJECT_COUNT;
    if (r->form) {
        enum formscan_status fs = feed_form(r, at_end);
        if (fs == FORMSCAN_DUPLICATE_MODEL) {
            bad = REJECT_DUPLICATE_MODEL;
        } else if (fs != FORMSCAN_MODEL) {
            bad = REJECT_BAD_FORM;
            formscan_error(r->form, why, sizeof why);
        }
    } else {
        enum jsonscan_status js = feed_json(r, at_end);
        if (js == JSONSCAN_DUPLICATE_MODEL) {
            bad = REJECT_DUPLICATE_MODEL;
        } else if (js != JSONSCAN_MODEL) {
            bad = REJECT_BAD_JSON;
            jsonscan_error(r->scan, why, sizeof why);
        }
    }
    if (!at_end && (bad == REJECT_COUNT || body_all_in(r))) {
        return true;
    }
    end_body_scan(r);
    if (bad != REJECT_COUNT) {
        conn_reject(c, bad, why);
        return false;
    }
    return true;
}

/* Feeds the body's new bytes to the JSON scan (at_end: the body is complete). */
static enum route_status scan_json(struct runtime *rt, struct request *r, bool at_end, char *why,
                                   size_t whylen)
{
    struct jsonscan *scan = r->scan;
    enum jsonscan_status js = feed_json(r, at_end);
    enum route_status st = router_resolve_scan(&rt->fleet.router, js, scan, &r->route);
    if (st == ROUTE_BAD_JSON) {
        jsonscan_error(scan, why, whylen);
    } else if (st == ROUTE_NOT_FOUND && js == JSONSCAN_MODEL) {
        size_t len;
        const char *name = jsonscan_model(scan, &len);
        note_asked_model(r, name, len);
    } else if (st == ROUTE_NOT_FOUND && js == JSONSCAN_MODEL_TOO_LONG) {
        /* Longer than any name: named by its start, so the answer still
         * says which field was at fault. */
        size_t len;
        const char *name = jsonscan_model(scan, &len);
        char start[80];
        int n = snprintf(start, sizeof start, "%.64s...", name);
        note_asked_model(r, start, n > 0 ? (size_t)n : 0);
    }
    return st;
}

/* The same for a multipart form; a form that is not one is ROUTE_BAD_JSON
 * here (answered bad_form by scan_body). */
static enum route_status scan_form(struct runtime *rt, struct request *r, bool at_end, char *why,
                                   size_t whylen)
{
    struct formscan *form = r->form;
    enum formscan_status fs = feed_form(r, at_end);
    size_t len;
    const char *name;
    switch (fs) {
    case FORMSCAN_MORE:
        return ROUTE_NEED_BODY;
    case FORMSCAN_MODEL:
        name = formscan_model(form, &len);
        switch (router_resolve_name(&rt->fleet.router, name, len, &r->route)) {
        case ROUTE_FOUND:
            return ROUTE_FOUND;
        case ROUTE_AMBIGUOUS:
            return ROUTE_AMBIGUOUS;
        default:
            note_asked_model(r, name, len);
            return ROUTE_NOT_FOUND;
        }
    case FORMSCAN_MODEL_TOO_LONG:
        return ROUTE_NOT_FOUND;
    case FORMSCAN_NO_MODEL:
        return ROUTE_NO_MODEL_FIELD;
    case FORMSCAN_DUPLICATE_MODEL:
        return ROUTE_DUPLICATE_MODEL;
    default:
        formscan_error(form, why, whylen);
        return ROUTE_BAD_JSON;
    }
}

/* Feeds the body's new bytes to the scan that decides the route (at_end:
 * the body is complete). Returns false after rejecting the request. */
static bool scan_body(struct conn *c, struct request *r, bool at_end)
{
    if (r->model_resolved) {
        return scan_rest(c, r, at_end);
    }
    struct runtime *rt = rt_of(c);
    char why[160] = "";
    enum route_status st = r->form ? scan_form(rt, r, at_end, why, sizeof why)
                                   : scan_json(rt, r, at_end, why, sizeof why);
    if (st == ROUTE_NEED_BODY || (st != ROUTE_FOUND && !at_end && body_all_in(r))) {
        return true;
    }
    bool form = r->form != NULL;
    if (st == ROUTE_AMBIGUOUS) {
        /* The name lives in the scan, and the answer may free the request:
         * copied, the scan freed, then answered. */
        size_t len;
        const char *name = form ? formscan_model(r->form, &len) : jsonscan_model(r->scan, &len);
        char copy[JSONSCAN_MODEL_MAX + 1];
        memcpy(copy, name, len);
        end_body_scan(r);
        reject_ambiguous(c, copy, len, false);
        return false;
    }
    if (st == ROUTE_FOUND) {
        int rc = route_by_body(rt, r);
        if (rc != REJECT_COUNT && !at_end && body_all_in(r)) {
            return true; /* taken again, and refused, at the request's end */
        }
        if (rc != REJECT_COUNT) {
            end_body_scan(r);
            conn_reject(c, (enum reject_reason)rc, NULL);
            return false;
        }
        if (at_end) {
            end_body_scan(r);
        }
        return true; /* the rest of the body is still scanned (scan_rest) */
    }
    if (st == ROUTE_DUPLICATE_MODEL) {
        /* Named in the error as when the route was taken before the second. */
        size_t len = 0;
        const char *name = form ? (r->form->model_known ? formscan_model(r->form, &len) : NULL)
                                : (r->scan->model_known ? jsonscan_model(r->scan, &len) : NULL);
        if (name) {
            note_asked_model(r, name, len);
        }
    }
    end_body_scan(r);
    switch (st) {
    case ROUTE_DUPLICATE_MODEL:
        conn_reject(c, REJECT_DUPLICATE_MODEL, NULL);
        return false;
    case ROUTE_BAD_JSON:
        conn_reject(c, form ? REJECT_BAD_FORM : REJECT_BAD_JSON, why);
        return false;
    case ROUTE_NO_MODEL_FIELD:
        conn_reject(c, REJECT_NO_MODEL_FIELD, NULL);
        return false;
    default:
        conn_reject(c, unrouted_reason(rt_of(c), r), NULL);
        return false;
    }
}

bool proxy_on_body(struct conn *c, struct request *r)
{
    if (r->ex.body.len <= r->body_seen) {
        return true;
    }
    /* Chunked bodies (no declared length) are counted as they grow. */
    int rc = reserve_body(rt_of(c), r, r->ex.body.len);
    if (rc != REJECT_COUNT) {
        conn_reject(c, (enum reject_reason)rc, NULL);
        return false;
    }
    if ((r->scan || r->form) && !scan_body(c, r, false)) {
        return false;
    }
    r->body_seen = r->ex.body.len;
    return true;
}

/* Forwarding headers a client could forge. Unless limits.trust_forwarded_headers
 * (thaw sits behind a proxy that sets them), thaw drops the client's and
 * writes its own. */
static bool is_forwarding_header(const char *name, size_t len)
{
    return http_name_eq(name, len, "x-forwarded-for") ||
           http_name_eq(name, len, "x-forwarded-proto") ||
           http_name_eq(name, len, "x-forwarded-host") || http_name_eq(name, len, "forwarded");
}

static void append_forwarding_headers(struct buf *b, const struct request *r, bool trusted)
{
    const struct http_head *h = &r->ex.head;
    const struct http_header *proto = trusted ? http_head_find(h, "x-forwarded-proto") : NULL;
    buf_append_str(b, "X-Forwarded-For: ");
    /* Trusted: every X-Forwarded-For value in order, then the peer (as
     * nginx's $proxy_add_x_forwarded_for). */
    for (uint32_t i = 0; trusted && i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (x->value_len && http_name_eq(http_hname(h, x), x->name_len, "x-forwarded-for")) {
            buf_append(b, http_hvalue(h, x), x->value_len);
            buf_append(b, ", ", 2);
        }
    }
    buf_append_str(b, r->conn->peer_ip);
    buf_append(b, "\r\n", 2);
    if (proto) {
        buf_append_str(b, "X-Forwarded-Proto: ");
        buf_append(b, http_hvalue(h, proto), proto->value_len);
        buf_append(b, "\r\n", 2);
    } else {
        buf_append_str(b, "X-Forwarded-Proto: http\r\n");
    }
}

/* The head sent to the replica: the client's, less hop-by-hop and thaw's own
 * headers, with the route's path and thaw's forwarding headers. */
static void build_upstream_head(const struct runtime *rt, struct request *r,
                                const struct endpoint *ep)
{
    struct buf *b = &r->fwd.head;
    struct http_head *h = &r->ex.head;
    bool trusted = rt->cfg->limits.trust_forwarded_headers;
    buf_reset(b);
    buf_append_str(b, llhttp_method_name((llhttp_method_t)h->method));
    buf_append(b, " ", 1);
    if (r->route.add_slash) {
        buf_append(b, "/", 1);
    }
    buf_append(b, http_target(h) + r->route.path_off, r->route.path_len);
    buf_append_str(b, " HTTP/1.1\r\n");
    const char *authority = NULL;
    size_t authority_len = 0;
    bool absolute = http_target_authority(h, &authority, &authority_len);
    bool have_host = false;
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        const char *name = http_hname(h, x);
        if (http_is_hop_by_hop(h, x) || http_name_eq(name, x->name_len, "content-length") ||
            http_name_eq(name, x->name_len, "expect") ||
            http_name_eq(name, x->name_len, "thaw-priority")) {
            continue;
        }
        if (r->fwd.heartbeat && http_name_eq(name, x->name_len, "accept-encoding")) {
            continue; /* thaw's event-stream head went out uncoded: asked below */
        }
        if (http_name_eq(name, x->name_len, "x-forwarded-for") ||
            http_name_eq(name, x->name_len, "x-forwarded-proto") ||
            (!trusted && is_forwarding_header(name, x->name_len))) {
            continue; /* written below */
        }
        if (http_name_eq(name, x->name_len, "host")) {
            if (absolute) {
                continue; /* the absolute-form authority replaces it */
            }
            have_host = true;
        }
        buf_append(b, name, x->name_len);
        buf_append(b, ": ", 2);
        buf_append(b, http_hvalue(h, x), x->value_len);
        buf_append(b, "\r\n", 2);
    }
    if (absolute && authority_len) {
        buf_append_str(b, "Host: ");
        buf_append(b, authority, authority_len);
        buf_append(b, "\r\n", 2);
    } else if (!have_host) {
        buf_printf(b, "Host: %s\r\n", ep->addr_text);
    }
    append_forwarding_headers(b, r, trusted);
    if (r->fwd.heartbeat) {
        buf_append_str(b, "Accept-Encoding: identity\r\n");
    }
    if (r->ex.body.len > 0 || h->has_length || h->chunked) {
        buf_append_str(b, "Content-Length: ");
        buf_append_u64(b, r->ex.body.len);
        buf_append(b, "\r\n", 2);
    }
    buf_append(b, "\r\n", 2);
}

static void retry_after_ejection(struct runtime *rt, struct model *m);

static void start_at(struct runtime *rt, struct request *r, struct endpoint *ep)
{
    r->ex.state = REQ_UPSTREAM;
    request_hold_tenant_slot(r);
    if (r->fwd.head.len == 0) {
        build_upstream_head(rt, r, ep);
    }
    const struct model_settings *set = &r->model->set;
    r->fwd.connect_timeout_ms = set->connect_timeout_ms;
    r->fwd.first_byte_timeout_ms = set->first_byte_timeout_ms;
    r->fwd.idle_timeout_ms = set->upstream_idle_timeout_ms;
    upstream_start(&rt->up, &r->fwd, ep);
}

/* Cold-start heartbeats: a streaming client held while its model loads gets
 * the event-stream head at once and an SSE comment every
 * loading_heartbeat_ms, so it (and proxies between) do not time out. The
 * comment says how far along the cold start is (coldstart_heartbeat):
 * ": loading phase=load elapsed=12s expected_remaining=40s". */
struct heartbeat {
    char chunk[192];
    size_t len;
};

/* The comment as one chunk of the response's chunked body. */
static void heartbeat_build(const struct model *m, struct heartbeat *hb)
{
    char comment[160];
    size_t n;
    if (m->n_endpoints > 0 && !m->cold.started_ms) {
        /* Loaded: the stream waits for one of the replicas' slots. */
        n = (size_t)snprintf(comment, sizeof comment, ": queued\n\n");
    } else {
        n = coldstart_heartbeat(&m->cold, clock_now_ms(), comment, sizeof comment);
    }
    int w = snprintf(hb->chunk, sizeof hb->chunk, "%zx\r\n%.*s\r\n", n, (int)n, comment);
    hb->len = w > 0 && (size_t)w < sizeof hb->chunk ? (size_t)w : 0;
}

/* "stream": true, as the model server reads the body (the last such key).
 * A body routed by its model was scanned whole on its way in; another is
 * scanned here, up to 1 MiB (a scan, not a parse, but on the loop). */
static bool wants_stream(const struct request *r)
{
    if (r->body_scanned) {
        return r->stream_asked;
    }
    if (r->ex.body.len == 0 || r->ex.body.len > 1024 * 1024) {
        return false;
    }
    struct jsonscan scan;
    jsonscan_init_whole(&scan);
    enum jsonscan_status st = jsonscan_feed(&scan, r->ex.body.data, r->ex.body.len);
    if (st == JSONSCAN_MORE || st == JSONSCAN_MODEL) {
        st = jsonscan_finish(&scan);
    }
    return (st == JSONSCAN_MODEL || st == JSONSCAN_NO_MODEL) && scan.stream;
}

struct heartbeat_round {
    struct heartbeat hb;
    bool any;
};

static void heartbeat_one(struct queue_item *it, void *ud)
{
    struct request *r = container_of(it, struct request, qi);
    struct heartbeat_round *round = ud;
    if (r->fwd.heartbeat) {
        conn_write(r->conn, round->hb.chunk, round->hb.len);
        round->any = true;
    }
}

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    struct heartbeat_round round = {.any = false};
    heartbeat_build(m, &round.hb);
    queue_visit(&m->queue, heartbeat_one, &round);
    if (round.any) {
        uint64_t ms = m->set.loading_heartbeat_ms;
        struct timeval tv = clock_timeval(ms);
        event_add(m->heartbeat_timer, &tv);
    }
}

static void start_heartbeat(struct runtime *rt, struct request *r)
{
    struct model *m = r->model;
    struct conn *c = r->conn;
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                               "X-Thaw-Cold-Start: 1\r\n\r\n";
    if (!m->heartbeat_timer) {
        m->heartbeat_timer = evtimer_new(rt->base, on_heartbeat, m);
        if (!m->heartbeat_timer) {
            return;
        }
    }
    r->fwd.heartbeat = true;
    r->ex.response_started = true;
    conn_write(c, head, sizeof head - 1);
    struct heartbeat hb;
    heartbeat_build(m, &hb);
    conn_write(c, hb.chunk, hb.len);
    if (!event_pending(m->heartbeat_timer, EV_TIMEOUT, NULL)) {
        uint64_t ms = m->set.loading_heartbeat_ms;
        struct timeval tv = clock_timeval(ms);
        event_add(m->heartbeat_timer, &tv);
    }
}

/* Places a routed request: straight to a free replica slot when nothing is
 * waiting ahead of it, else into the model's queue. */
static void place(struct runtime *rt, struct request *r)
{
    struct model *m = r->model;
    uint64_t now = clock_now_ms();
    if (m->removed) {
        /* Routed at its head, then a reload removed the model. */
        conn_reject(r->conn, REJECT_MODEL_REMOVED, NULL);
        return;
    }
    if (!r->tenant) {
        r->tenant = rt->tenants.all[0];
    }
    if (tenant_flow_at_model(r)) {
        conn_reject(r->conn, REJECT_INTERNAL, NULL);
        return;
    }
    /* Straight to a replica when nothing that may run waits ahead (waiting
     * requests of tenants at their cap do not hold others back) and r's
     * tenant is below its own cap. */
    if (!queue_peek(&m->queue) && queue_flow_may_run(&m->queue, r->qi.flow)) {
        struct endpoint *ep = model_pick_endpoint(m, now);
        if (ep) {
            r->queued_ms = now;
            queue_item_stamp(&r->qi, r->tier, now, now + m->set.queue_timeout_ms);
            histogram_observe(&m->stats.queue_wait[r->tier], 0);
            histogram_observe(&r->tenant->stats.queue_wait, 0);
            start_at(rt, r, ep);
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
            conn_reject(r->conn, REJECT_START_FAILED,
                        "backing off before its next start (it failed to start, or "
                        "crashed soon after)");
            return;
        }
    }
    struct queue_item *displaced = NULL;
    int rc = queue_push_flow(&m->queue, &r->qi, r->qi.flow, r->tier, now,
                             now + m->set.queue_timeout_ms, &displaced);
    if (rc) {
        conn_reject(r->conn, rc == -EDQUOT ? REJECT_TENANT_QUEUE_FULL : REJECT_QUEUE_FULL, NULL);
        return;
    }
    r->ex.state = REQ_QUEUED;
    r->queued_ms = now;
    if (m->set.loading_heartbeat_ms && m->n_endpoints == 0 && r->ex.head.http_major == 1 &&
        r->ex.head.http_minor >= 1 && wants_stream(r)) {
        start_heartbeat(rt, r);
    }
    if (displaced) {
        struct request *d = container_of(displaced, struct request, qi);
        d->ex.state = REQ_ROUTED;
        /* At the global bound it may be another model's. */
        LOGI("queued request displaced", "model=%s tier=batch by=critical for=%s", d->model->name,
             m->name);
        conn_reject(d->conn, REJECT_QUEUE_DISPLACED, NULL);
    }
    arm_queue_timer(rt, m);
    if (m->n_endpoints > 0) {
        retry_after_ejection(rt, m); /* a replica skipped for a time */
    }
}

/* GET /v1/models[/{id}]: from the router and the fleet, never a replica.
 * Counted as proxied (no model) or, for an unknown id, rejected. */
static void answer_models_api(struct runtime *rt, struct conn *c, struct request *r)
{
    char id[JSONSCAN_MODEL_MAX + 1];
    size_t idlen = 0;
    const char *path = http_target(&r->ex.head) + r->route.path_off;
    enum route_models which = router_models_path(path, r->route.path_len, id, sizeof id, &idlen);
    struct buf body;
    buf_init(&body);
    if (which == ROUTE_MODELS_LIST) {
        models_api_list(rt, &body);
    } else if (idlen == 0 || !models_api_one(rt, id, idlen, &body)) {
        buf_dispose(&body);
        note_asked_model(r, id, idlen);
        conn_reject(c, REJECT_UNKNOWN_MODEL, NULL);
        return;
    }
    request_count_proxied(&rt->requests, r, 200);
    conn_respond(c, 200, "application/json", body.data ? body.data : "", body.len, NULL);
    buf_dispose(&body);
}

void proxy_on_request(struct conn *c, struct request *r)
{
    struct runtime *rt = rt_of(c);
    if (!proxy_on_body(c, r)) {
        return;
    }
    if ((r->scan || r->form) && !scan_body(c, r, true)) {
        return;
    }
    if (r->route.ambiguous) {
        reject_ambiguous(c, r->route.ambiguous, r->route.ambiguous_len, r->route.ambiguous_host);
        return;
    }
    r->ex.state = REQ_ROUTED;
    if (r->models_api) {
        answer_models_api(rt, c, r);
        return;
    }
    place(rt, r);
}

void proxy_on_abort(struct conn *c, struct request *r, enum abort_reason reason)
{
    struct runtime *rt = rt_of(c);
    if (r->ex.state == REQ_QUEUED) {
        queue_remove(&r->model->queue, &r->qi);
        LOGD("held request abandoned by client", "model=%s", r->model->name);
        arm_queue_timer(rt, r->model);
    } else if (r->fwd.up) {
        /* Before the replica's slot frees and dispatch runs: the tenant's
         * slot is free too. */
        request_release_tenant_slot(r);
        upstream_cancel(r->fwd.up);
    }
    request_count_aborted(&rt->requests, r, reason);
}

static void on_dispatch_more(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    proxy_dispatch(runtime_of(m), m);
}

/* Releases waiting requests to free slots, at most PROXY_DISPATCH_BATCH per
 * turn of the loop: when a model wakes with a thousand held requests, the
 * first replies flow back while the rest are still being sent. */
void proxy_dispatch(struct runtime *rt, struct model *m)
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
                m->dispatch_more = evtimer_new(rt->base, on_dispatch_more, m);
            }
            if (m->dispatch_more) {
                struct timeval zero = {0, 0};
                event_add(m->dispatch_more, &zero);
                break;
            }
        }
        struct queue_item *it = queue_pop(&m->queue);
        if (!it) {
            break; /* what waits belongs to tenants at their cap */
        }
        struct request *r = container_of(it, struct request, qi);
        double waited_s = (double)(now - r->queued_ms) / 1000.0;
        histogram_observe(&m->stats.queue_wait[r->tier], waited_s);
        if (r->tenant) {
            histogram_observe(&r->tenant->stats.queue_wait, waited_s);
        }
        took++;
        start_at(rt, r, ep);
    }
    if (took) {
        arm_queue_timer(rt, m);
    }
    if (m->queue.count > 0 && m->n_endpoints > 0) {
        retry_after_ejection(rt, m);
    }
}

void proxy_model_removed(struct runtime *rt, struct model *m, const char *reason)
{
    /* Requests routed at their head, or early by their body, hold m while
     * their body still arrives: answer them before m goes. */
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &rt->net.conns)
    {
        struct conn *c = container_of(pos, struct conn, node);
        if (c->handler != &proxy_conn_handler || !c->ex) {
            continue;
        }
        struct request *r = request_of(c->ex);
        if (r->ex.state == REQ_READING && r->model == m) {
            conn_reject(c, REJECT_MODEL_REMOVED, reason);
        }
    }
    proxy_flush_queue(rt, m, REJECT_MODEL_REMOVED, reason);
}

static void answer_cut_short(struct request *r, enum reject_reason reason,
                             enum abort_reason abort);

void proxy_give_up_forwarded(struct runtime *rt, enum reject_reason reason, enum abort_reason abort)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &rt->net.conns)
    {
        struct conn *c = container_of(pos, struct conn, node);
        if (c->handler != &proxy_conn_handler || !c->ex || !request_of(c->ex)->fwd.up) {
            continue;
        }
        /* thaw's own doing, not the replica's: no upstream error. */
        struct request *r = request_of(c->ex);
        request_release_tenant_slot(r);
        upstream_cancel(r->fwd.up);
        answer_cut_short(r, reason, abort);
    }
}

void proxy_flush_queue(struct runtime *rt, struct model *m, enum reject_reason reason,
                       const char *detail)
{
    struct queue_item *it;
    while ((it = queue_pop_any(&m->queue))) {
        struct request *r = container_of(it, struct request, qi);
        r->ex.state = REQ_ROUTED;
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
    if (m->rollout_timer) {
        event_free(m->rollout_timer);
        m->rollout_timer = NULL;
    }
}

/* How often a rollout looks at its canary: often enough to roll back
 * within a fraction of a step. */
static uint64_t rollout_period_ms(const struct model *m)
{
    uint64_t ms = m->revs->policy.step_interval_ms / 4;
    return ms < 50 ? 50 : ms > 1000 ? 1000 : ms;
}

static void on_rollout_timer(evutil_socket_t fd, short what, void *arg)
{
    struct model *m = arg;
    if (!m->revs || !m->revs->rollout) {
        return;
    }
    struct model_revisions *rv = m->revs;
    struct backend *b = m->backend;
    if (b && b->ops->rollout_leads && !b->ops->rollout_leads(b)) {
        /* Another activator runs this rollout; its writes reach us. */
        struct timeval tv = clock_timeval(rollout_period_ms(m));
        event_add(m->rollout_timer, &tv);
        return;
    }
    struct rollout_decision d = model_rollout_tick(m, clock_now_ms());
    if (d.action == ROLLOUT_ROLLBACK) {
        LOGW("canary rolled back", "model=%s namespace=%s canary=%s stable=%s why=\"%s\"",
             m->name, m->namespace_, rv->names[1], rv->names[0], d.why);
    } else if (d.action != ROLLOUT_HOLD) {
        LOGI(d.action == ROLLOUT_PROMOTE ? "canary promoted" : "canary stepped up",
             "model=%s namespace=%s canary=%s percent=%u why=\"%s\"", m->name, m->namespace_,
             rv->names[1], d.canary_percent, d.why);
    }
    if (d.action != ROLLOUT_HOLD && m->backend && m->backend->ops->rollout_decided) {
        m->backend->ops->rollout_decided(m->backend, m, &d);
    }
    if (rv->state.stage == ROLLOUT_PROGRESSING) {
        struct timeval tv = clock_timeval(rollout_period_ms(m));
        event_add(m->rollout_timer, &tv);
    }
}

int proxy_link_revisions(struct runtime *rt, const struct config *cfg)
{
    int rc = fleet_link_revisions(&rt->fleet, cfg, clock_now_ms());
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &rt->fleet.models)
    {
        struct model *m = container_of(pos, struct model, node);
        if (m->revs) {
            proxy_revisions_changed(rt, m);
        }
    }
    return rc;
}

void proxy_revisions_changed(struct runtime *rt, struct model *m)
{
    bool runs = m->revs && m->revs->rollout && m->revs->state.stage == ROLLOUT_PROGRESSING;
    if (!runs) {
        if (m->rollout_timer) {
            event_del(m->rollout_timer);
        }
        return;
    }
    if (!m->rollout_timer) {
        m->rollout_timer = evtimer_new(rt->base, on_rollout_timer, m);
        if (!m->rollout_timer) {
            LOGE("out of memory starting a rollout", "model=%s", m->name);
            return;
        }
    }
    if (!event_pending(m->rollout_timer, EV_TIMEOUT, NULL)) {
        struct timeval tv = clock_timeval(rollout_period_ms(m));
        event_add(m->rollout_timer, &tv);
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

/* Requests that wait because every replica is ejected (or a woken one's
 * first request goes alone) try again when the first of those ends, unless
 * a new replica or an answer comes sooner. */
static void retry_after_ejection(struct runtime *rt, struct model *m)
{
    uint64_t now = clock_now_ms();
    uint64_t at = model_next_opening(m, now);
    if (!at) {
        return;
    }
    if (!m->eject_timer) {
        m->eject_timer = evtimer_new(rt->base, on_dispatch_more, m);
    }
    if (m->eject_timer) {
        uint64_t wait = at - now;
        struct timeval tv = clock_timeval(wait + 1);
        event_add(m->eject_timer, &tv);
    }
}

static void upstream_retry(struct upstream_req *f)
{
    struct request *r = request_of_fwd(f);
    struct model *m = r->model;
    struct runtime *rt = rt_of(r->conn);
    if (m->removed) {
        r->ex.state = REQ_ROUTED;
        conn_reject(r->conn, REJECT_MODEL_REMOVED, NULL);
        return;
    }
    size_t limit = m->n_endpoints > 1 ? m->n_endpoints : 1;
    if (r->fwd.tries >= limit || m->n_endpoints == 0) {
        /* Every replica refused. A backend that can start replicas (its
         * replica may just have died, before thaw reaped it) gets the
         * request back in the queue; it waits for the next replica or its
         * deadline. Static models answer 502. No immediate retry here: a
         * dead replica refuses synchronously and this would recurse. */
        if (r->fwd.tries < PROXY_MAX_TRIES && m->backend &&
            backend_scale(m->backend, m, 1) != -ENOTSUP) {
            r->ex.state = REQ_QUEUED;
            request_release_tenant_slot(r);
            queue_push_front(&m->queue, &r->qi);
            arm_queue_timer(rt, m);
            retry_after_ejection(rt, m);
            return;
        }
        r->ex.state = REQ_ROUTED;
        conn_reject(r->conn, REJECT_UPSTREAM_CONNECT, NULL);
        return;
    }
    uint64_t now = clock_now_ms();
    struct endpoint *ep = model_pick_endpoint(m, now);
    if (ep) {
        start_at(rt, r, ep);
        return;
    }
    /* Every slot is busy (or every replica ejected): wait at the front of
     * its tier. */
    r->ex.state = REQ_QUEUED;
    request_release_tenant_slot(r);
    queue_push_front(&m->queue, &r->qi);
    arm_queue_timer(rt, m);
    retry_after_ejection(rt, m);
}

static void upstream_done(struct upstream_req *f, int status)
{
    struct request *r = request_of_fwd(f);
    struct conn *c = r->conn;
    request_count_proxied(&rt_of(c)->requests, r, status);
    conn_response_done(c);
}

static void upstream_client_gone(struct upstream_req *f)
{
    struct request *r = request_of_fwd(f);
    request_count_aborted(&rt_of(r->conn)->requests, r, ABORT_CLIENT_CLOSED);
    conn_close(r->conn, ABORT_CLIENT_CLOSED);
}

/* r's exchange with its replica ended early (the replica's doing, or
 * thaw's). Nothing of the replica's reached the client yet (a heartbeat
 * stream still waiting for its head, or for an error body to end): thaw's
 * own answer, inside that stream when there is one; else the client is cut. */
static void answer_cut_short(struct request *r, enum reject_reason reason,
                             enum abort_reason abort)
{
    struct conn *c = r->conn;
    if (!r->ex.response_started || (r->fwd.heartbeat && r->ex.state == REQ_UPSTREAM)) {
        r->ex.state = REQ_ROUTED;
        conn_reject(c, reason, NULL);
        return;
    }
    request_count_aborted(&rt_of(c)->requests, r, abort);
    conn_close(c, abort);
}

static void upstream_failed(struct upstream_req *f, enum reject_reason reason,
                            enum abort_reason abort)
{
    struct request *r = request_of_fwd(f);
    if (r->model) {
        r->model->stats.upstream_errors++;
    }
    answer_cut_short(r, reason, abort);
}

static void upstream_first_byte(struct upstream_req *f, uint64_t now_ms)
{
    struct request *r = request_of_fwd(f);
    histogram_observe(&r->model->stats.upstream_ttfb, (double)(now_ms - f->dispatch_ms) / 1000.0);
}

static void upstream_capacity(void *ud, struct model *m)
{
    proxy_dispatch(ud, m);
}

/* The proxy port's side of conn.h: each takes the exchange and works on the
 * request that embeds it. */
static struct exchange *proxy_new_exchange(struct conn *c)
{
    struct request *r = request_new(&rt_of(c)->requests, c);
    return r ? &r->ex : NULL;
}

static void proxy_free_exchange(struct conn *c, struct exchange *x)
{
    request_free(&rt_of(c)->requests, request_of(x));
}

static int on_head_x(struct conn *c, struct exchange *x)
{
    return proxy_on_head(c, request_of(x));
}

static bool on_body_x(struct conn *c, struct exchange *x)
{
    return proxy_on_body(c, request_of(x));
}

static void on_request_x(struct conn *c, struct exchange *x)
{
    proxy_on_request(c, request_of(x));
}

static void on_abort_x(struct conn *c, struct exchange *x, enum abort_reason reason)
{
    proxy_on_abort(c, request_of(x), reason);
}

static unsigned retry_after_x(const struct exchange *x)
{
    return proxy_retry_after_s(request_of((struct exchange *)x));
}

/* A request begins on the proxy port: it counts from here. */
static void proxy_on_start(struct conn *c, struct exchange *x)
{
    rt_of(c)->metrics.requests_accepted++;
    rt_of(c)->inflight++;
}

static void proxy_on_reject(struct conn *c, struct exchange *x, enum reject_reason reason)
{
    request_count_rejected(&rt_of(c)->requests, request_of(x), reason);
}

/* Ends a heartbeat stream (thaw's 200 event-stream head went out) with an
 * error: one SSE event `error` whose data is the error JSON (json, with its
 * "status"), then the stream's last chunk. Never raw JSON inside the stream. */
static void end_stream_with_error(struct request *r, const struct buf *json)
{
    static const char event[] = "event: error\ndata: ";
    size_t n = json->len && json->data[json->len - 1] == '\n' ? json->len - 1 : json->len;
    struct buf ev;
    buf_init(&ev);
    buf_printf(&ev, "%zx\r\n%s", sizeof event - 1 + n + 2, event);
    buf_append(&ev, json->data, n);
    buf_append_str(&ev, "\n\n\r\n0\r\n\r\n");
    conn_write(r->conn, ev.data, ev.len);
    buf_dispose(&ev);
    r->ex.state = REQ_ANSWERED;
}

/* thaw's own error after the heartbeats began travels as that last event. */
static bool proxy_reject_in_stream(struct conn *c, struct exchange *x, enum reject_reason reason,
                                   const char *detail)
{
    struct request *r = request_of(x);
    if (!r->fwd.heartbeat) {
        return false;
    }
    struct buf json;
    buf_init(&json);
    conn_error_body(&json, reason, detail, r->ex.error_model, true);
    end_stream_with_error(r, &json);
    buf_dispose(&json);
    conn_response_done(c);
    return true;
}

static const char *json_string(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* The replica answered an error status into a heartbeat stream. Its error
 * (OpenAI's {"error":{...}}, vLLM's {"object":"error","message":...} or
 * FastAPI's {"detail":...}) is carried over into the event where it has
 * one; otherwise the message says what status the model's server gave. */
static void upstream_stream_error(struct upstream_req *f, int status, const char *body, size_t len,
                                  const char *why)
{
    struct request *r = request_of_fwd(f);
    cJSON *root = len ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *src = cJSON_IsObject(err) ? err : root;
    const char *message = cJSON_IsObject(src) ? json_string(src, "message") : NULL;
    if (!message && cJSON_IsString(err)) {
        message = err->valuestring;
    }
    if (!message && cJSON_IsObject(root)) {
        message = json_string(root, "detail");
    }
    const char *type = cJSON_IsObject(src) ? json_string(src, "type") : NULL;
    const char *param = cJSON_IsObject(src) ? json_string(src, "param") : NULL;
    const char *code = cJSON_IsObject(src) ? json_string(src, "code") : NULL;
    /* vLLM's code is the status as a number; OpenAI's clients take a string. */
    const cJSON *num = cJSON_IsObject(src) ? cJSON_GetObjectItemCaseSensitive(src, "code") : NULL;
    char code_text[24];
    if (!code && cJSON_IsNumber(num) && num->valuedouble == (double)(long long)num->valuedouble) {
        snprintf(code_text, sizeof code_text, "%lld", (long long)num->valuedouble);
        code = code_text;
    }
    struct buf m, json;
    buf_init(&m);
    buf_init(&json);
    if (why) {
        buf_append_str(&m, why);
        type = NULL;
        param = NULL;
        code = "upstream_error";
    } else if (message) {
        buf_append_str(&m, message);
    } else {
        buf_printf(&m, "the model's server answered %d %s", status, http_reason_phrase(status));
    }
    buf_printf(&m, " (model `%s`)", r->model->name);
    conn_error_json(&json, m.data, m.len, type ? type : conn_error_type(status), param, code,
                    status);
    LOGI("replica answered an error into a loading stream", "model=%s status=%d", r->model->name,
         status);
    end_stream_with_error(r, &json);
    buf_dispose(&m);
    buf_dispose(&json);
    cJSON_Delete(root);
}

const struct conn_handler proxy_conn_handler = {
    .new_exchange = proxy_new_exchange,
    .free_exchange = proxy_free_exchange,
    .on_start = proxy_on_start,
    .on_head = on_head_x,
    .on_body = on_body_x,
    .on_request = on_request_x,
    .on_abort = on_abort_x,
    .on_reject = proxy_on_reject,
    .reject_in_stream = proxy_reject_in_stream,
    .retry_after_s = retry_after_x,
};

const struct upstream_handler proxy_upstream_handler = {
    .retry = upstream_retry,
    .done = upstream_done,
    .failed = upstream_failed,
    .client_gone = upstream_client_gone,
    .first_byte = upstream_first_byte,
    .take_slot = endpoint_take_slot,
    .give_slot = endpoint_give_slot,
    .capacity = upstream_capacity,
    .stream_error = upstream_stream_error,
};

/* ---- wiring ------------------------------------------------------------------ */

/* What the fleet reports, for the proxy and the replica connections. */
static void fleet_capacity(void *ud, struct model *m)
{
    proxy_dispatch(ud, m);
}

static void fleet_deadlines(void *ud, struct model *m)
{
    arm_queue_timer(ud, m);
}

static void fleet_unavailable(void *ud, struct model *m, const char *reason, uint64_t retry_after_ms)
{
    proxy_flush_queue(ud, m, REJECT_START_FAILED, reason);
}

static void fleet_endpoint_gone(void *ud, struct endpoint *ep)
{
    upstream_close_idle(ep);
}

static void fleet_endpoint_conn(void *ud, struct endpoint *ep, int fd)
{
    struct runtime *rt = ud;
    upstream_adopt(&rt->up, ep, fd);
}

static void fleet_removing(void *ud, struct model *m, const char *reason)
{
    LOGI("model removed", "model=%s reason=\"%s\"", m->name, reason);
    proxy_model_removed(ud, m, reason);
    for (size_t i = 0; i < m->n_endpoints; i++) {
        upstream_close_idle(m->endpoints[i]);
    }
}

static void fleet_revisions(void *ud, struct model *m)
{
    proxy_revisions_changed(ud, m);
}

void proxy_wire(struct runtime *rt)
{
    rt->up.handler = &proxy_upstream_handler;
    rt->up.ud = rt;
    rt->fleet.cb_ud = rt;
    rt->fleet.on_capacity = fleet_capacity;
    rt->fleet.on_deadlines = fleet_deadlines;
    rt->fleet.on_unavailable = fleet_unavailable;
    rt->fleet.on_endpoint_gone = fleet_endpoint_gone;
    rt->fleet.on_endpoint_conn = fleet_endpoint_conn;
    rt->fleet.on_removing = fleet_removing;
    rt->fleet.on_revisions = fleet_revisions;
}

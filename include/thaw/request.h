/* The request object: one HTTP request on the proxy port from its first
 * byte to its answer, its cache of reusable objects, and the one place its
 * outcome is counted. Every request that thaw starts reading ends in exactly
 * one of request_count_proxied, _rejected or _aborted (later calls are no-ops),
 * so the counters reconcile: accepted = proxied + rejected + aborted. Each
 * writes the access log line. */
#ifndef THAW_REQUEST_H
#define THAW_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/buf.h"
#include "thaw/conn.h"
#include "thaw/formscan.h"
#include "thaw/http.h"
#include "thaw/jsonscan.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/model.h"
#include "thaw/queue.h"
#include "thaw/router.h"
#include "thaw/tenant.h"
#include "thaw/upstream.h"

struct conn;
struct metrics_stream;
struct server;
struct upstream;

struct request {
    struct exchange ex; /* what the connection sees: head, body, state */
    struct upstream_req fwd; /* what an upstream connection sees */
    struct queue_item qi; /* while queued */
    struct list_node cache_node;
    struct conn *conn;
    struct model *model;
    struct route route;
    enum tier tier;
    enum tier asked_tier; /* the thaw-priority header's, when has_asked_tier */
    bool has_asked_tier;
    /* Who it is for (NULL until the head is read, or when no tenant
     * claimed it); while tenant_running, it holds one of its tenant's
     * running slots at r->model (see request_release_tenant_slot). */
    struct tenant *tenant;
    bool tenant_running;
    uint64_t start_ms, queued_ms;
    bool counted;          /* its outcome has been counted */
    bool model_resolved;
    size_t body_seen;       /* body bytes already accounted for and scanned */
    uint64_t body_reserved; /* this request's share of server.buffered_body_bytes */
    /* While a body-routed request's model is unknown: the scan of its body
     * (about 450 bytes, freed once the route is decided). */
    struct jsonscan *scan;
    /* The same for a multipart/form-data body (about 1.5 KiB). */
    struct formscan *form;
    /* The whole JSON body was scanned (routing by it): stream_asked is its
     * last top-level "stream" being true, as the model server reads it. */
    bool body_scanned, stream_asked;
    /* GET /v1/models[/{id}]: thaw answers it itself (models_api). */
    bool models_api;
    /* The model name the request asked for when no model has it, for the
     * error's message (ex.error_model points here then). */
    char asked_model[JSONSCAN_MODEL_MAX + 1];
    /* The admin port's streamed /metrics answer, while it is being written. */
    struct metrics_stream *metrics_stream;
};

/* Free request objects kept for reuse, at most this many. */
#define REQUEST_CACHE_MAX 256

/* What requests share, and all request.c reaches: the cache of free request
 * objects and the counters outcomes go to (the server's, by pointer). */
struct request_pool {
    struct list_node free;
    size_t n_free;
    struct server_metrics *metrics;
    uint64_t *inflight;            /* proxy requests accepted and not finished */
    uint64_t *buffered_body_bytes; /* bodies held in memory, all requests */
    bool access_log;               /* write the access log line (config) */
};

void request_pool_init(struct request_pool *pool, struct server_metrics *metrics,
                       uint64_t *inflight, uint64_t *buffered_body_bytes);
/* Frees the cached request objects. */
void request_pool_dispose(struct request_pool *pool);

struct request *request_new(struct request_pool *pool, struct conn *c);
/* The request whose exchange x is. */
static inline struct request *request_of(struct exchange *x)
{
    return container_of(x, struct request, ex);
}
/* The request whose forwarding part f is. */
static inline struct request *request_of_fwd(struct upstream_req *f)
{
    return container_of(f, struct request, fwd);
}
/* Frees r (or caches it). r must not be queued or at an upstream. */
void request_free(struct request_pool *pool, struct request *r);

/* Takes (or gives back) one of r's tenant's running slots at r->model; the
 * second call of either is a no-op. Counting an outcome gives it back. */
void request_hold_tenant_slot(struct request *r);
void request_release_tenant_slot(struct request *r);

/* Outcome accounting (proxy-port requests only; admin ones are not counted). */
void request_count_proxied(struct request_pool *pool, struct request *r, int status);
void request_count_rejected(struct request_pool *pool, struct request *r,
                            enum reject_reason reason);
void request_count_aborted(struct request_pool *pool, struct request *r,
                           enum abort_reason reason);

#endif

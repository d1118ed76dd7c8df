/* The request path between a client connection and a replica: route,
 * classify (tier), queue or dispatch, and account for every outcome.
 *
 * Every request that thaw starts reading ends in exactly one of
 * proxy_count_proxied, proxy_count_rejected or proxy_count_aborted, so the
 * counters reconcile: accepted = proxied + rejected + aborted. */
#ifndef THAW_PROXY_H
#define THAW_PROXY_H

#include <stdbool.h>
#include <stdint.h>

#include "thaw/buf.h"
#include "thaw/http.h"
#include "thaw/jsonscan.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/model.h"
#include "thaw/queue.h"
#include "thaw/router.h"

struct conn;
struct metrics_stream;
struct server;
struct upstream;

enum request_state {
    REQ_READING,
    REQ_ROUTED,   /* complete, being placed */
    REQ_QUEUED,
    REQ_UPSTREAM, /* at a replica */
    REQ_ANSWERED, /* an answer is being (or has been) written */
};

struct request {
    struct queue_item qi; /* while queued */
    struct list_node cache_node;
    struct conn *conn;
    struct http_head head;
    struct buf body;
    struct buf up_head; /* the head sent upstream */
    struct model *model;
    struct route route;
    enum tier tier;
    enum request_state state;
    uint64_t start_ms, queued_ms, dispatch_ms;
    struct upstream *up;
    struct endpoint *last_ep;
    uint16_t tries;
    bool counted;          /* its outcome has been counted */
    bool stale_retried;    /* sent again once after a pooled connection failed */
    bool response_started; /* response bytes went to the client */
    bool model_resolved;
    bool heartbeat; /* thaw sent a 200 event-stream head and ": loading" comments */
    size_t body_seen;       /* body bytes already accounted for and scanned */
    uint64_t body_reserved; /* this request's share of server.buffered_body_bytes */
    /* While a body-routed request's model is unknown: the scan of its body
     * (about 450 bytes, freed once the route is decided). */
    struct jsonscan *scan;
    /* The admin port's streamed /metrics answer, while it is being written. */
    struct metrics_stream *metrics_stream;
};

struct request *request_new(struct server *srv, struct conn *c);
/* Frees r (or caches it). r must not be queued or at an upstream. */
void request_free(struct server *srv, struct request *r);

/* conn -> proxy. The head of a proxy-port request is complete: route what
 * can be routed now. Returns REJECT_COUNT to go on reading the body, or a
 * reason to reject the request with. */
int proxy_on_head(struct conn *c, struct request *r);
/* conn -> proxy. More of the body arrived (r->body grew): account for it
 * and route by its "model" as soon as that is known. false when the
 * request was answered (rejected) meanwhile. */
bool proxy_on_body(struct conn *c, struct request *r);
/* The whole request has arrived. The proxy answers it sooner or later. */
void proxy_on_request(struct conn *c, struct request *r);
/* The connection is going away while r is unanswered. */
void proxy_on_abort(struct conn *c, struct request *r, enum abort_reason reason);

/* upstream -> proxy. Each is called once the upstream has let go of r. */
/* Connecting failed before any byte was sent: try elsewhere or answer 502. */
void proxy_upstream_retry(struct request *r);
/* The response ended; r may be answered-done. */
void proxy_upstream_done(struct request *r);
/* The upstream failed; before the response started this answers `reason`,
 * after it the client connection is aborted. */
void proxy_upstream_failed(struct request *r, enum reject_reason reason, enum abort_reason abort);

/* A model gained capacity: dispatch what waits. */
void proxy_dispatch(struct server *srv, struct model *m);
/* m is being removed: answers its queued requests and those still reading
 * their body (503 no_replicas with reason). */
void proxy_model_removed(struct server *srv, struct model *m, const char *reason);
/* Answers every queued request of m with reason (model removed, shutdown). */
void proxy_flush_queue(struct server *srv, struct model *m, enum reject_reason reason,
                       const char *detail);
/* Seconds a client told to retry should wait: the model's measured cold start
 * (or restart backoff) when it has no ready replica, else 1. */
unsigned proxy_retry_after_s(const struct request *r);

/* Outcome accounting (proxy-port requests only; admin ones are not counted). */
void proxy_count_proxied(struct server *srv, struct request *r, int status);
void proxy_count_rejected(struct server *srv, struct request *r, enum reject_reason reason);
void proxy_count_aborted(struct server *srv, struct request *r, enum abort_reason reason);

#endif

/* The request path between a client connection and a replica: route,
 * classify (tier), queue or dispatch, retry. Outcomes are counted by
 * request.c. */
#ifndef THAW_PROXY_H
#define THAW_PROXY_H

#include <stdbool.h>
#include <stdint.h>

#include "thaw/buf.h"
#include "thaw/conn.h"
#include "thaw/http.h"
#include "thaw/jsonscan.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/model.h"
#include "thaw/queue.h"
#include "thaw/request.h"
#include "thaw/router.h"
#include "thaw/upstream.h"

struct conn;
struct metrics_stream;
struct runtime;
struct upstream;

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

/* What upstream connections report to (see upstream.h): retry elsewhere or
 * answer 502, count and finish, answer or abort on failure, dispatch when a
 * slot frees. */
extern const struct upstream_handler proxy_upstream_handler;

/* A reload changed the tenants: every model's flows take their new caps and
 * weights, then dispatch. */
void proxy_tenants_changed(struct runtime *rt);
/* A model gained capacity: dispatch what waits. */
void proxy_dispatch(struct runtime *rt, struct model *m);
/* m is being removed: answers its queued requests and those still reading
 * their body (503 no_replicas with reason). */
void proxy_model_removed(struct runtime *rt, struct model *m, const char *reason);
/* Every request at a replica is given up (a drain's deadline): one whose
 * answer has not started gets `reason`, a heartbeat stream its error
 * event, the others are cut (`abort`). Queues must be empty first. */
void proxy_give_up_forwarded(struct runtime *rt, enum reject_reason reason,
                             enum abort_reason abort);
/* Answers every queued request of m with reason (model removed, shutdown). */
void proxy_flush_queue(struct runtime *rt, struct model *m, enum reject_reason reason,
                       const char *detail);
/* Seconds a client told to retry should wait: the model's measured cold start
 * (or restart backoff) when it has no ready replica, else 1. */
unsigned proxy_retry_after_s(const struct request *r);

/* Makes the proxy the fleet's listener (dispatch on capacity, answer the
 * queues of models removed or failing to start, close the pools of replicas
 * gone, pool a new replica's first connection) and the handler of rt's
 * replica connections. */
void proxy_wire(struct runtime *rt);
/* m's revisions or rollout changed: runs (or stops) its rollout timer. */
void proxy_revisions_changed(struct runtime *rt, struct model *m);
/* Links the configuration's models with revisions to their revisions'
 * models (start-up, reload) and runs their rollouts. 0 or -ENOMEM. */
int proxy_link_revisions(struct runtime *rt, const struct config *cfg);

/* What the proxy port's connections call (see conn.h). */
extern const struct conn_handler proxy_conn_handler;

#endif

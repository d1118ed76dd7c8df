/* The admin port: /healthz, /readyz, /metrics (Prometheus text format) and
 * /status (JSON: models, replicas, queues). Read-only; no secrets. */
#ifndef THAW_ADMIN_H
#define THAW_ADMIN_H

#include "thaw/buf.h"

struct conn;
struct request;
struct server;

void admin_on_request(struct conn *c, struct request *r);
/* The connection is going away with r unfinished (a /metrics answer still
 * being written): frees what r's answer holds. */
void admin_on_abort(struct conn *c, struct request *r);
/* Renders the whole Prometheus exposition into out at once. (GET /metrics
 * writes the same text in pieces, from a snapshot of the models.) */
void admin_render_metrics(struct server *srv, struct buf *out);
/* Renders /status into out. */
void admin_render_status(struct server *srv, struct buf *out);

#endif

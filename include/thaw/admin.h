/* The admin port: /healthz, /readyz, /metrics (Prometheus text format) and
 * /status (JSON: models, replicas, queues). Read-only; no secrets. */
#ifndef THAW_ADMIN_H
#define THAW_ADMIN_H

#include "thaw/buf.h"

struct conn;
struct request;
struct server;

void admin_on_request(struct conn *c, struct request *r);
/* Renders the Prometheus exposition into out. */
void admin_render_metrics(struct server *srv, struct buf *out);
/* Renders /status into out. */
void admin_render_status(struct server *srv, struct buf *out);

#endif

/* The admin port: /healthz, /readyz, /metrics (Prometheus text format) and
 * /status (JSON: models, replicas, queues). Read-only; no secrets. */
#ifndef THAW_ADMIN_H
#define THAW_ADMIN_H

#include "thaw/buf.h"
#include "thaw/conn.h"

struct conn;
struct request;
struct server;

/* What the admin port's connections call (see conn.h): answers each
 * request; a /metrics answer still being written when the connection goes
 * is freed. */
extern const struct conn_handler admin_conn_handler;

#endif

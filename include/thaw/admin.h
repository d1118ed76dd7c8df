/* The admin port: /healthz, /readyz, /metrics (Prometheus text format) and
 * /status (JSON: models, replicas, queues). Read-only; no secrets. */
#ifndef THAW_ADMIN_H
#define THAW_ADMIN_H

#include "thaw/buf.h"
#include "thaw/conn.h"

#include <stdbool.h>
#include <stddef.h>

struct backend;
struct runtime;

#define ADMIN_MAX_BACKENDS 3

/* What the admin port reads: the runtime context, and from the server (by
 * callback) the backends in use and whether it is ready. */
struct admin_ctx {
    struct runtime *rt;
    void *ud; /* for the callbacks */
    bool (*is_ready)(void *ud);
    /* The backends in use; returns how many (at most ADMIN_MAX_BACKENDS). */
    size_t (*backends)(void *ud, struct backend **out);
};

/* What the admin port's connections call (see conn.h; their context is a
 * struct admin_ctx): answers each
 * request; a /metrics answer still being written when the connection goes
 * is freed. */
extern const struct conn_handler admin_conn_handler;

#endif

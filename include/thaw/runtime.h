/* The runtime context: what the request path shares while the process runs
 * (the loop, the configuration in force, the fleet, the connection and
 * upstream contexts, the request cache and the counters). The server owns
 * one and wires it; the proxy and the admin port reach only this, never the
 * server with its listeners, signals and backends. */
#ifndef THAW_RUNTIME_H
#define THAW_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "thaw/config.h"
#include "thaw/conn.h"
#include "thaw/fdbudget.h"
#include "thaw/http.h"
#include "thaw/metrics.h"
#include "thaw/model.h"
#include "thaw/queue.h"
#include "thaw/request.h"
#include "thaw/tenant.h"
#include "thaw/upstream.h"

/* The outcome of configuration reloads, as /status and /metrics report it. */
struct reload_status {
    uint64_t succeeded, failed;
    bool last_ok;
    double last_success_unix; /* start-up counts as the first success */
    double last_attempt_unix; /* 0: never reloaded */
    unsigned restart_needed;  /* settings the last reload could not apply */
    char restart_keys[512];   /* their keys, one per line (cut short when many) */
    char last_error[768];     /* "FILE:LINE: KEY: problem" of the last failure */
    /* Set from the command line: these file settings are overridden. */
    bool listen_overridden, admin_listen_overridden, log_level_overridden;
};

struct runtime {
    struct event_base *base;
    struct config *cfg; /* the configuration in force (replaced by a reload) */
    struct fleet fleet;
    struct queue_global qglobal;
    struct conn_ctx net;    /* client connections */
    struct upstream_ctx up; /* replica connections */
    struct request_pool requests; /* request objects and what they count into */
    struct server_metrics metrics;
    uint64_t inflight; /* proxy requests accepted and not yet finished */
    /* Request body bytes held (reserved from Content-Length, or read so
     * far), against limits.max_buffered_body_bytes. */
    uint64_t buffered_body_bytes;
    size_t n_conns;       /* proxy-port connections counted against the limit */
    size_t n_admin_conns; /* admin-port connections */
    /* What the descriptor limit allows (the server works it out at start-up
     * and on each reload: runtime_set_fds; limit 0 before), and from it the
     * limits in force: proxy-port connections (limits.max_connections, or
     * fewer), and connections refused at that limit that may be open at once
     * for their 503 and lingering close. */
    struct fdbudget fds;
    uint64_t max_conns;
    size_t max_refused;
    size_t n_refused; /* connections refused at max_conns still open */
    struct http_limits req_limits, resp_limits, admin_limits;
    struct reload_status reload;
    uint64_t started_ms;
    struct tenants tenants; /* from cfg->tenants (runtime_apply_config) */
    /* The last tenants document loaded from cfg->tenants.source, in force
     * over the file's tenants while that source is configured. */
    struct config_tenants source_tenants;
    bool source_loaded;
};

/* Sets up rt for cfg on base: the connection and upstream contexts, the
 * request cache, the fleet, and the limits and timeouts of cfg. The caller
 * then wires the handlers (proxy_wire). 0 or -ENOMEM. */
int runtime_init(struct runtime *rt, struct config *cfg, struct event_base *base);
/* Applies rt->cfg's limits, timeouts and upstream settings to what happens
 * next (after a reload replaced rt->cfg): requests already read and
 * connections already armed keep what they had. */
void runtime_apply_config(struct runtime *rt);
/* Takes fds (what the descriptor limit allows) and applies it with the
 * configuration in force (runtime_apply_config does again). */
void runtime_set_fds(struct runtime *rt, const struct fdbudget *fds);
/* Frees the request cache and the read buffer (not the loop, the fleet or
 * the configuration: their owner frees those). */
void runtime_dispose(struct runtime *rt);

#endif

#include "thaw/runtime.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* How long a rejected connection lingers (discarding input) before it closes. */
#define RUNTIME_LINGER_MS 2000

/* libevent's common timeouts: one queue per duration instead of a heap entry
 * per connection. libevent allows a bounded number of distinct ones: past
 * it, the running value is kept. */
int runtime_init(struct runtime *rt, struct config *cfg, struct event_base *base)
{
    rt->cfg = cfg;
    rt->base = base;
    rt->started_ms = clock_now_ms();
    list_init(&rt->net.conns);
    if (tenants_init(&rt->tenants)) {
        return -ENOMEM;
    }
    request_pool_init(&rt->requests, &rt->metrics, &rt->inflight, &rt->buffered_body_bytes);
    rt->net.scratch = malloc(CONN_SCRATCH_BYTES);
    if (!rt->net.scratch) {
        return -ENOMEM;
    }
    const struct config_limits *lim = &cfg->limits;
    rt->resp_limits = (struct http_limits){cfg->upstream.max_response_header_bytes, 1000, 0};
    rt->admin_limits = (struct http_limits){16384, 64, 0};
    rt->net.base = base;
    rt->net.linger_ms = RUNTIME_LINGER_MS;
    fleet_init(&rt->fleet, &rt->qglobal, lim->queue_aging_ms);
    rt->fleet.cb_ud = rt;
    rt->up = (struct upstream_ctx){
        .base = base,
        .scratch = rt->net.scratch,
        .resp_limits = &rt->resp_limits,
        .ud = rt,
        .metrics = &rt->metrics,
        .draining = &rt->net.draining,
    };
    list_init(&rt->up.pooled);
    runtime_apply_config(rt);
    return 0;
}

/* The connection limits in force: the configured ones, lowered to what the
 * descriptor limit allows once that is known. Replica connections share the
 * clients' budget (one each): past it a new one first closes a pooled one. */
static void apply_fds(struct runtime *rt)
{
    rt->max_conns = fdbudget_connections(&rt->fds, rt->cfg->limits.max_connections);
    rt->max_refused = rt->fds.limit ? rt->fds.max_refused : CONN_MAX_LINGERING;
    rt->up.max_open = rt->fds.limit ? rt->max_conns : 0;
}

void runtime_set_fds(struct runtime *rt, const struct fdbudget *fds)
{
    rt->fds = *fds;
    apply_fds(rt);
}

void runtime_apply_config(struct runtime *rt)
{
    const struct config *cfg = rt->cfg;
    const struct config_limits *lim = &cfg->limits;
    rt->req_limits =
        (struct http_limits){lim->max_header_bytes, lim->max_headers, lim->max_body_bytes};
    rt->resp_limits.max_head_bytes = cfg->upstream.max_response_header_bytes;
    rt->net.header_timeout_ms = lim->header_timeout_ms;
    rt->net.keepalive_timeout_ms = lim->keepalive_timeout_ms;
    rt->net.send_timeout_ms = lim->send_timeout_ms;
    rt->net.body_timeout_ms = lim->body_timeout_ms;
    rt->net.body_total_timeout_ms = lim->body_total_timeout_ms;
    rt->up.keepalive_per_endpoint = cfg->upstream.keepalive_per_endpoint;
    rt->up.keepalive_timeout_ms = cfg->upstream.keepalive_timeout_ms;
    rt->up.eject_ms = cfg->upstream.eject_ms;
    rt->qglobal.max_total = lim->max_queue_total;
    rt->fleet.queue_aging_ms = lim->queue_aging_ms;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &rt->fleet.models)
    {
        container_of(pos, struct model, node)->queue.aging_ms = lim->queue_aging_ms;
    }
    apply_fds(rt);
    rt->requests.access_log = cfg->access_log;
    bool from_source = cfg->tenants.source.kind != TENANTS_SOURCE_NONE && rt->source_loaded;
    int rc = tenants_apply(&rt->tenants, from_source ? &rt->source_tenants : &cfg->tenants);
    if (rc) {
        LOGE("tenants not applied; keeping the running ones", "error=\"%s\"",
             rc == -ENOSPC ? "more than 4096 tenant names over this process's life"
                           : strerror(-rc));
    }
}

void runtime_dispose(struct runtime *rt)
{
    tenants_dispose(&rt->tenants);
    config_tenants_dispose(&rt->source_tenants);
    request_pool_dispose(&rt->requests);
    free(rt->net.scratch);
    rt->net.scratch = NULL;
}

#include "thaw/model.h"
#include "thaw/clock.h"
#include "thaw/netaddr.h"
#include "thaw/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fleet_init(struct fleet *f, struct queue_global *qg, uint64_t queue_aging_ms)
{
    memset(f, 0, sizeof *f);
    list_init(&f->models);
    router_init(&f->router);
    f->qglobal = qg;
    f->queue_aging_ms = queue_aging_ms;
}

void model_apply_settings(struct model *m, const struct config_model *cm)
{
    m->set.max_concurrency = (uint32_t)cm->max_concurrency;
    m->set.priority = cm->priority;
    m->set.max_queue = cm->max_queue;
    m->queue.max = (size_t)cm->max_queue;
    if (cm->queue_timeout_ms < m->set.queue_timeout_ms && m->queue.count > 0 &&
        queue_cap_deadlines(&m->queue, cm->queue_timeout_ms, clock_now_ms()) && m->fleet &&
        m->fleet->on_deadlines) {
        m->fleet->on_deadlines(m->fleet->cb_ud, m);
    }
    m->set.queue_timeout_ms = cm->queue_timeout_ms;
    m->set.connect_timeout_ms = cm->connect_timeout_ms;
    m->set.first_byte_timeout_ms = cm->first_byte_timeout_ms;
    m->set.upstream_idle_timeout_ms = cm->upstream_idle_timeout_ms;
    m->set.loading_heartbeat_ms = cm->loading_heartbeat_ms;
    const char *hp = cm->health_path ? cm->health_path : "/health";
    snprintf(m->set.health_path, sizeof m->set.health_path, "%s",
             strlen(hp) < sizeof m->set.health_path ? hp : "/");
}

/* Routes every name of cm to m; a name another model holds stays with it,
 * and a warning names them. */
static int route_model(struct fleet *f, struct model *m, const struct config_model *cm)
{
    m->name_taken = false;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &f->models)
    {
        const struct model *o = container_of(pos, struct model, node);
        if (o != m && !o->name_taken && strcmp(o->name, m->name) == 0 &&
            strcmp(o->namespace_, m->namespace_) == 0) {
            m->name_taken = true;
            break;
        }
    }
    struct route_names rn = {
        .name = cm->name,
        .namespace_ = cm->namespace_,
        .hosts = (const char *const *)cm->hosts,
        .n_hosts = cm->n_hosts,
        .aliases = (const char *const *)cm->aliases,
        .n_aliases = cm->n_aliases,
    };
    struct route_conflicts conflicts = {0};
    int rc = router_add(&f->router, m, &rn, &conflicts);
    if (!rc && conflicts.n) {
        char names[sizeof conflicts.names * 4 + 8];
        LOGW("model names already taken by another model are ignored",
             "model=%s namespace=%s conflicts=%zu names=%s", cm->name, cm->namespace_,
             conflicts.n, log_quote(names, sizeof names, conflicts.names,
                                    strlen(conflicts.names), sizeof conflicts.names));
    }
    return rc;
}

int fleet_reroute_model(struct fleet *f, struct model *m, const struct config_model *cm)
{
    router_remove(&f->router, m);
    return route_model(f, m, cm);
}

struct model *fleet_add_model(struct fleet *f, const struct config_model *cm)
{
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        return NULL;
    }
    m->fleet = f;
    m->refs = 1;
    m->name = strdup(cm->name);
    m->namespace_ = strdup(cm->namespace_);
    if (!m->name || !m->namespace_) {
        free(m->name);
        free(m->namespace_);
        free(m);
        return NULL;
    }
    queue_init(&m->queue, (size_t)cm->max_queue, f->queue_aging_ms, f->qglobal);
    model_apply_settings(m, cm);
    if (route_model(f, m, cm)) {
        router_remove(&f->router, m);
        queue_dispose(&m->queue); /* out of the global bound's list */
        free(m->name);
        free(m->namespace_);
        free(m);
        return NULL;
    }
    list_push_back(&f->models, &m->node);
    f->n_models++;
    return m;
}

struct model *fleet_find(const struct fleet *f, const char *namespace_, const char *name)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &f->models)
    {
        struct model *m = container_of(pos, struct model, node);
        if (strcmp(m->name, name) == 0 && strcmp(m->namespace_, namespace_) == 0) {
            return m;
        }
    }
    return NULL;
}

static void detach_endpoint(struct model *m, size_t i)
{
    struct endpoint *ep = m->endpoints[i];
    m->endpoints[i] = m->endpoints[--m->n_endpoints];
    /* Requests still running on it (a draining or dead replica) no longer
     * hold the model's slots; they stay its load until they end, or the
     * autoscaler, seeing them gone, would drain the next replica under its
     * own streams. */
    m->inflight -= ep->inflight;
    if (ep->inflight && !ep->left) {
        m->inflight_leaving += ep->inflight;
        ep->left = m;
        model_ref(m);
    }
    ep->model = NULL;
    if (m->fleet->on_endpoint_gone) {
        m->fleet->on_endpoint_gone(m->fleet->cb_ud, ep);
    }
    endpoint_unref(ep); /* the model's link */
}

int fleet_replica_ready(struct fleet *f, struct model *m, const char *id, const char *addr)
{
    return fleet_replica_ready_with(f, m, id, addr, UINT32_MAX, -1);
}

int fleet_replica_ready_with(struct fleet *f, struct model *m, const char *id, const char *addr,
                             uint32_t share, int conn_fd)
{
    for (size_t i = 0; i < m->n_endpoints; i++) {
        if (strcmp(m->endpoints[i]->id, id) == 0) {
            if (conn_fd >= 0) {
                close(conn_fd);
            }
            return 0; /* already known */
        }
    }
    struct endpoint *ep = endpoint_new(id, addr);
    if (!ep) {
        int err = errno;
        if (conn_fd >= 0) {
            close(conn_fd);
        }
        return -err;
    }
    ep->model = m;
    snprintf(ep->model_name, sizeof ep->model_name, "%s", m->name);
    ep->share = share;
    snprintf(ep->check_path, sizeof ep->check_path, "%s", m->set.health_path);
    ep->one_queue = !m->fixed_replicas; /* a configured address may be a load balancer's */
    if (m->n_endpoints == m->cap_endpoints) {
        size_t ncap = m->cap_endpoints ? m->cap_endpoints * 2 : 4;
        struct endpoint **ne = realloc(m->endpoints, ncap * sizeof *ne);
        if (!ne) {
            endpoint_unref(ep);
            if (conn_fd >= 0) {
                close(conn_fd);
            }
            return -ENOMEM;
        }
        m->endpoints = ne;
        m->cap_endpoints = ncap;
    }
    ep->head_start_until_ms = clock_now_ms() + UPSTREAM_HEAD_START_MS;
    m->endpoints[m->n_endpoints++] = ep;
    LOGI("replica ready", "model=%s replica=%s addr=%s", m->name, id, addr);
    if (conn_fd >= 0 && f->on_endpoint_conn) {
        f->on_endpoint_conn(f->cb_ud, ep, conn_fd);
    } else if (conn_fd >= 0) {
        close(conn_fd);
    }
    if (f->on_capacity) {
        f->on_capacity(f->cb_ud, m);
    }
    return 0;
}

void fleet_replica_gone(struct fleet *f, struct model *m, const char *id, const char *reason)
{
    for (size_t i = 0; i < m->n_endpoints; i++) {
        if (strcmp(m->endpoints[i]->id, id) == 0) {
            LOGI("replica gone", "model=%s replica=%s reason=\"%s\"", m->name, id, reason);
            detach_endpoint(m, i);
            return;
        }
    }
}

void fleet_model_unavailable(struct fleet *f, struct model *m, const char *reason,
                             uint64_t retry_after_ms)
{
    if (f->on_unavailable) {
        f->on_unavailable(f->cb_ud, m, reason, retry_after_ms);
    }
}

void fleet_revisions_changed(struct fleet *f, struct model *m)
{
    if (f->on_revisions) {
        f->on_revisions(f->cb_ud, m);
    }
}

void fleet_remove_model(struct fleet *f, struct model *m, const char *reason)
{
    m->removing = true;
    if (f->on_removing) {
        f->on_removing(f->cb_ud, m, reason);
    }
    router_remove(&f->router, m);
    model_revisions_unlink(m);
    while (m->n_endpoints) {
        detach_endpoint(m, m->n_endpoints - 1);
    }
    list_remove(&m->node);
    f->n_models--;
    /* Requests still holding m may ask it things; it has no backend now. */
    m->removed = true;
    m->backend = NULL;
    m->backend_data = NULL;
    model_unref(m);
}

void model_ref(struct model *m)
{
    m->refs++;
}

void model_unref(struct model *m)
{
    if (--m->refs > 0) {
        return;
    }
    queue_dispose(&m->queue);
    free(m->endpoints);
    model_revisions_free(m->revs);
    free(m->revision);
    free(m->name);
    free(m->namespace_);
    free(m);
}

void fleet_dispose(struct fleet *f)
{
    while (!list_empty(&f->models)) {
        struct model *m = container_of(list_first(&f->models), struct model, node);
        fleet_remove_model(f, m, "shutdown");
    }
    router_dispose(&f->router);
}

static uint32_t endpoint_slots(const struct model *m, const struct endpoint *ep)
{
    return ep->share < m->set.max_concurrency ? ep->share : m->set.max_concurrency;
}

struct endpoint *model_pick_endpoint(struct model *m, uint64_t now_ms)
{
    struct endpoint *best = NULL, *best_ejected = NULL;
    bool all_ejected = true;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        struct endpoint *ep = m->endpoints[i];
        bool ejected = ep->ejected_until_ms > now_ms;
        if (!ejected) {
            all_ejected = false;
        }
        if (ep->inflight >= endpoint_slots(m, ep)) {
            continue;
        }
        if (ep->n_idle == 0 && ep->unconfirmed >= ep->accept_window) {
            continue; /* it has not accepted the connections it has yet */
        }
        if (ep->inflight > 0 && ep->head_start_until_ms > now_ms) {
            continue; /* its first request goes alone */
        }
        if (ejected) {
            if (!best_ejected || ep->ejected_until_ms < best_ejected->ejected_until_ms) {
                best_ejected = ep;
            }
            continue;
        }
        if (!best || ep->inflight < best->inflight) {
            best = ep;
        }
    }
    /* When every replica is ejected, try the one whose ejection ends first
     * rather than refusing everything (Envoy's panic mode), for models whose
     * replicas are fixed. Where the backend replaces replicas, an ejected one
     * is usually gone (a pod the watch has not reported yet): wait instead. */
    if (!best && all_ejected && m->fixed_replicas) {
        best = best_ejected;
    }
    return best;
}

size_t model_serving_endpoints(const struct model *m, uint64_t now_ms)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        n += m->endpoints[i]->ejected_until_ms <= now_ms;
    }
    return n;
}

uint64_t model_next_opening(const struct model *m, uint64_t now_ms)
{
    uint64_t best = 0;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        const struct endpoint *ep = m->endpoints[i];
        uint64_t at[2] = {ep->ejected_until_ms, ep->inflight ? ep->head_start_until_ms : 0};
        for (int k = 0; k < 2; k++) {
            if (at[k] > now_ms && (best == 0 || at[k] < best)) {
                best = at[k];
            }
        }
    }
    return best;
}

uint32_t model_capacity(const struct model *m)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        sum += endpoint_slots(m, m->endpoints[i]);
    }
    return sum;
}

double model_demand(const struct model *m)
{
    return (double)m->inflight + (double)m->inflight_leaving + (double)queue_runnable(&m->queue);
}

void endpoint_take_slot(struct endpoint *ep)
{
    ep->inflight++;
    ep->model->inflight++;
    ep->requests++;
}

struct model *endpoint_give_slot(struct endpoint *ep)
{
    ep->inflight--;
    if (ep->model) {
        ep->model->inflight--;
    } else if (ep->left) {
        ep->left->inflight_leaving--;
        if (!ep->inflight) {
            model_unref(ep->left);
            ep->left = NULL;
        }
    }
    return ep->model;
}

/* ---- revisions: their links and lifetime (the decisions are revisions.c's) */

void model_revisions_free_names(struct model_revisions *rv)
{
    for (size_t i = 0; i < rv->n; i++) {
        free(rv->names[i]);
        rv->names[i] = NULL;
    }
}

void model_revisions_free(struct model_revisions *rv)
{
    if (!rv) {
        return;
    }
    model_revisions_free_names(rv);
    free(rv->sticky_header);
    free(rv);
}

void model_revisions_unlink(struct model *m)
{
    if (m->parent && m->parent->revs) {
        struct model_revisions *rv = m->parent->revs;
        for (size_t i = 0; i < rv->n; i++) {
            if (rv->rev[i] == m) {
                rv->rev[i] = NULL;
            }
        }
    }
    m->parent = NULL;
    if (m->revs) {
        for (size_t i = 0; i < m->revs->n; i++) {
            if (m->revs->rev[i]) {
                m->revs->rev[i]->parent = NULL;
            }
        }
        model_revisions_free(m->revs);
        m->revs = NULL;
    }
}

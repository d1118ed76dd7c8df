/* Configuration reload: diff the running configuration against a freshly
 * loaded one and apply the difference without dropping anything that did
 * not change. See reload.h. */
#include "thaw/reload.h"
#include "thaw/clock.h"
#include "thaw/backend.h"
#include "thaw/config.h"
#include "thaw/log.h"
#include "thaw/proxy.h"
#include "thaw/server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void reload_status_init(struct reload_status *st)
{
    memset(st, 0, sizeof *st);
    st->last_ok = true;
    st->last_success_unix = unix_now();
}

/* SIGHUP: reload the configuration file (on the loop, never in a raw
 * signal handler). */
static void on_sighup(evutil_socket_t sig, short what, void *arg)
{
    reload_from_file(arg);
}

int reload_install(struct server *srv)
{
    reload_status_init(&srv->rt.reload);
    srv->sig_hup = evsignal_new(srv->rt.base, SIGHUP, on_sighup, srv);
    return srv->sig_hup ? event_add(srv->sig_hup, NULL) : -1;
}

/* ---- comparing ----------------------------------------------------------- */

static bool same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool same_strv(char **a, size_t na, char **b, size_t nb)
{
    if (na != nb) {
        return false;
    }
    for (size_t i = 0; i < na; i++) {
        if (!same_str(a[i], b[i])) {
            return false;
        }
    }
    return true;
}

static bool same_names(const struct config_model *a, const struct config_model *b)
{
    return same_strv(a->hosts, a->n_hosts, b->hosts, b->n_hosts) &&
           same_strv(a->aliases, a->n_aliases, b->aliases, b->n_aliases);
}

/* What model_apply_settings takes. */
static bool same_settings(const struct config_model *a, const struct config_model *b)
{
    return a->max_concurrency == b->max_concurrency && a->priority == b->priority &&
           a->max_queue == b->max_queue && a->queue_timeout_ms == b->queue_timeout_ms &&
           a->connect_timeout_ms == b->connect_timeout_ms &&
           a->first_byte_timeout_ms == b->first_byte_timeout_ms &&
           a->upstream_idle_timeout_ms == b->upstream_idle_timeout_ms &&
           a->loading_heartbeat_ms == b->loading_heartbeat_ms;
}

/* A model's revisions: their names and shares, and how requests go to them
 * (fleet_link_revisions applies them after the models). */
static bool same_split(const struct config_model *a, const struct config_model *b)
{
    if (a->n_revisions != b->n_revisions ||
        a->fallback_to_warm_revision != b->fallback_to_warm_revision ||
        a->sticky_tenant != b->sticky_tenant || !same_str(a->sticky_header, b->sticky_header) ||
        memcmp(&a->rollout, &b->rollout, sizeof a->rollout) != 0) {
        return false;
    }
    for (size_t i = 0; i < a->n_revisions; i++) {
        if (!same_str(a->revisions[i].name, b->revisions[i].name) ||
            a->revisions[i].percent != b->revisions[i].percent) {
            return false;
        }
    }
    return true;
}

/* What the backend takes: endpoints, or every key of the process
 * definition and counts (the process backend's take_definition). */
static bool same_replicas(const struct config_model *a, const struct config_model *b)
{
    return same_strv(a->endpoints, a->n_endpoints, b->endpoints, b->n_endpoints) &&
           same_strv(a->command, a->n_command, b->command, b->n_command) &&
           same_strv(a->env, a->n_env, b->env, b->n_env) &&
           same_str(a->health_path, b->health_path) && a->min_replicas == b->min_replicas &&
           a->max_replicas == b->max_replicas && a->idle_timeout_ms == b->idle_timeout_ms &&
           a->startup_timeout_ms == b->startup_timeout_ms &&
           a->stop_grace_ms == b->stop_grace_ms && a->stop_drain_ms == b->stop_drain_ms &&
           a->gpu_slices == b->gpu_slices && a->gpu_memory_bytes == b->gpu_memory_bytes &&
           same_str(a->mig_profile, b->mig_profile) && a->target == b->target &&
           a->stable_window_ms == b->stable_window_ms && a->prewarm == b->prewarm &&
           memcmp(&a->sleep, &b->sleep, sizeof a->sleep) == 0;
}

static const struct config_model *find_config_model(const struct config *cfg, const char *ns,
                                                    const char *name)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        if (strcmp(cfg->models[i].name, name) == 0 &&
            strcmp(cfg->models[i].namespace_, ns) == 0) {
            return &cfg->models[i];
        }
    }
    return NULL;
}

/* ---- settings that need a restart ----------------------------------------- */

#define SWAP(a, b)                                                                                 \
    do {                                                                                           \
        __typeof__(a) swap_tmp_ = (a);                                                             \
        (a) = (b);                                                                                 \
        (b) = swap_tmp_;                                                                           \
    } while (0)

static void needs_restart(struct server *srv, const char *key)
{
    struct reload_status *st = &srv->rt.reload;
    st->restart_needed++;
    size_t used = strlen(st->restart_keys);
    if (used + strlen(key) + 2 <= sizeof st->restart_keys) {
        snprintf(st->restart_keys + used, sizeof st->restart_keys - used, "%s\n", key);
    }
    LOGW("configuration change needs a restart; keeping the running value", "key=%s file=%s",
         key, LOG_Q(srv->rt.cfg->path));
}

static bool same_gpus(const struct config *a, const struct config *b)
{
    if (a->n_gpus != b->n_gpus || a->gpu_discovery != b->gpu_discovery ||
        a->gpu_discovery_slices != b->gpu_discovery_slices) {
        return false;
    }
    for (size_t i = 0; i < a->n_gpus; i++) {
        const struct config_gpu *x = &a->gpus[i], *y = &b->gpus[i];
        if (x->id != y->id || x->slices != y->slices || x->sharing != y->sharing ||
            x->memory_bytes != y->memory_bytes || !same_str(x->mig, y->mig) ||
            !same_str(x->profile, y->profile)) {
            return false;
        }
    }
    return true;
}

/* The watch is set up at start-up: another source needs a restart. */
static bool same_tenants_source(const struct config_tenants_source *a,
                                const struct config_tenants_source *b)
{
    return a->kind == b->kind && same_str(a->namespace_, b->namespace_) &&
           same_str(a->name, b->name) && same_str(a->key, b->key);
}

static bool same_kubernetes(const struct config_kubernetes *a, const struct config_kubernetes *b)
{
    return a->enabled == b->enabled &&
           same_strv(a->namespaces, a->n_namespaces, b->namespaces, b->n_namespaces) &&
           same_str(a->label_selector, b->label_selector) &&
           same_str(a->kubeconfig, b->kubeconfig) && same_str(a->context, b->context) &&
           a->probe_pods == b->probe_pods && a->events == b->events &&
           a->default_port == b->default_port && a->leader_election == b->leader_election &&
           same_str(a->lease_name, b->lease_name) &&
           same_str(a->lease_namespace, b->lease_namespace) &&
           same_str(a->identity, b->identity) && a->lease_duration_ms == b->lease_duration_ms &&
           a->renew_interval_ms == b->renew_interval_ms &&
           a->renew_deadline_ms == b->renew_deadline_ms &&
           same_str(a->peers_service, b->peers_service) &&
           same_str(a->peers_namespace, b->peers_namespace) && a->peers_port == b->peers_port &&
           a->peers_poll_ms == b->peers_poll_ms && a->peers_timeout_ms == b->peers_timeout_ms &&
           a->gpu_memory_bytes == b->gpu_memory_bytes;
}

/* Moves the running values of restart-only settings into next (swapping, so
 * whatever the running backends point into stays alive in next), warning
 * about each one the file changed. */
static void keep_restart_only(struct server *srv, struct config *next)
{
    struct config *cur = srv->rt.cfg;
    struct reload_status *st = &srv->rt.reload;
    if (!st->listen_overridden && strcmp(cur->listen, next->listen) != 0) {
        needs_restart(srv, "listen");
    }
    SWAP(cur->listen, next->listen);
    if (!st->admin_listen_overridden && strcmp(cur->admin_listen, next->admin_listen) != 0) {
        needs_restart(srv, "admin_listen");
    }
    SWAP(cur->admin_listen, next->admin_listen);
    if (!same_gpus(cur, next)) {
        needs_restart(srv, "gpus");
    }
    SWAP(cur->gpus, next->gpus);
    SWAP(cur->n_gpus, next->n_gpus);
    SWAP(cur->gpu_discovery, next->gpu_discovery);
    SWAP(cur->gpu_discovery_slices, next->gpu_discovery_slices);
    if (memcmp(&cur->autoscaler, &next->autoscaler, sizeof cur->autoscaler) != 0) {
        needs_restart(srv, "autoscaler");
    }
    next->autoscaler = cur->autoscaler;
    if (memcmp(&cur->warm_pool, &next->warm_pool, sizeof cur->warm_pool) != 0) {
        needs_restart(srv, "warm_pool");
    }
    next->warm_pool = cur->warm_pool;
    if (!same_kubernetes(&cur->kubernetes, &next->kubernetes)) {
        needs_restart(srv, "kubernetes");
    }
    SWAP(cur->kubernetes, next->kubernetes);
    if (!same_tenants_source(&cur->tenants.source, &next->tenants.source)) {
        needs_restart(srv, "tenants.source");
    }
    SWAP(cur->tenants.source, next->tenants.source);
    if (st->log_level_overridden) {
        next->log_level = cur->log_level;
    }
}

/* ---- thaw-wide settings ---------------------------------------------------- */

/* libevent keeps at most 256 common timeouts per loop (equal durations
 * share one); past that the running value stays rather than none. */
/* The log level applies at once; limits and timeouts with the new
 * configuration (runtime_apply_config). */
static void apply_thaw_settings(struct server *srv, const struct config *next)
{
    log_init(next->log_level);
}

/* ---- models ---------------------------------------------------------------- */

struct model_counts {
    unsigned added, removed, changed, unchanged, failed;
};

/* Models this file owns (not the ones Kubernetes discovered). */
static bool from_file(const struct server *srv, const struct model *m)
{
    return m->backend &&
           (m->backend == srv->static_backend || m->backend == srv->process_backend);
}

static struct backend *backend_for(struct server *srv, const struct config_model *cm)
{
    return cm->n_command ? srv->process_backend : srv->static_backend;
}

static void remove_model(struct server *srv, struct model *m)
{
    LOGI("model removed by reload: draining", "model=%s namespace=%s inflight=%u queued=%zu",
         m->name, m->namespace_, m->inflight, m->queue.count);
    m->removing = true; /* its queue's answers count as unrouted: its series go */
    proxy_flush_queue(&srv->rt, m, REJECT_MODEL_REMOVED, NULL);
    if (m->backend->ops->retire) {
        m->backend->ops->retire(m->backend, m);
    }
    fleet_remove_model(&srv->rt.fleet, m, "removed from the configuration");
}

static void remove_missing(struct server *srv, const struct config *next, struct model_counts *n)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->rt.fleet.models)
    {
        struct model *m = container_of(pos, struct model, node);
        if (from_file(srv, m) && !find_config_model(next, m->namespace_, m->name)) {
            remove_model(srv, m);
            n->removed++;
        }
    }
}

/* A model with a command finds the process backend running: reload_from_file
 * starts it before it applies a file that needs it. */
static int add_model(struct server *srv, const struct config *next, const struct config_model *cm)
{
    struct model *m = fleet_add_model(&srv->rt.fleet, cm);
    if (!m) {
        LOGE("out of memory adding model", "model=%s", cm->name);
        return -1;
    }
    struct backend *b = backend_for(srv, cm);
    if (b->ops->attach(b, m, cm)) {
        LOGE("cannot start model added by reload", "model=%s", cm->name);
        fleet_remove_model(&srv->rt.fleet, m, "could not be started");
        return -1;
    }
    LOGI("model added by reload", "model=%s namespace=%s line=%d", m->name, m->namespace_,
         cm->line);
    return 0;
}

/* Applies a changed definition to a running model; its queue and the
 * requests at its replicas stay. */
static int change_model(struct server *srv, struct model *m, const struct config_model *was,
                        const struct config_model *cm)
{
    bool settings = !same_settings(was, cm);
    bool replicas = !same_replicas(was, cm);
    if (settings) {
        model_apply_settings(m, cm);
    }
    /* The process autoscaler's target follows max_concurrency. */
    if ((replicas || settings) && m->backend->ops->update &&
        m->backend->ops->update(m->backend, m, cm)) {
        LOGE("cannot apply the model's new definition", "model=%s", m->name);
        return -1;
    }
    LOGI("model changed by reload",
         "model=%s namespace=%s settings=%d replicas=%d names=%d revisions=%d", m->name,
         m->namespace_, settings, replicas, !same_names(was, cm), !same_split(was, cm));
    /* More slots (or replicas) may let held requests go now. */
    proxy_dispatch(&srv->rt, m);
    return 0;
}

/* Names move between models in two passes, so one model may take a host
 * another gives up in the same reload. */
static void reroute_changed(struct server *srv, const struct config *cur, const struct config *next)
{
    struct list_node *pos, *tmp;
    for (int pass = 0; pass < 2; pass++) {
        list_for_each_safe(pos, tmp, &srv->rt.fleet.models)
        {
            struct model *m = container_of(pos, struct model, node);
            const struct config_model *was = find_config_model(cur, m->namespace_, m->name);
            const struct config_model *cm = find_config_model(next, m->namespace_, m->name);
            if (!from_file(srv, m) || !was || !cm || same_names(was, cm) ||
                !cm->n_command != !was->n_command) {
                continue;
            }
            if (pass == 0) {
                router_remove(&srv->rt.fleet.router, m);
                continue;
            }
            fleet_reroute_model(&srv->rt.fleet, m, cm);
        }
    }
}

static void apply_models(struct server *srv, const struct config *next, struct model_counts *n)
{
    const struct config *cur = srv->rt.cfg;
    remove_missing(srv, next, n);
    reroute_changed(srv, cur, next);
    for (size_t i = 0; i < next->n_models; i++) {
        const struct config_model *cm = &next->models[i];
        struct model *m = fleet_find(&srv->rt.fleet, cm->namespace_, cm->name);
        const struct config_model *was = find_config_model(cur, cm->namespace_, cm->name);
        if (m && !from_file(srv, m)) {
            LOGW("model in the file has the name of a discovered model; ignored",
                 "model=%s namespace=%s line=%d", cm->name, cm->namespace_, cm->line);
            n->failed++;
        } else if (!m) {
            if (add_model(srv, next, cm)) {
                n->failed++;
            } else {
                n->added++;
            }
        } else if (!was) {
            n->unchanged++; /* cannot happen: file models come from cur */
        } else if (!cm->n_command != !was->n_command) {
            char key[128];
            config_model_prefix(next, i, key, sizeof key);
            snprintf(key + strlen(key), sizeof key - strlen(key), "%s",
                     cm->n_command ? "command" : "endpoints");
            needs_restart(srv, key);
            n->unchanged++;
        } else if (same_settings(was, cm) && same_replicas(was, cm) && same_names(was, cm) &&
                   same_split(was, cm)) {
            n->unchanged++;
        } else if (change_model(srv, m, was, cm)) {
            n->failed++;
        } else {
            n->changed++;
        }
    }
}

/* A model whose backend kind changed keeps running as it was, so the new
 * configuration must describe it as it was. */
static void keep_running_kinds(const struct config *cur, struct config *next)
{
    for (size_t i = 0; i < next->n_models; i++) {
        struct config_model *cm = &next->models[i];
        const struct config_model *was = find_config_model(cur, cm->namespace_, cm->name);
        if (was && !cm->n_command != !was->n_command) {
            struct config_model *w = (struct config_model *)was;
            SWAP(*cm, *w);
        }
    }
}

void reload_apply(struct server *srv, struct config *next)
{
    srv->rt.reload.restart_needed = 0;
    srv->rt.reload.restart_keys[0] = '\0';
    keep_restart_only(srv, next);
    apply_thaw_settings(srv, next);
    struct model_counts n = {0};
    apply_models(srv, next, &n);
    keep_running_kinds(srv->rt.cfg, next);
    if (proxy_link_revisions(&srv->rt, next)) {
        LOGE("out of memory linking models to their revisions", NULL);
    }
    struct config *old = srv->rt.cfg;
    srv->rt.cfg = next;
    runtime_apply_config(&srv->rt); /* tenants too: keys, caps, tiers, weights */
    server_apply_fd_budget(srv, old);
    proxy_tenants_changed(&srv->rt);
    struct backend *backends[ADMIN_MAX_BACKENDS];
    size_t n_backends = server_backends(srv, backends);
    for (size_t i = 0; i < n_backends; i++) {
        if (backends[i]->ops->set_config) {
            backends[i]->ops->set_config(backends[i], next);
        }
    }
    config_free(old);
    LOGI("configuration reloaded",
         "file=%s models=%zu added=%u removed=%u changed=%u unchanged=%u failed=%u "
         "restart_needed=%u tenants=%zu",
         LOG_Q(next->path), srv->rt.fleet.n_models, n.added, n.removed, n.changed, n.unchanged,
         n.failed, srv->rt.reload.restart_needed, next->tenants.n_list);
}

int reload_apply_source_tenants(void *ud, struct config_tenants *ts)
{
    struct server *srv = ud;
    struct runtime *rt = &srv->rt;
    int rc = tenants_apply(&rt->tenants, ts);
    if (rc) {
        return rc;
    }
    SWAP(rt->source_tenants, *ts);
    rt->source_loaded = true;
    proxy_tenants_changed(rt); /* new caps and weights; what a raised cap lets go runs */
    return 0;
}

static void record_failure(struct server *srv, const char *msg)
{
    struct reload_status *st = &srv->rt.reload;
    st->failed++;
    st->last_ok = false;
    st->last_attempt_unix = unix_now();
    snprintf(st->last_error, sizeof st->last_error, "%s", msg);
    char q[600];
    log_quote(q, sizeof q, msg, strlen(msg), 500);
    LOGE("configuration reload failed: keeping the running configuration", "error=%s", q);
}

/* The file loaded, and the backends running that it needs: checks it
 * against them and applies it, or records why not. Takes next. */
static void check_and_apply(struct server *srv, struct config *next)
{
    struct config_error err;
    struct backend *backends[ADMIN_MAX_BACKENDS];
    size_t n_backends = server_backends(srv, backends);
    for (size_t i = 0; i < n_backends; i++) {
        if (backends[i]->ops->check_config &&
            backends[i]->ops->check_config(backends[i], next, err.msg, sizeof err.msg)) {
            config_free(next);
            record_failure(srv, err.msg);
            return;
        }
    }
    long over = tenants_first_over(&srv->rt.tenants, &next->tenants);
    if (over >= 0) {
        /* Checked before anything is applied, so the reload stays whole. */
        snprintf(err.msg, sizeof err.msg,
                 "%s:%d: tenants.list[%ld].name: one tenant name too many for this process "
                 "(at most %d names over its life, as metric labels; restart thaw to count "
                 "again)",
                 next->path, next->tenants.list[over].line, over, TENANTS_MAX_IDS);
        config_free(next);
        record_failure(srv, err.msg);
        return;
    }
    reload_apply(srv, next);
    struct reload_status *st = &srv->rt.reload;
    st->succeeded++;
    st->last_ok = true;
    st->last_error[0] = '\0';
    st->last_attempt_unix = st->last_success_unix = unix_now();
}

static void backend_start_failed(struct server *srv, struct config *next)
{
    struct config_error err;
    snprintf(err.msg, sizeof err.msg,
             "%s:0: models: the process backend its models need could not start (GPU "
             "discovery or the declared GPUs; see the log)",
             next->path);
    config_free(next);
    record_failure(srv, err.msg);
}

/* The GPU discovery a reload waited for has ended: the reload goes on (or
 * fails), then a SIGHUP that came meanwhile reads the file again. */
static void on_process_backend(struct server *srv, bool ok)
{
    struct config *next = srv->reload_waiting;
    srv->reload_waiting = NULL;
    if (!ok) {
        backend_start_failed(srv, next);
    } else if (srv->rt.net.draining) {
        struct config_error err;
        snprintf(err.msg, sizeof err.msg,
                 "%s:0: models: not applied: thaw began to drain while GPU discovery ran",
                 next->path);
        config_free(next);
        record_failure(srv, err.msg);
    } else {
        check_and_apply(srv, next);
    }
    if (srv->reload_again) {
        srv->reload_again = false;
        reload_from_file(srv);
    }
}

void reload_from_file(struct server *srv)
{
    if (srv->rt.net.draining) {
        LOGW("reload ignored: draining", NULL);
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", srv->rt.cfg->path);
    if (srv->reload_waiting) {
        /* Not lost: this one reads the file again once that one is done. */
        srv->reload_again = true;
        LOGI("reload requested while one waits for GPU discovery: it follows", "file=%s",
             LOG_Q(path));
        return;
    }
    LOGI("reloading configuration", "file=%s", LOG_Q(path));
    struct config_error err;
    struct config *next = config_load(path, &err);
    if (!next) {
        record_failure(srv, err.msg);
        return;
    }
    /* The first process model of a thaw that had none: its backend starts
     * now, on the GPUs thaw runs with (a change to "gpus" needs a restart),
     * so the file's GPU needs are checked against them. GPU discovery runs
     * on the loop, which keeps serving; the reload goes on when it ends. */
    int started = server_start_process_backend(srv, next, srv->rt.cfg, on_process_backend);
    if (started < 0) {
        backend_start_failed(srv, next);
        return;
    }
    if (started > 0) {
        srv->reload_waiting = next;
        LOGI("reload waits for GPU discovery", "file=%s", LOG_Q(path));
        return;
    }
    check_and_apply(srv, next);
}

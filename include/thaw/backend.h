/* The backend interface: where a model's replicas come from.
 *
 * The request path asks a backend for replicas (backend_scale) and learns
 * about them only through the fleet's up-calls (fleet_replica_ready /
 * fleet_replica_gone), whatever the backend: `static` (a fixed list of
 * endpoints from the config), and later `process` and `kubernetes`.
 * A backend is owned by the server; models point at the one serving them. */
#ifndef THAW_BACKEND_H
#define THAW_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "thaw/buf.h"
#include "thaw/config.h"
#include "thaw/model.h"

struct rollout_decision;

struct backend;

struct backend_ops {
    const char *name;
    /* Takes a model from config under this backend's management. */
    int (*attach)(struct backend *b, struct model *m, const struct config_model *cm);
    /* Asks for `replicas` replicas of m (the backend may clamp). 0, or
     * -ENOTSUP when the backend cannot change the count. */
    int (*scale)(struct backend *b, struct model *m, unsigned replicas);
    /* What a client told to come back should wait, in ms (cold start, or
     * the remaining restart backoff). */
    uint64_t (*retry_after_ms)(struct backend *b, struct model *m);
    /* Replicas wanted / observed, for status. */
    void (*describe)(struct backend *b, struct model *m, cJSON *out);
    /* The backend's capacity (GPUs and their slices), for status; may be NULL. */
    void (*describe_capacity)(struct backend *b, cJSON *out);
    /* Has it caught up with its source (informers listed)? NULL: always. */
    bool (*synced)(struct backend *b);
    /* A configuration reload changed m's definition to cm (settings are
     * already applied to m). Replicas whose definition changed are replaced,
     * the old ones drained first. NULL: models cannot change at run time. */
    int (*update)(struct backend *b, struct model *m, const struct config_model *cm);
    /* A reload removed m: stop its replicas once their in-flight requests are
     * done. Called just before fleet_remove_model. NULL: nothing to stop. */
    void (*retire)(struct backend *b, struct model *m);
    /* After a reload: read cfg from now on (settings that need a restart
     * keep the values the backend started with). NULL: it keeps none. */
    void (*set_config)(struct backend *b, const struct config *cfg);
    /* Optional: what a reload's configuration asks that this backend as it
     * runs cannot give (a GPU need no running GPU meets); 0, or -EINVAL
     * with "FILE:LINE: KEY: problem" in err. */
    int (*check_config)(struct backend *b, const struct config *cfg, char *err, size_t errlen);
    /* Its own metric families in Prometheus text (API client, leadership).
     * NULL: none. */
    void (*render_metrics)(struct backend *b, struct buf *out);
    /* This activator's per-model demand for its peers (GET /demand on the
     * admin port). NULL: the backend has no peers; the path is a 404. */
    void (*demand)(struct backend *b, cJSON *out);
    /* Optional: thaw drains to exit; nothing new is started from now on. */
    void (*draining)(struct backend *b);
    /* Optional: a rollout step, promotion or rollback of parent's canary
     * was applied; keep it where a restarted activator finds it. */
    void (*rollout_decided)(struct backend *b, struct model *parent,
                            const struct rollout_decision *d);
    /* Optional: whether this activator decides rollouts (the leader);
     * NULL: it does. */
    bool (*rollout_leads)(struct backend *b);
    /* Stops everything the backend started; called once, at exit. */
    void (*stop)(struct backend *b);
    void (*free)(struct backend *b);
};

struct backend {
    const struct backend_ops *ops;
    struct fleet *fleet;
};

static inline int backend_scale(struct backend *b, struct model *m, unsigned replicas)
{
    return b->ops->scale(b, m, replicas);
}

/* The static backend: replicas are the config's endpoints, always ready. */
struct backend *backend_static_new(struct fleet *fleet);

struct event_base;
/* The process backend: models are local commands (see backends/process.c),
 * on cfg's GPUs. With "gpus": "discover" it waits for the discovery
 * command (at start-up, before the loop turns). NULL: it could not start
 * (logged). */
struct backend *backend_process_new(struct fleet *fleet, struct event_base *base,
                                    const struct config *cfg);
/* The same with "gpus": "discover" while the loop runs (a reload): the
 * discovery command runs on the loop, which keeps serving, and done gets
 * the backend once the GPUs are in, or NULL when discovery failed or found
 * GPUs cfg's models do not fit (logged). Returns the start under way, or
 * NULL when the command could not even be started (logged; done is not
 * called). cfg must stay until done. */
struct backend_process_start;
typedef void (*backend_process_started_fn)(void *ud, struct backend *b);
struct backend_process_start *backend_process_start(struct fleet *fleet, struct event_base *base,
                                                    const struct config *cfg,
                                                    backend_process_started_fn done, void *ud);
/* Ends a start under way: its command's group killed and reaped; done is
 * not called. */
void backend_process_start_cancel(struct backend_process_start *s);

/* Applies a tenants document read from the cluster as a reload would; may
 * take its contents (swapping them out of ts; the caller disposes of what is
 * left). 0, or a negative errno when it could not (the tenants in force stay). */
typedef int (*backend_tenants_apply_fn)(void *ud, struct config_tenants *ts);
struct k8s_auth;
/* The Kubernetes backend (see backend_k8s.c); takes over auth. NULL with err
 * set on failure. */
struct backend *backend_k8s_new(struct fleet *fleet, struct event_base *base,
                                const struct config *cfg, struct k8s_auth *auth, char *err,
                                size_t errlen);
/* Watches the tenants document src names (a Secret's or ConfigMap's data
 * key; namespace NULL: the one the client's credentials are in), calling
 * apply with each version that reads well. 0 or a negative errno. */
int backend_k8s_watch_tenants(struct backend *b, const struct config_tenants_source *src,
                              backend_tenants_apply_fn apply, void *ud);

#endif

/* Models, their replicas (endpoints) and the fleet that holds them.
 *
 * A model is what clients name; its replicas come from a backend (see
 * backend.h), which reports them through fleet_replica_ready/_gone. The
 * request path only sees models and endpoints, never which backend made them.
 * The fleet owns models; a model owns its endpoints. An endpoint that goes
 * away while connections still use it is unlinked from its model at once
 * and freed when its last reference (in-flight request or pooled
 * connection) is dropped. */
#ifndef THAW_MODEL_H
#define THAW_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "thaw/coldstart.h"
#include "thaw/config.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/queue.h"
#include "thaw/revsplit.h"
#include "thaw/rollout.h"
#include "thaw/router.h"
#include "thaw/upstream.h"

struct backend;
struct event;
struct fleet;


struct model_settings {
    uint32_t max_concurrency;
    enum tier priority;
    uint64_t max_queue;
    uint64_t queue_timeout_ms;
    uint64_t connect_timeout_ms;
    uint64_t first_byte_timeout_ms;
    uint64_t upstream_idle_timeout_ms;
    uint64_t loading_heartbeat_ms;
    char health_path[128]; /* its replicas' (for accept checks); "/" when longer */
};

struct model_stats {
    struct code_counts codes;
    uint64_t proxied, rejected, aborted;
    uint64_t rejections[REJECT_COUNT];
    uint64_t upstream_errors;
    struct histogram upstream_ttfb;   /* dispatch -> response head */
    struct histogram queue_wait[TIER_COUNT];
    struct histogram cold_start; /* replica start -> ready (cs_hist_bounds) */
    struct histogram cold_phase[CS_PHASES]; /* time in each phase (cs_hist_bounds) */
    uint64_t pool_decisions[7];  /* by enum wp_action (WP_ACTIONS) */
    /* sleep mode: replicas put to sleep, woken, and the calls that failed
     * (each fell back to a stop, or to a cold start) */
    uint64_t sleeps, sleep_failures, wakes, wake_failures;
    struct histogram wake; /* a request finds it asleep -> the replica takes requests again */
    uint64_t failed; /* finished with a 5xx or an upstream failure (rollout's error rate) */
};

/* A model's revisions (revisions.h decides with them; the model owns them
 * and their links, so a model is freed without calling upward). */
/* What a rollout's window starts from: a revision's counters at the start
 * of the step. */
struct revision_baseline {
    uint64_t requests, errors;
    struct histogram ttfb;
};

struct model_revisions {
    size_t n;
    char *names[REVSPLIT_MAX];
    uint32_t configured[REVSPLIT_MAX]; /* the split as set, before any rollout step */
    struct model *rev[REVSPLIT_MAX];   /* NULL while that revision has no model */
    struct revsplit split;
    bool fallback;
    char *sticky_header; /* lower-case; NULL: none */
    bool sticky_tenant;
    bool rollout;
    struct rollout_policy policy;
    struct rollout_state state;
    size_t stable; /* the stable revision: 0, or the canary once promoted */
    struct revision_baseline base[2];
    struct rollout_decision last; /* the last decision that changed something */
    uint64_t steps, promotions, rollbacks;
};


struct model {
    struct list_node node; /* in fleet->models */
    struct fleet *fleet;
    char *name;
    char *namespace_;
    struct model_settings set;
    struct queue queue;
    struct endpoint **endpoints;
    size_t n_endpoints, cap_endpoints;
    uint32_t inflight; /* requests at an endpoint */
    uint32_t inflight_leaving; /* at replicas that left it (draining): still its load */
    struct backend *backend;
    void *backend_data;      /* the backend's per-model state */
    struct event *queue_timer; /* set by the proxy: fires at the next deadline */
    struct log_limit queue_timeout_log; /* "queue deadline passed": a line a second at most */
    struct event *dispatch_more; /* set by the proxy: continues a large dispatch */
    struct event *heartbeat_timer; /* set by the proxy: SSE comments while loading */
    struct event *eject_timer;     /* set by the proxy: retry when an ejection ends */
    struct event *rollout_timer;   /* set by the proxy: a model with a rollout */
    uint64_t cold_start_ms;    /* last measured, 0 when never */
    struct coldstart cold;     /* the cold start in progress and recent ones (backends) */
    bool fixed_replicas;       /* the backend cannot replace replicas (static) */
    bool namespaced;           /* a cluster's: metrics carry its namespace */
    unsigned replicas_desired; /* what the backend is asked to hold */
    unsigned pool_slices;      /* GPU slices its replicas hold (backends with capacity) */
    bool pool_warm;            /* held only by the warm pool */
    unsigned replicas_asleep;  /* sleep mode: replicas asleep or falling asleep (backends) */
    /* The fleet's link + one per request routed to it + backend holds. A
     * removed model leaves the fleet and its routes at once and is freed
     * when the last request that named it is done. */
    uint32_t refs;
    bool removed;
    bool removing; /* fleet_remove_model began: its answers no longer count in its series */
    /* Another model had its name (and namespace) first: it is reached by no
     * name of its own, and its series would repeat that one's labels. */
    bool name_taken;
    struct model_stats stats;
    /* A model with revisions routes each request to one of them (see
     * revisions.h); a revision points back at it and carries its name. */
    struct model_revisions *revs;
    struct model *parent; /* not referenced: unlinked when either goes */
    char *revision;
};

/* Called when a model gained capacity (replica ready or a slot freed). */
typedef void (*fleet_capacity_cb)(void *ud, struct model *m);
/* Called just before a model is removed: its queued requests must be answered. */
typedef void (*fleet_removing_cb)(void *ud, struct model *m, const char *reason);
/* The model cannot get a replica for now (failed start): answer its queue. */
typedef void (*fleet_unavailable_cb)(void *ud, struct model *m, const char *reason,
                                     uint64_t retry_after_ms);

struct fleet {
    struct list_node models;
    size_t n_models;
    struct router router;
    struct queue_global *qglobal;
    uint64_t queue_aging_ms;
    fleet_capacity_cb on_capacity;
    fleet_removing_cb on_removing;
    fleet_unavailable_cb on_unavailable;
    /* An endpoint left its model: close its pooled connections. */
    void (*on_endpoint_gone)(void *ud, struct endpoint *ep);
    /* A new endpoint comes with an open idle connection: pool it (it owns fd). */
    void (*on_endpoint_conn)(void *ud, struct endpoint *ep, int fd);
    /* A model's revisions or rollout changed (a backend set them). */
    void (*on_revisions)(void *ud, struct model *m);
    /* Deadlines of requests waiting for a model came nearer (a shorter
     * queue timeout): the next one to pass may be sooner than planned. */
    void (*on_deadlines)(void *ud, struct model *m);
    void *cb_ud;
};

void fleet_init(struct fleet *f, struct queue_global *qg, uint64_t queue_aging_ms);
/* Frees every model (endpoints still referenced are left to their holders). */
void fleet_dispose(struct fleet *f);
/* Creates a model from config; routes it (a name another model already has
 * stays with that one, and is logged). NULL on allocation failure. */
struct model *fleet_add_model(struct fleet *f, const struct config_model *cm);
/* Unroutes m, answers its queue (on_removing), detaches its endpoints and
 * drops the fleet's reference: requests already at a replica finish. */
void fleet_remove_model(struct fleet *f, struct model *m, const char *reason);
void model_ref(struct model *m);
void model_unref(struct model *m);
/* Re-reads a model's names (hosts, aliases) after its definition changed. */
int fleet_reroute_model(struct fleet *f, struct model *m, const struct config_model *cm);
/* Applies limits and timeouts from cm (run-time updates keep queued work). */
void model_apply_settings(struct model *m, const struct config_model *cm);
struct model *fleet_find(const struct fleet *f, const char *namespace_, const char *name);

/* Backend up-calls. addr is numeric "ip:port". 0 or a negative errno. */
int fleet_replica_ready(struct fleet *f, struct model *m, const char *id, const char *addr);
/* The same with this activator's share of the replica's slots (endpoint.share;
 * UINT32_MAX: all) and a connection to the replica already open and idle (the
 * one its readiness probe succeeded on; -1: none), which the fleet hands to
 * on_endpoint_conn for the first request, or closes. */
int fleet_replica_ready_with(struct fleet *f, struct model *m, const char *id, const char *addr,
                             uint32_t share, int conn_fd);
void fleet_replica_gone(struct fleet *f, struct model *m, const char *id, const char *reason);
void fleet_revisions_changed(struct fleet *f, struct model *m);
void fleet_model_unavailable(struct fleet *f, struct model *m, const char *reason,
                             uint64_t retry_after_ms);

/* Least-loaded ready endpoint with a free slot, skipping ejected ones (unless
 * all are ejected and the replicas are fixed), those that would need a new
 * connection while their accept window of new connections is full, and
 * woken ones whose first request is still alone (head_start_until_ms). NULL
 * when none can take it. */
struct endpoint *model_pick_endpoint(struct model *m, uint64_t now_ms);
/* Endpoints not ejected at now_ms: the replicas that serve now. */
size_t model_serving_endpoints(const struct model *m, uint64_t now_ms);
/* When the first endpoint skipped for a time takes requests again (an
 * ejection or a head start ends); 0 when none is. */
uint64_t model_next_opening(const struct model *m, uint64_t now_ms);
/* Sum over endpoints of the slots this activator may use (max_concurrency,
 * or its share when that is smaller). */
uint32_t model_capacity(const struct model *m);
/* The concurrency the autoscaler scales on: requests in flight and those
 * waiting that more replicas could start (not those of a tenant at its own
 * concurrency cap: queue_runnable). */
double model_demand(const struct model *m);

/* Unlinks m from its parent or its revisions (m is being removed). */
void model_revisions_unlink(struct model *m);
void model_revisions_free(struct model_revisions *rv);
/* Frees the revisions' names (n stays). */
void model_revisions_free_names(struct model_revisions *rv);

/* A request takes one of ep's slots: counted on ep and on its model. */
void endpoint_take_slot(struct endpoint *ep);
/* Gives the slot back. Returns the model it counted against, whose waiting
 * requests may now go (NULL once the endpoint has left its model). */
struct model *endpoint_give_slot(struct endpoint *ep);

#endif

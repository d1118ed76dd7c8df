/* Scaling decisions for a backend's models: the autoscaler's wish per model
 * (autoscaler.h), then the warm pool and GPU admission over all of them
 * (warmpool.h). Backends embed a struct scaler_model per model, feed samples,
 * and apply each model's `target`. Decisions other than plain admits are
 * logged with their reason and counted per model. */
#ifndef THAW_SCALER_H
#define THAW_SCALER_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "thaw/autoscaler.h"
#include "thaw/config.h"
#include "thaw/forecast.h"
#include "thaw/model.h"
#include "thaw/warmpool.h"

struct scaler_model {
    struct model *m;
    struct as_config asc;
    struct as_state ass;
    unsigned slices;
    unsigned min_replicas;
    double rate; /* requests per second, smoothed */
    uint64_t rate_count, rate_ms;
    uint64_t served_seen; /* requests proxied or aborted, at the last plan */
    struct as_decision last;
    unsigned target;
    bool warm;
    char last_action[16];
    char last_reason[160];
    /* The last plan evicted or preempted some of its replicas: on one node
     * (GPU unit), so those stops go there (the plan's on_node says where),
     * for this reason (its last decision may be a deny of what it still wants). */
    bool released_on_node;
    char release_reason[160];
    /* warming ahead of demand: the model's mode (PREWARM_INHERIT: the
     * autoscaler's), its demand profile while the mode in force is not off,
     * and the last forecast */
    enum prewarm_mode prewarm;
    struct forecast *fc;
    uint64_t fc_count;  /* arrivals already in the profile */
    double expected;    /* arrivals forecast within horizon_ms */
    uint64_t horizon_ms;
    bool forecast_due;  /* expected reaches autoscaler.prewarm_min_requests */
    bool forecast_quiet; /* fewer than due forecast within autoscaler.prewarm_quiet_ms
                          * (at least the horizon), every slot of it seen before */
    bool prewarm_on;    /* the mode in force is "on" (else shadow) */
    /* in, per plan: what the model holds now and whether it may start */
    unsigned current, ready;
    bool hold_starts; /* a failed start or a crash loop is backing off: nothing
                       * starts, not even for min_replicas */
    bool demand_starts; /* starts wait for demand: only min_replicas starts one */
    /* in, per plan when the backend knows nodes (scale_driver_ops.nodes):
     * the request per replica by the cluster's resource index, the nodes a
     * replica may go to, and its replicas per node (backend-owned arrays) */
    uint64_t req[WP_MAX_RES];
    uint64_t gpu_memory; /* per replica on one shared GPU; 0: not limited */
    bool memory_sleeps;  /* sleep mode frees it (struct wp_model) */
    const bool *eligible;
    unsigned *on_node;
};

/* target and window_ms 0: derived from max_concurrency / the global window. */
void scaler_model_init(struct scaler_model *sm, struct model *m, const struct config *cfg,
                       uint64_t target, uint64_t window_ms, unsigned min_replicas,
                       unsigned max_replicas, uint64_t grace_ms, unsigned slices);
/* Frees what scaler_model_init and scaler_forecast allocated. */
void scaler_model_dispose(struct scaler_model *sm);
/* Feeds each model's arrivals since the last call into its demand profile
 * (wall-clock time) and forecasts the arrivals due within its cold start
 * (at least a->prewarm_lead_ms); scaler_plan warms the models in mode "on"
 * whose forecast is due, and logs what it would do for those in "shadow". */
void scaler_forecast(struct scaler_model **sms, size_t n, uint64_t wall_ms,
                     const struct config_autoscaler *a);
/* One concurrency sample (model_demand: in flight + waiting that could start). */
void scaler_record(struct scaler_model *sm, uint64_t now_ms);
/* Plans all models: fills each target (and warm). c: the nodes (each
 * model's req, eligible and on_node index them), or no nodes and a cap of
 * slices (0: unlimited). */
void scaler_plan(struct scaler_model **sms, size_t n, struct wp_cluster *c, unsigned warm_budget,
                 uint64_t now_ms);
void scaler_describe(const struct scaler_model *sm, cJSON *out);

#endif

/* The warm pool and GPU admission, as one pure planning step over all
 * models sharing a capacity of GPU slices.
 *
 * In: each model's tier, slices per replica, replicas it holds now, the
 * autoscaler's wish, min_replicas, whether it is idle, and its value
 * (recent request rate x measured cold start, in seconds).
 * Out: each model's target replicas, and the decisions that led there:
 *  - keep warm: an idle model the autoscaler would take to zero keeps one
 *    replica while the warm budget (slices idle replicas may hold) has
 *    room, given by tier first, then by value;
 *  - admit / deny: scale-ups in tier order (critical first), then value;
 *  - evict: to fit a scale-up, idle warm replicas of lower priority go first
 *    (lowest value first; of equal priority only with lower value, so a warm
 *    idle replica never blocks live demand of its own tier);
 *  - preempt: then running models of strictly lower priority shrink toward
 *    their min_replicas; never a model of equal or higher priority.
 * min_replicas is always kept. Models needing no slices are not limited. */
#ifndef THAW_WARMPOOL_H
#define THAW_WARMPOOL_H

#include <stdbool.h>
#include <stddef.h>

#include "thaw/tier.h"

struct wp_model {
    const char *name;
    enum tier tier;
    unsigned slices; /* per replica */
    unsigned current;
    unsigned desired;
    unsigned min_replicas;
    bool idle;
    double value;
    /* out */
    unsigned target;
    unsigned warm; /* replicas kept only by the warm pool */
};

enum wp_action { WP_KEEP_WARM, WP_TO_ZERO, WP_ADMIT, WP_DENY, WP_EVICT, WP_PREEMPT };

struct wp_decision {
    size_t model;
    enum wp_action action;
    unsigned replicas;
    size_t by; /* the model whose demand caused an evict/preempt; == model otherwise */
};

struct wp_plan {
    struct wp_decision d[256];
    size_t n;
    size_t dropped; /* decisions beyond the array */
    unsigned used_slices, capacity, warm_slices, warm_budget;
};

const char *wp_action_name(enum wp_action a);
/* capacity 0 means unlimited. */
void warmpool_plan(struct wp_model *m, size_t n, unsigned capacity, unsigned warm_budget,
                   struct wp_plan *out);

#endif

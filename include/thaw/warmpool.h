/* The warm pool and GPU admission, as one pure planning step over all
 * models sharing GPU capacity.
 *
 * In: each model's tier, slices per replica, replicas it holds now, the
 * autoscaler's wish, min_replicas, whether it is idle, and its value
 * (recent request rate x measured cold start, in seconds); and the capacity,
 * either one number of slices or a set of nodes (below).
 * Out: each model's target replicas, and the decisions that led there:
 *  - keep warm: an idle model the autoscaler would take to zero keeps one
 *    replica while the warm budget (slices idle replicas may hold) has
 *    room, given by tier first, then by value;
 *  - admit / deny: scale-ups in tier order (critical first), then value;
 *  - evict: to fit a scale-up, idle warm replicas of lower priority go first
 *    (lowest value first); of its own priority those worth less, or any
 *    once its demand has waited past the tier's patience (a warm idle
 *    replica delays live demand of its own tier, never blocks it);
 *  - preempt: then running models of strictly lower priority shrink toward
 *    their min_replicas; never a model of equal or higher priority;
 *  - prewarm: a model whose demand is forecast (prewarm) keeps an idle
 *    replica ahead of the others of its tier, or, at zero, gets one once every scale-up
 *    is served, from the warm budget and free room only (it never evicts
 *    or preempts; live demand of any tier may evict it like a warm one);
 *    one whose forecast is known to be quiet (quiet) is not kept warm.
 * min_replicas is always kept. Models needing no slices are not limited.
 *
 * Per node (struct wp_cluster): a node is a set of (resource -> what thaw's
 * models may use of it) and a replica a set of (resource -> request). A
 * replica is admitted only when one node it may go to (eligible) has room
 * for its whole request; evictions and preemptions take only replicas on
 * that same node, and only when their release makes the replica fit there.
 * A model's replicas that are not placed on any node yet (current minus
 * on_node) wait for a node the same way, before its new ones. One node
 * holding every replica, with a single resource, is the single-capacity
 * plan (warmpool_plan).
 *
 * GPU memory (time-sliced and MPS GPUs share their framebuffer): a node may
 * say it has `gpus` physical GPUs of `gpu_memory` bytes each, and a model
 * that its replica needs `gpu_memory` bytes of one of them. A replica is
 * admitted on such a node only when it fits one GPU alone and the memory of
 * every replica on the node with it still packs into the GPUs (first-fit
 * decreasing: wp_memory_packs). Which GPU a pod gets is not thaw's choice
 * (the device plugin's), so this is a bound on the node, not an assignment.
 * An eviction or preemption for memory takes replicas that hold memory on
 * that node, and only when their release makes the newcomer pack.
 *
 * A model whose replicas sleep (sleep mode) frees their memory by putting
 * an idle one to sleep, not by scaling down: its replicas are not counted
 * per model (memory_sleeps) nor evicted for memory. What its awake replicas
 * hold is the node's `held`, each counted against a newcomer only when it
 * cannot be put to sleep for it (busy, or of a higher priority). A held
 * entry whose model the node names (held_model) is released by a
 * preemption of that model there, so a busy replica of a lower tier is
 * preempted for its memory as any other would be. */
#ifndef THAW_WARMPOOL_H
#define THAW_WARMPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/tier.h"

#define WP_MAX_RES 16
#define WP_NO_NODE ((size_t)-1)
#define WP_NO_MODEL ((size_t)-1)
#define WP_MAX_GPUS 64 /* physical GPUs of one node the memory packing counts */

struct wp_model {
    const char *name;
    enum tier tier;
    unsigned slices; /* per replica: what the warm budget and a slice cap count */
    unsigned current;
    unsigned desired;
    unsigned min_replicas;
    bool idle;
    double value;
    bool prewarm; /* demand is forecast within its cold start */
    bool quiet;   /* no demand is forecast: the warm budget does not keep it */
    uint64_t waited_ms; /* how long its oldest waiting request has waited (0: none) */
    /* out */
    unsigned target;
    unsigned warm; /* replicas kept only by the warm pool */
    /* per node (warmpool_plan_cluster only) */
    uint64_t req[WP_MAX_RES]; /* per replica, by the cluster's resource index */
    uint64_t gpu_memory;      /* per replica, on one GPU; 0: not declared (not limited) */
    bool memory_sleeps;       /* sleep mode frees it: see `held` of struct wp_node */
    const bool *eligible;     /* per node: may a replica go there; NULL: everywhere */
    unsigned *on_node;        /* per node: in, replicas placed; out, as planned */
};

/* GPU memory an awake replica of a sleep-mode model holds on a node. */
struct wp_held {
    uint64_t memory;
    enum tier tier;
    bool sleepable; /* idle and awake: it can be put to sleep now */
};

struct wp_node {
    const char *name;
    uint64_t alloc[WP_MAX_RES]; /* what thaw's models may use, by resource index */
    uint64_t gpu_memory;        /* per physical GPU; 0: unknown (memory not limited) */
    unsigned gpus;              /* physical GPUs sharing their memory (at most WP_MAX_GPUS) */
    const struct wp_held *held; /* awake replicas of sleep-mode models there */
    size_t n_held;
    /* per held entry: its model's index in the plan (WP_NO_MODEL: not said);
     * NULL: none said (then only sleep frees held memory, never a preemption) */
    const size_t *held_model;
    /* out */
    uint64_t used[WP_MAX_RES]; /* by the planned replicas */
};

struct wp_cluster {
    size_t n_res;
    const char *res[WP_MAX_RES]; /* resource names, for messages */
    struct wp_node *nodes;
    size_t n_nodes;
    unsigned cap_slices; /* a cap on all models' slices together; 0: none */
};

enum wp_action { WP_KEEP_WARM, WP_TO_ZERO, WP_ADMIT, WP_DENY, WP_EVICT, WP_PREEMPT, WP_PREWARM };
#define WP_ACTIONS 7

struct wp_decision {
    size_t model;
    enum wp_action action;
    unsigned replicas;
    size_t by;   /* the model whose demand caused an evict/preempt; == model otherwise */
    size_t node; /* where an admit, evict or preempt happened; WP_NO_NODE otherwise */
};

struct wp_plan {
    struct wp_decision d[256];
    size_t n;
    size_t dropped; /* decisions beyond the array */
    unsigned used_slices, capacity, warm_slices, warm_budget;
    bool per_node; /* capacity was a set of nodes */
};

const char *wp_action_name(enum wp_action a);
/* Whether replicas needing these amounts of GPU memory (n of them, any
 * order; 0 entries take nothing) pack into `gpus` GPUs of `per_gpu` bytes,
 * by first-fit decreasing (which may refuse a packing that exists, never
 * accepts one that does not). per_gpu 0: not limited. Sorts items. */
bool wp_memory_packs(uint64_t *items, size_t n, unsigned gpus, uint64_t per_gpu);
/* capacity 0 means unlimited. */
void warmpool_plan(struct wp_model *m, size_t n, unsigned capacity, unsigned warm_budget,
                   struct wp_plan *out);
/* Per node. c->n_nodes 0: no node limit (only cap_slices, 0: unlimited).
 * Each model's on_node (when nodes are given) must have c->n_nodes entries.
 * Fills each node's used. */
void warmpool_plan_cluster(struct wp_model *m, size_t n, struct wp_cluster *c, unsigned warm_budget,
                           struct wp_plan *out);

#endif

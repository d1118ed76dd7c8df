/* The scaling driver both scaling backends share: the GPU capacity cap, the
 * planning cadence, and one planning step over all of a backend's models
 * (collect what each model holds, scaler_plan, apply each target). The
 * backend supplies the hooks; what a target means (process starts and
 * stops, a scale PATCH) stays the backend's. */
#ifndef THAW_SCALE_DRIVER_H
#define THAW_SCALE_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/config.h"
#include "thaw/scaler.h"

struct scale_driver_ops {
    /* How many models collect may return at most (the batch is sized by it). */
    size_t (*count)(void *ud);
    /* Fills each model's current/ready/hold_starts/demand_starts, stores
     * its scaler_model in sms (at most max) and returns how many. */
    size_t (*collect)(void *ud, uint64_t now_ms, struct scaler_model **sms, size_t max);
    /* GPU slices the hardware offers; 0: unknown (no cap unless configured). */
    unsigned (*gpu_slices)(void *ud);
    /* Turns each planned model's target into starts and stops. */
    void (*apply)(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms);
    /* Optional: the nodes. Fills c (resources, nodes) and each collected
     * model's req, eligible and on_node, in arrays the backend keeps until
     * the next call; false when it knows no node with a counted resource
     * (then gpu_slices gives one capacity). */
    bool (*nodes)(void *ud, struct scaler_model **sms, size_t n, struct wp_cluster *c);
};

struct scale_driver {
    const struct scale_driver_ops *ops;
    void *ud;
    uint64_t next_plan_ms;
};

void scale_driver_init(struct scale_driver *d, const struct scale_driver_ops *ops, void *ud);
/* The slices to plan against when no nodes are known: the hardware's, capped
 * by warm_pool.capacity_slices (which alone applies when the hardware count
 * is unknown). 0: unlimited. With nodes, the cap applies on top of them. */
unsigned scale_driver_capacity(unsigned gpu_slices, const struct config_warm_pool *wp);
/* True once autoscaler.tick_ms has passed since the last planning step. */
bool scale_driver_due(const struct scale_driver *d, uint64_t now_ms);
/* One planning step now; the next is due autoscaler.tick_ms later. */
void scale_driver_plan(struct scale_driver *d, const struct config *cfg);

#endif

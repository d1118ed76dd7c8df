/* A KPA-style autoscaler on concurrency (in flight + queued), as pure
 * functions of samples and time (milliseconds, any monotonic origin).
 *
 * Samples go into time buckets (bucket width = stable window / 60, at least
 * 1 s). Each decision averages the stable window (default 60 s) and the panic
 * window (10% of it); desired = ceil(average / target). Panic mode starts
 * when the panic-window demand reaches panic_threshold x the ready capacity
 * (ready x target) and lasts until a whole stable window has passed without
 * that; in panic the autoscaler only scales up. Per decision the count moves
 * at most by max_scale_up_rate x ready up and ready / max_scale_down_rate
 * down. From zero it asks at least activation_scale. A model with no
 * demand at all (nothing in flight or queued) for scale_to_zero_grace_ms
 * goes to zero (then min_scale) at once, whatever the averages still say;
 * before that it keeps at least one replica. With a scale-down delay the
 * highest recommendation of that long is kept, going to zero included.
 * Defaults are Knative's. */
#ifndef THAW_AUTOSCALER_H
#define THAW_AUTOSCALER_H

#include <stdbool.h>
#include <stdint.h>

#define AS_BUCKETS 64
#define AS_DELAY_SLOTS 64

struct as_config {
    double target;               /* concurrency per replica */
    uint64_t stable_window_ms;   /* 60000 */
    double panic_window_pct;     /* 10 */
    double panic_threshold;      /* 2.0 (200%) */
    double max_scale_up_rate;    /* 1000 */
    double max_scale_down_rate;  /* 2 */
    uint64_t scale_down_delay_ms; /* 0 */
    uint64_t scale_to_zero_grace_ms; /* 30000 */
    unsigned min_scale, max_scale;
    unsigned activation_scale;   /* 1 */
};

struct as_bucket {
    int64_t idx; /* bucket number (time / width); -1: empty */
    double sum;
    uint32_t n;
};

struct as_state {
    struct as_bucket b[AS_BUCKETS];
    uint64_t bucket_ms;
    bool panicking;
    uint64_t panic_since_ms; /* last time demand was over the panic threshold */
    unsigned panic_floor;    /* desired may not fall below this while panicking */
    uint64_t last_demand_ms; /* last sample with demand > 0 */
    bool ever_demand;
    struct {
        uint64_t at; /* slice number + 1 (see as_decide); 0: unused */
        unsigned desired;
    } delay[AS_DELAY_SLOTS];
};

struct as_decision {
    unsigned desired;
    double stable_avg, panic_avg;
    bool panic;
    const char *why; /* static string: what bounded the result */
};

/* Knative's defaults, with target the given per-replica concurrency. */
void as_config_defaults(struct as_config *c, double target);
void as_init(struct as_state *s, const struct as_config *c);
/* Records one observation of concurrency (in flight + queued) at now. */
void as_record(struct as_state *s, uint64_t now_ms, double concurrency);
/* Demand seen age_ms before now_ms, reported rather than sampled (by
 * another activator, or recorded before a restart): the idle clock moves to
 * it when that is later than the last demand it knows. age_ms may exceed
 * now_ms (the monotonic clock's origin): only differences are kept. */
void as_note_demand(struct as_state *s, uint64_t now_ms, uint64_t age_ms);
/* Milliseconds since the last demand; UINT64_MAX when there never was any. */
uint64_t as_idle_ms(const struct as_state *s, uint64_t now_ms);
/* A scale made outside as_decide (a wake from zero straight to the
 * activation scale): the scale-down delay keeps it as it keeps a decision. */
void as_note_scaled(struct as_state *s, const struct as_config *c, uint64_t now_ms,
                    unsigned replicas);
/* The replica count wanted now, given `ready` replicas serving of the
 * `current` the model has (the others still starting). */
void as_decide(struct as_state *s, const struct as_config *c, uint64_t now_ms, unsigned ready,
               unsigned current, struct as_decision *out);

#endif

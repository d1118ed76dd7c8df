#include "thaw/autoscaler.h"

#include <math.h>
#include <string.h>

void as_config_defaults(struct as_config *c, double target)
{
    c->target = target > 0 ? target : 1;
    c->stable_window_ms = 60000;
    c->panic_window_pct = 10;
    c->panic_threshold = 2.0;
    c->max_scale_up_rate = 1000;
    c->max_scale_down_rate = 2;
    c->scale_down_delay_ms = 0;
    c->scale_to_zero_grace_ms = 30000;
    c->min_scale = 0;
    c->max_scale = 1000;
    c->activation_scale = 1;
}

void as_init(struct as_state *s, const struct as_config *c)
{
    memset(s, 0, sizeof *s);
    s->bucket_ms = c->stable_window_ms / 60;
    if (s->bucket_ms < 1000) {
        s->bucket_ms = 1000;
    }
    for (int i = 0; i < AS_BUCKETS; i++) {
        s->b[i].idx = -1;
    }
}

void as_record(struct as_state *s, uint64_t now_ms, double concurrency)
{
    int64_t idx = (int64_t)(now_ms / s->bucket_ms);
    struct as_bucket *b = &s->b[idx % AS_BUCKETS];
    if (b->idx != idx) {
        b->idx = idx;
        b->sum = 0;
        b->n = 0;
    }
    b->sum += concurrency;
    b->n++;
    if (concurrency > 0) {
        s->last_demand_ms = now_ms;
        s->ever_demand = true;
    }
}

void as_note_demand(struct as_state *s, uint64_t now_ms, uint64_t age_ms)
{
    if (age_ms < as_idle_ms(s, now_ms)) {
        /* Unsigned arithmetic wraps: now_ms - last_demand_ms is age_ms even
         * when age_ms > now_ms. */
        s->last_demand_ms = now_ms - age_ms;
        s->ever_demand = true;
    }
}

uint64_t as_idle_ms(const struct as_state *s, uint64_t now_ms)
{
    return s->ever_demand ? now_ms - s->last_demand_ms : UINT64_MAX;
}

/* Mean over the buckets of the last window_ms (each bucket's own mean). */
static double window_avg(const struct as_state *s, uint64_t now_ms, uint64_t window_ms)
{
    int64_t now_idx = (int64_t)(now_ms / s->bucket_ms);
    int64_t span = (int64_t)((window_ms + s->bucket_ms - 1) / s->bucket_ms);
    if (span < 1) {
        span = 1;
    }
    if (span > AS_BUCKETS) {
        span = AS_BUCKETS;
    }
    double sum = 0;
    int64_t n = 0;
    for (int64_t i = now_idx - span + 1; i <= now_idx; i++) {
        const struct as_bucket *b = &s->b[(i % AS_BUCKETS + AS_BUCKETS) % AS_BUCKETS];
        if (b->idx == i && b->n) {
            sum += b->sum / b->n;
            n++;
        }
    }
    return n ? sum / (double)n : 0;
}

static unsigned clamp_u(double v, unsigned lo, unsigned hi)
{
    if (v < lo) {
        return lo;
    }
    if (v > hi) {
        return hi;
    }
    return (unsigned)v;
}

/* The scale-down delay's memory: each slot keeps the highest count of a
 * slice delay/(slots-1) long, so a delay of an hour fits whatever the
 * decision rate. */
static void delay_note(struct as_state *s, const struct as_config *c, uint64_t now_ms,
                       unsigned replicas)
{
    uint64_t width = c->scale_down_delay_ms / (AS_DELAY_SLOTS - 1) + 1;
    uint64_t slice = now_ms / width + 1; /* 0 marks an unused slot */
    unsigned i = (unsigned)(slice % AS_DELAY_SLOTS);
    if (s->delay[i].at != slice) {
        s->delay[i].at = slice;
        s->delay[i].desired = replicas;
    } else if (replicas > s->delay[i].desired) {
        s->delay[i].desired = replicas;
    }
}

static unsigned delay_highest(const struct as_state *s, const struct as_config *c,
                              uint64_t now_ms)
{
    uint64_t width = c->scale_down_delay_ms / (AS_DELAY_SLOTS - 1) + 1;
    uint64_t oldest = now_ms >= c->scale_down_delay_ms ? (now_ms - c->scale_down_delay_ms) / width + 1
                                                       : 1;
    unsigned best = 0;
    for (int j = 0; j < AS_DELAY_SLOTS; j++) {
        if (s->delay[j].at >= oldest && s->delay[j].desired > best) {
            best = s->delay[j].desired;
        }
    }
    return best;
}

void as_note_scaled(struct as_state *s, const struct as_config *c, uint64_t now_ms,
                    unsigned replicas)
{
    if (c->scale_down_delay_ms) {
        delay_note(s, c, now_ms, replicas);
    }
}

void as_decide(struct as_state *s, const struct as_config *c, uint64_t now_ms, unsigned ready,
               unsigned current, struct as_decision *out)
{
    uint64_t panic_ms = (uint64_t)((double)c->stable_window_ms * c->panic_window_pct / 100.0);
    if (panic_ms < s->bucket_ms) {
        panic_ms = s->bucket_ms;
    }
    double stable = window_avg(s, now_ms, c->stable_window_ms);
    double panic = window_avg(s, now_ms, panic_ms);
    out->stable_avg = stable;
    out->panic_avg = panic;
    out->why = "stable window";
    double want_stable = ceil(stable / c->target - 1e-9);
    double want_panic = ceil(panic / c->target - 1e-9);

    /* Panic: the short window asks for twice what is ready (or anything at
     * all when nothing is ready). */
    bool over = ready == 0 ? panic > 0 : panic / ((double)ready * c->target) >= c->panic_threshold;
    if (over) {
        if (!s->panicking) {
            s->panic_floor = ready;
        }
        s->panicking = true;
        s->panic_since_ms = now_ms;
    } else if (s->panicking && now_ms - s->panic_since_ms >= c->stable_window_ms) {
        s->panicking = false;
        s->panic_floor = 0;
    }
    double want;
    if (s->panicking) {
        want = want_panic > want_stable ? want_panic : want_stable;
        if (want < s->panic_floor) {
            want = s->panic_floor; /* scale up only */
        }
        s->panic_floor = (unsigned)want;
        out->why = "panic window";
    } else {
        want = want_stable;
    }

    /* Rate limits, relative to what is ready. */
    if (ready > 0) {
        double up = ceil(c->max_scale_up_rate * ready);
        double down = floor((double)ready / c->max_scale_down_rate);
        if (want > up) {
            want = up;
            out->why = "max scale-up rate";
        }
        if (want < down) {
            want = down;
            out->why = "max scale-down rate";
        }
    }

    /* Zero after the grace period with nothing in flight or queued, whatever
     * the averages still say; never sooner. */
    bool idle_long = as_idle_ms(s, now_ms) >= c->scale_to_zero_grace_ms;
    bool graced = false;
    if (idle_long) {
        want = 0; /* idle ends a panic too: there is nothing to scale up for */
        s->panicking = false;
        s->panic_floor = 0;
        out->why = "idle past the scale-to-zero grace";
    } else if (want < 1 && (ready > 0 || current > 0)) {
        /* A replica still loading (installed with one, or woken) is kept
         * through the grace as a serving one is. */
        want = 1;
        graced = true;
        out->why = "scale-to-zero grace";
    }

    /* From zero: the activation scale (before the delay, which keeps it). */
    if (ready == 0 && !graced && want > 0 && want < c->activation_scale) {
        want = c->activation_scale;
        out->why = "activation scale";
    }
    /* Scale-down delay: the highest recommendation of the last delay, going
     * to zero included (as Knative's: replicas stay that long to spare a
     * cold start). */
    if (c->scale_down_delay_ms) {
        delay_note(s, c, now_ms, (unsigned)want);
        unsigned held = delay_highest(s, c, now_ms);
        if (held > want) {
            want = held;
            out->why = "scale-down delay";
        }
    }
    unsigned desired = clamp_u(want, c->min_scale, c->max_scale);
    if ((double)desired != want) {
        out->why = desired == c->min_scale ? "min scale" : "max scale";
    }
    out->desired = desired;
    out->panic = s->panicking;
}

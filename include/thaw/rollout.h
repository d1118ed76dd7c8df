/* Progressive rollout of a canary revision: the decisions as pure functions
 * of the policy, the rollout's state, what the stable and canary revisions
 * did since the current step began, and the time (injected; no clock here).
 *
 * A step lasts at least step_interval_ms and needs min_requests answered by
 * the canary. The canary is rolled back (to 0%) as soon as it has
 * min_requests and its error rate (5xx answers and upstream failures, in
 * percent of its requests) exceeds the stable revision's by more than
 * max_error_rate_increase_pct points, or its time-to-first-byte p99 exceeds
 * the stable revision's times max_ttfb_p99_ratio_pct / 100 and by more than
 * ttfb_p99_tolerance_ms (compared only when the stable revision has answered
 * in the window; the tolerance keeps the noise of fast answers, a few ms
 * apart in coarse histogram buckets, from rolling a healthy canary back). Otherwise, once the
 * step's time is up, the canary's percent goes up by step_percent; reaching
 * 100 promotes it (it becomes the stable revision). */
#ifndef THAW_ROLLOUT_H
#define THAW_ROLLOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/metrics.h"

struct rollout_policy {
    uint32_t step_percent;
    uint64_t step_interval_ms;
    uint64_t min_requests;
    uint32_t max_error_rate_increase_pct;
    uint32_t max_ttfb_p99_ratio_pct;
    uint64_t ttfb_p99_tolerance_ms;
};

enum rollout_stage {
    ROLLOUT_PROGRESSING = 0,
    ROLLOUT_PROMOTED,
    ROLLOUT_ROLLED_BACK,
    ROLLOUT_STAGE_COUNT
};
const char *rollout_stage_name(enum rollout_stage s);
/* -1 when name is none of them. */
int rollout_stage_parse(const char *name, size_t len);

struct rollout_state {
    enum rollout_stage stage;
    uint32_t canary_percent;
    uint64_t step_started_ms;
};

/* What a revision did in the current step. */
struct rollout_window {
    uint64_t requests; /* finished: answered or failed */
    uint64_t errors;   /* of those, 5xx or upstream failures */
    double ttfb_p99_s; /* 0: no response head in the window */
};

enum rollout_action { ROLLOUT_HOLD, ROLLOUT_STEP, ROLLOUT_PROMOTE, ROLLOUT_ROLLBACK };
const char *rollout_action_name(enum rollout_action a);

struct rollout_decision {
    enum rollout_action action;
    uint32_t canary_percent; /* after the action */
    char why[200];           /* for the log line and the Event */
};

struct rollout_decision rollout_decide(const struct rollout_policy *p,
                                       const struct rollout_state *s,
                                       const struct rollout_window *stable,
                                       const struct rollout_window *canary, uint64_t now_ms);

/* The q-quantile (0 < q <= 1) of the observations made between two
 * snapshots of a histogram, as the upper bound of the bucket it falls in
 * (the last bound for the overflow). 0 when there were none. */
double rollout_quantile(const struct histogram *now, const struct histogram *base, double q);

#endif

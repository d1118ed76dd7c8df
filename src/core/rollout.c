#include "thaw/rollout.h"

#include <stdio.h>
#include <string.h>

static const char *const stage_names[ROLLOUT_STAGE_COUNT] = {"progressing", "promoted",
                                                             "rolled_back"};

const char *rollout_stage_name(enum rollout_stage s)
{
    return (unsigned)s < ROLLOUT_STAGE_COUNT ? stage_names[s] : "unknown";
}

int rollout_stage_parse(const char *name, size_t len)
{
    for (int i = 0; i < ROLLOUT_STAGE_COUNT; i++) {
        if (strlen(stage_names[i]) == len && memcmp(stage_names[i], name, len) == 0) {
            return i;
        }
    }
    return -1;
}

const char *rollout_action_name(enum rollout_action a)
{
    switch (a) {
    case ROLLOUT_STEP:
        return "step";
    case ROLLOUT_PROMOTE:
        return "promote";
    case ROLLOUT_ROLLBACK:
        return "rollback";
    default:
        return "hold";
    }
}

static double error_rate_pct(const struct rollout_window *w)
{
    return w->requests ? 100.0 * (double)w->errors / (double)w->requests : 0.0;
}

/* Why the canary is worse than the stable revision allows, into why; false
 * when it is within the thresholds. */
static bool canary_unhealthy(const struct rollout_policy *p, const struct rollout_window *stable,
                             const struct rollout_window *canary, char *why, size_t whylen)
{
    double ce = error_rate_pct(canary), se = error_rate_pct(stable);
    if (ce - se > (double)p->max_error_rate_increase_pct) {
        snprintf(why, whylen,
                 "canary error rate %.1f%% (%llu of %llu) exceeds stable's %.1f%% by more than "
                 "%u points",
                 ce, (unsigned long long)canary->errors, (unsigned long long)canary->requests, se,
                 p->max_error_rate_increase_pct);
        return true;
    }
    double limit = stable->ttfb_p99_s * (double)p->max_ttfb_p99_ratio_pct / 100.0;
    double tolerance = stable->ttfb_p99_s + (double)p->ttfb_p99_tolerance_ms / 1000.0;
    if (stable->ttfb_p99_s > 0 && canary->ttfb_p99_s > limit && canary->ttfb_p99_s > tolerance) {
        snprintf(why, whylen,
                 "canary time-to-first-byte p99 %.3fs exceeds %u%% of stable's %.3fs (and it "
                 "by more than %llums)",
                 canary->ttfb_p99_s, p->max_ttfb_p99_ratio_pct, stable->ttfb_p99_s,
                 (unsigned long long)p->ttfb_p99_tolerance_ms);
        return true;
    }
    return false;
}

struct rollout_decision rollout_decide(const struct rollout_policy *p,
                                       const struct rollout_state *s,
                                       const struct rollout_window *stable,
                                       const struct rollout_window *canary, uint64_t now_ms)
{
    struct rollout_decision d = {.action = ROLLOUT_HOLD, .canary_percent = s->canary_percent};
    if (s->stage != ROLLOUT_PROGRESSING) {
        snprintf(d.why, sizeof d.why, "rollout %s", rollout_stage_name(s->stage));
        return d;
    }
    bool judged = canary->requests >= p->min_requests;
    if (judged && canary_unhealthy(p, stable, canary, d.why, sizeof d.why)) {
        d.action = ROLLOUT_ROLLBACK;
        d.canary_percent = 0;
        return d;
    }
    if (now_ms < s->step_started_ms + p->step_interval_ms) {
        snprintf(d.why, sizeof d.why, "step at %u%% runs until its interval ends",
                 s->canary_percent);
        return d;
    }
    if (!judged) {
        snprintf(d.why, sizeof d.why, "canary has %llu of the %llu requests a step needs",
                 (unsigned long long)canary->requests, (unsigned long long)p->min_requests);
        return d;
    }
    uint32_t next = s->canary_percent + p->step_percent;
    if (next >= 100) {
        d.action = ROLLOUT_PROMOTE;
        d.canary_percent = 100;
        snprintf(d.why, sizeof d.why, "canary healthy at %u%%: promoted", s->canary_percent);
        return d;
    }
    d.action = ROLLOUT_STEP;
    d.canary_percent = next;
    snprintf(d.why, sizeof d.why, "canary healthy at %u%%: stepping to %u%%", s->canary_percent,
             next);
    return d;
}

double rollout_quantile(const struct histogram *now, const struct histogram *base, double q)
{
    uint64_t total = now->count - base->count;
    if (total == 0) {
        return 0;
    }
    /* The rank of the quantile, rounded up: p99 of 10 is the 10th. */
    uint64_t rank = (uint64_t)((double)total * q);
    if ((double)rank < (double)total * q || rank == 0) {
        rank++;
    }
    uint64_t seen = 0;
    for (int i = 0; i < HIST_NBUCKETS; i++) {
        seen += now->buckets[i] - base->buckets[i];
        if (seen >= rank) {
            return hist_bounds[i];
        }
    }
    return hist_bounds[HIST_NBUCKETS - 1];
}

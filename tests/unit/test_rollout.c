/* Rollout decisions as worked examples on a fake clock: steps wait out the
 * interval and the evidence, a failing or slow canary is rolled back at
 * once, a healthy one climbs and is promoted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/rollout.h"

static const struct rollout_policy policy = {
    .step_percent = 20,
    .step_interval_ms = 60000,
    .min_requests = 50,
    .max_error_rate_increase_pct = 5,
    .max_ttfb_p99_ratio_pct = 150,
    .ttfb_p99_tolerance_ms = 100,
};

static struct rollout_state at(uint32_t pct, uint64_t started)
{
    return (struct rollout_state){ROLLOUT_PROGRESSING, pct, started};
}

/* Stable: 1000 requests, 10 errors (1%), p99 0.5 s. */
static const struct rollout_window stable = {1000, 10, 0.5};

static void test_waits_for_interval(void **state)
{
    (void)state;
    struct rollout_state s = at(10, 1000);
    struct rollout_window canary = {100, 1, 0.5};
    struct rollout_decision d = rollout_decide(&policy, &s, &stable, &canary, 60999);
    assert_int_equal(d.action, ROLLOUT_HOLD);
    assert_int_equal(d.canary_percent, 10);
    d = rollout_decide(&policy, &s, &stable, &canary, 61000);
    assert_int_equal(d.action, ROLLOUT_STEP);
    assert_int_equal(d.canary_percent, 30);
    assert_non_null(strstr(d.why, "stepping to 30%"));
}

/* Time alone is not enough: 49 canary requests hold the step. */
static void test_waits_for_evidence(void **state)
{
    (void)state;
    struct rollout_state s = at(10, 0);
    struct rollout_window canary = {49, 0, 0.1};
    struct rollout_decision d = rollout_decide(&policy, &s, &stable, &canary, 10 * 60000);
    assert_int_equal(d.action, ROLLOUT_HOLD);
    assert_non_null(strstr(d.why, "49 of the 50"));
    /* ... and an awful canary with too few requests is not judged yet. */
    struct rollout_window bad = {49, 49, 9};
    assert_int_equal(rollout_decide(&policy, &s, &stable, &bad, 1).action, ROLLOUT_HOLD);
}

/* 1% stable, 6% canary: 5 points more is allowed; 6.1% is not, and the
 * rollback does not wait for the interval. */
static void test_error_rate_rollback(void **state)
{
    (void)state;
    struct rollout_state s = at(30, 0);
    struct rollout_window ok = {1000, 60, 0.5};
    assert_int_equal(rollout_decide(&policy, &s, &stable, &ok, 1).action, ROLLOUT_HOLD);
    struct rollout_window bad = {1000, 61, 0.5};
    struct rollout_decision d = rollout_decide(&policy, &s, &stable, &bad, 1);
    assert_int_equal(d.action, ROLLOUT_ROLLBACK);
    assert_int_equal(d.canary_percent, 0);
    assert_non_null(strstr(d.why, "error rate 6.1%"));
    assert_non_null(strstr(d.why, "stable's 1.0%"));
}

/* p99 0.5 s stable, 150%: 0.75 s is the limit. */
static void test_latency_rollback(void **state)
{
    (void)state;
    struct rollout_state s = at(10, 0);
    struct rollout_window ok = {100, 0, 0.75};
    assert_int_equal(rollout_decide(&policy, &s, &stable, &ok, 1).action, ROLLOUT_HOLD);
    struct rollout_window slow = {100, 0, 1.0};
    struct rollout_decision d = rollout_decide(&policy, &s, &stable, &slow, 1);
    assert_int_equal(d.action, ROLLOUT_ROLLBACK);
    assert_non_null(strstr(d.why, "p99"));
    /* 3x slower but only 4 ms more: within the tolerance. */
    struct rollout_window fast = {1000, 10, 0.002};
    struct rollout_window noisy = {100, 0, 0.006};
    assert_int_equal(rollout_decide(&policy, &s, &fast, &noisy, 1).action, ROLLOUT_HOLD);
    /* No stable answers in the window: latency is not compared. */
    struct rollout_window idle = {0, 0, 0};
    assert_int_equal(rollout_decide(&policy, &s, &idle, &slow, 1).action, ROLLOUT_HOLD);
}

/* 10 -> 30 -> 50 -> 70 -> 90 -> promoted, one interval each. */
static void test_healthy_canary_promoted(void **state)
{
    (void)state;
    struct rollout_state s = at(10, 0);
    struct rollout_window canary = {200, 2, 0.4};
    uint64_t now = 0;
    uint32_t seen[8];
    int n = 0;
    for (;;) {
        now += 60000;
        struct rollout_decision d = rollout_decide(&policy, &s, &stable, &canary, now);
        seen[n++] = d.canary_percent;
        if (d.action == ROLLOUT_PROMOTE) {
            s.stage = ROLLOUT_PROMOTED;
            break;
        }
        assert_int_equal(d.action, ROLLOUT_STEP);
        s.canary_percent = d.canary_percent;
        s.step_started_ms = now;
    }
    uint32_t want[] = {30, 50, 70, 90, 100};
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(seen[i], want[i]);
    }
    /* Once promoted (or rolled back) nothing more happens. */
    assert_int_equal(rollout_decide(&policy, &s, &stable, &canary, now * 2).action, ROLLOUT_HOLD);
}

static void test_quantile_of_window(void **state)
{
    (void)state;
    struct histogram base = {0}, now = {0};
    for (int i = 0; i < 50; i++) {
        histogram_observe(&base, 5.0); /* before the window: ignored */
    }
    now = base;
    for (int i = 0; i < 99; i++) {
        histogram_observe(&now, 0.004);
    }
    histogram_observe(&now, 0.2);
    assert_true(rollout_quantile(&now, &base, 0.99) == 0.005);
    histogram_observe(&now, 0.2);
    assert_true(rollout_quantile(&now, &base, 0.99) == 0.25);
    assert_true(rollout_quantile(&base, &base, 0.99) == 0);
}

static void test_stage_names(void **state)
{
    (void)state;
    for (int i = 0; i < ROLLOUT_STAGE_COUNT; i++) {
        const char *n = rollout_stage_name((enum rollout_stage)i);
        assert_int_equal(rollout_stage_parse(n, strlen(n)), i);
    }
    assert_int_equal(rollout_stage_parse("done", 4), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_for_interval),
        cmocka_unit_test(test_waits_for_evidence),
        cmocka_unit_test(test_error_rate_rollback),
        cmocka_unit_test(test_latency_rollback),
        cmocka_unit_test(test_healthy_canary_promoted),
        cmocka_unit_test(test_quantile_of_window),
        cmocka_unit_test(test_stage_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

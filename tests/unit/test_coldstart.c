/* Cold starts in phases: time per phase, the model's cold start in
 * progress, the expected remaining time from its history, the heartbeat
 * text and the cold-start histogram buckets (pure; times are arguments). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "thaw/coldstart.h"

static void test_timeline_sums_time_per_phase(void **state)
{
    struct cs_timeline t;
    cs_timeline_begin(&t, CS_SCALE, 1000);
    cs_timeline_enter(&t, CS_SCHEDULE, 1100);
    cs_timeline_enter(&t, CS_CAPACITY, 1500);
    cs_timeline_enter(&t, CS_SCHEDULE, 2500); /* back: a node went away */
    cs_timeline_enter(&t, CS_CAPACITY, 2600);
    cs_timeline_enter(&t, CS_LOAD, 3600);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_SCALE, 5000), 100);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_SCHEDULE, 5000), 500);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_CAPACITY, 5000), 2000);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_LOAD, 5000), 1400); /* running */
    assert_false(cs_timeline_entered(&t, CS_IMAGE_PULL));
    assert_int_equal(cs_timeline_slowest(&t, 5000), CS_CAPACITY);
    char s[200];
    cs_timeline_summary(&t, 5000, s, sizeof s);
    assert_string_equal(s, "scale 0.1s, schedule 0.5s, capacity 2.0s, load 1.4s");
    /* Entering the current phase changes nothing. */
    cs_timeline_enter(&t, CS_LOAD, 4000);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_LOAD, 5000), 1400);
}

static void test_timeline_move_takes_at_most_what_is_there(void **state)
{
    struct cs_timeline t;
    cs_timeline_begin(&t, CS_CONTAINER_START, 0);
    cs_timeline_enter(&t, CS_LOAD, 3000);
    /* The kubelet says the pull took 2.5 s of those 3. */
    cs_timeline_move(&t, CS_CONTAINER_START, CS_IMAGE_PULL, 2500, 3200);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_IMAGE_PULL, 3200), 2500);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_CONTAINER_START, 3200), 500);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_LOAD, 3200), 200);
    assert_true(cs_timeline_entered(&t, CS_IMAGE_PULL));
    cs_timeline_move(&t, CS_CONTAINER_START, CS_IMAGE_PULL, 9000, 3200);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_CONTAINER_START, 3200), 0);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_IMAGE_PULL, 3200), 3000);
    /* The running phase's time can move too, and it keeps running. */
    cs_timeline_move(&t, CS_LOAD, CS_HEALTH, 100, 3400);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_LOAD, 3400), 300);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_LOAD, 3500), 400);
    assert_int_equal(cs_timeline_phase_ms(&t, CS_HEALTH, 3500), 100);
}

static void test_expected_is_the_median_of_recent_cold_starts(void **state)
{
    struct coldstart c;
    memset(&c, 0, sizeof c);
    uint64_t rem = 99;
    assert_int_equal(coldstart_expected_ms(&c), 0);
    coldstart_begin(&c, CS_LOAD, 1000);
    assert_false(coldstart_remaining_ms(&c, 2000, &rem)); /* no history */
    struct cs_timeline t;
    cs_timeline_begin(&t, CS_LOAD, 1000);
    cs_timeline_enter(&t, CS_HEALTH, 40000);
    struct histogram h[CS_PHASES];
    memset(h, 0, sizeof h);
    assert_true(coldstart_replica_ready(&c, &t, 41000, h));
    assert_int_equal(c.started_ms, 0);
    assert_int_equal(h[CS_LOAD].count, 1);
    assert_int_equal(h[CS_HEALTH].count, 1);
    assert_int_equal(h[CS_SCALE].count, 0);
    assert_true(h[CS_LOAD].sum > 38.9 && h[CS_LOAD].sum < 39.1);
    assert_int_equal(coldstart_expected_ms(&c), 40000);
    /* A second replica of the same start: observed, but no second total. */
    assert_false(coldstart_replica_ready(&c, &t, 42000, h));
    assert_int_equal(h[CS_LOAD].count, 2);
    assert_int_equal(c.n_recent, 1);
    coldstart_record(&c, 50000);
    coldstart_record(&c, 400000); /* one slow start does not move the median much */
    assert_int_equal(coldstart_expected_ms(&c), 50000);
    coldstart_begin(&c, CS_SCALE, 100000);
    coldstart_begin(&c, CS_SCALE, 120000); /* already in progress: kept */
    assert_true(coldstart_remaining_ms(&c, 112000, &rem));
    assert_int_equal(rem, 38000);
    assert_true(coldstart_remaining_ms(&c, 200000, &rem));
    assert_int_equal(rem, 0); /* past the expected time */
    for (int i = 0; i < CS_HISTORY; i++) {
        coldstart_record(&c, 1000);
    }
    assert_int_equal(c.n_recent, CS_HISTORY);
    assert_int_equal(coldstart_expected_ms(&c), 1000); /* the old ones left the ring */
    coldstart_cancel(&c);
    assert_false(coldstart_remaining_ms(&c, 200000, &rem));
}

static void test_heartbeat_text(void **state)
{
    struct coldstart c;
    memset(&c, 0, sizeof c);
    char s[160];
    size_t n = coldstart_heartbeat(&c, 5000, s, sizeof s);
    assert_string_equal(s, ": loading\n\n");
    assert_int_equal(n, strlen(s));
    coldstart_begin(&c, CS_SCALE, 1000);
    coldstart_phase(&c, CS_IMAGE_PULL, 4000);
    coldstart_heartbeat(&c, 13500, s, sizeof s);
    assert_string_equal(s, ": loading phase=image_pull elapsed=12s expected_remaining=unknown\n\n");
    coldstart_record(&c, 52000);
    coldstart_heartbeat(&c, 13500, s, sizeof s);
    assert_string_equal(s, ": loading phase=image_pull elapsed=12s expected_remaining=40s\n\n");
    n = coldstart_heartbeat(&c, 13500, s, 10); /* truncated, still terminated */
    assert_int_equal(n, 9);
    assert_int_equal(strlen(s), 9);
}

static void test_bucket_bounds_reach_half_an_hour(void **state)
{
    assert_true(cs_hist_bounds[HIST_NBUCKETS - 1] == 1800);
    int has_300 = 0, above_300 = 0;
    for (int i = 0; i < HIST_NBUCKETS; i++) {
        if (i) {
            assert_true(cs_hist_bounds[i] > cs_hist_bounds[i - 1]);
        }
        has_300 |= cs_hist_bounds[i] == 300;
        above_300 |= cs_hist_bounds[i] > 300;
    }
    /* The chart's ThawColdStartSlow threshold (300 s) sits below a finite
     * bucket, so a p90 above it can be computed. */
    assert_true(has_300 && above_300);
    struct histogram h;
    memset(&h, 0, sizeof h);
    histogram_observe_in(&h, cs_hist_bounds, 400);
    histogram_observe_in(&h, cs_hist_bounds, 4000); /* +Inf only */
    assert_int_equal(h.buckets[13], 1); /* le=600 */
    assert_int_equal(h.count, 2);
    for (int p = 0; p < CS_PHASES; p++) {
        assert_string_not_equal(cs_phase_name((enum cs_phase)p), "none");
    }
    assert_string_equal(cs_phase_name(CS_IMAGE_PULL), "image_pull");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeline_sums_time_per_phase),
        cmocka_unit_test(test_timeline_move_takes_at_most_what_is_there),
        cmocka_unit_test(test_expected_is_the_median_of_recent_cold_starts),
        cmocka_unit_test(test_heartbeat_text),
        cmocka_unit_test(test_bucket_bounds_reach_half_an_hour),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

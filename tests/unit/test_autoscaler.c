/* Autoscaler worked examples on a fake clock: steady load, a burst into
 * panic, decay, scale to zero after the grace, rate limits, scale-down delay,
 * activation scale, min/max. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/autoscaler.h"

/* Feeds `value` once a second from `from` for `secs` seconds. */
static uint64_t feed(struct as_state *s, uint64_t from, unsigned secs, double value)
{
    uint64_t t = from;
    for (unsigned i = 0; i < secs; i++, t += 1000) {
        as_record(s, t, value);
        as_record(s, t + 500, value);
    }
    return t;
}

static unsigned decide(struct as_state *s, const struct as_config *c, uint64_t now, unsigned ready,
                       struct as_decision *d)
{
    as_decide(s, c, now, ready, ready, d);
    return d->desired;
}

static void test_steady_load(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 60, 25); /* 25 concurrent for a minute */
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 3, &d), 3); /* ceil(25 / 10) */
    assert_false(d.panic);
    assert_true(d.stable_avg > 24.9 && d.stable_avg < 25.1);
    t = feed(&s, t, 60, 31);
    assert_int_equal(decide(&s, &c, t, 3, &d), 4);
}

static void test_burst_panics_and_holds(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 54, 5);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 1, &d), 1);
    t = feed(&s, t, 6, 40); /* the last 6 s: 4x what one replica should take */
    assert_int_equal(decide(&s, &c, t, 1, &d), 4); /* panic window decides */
    assert_true(d.panic);
    /* The burst ends (a trickle goes on), but panic only scales up: 4 holds... */
    t = feed(&s, t, 30, 1);
    assert_int_equal(decide(&s, &c, t, 4, &d), 4);
    assert_true(d.panic);
    /* ...until a whole stable window passed below the threshold. */
    t = feed(&s, t, 31, 1);
    decide(&s, &c, t, 4, &d);
    assert_false(d.panic);
    assert_int_equal(d.desired, 2); /* max scale-down rate: half of 4 per decision */
}

static void test_decay_then_zero_after_grace(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.scale_to_zero_grace_ms = 30000;
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 60, 40);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 4, &d), 4);
    t = feed(&s, t, 61, 2); /* demand falls to a trickle */
    assert_int_equal(decide(&s, &c, t, 4, &d), 2); /* max scale-down rate: 4 -> 2 */
    assert_int_equal(decide(&s, &c, t, 2, &d), 1);
    t = feed(&s, t, 29, 0); /* then stops: within the grace one replica stays */
    assert_int_equal(decide(&s, &c, t, 1, &d), 1);
    t = feed(&s, t, 2, 0); /* 30 s without demand: zero */
    assert_int_equal(decide(&s, &c, t, 1, &d), 0);
    assert_string_equal(d.why, "idle past the scale-to-zero grace");
    c.min_scale = 1; /* unless min-scale says otherwise */
    assert_int_equal(decide(&s, &c, t, 1, &d), 1);
}

static void test_grace_keeps_one_when_the_average_drops_early(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.stable_window_ms = 6000; /* a short window empties fast */
    c.scale_to_zero_grace_ms = 30000;
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 6, 2);
    t = feed(&s, t, 10, 0);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 1, &d), 1);
    assert_string_equal(d.why, "scale-to-zero grace");
    t = feed(&s, t, 25, 0);
    assert_int_equal(decide(&s, &c, t, 1, &d), 0);
}

static void test_rate_limits_and_bounds(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 1);
    c.max_scale_up_rate = 2;
    c.max_scale = 7;
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 60, 100);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 2, &d), 4); /* at most 2x per decision */
    assert_string_equal(d.why, "max scale-up rate");
    assert_int_equal(decide(&s, &c, t, 4, &d), 7); /* then max_scale */
    assert_string_equal(d.why, "max scale");
    c.min_scale = 2;
    t = feed(&s, t, 200, 0);
    assert_int_equal(decide(&s, &c, t, 2, &d), 2);
}

static void test_scale_down_delay(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.stable_window_ms = 6000;
    c.scale_down_delay_ms = 20000;
    c.max_scale_down_rate = 100;
    struct as_state s;
    as_init(&s, &c);
    uint64_t t = feed(&s, 1000000, 6, 50);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, t, 5, &d), 5);
    t = feed(&s, t, 8, 10);
    assert_int_equal(decide(&s, &c, t, 5, &d), 5); /* would be 1: held by the delay */
    assert_string_equal(d.why, "scale-down delay");
    t = feed(&s, t, 21, 10);
    assert_int_equal(decide(&s, &c, t, 5, &d), 1);
}

/* As Knative's: the delay also keeps replicas past the scale-to-zero grace,
 * and a delay of an hour holds over many more decisions than there are
 * slots. */
static void test_scale_down_delay_holds_before_zero(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.stable_window_ms = 6000;
    c.scale_to_zero_grace_ms = 1000;
    c.scale_down_delay_ms = 3600000;
    struct as_state s;
    as_init(&s, &c);
    struct as_decision d;
    uint64_t t = feed(&s, 1000000, 6, 5);
    assert_int_equal(decide(&s, &c, t, 1, &d), 1);
    for (int i = 0; i < 1700; i++) { /* 56 minutes of decisions every 2 s, no demand */
        t = feed(&s, t, 2, 0);
        assert_int_equal(decide(&s, &c, t, 1, &d), 1);
    }
    assert_string_equal(d.why, "scale-down delay");
    t = feed(&s, t, 300, 0); /* past the hour */
    assert_int_equal(decide(&s, &c, t, 1, &d), 0);
    assert_string_equal(d.why, "idle past the scale-to-zero grace");
}

static void test_activation_scale_from_zero(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.activation_scale = 3;
    struct as_state s;
    as_init(&s, &c);
    as_record(&s, 1000, 1); /* one request waiting for a cold model */
    struct as_decision d;
    assert_int_equal(decide(&s, &c, 1000, 0, &d), 3);
    assert_true(d.panic); /* demand with nothing ready */
}

/* Woken to the activation scale, a model keeps it for its scale-down delay
 * once its first replica is ready, whether the wake came from a decision or
 * from the backend's scale from zero (as_note_scaled); before, the next
 * decision with one replica ready asked for 1 at once. */
static void test_activation_scale_is_held_by_the_scale_down_delay(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.activation_scale = 2;
    c.scale_down_delay_ms = 30000;
    struct as_decision d;
    for (int noted = 0; noted < 2; noted++) {
        struct as_state s;
        as_init(&s, &c);
        as_record(&s, 1000000, 1);
        if (noted) {
            as_note_scaled(&s, &c, 1000000, 2); /* woken without a decision */
        } else {
            assert_int_equal(decide(&s, &c, 1000000, 0, &d), 2);
            assert_string_equal(d.why, "activation scale");
        }
        uint64_t t = feed(&s, 1000000, 5, 1);
        assert_int_equal(decide(&s, &c, t, 1, &d), 2);
        assert_string_equal(d.why, "scale-down delay");
        t = feed(&s, t, 30, 1);
        assert_int_equal(decide(&s, &c, t, 2, &d), 1); /* the delay is over */
    }
}

static void test_no_demand_ever_stays_at_zero(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    struct as_state s;
    as_init(&s, &c);
    struct as_decision d;
    assert_int_equal(decide(&s, &c, 5000, 0, &d), 0);
    feed(&s, 5000, 100, 0);
    assert_int_equal(decide(&s, &c, 105000, 0, &d), 0);
}

/* A restart: the idle clock starts from a recorded last request (or from
 * now), never from "no demand ever", which would scale to zero at once. */
static void test_noted_demand_starts_the_idle_clock(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.scale_to_zero_grace_ms = 20000;
    struct as_state s;
    as_init(&s, &c);
    struct as_decision d;
    assert_true(as_idle_ms(&s, 5000) == UINT64_MAX);
    as_note_demand(&s, 5000, 8000); /* 8 s ago: before the clock's origin */
    assert_true(as_idle_ms(&s, 5000) == 8000);
    assert_int_equal(decide(&s, &c, 5000, 1, &d), 1);
    assert_string_equal(d.why, "scale-to-zero grace");
    as_note_demand(&s, 6000, 30000); /* older than what it knows: ignored */
    assert_true(as_idle_ms(&s, 6000) == 9000);
    assert_int_equal(decide(&s, &c, 16999, 1, &d), 1);
    assert_int_equal(decide(&s, &c, 17000, 1, &d), 0);
    as_note_demand(&s, 17000, 0); /* newer: taken */
    assert_int_equal(decide(&s, &c, 36999, 1, &d), 1);
    as_record(&s, 37000, 0);
    assert_int_equal(decide(&s, &c, 37000, 1, &d), 0);
}

/* Replicas still loading (installed with one, or started) are kept through
 * the grace like serving ones, not taken to zero before they ever serve;
 * and not raised to the activation scale when nothing asks for them. */
static void test_loading_replicas_are_kept_through_the_grace(void **state)
{
    struct as_config c;
    as_config_defaults(&c, 10);
    c.scale_to_zero_grace_ms = 20000;
    c.activation_scale = 3;
    struct as_state s;
    as_init(&s, &c);
    struct as_decision d;
    as_note_demand(&s, 1000, 0); /* the clock starts when the model is seen */
    as_decide(&s, &c, 1500, 0, 1, &d);
    assert_int_equal(d.desired, 1);
    assert_string_equal(d.why, "scale-to-zero grace");
    as_decide(&s, &c, 20999, 0, 1, &d);
    assert_int_equal(d.desired, 1);
    as_decide(&s, &c, 21000, 0, 1, &d);
    assert_int_equal(d.desired, 0);
    /* At zero with nothing loading it stays there. */
    as_init(&s, &c);
    as_note_demand(&s, 1000, 0);
    as_decide(&s, &c, 1500, 0, 0, &d);
    assert_int_equal(d.desired, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_load),
        cmocka_unit_test(test_burst_panics_and_holds),
        cmocka_unit_test(test_decay_then_zero_after_grace),
        cmocka_unit_test(test_grace_keeps_one_when_the_average_drops_early),
        cmocka_unit_test(test_rate_limits_and_bounds),
        cmocka_unit_test(test_scale_down_delay),
        cmocka_unit_test(test_scale_down_delay_holds_before_zero),
        cmocka_unit_test(test_activation_scale_from_zero),
        cmocka_unit_test(test_activation_scale_is_held_by_the_scale_down_delay),
        cmocka_unit_test(test_no_demand_ever_stays_at_zero),
        cmocka_unit_test(test_noted_demand_starts_the_idle_clock),
        cmocka_unit_test(test_loading_replicas_are_kept_through_the_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

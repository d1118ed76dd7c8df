/* Process backend decisions: placement on GPU slices, probe pacing,
 * restart backoff, MPS shares. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/procplan.h"
#include "thaw/probe.h"

static void test_gpu_pick_packs_and_refuses(void **state)
{
    struct gpu_slot g[3] = {{0, 4, 0}, {1, 4, 3}, {2, 2, 0}};
    assert_int_equal(procplan_gpu_pick(g, 3, 1), 1); /* the fullest that fits */
    assert_int_equal(procplan_gpu_pick(g, 3, 2), 2);
    assert_int_equal(procplan_gpu_pick(g, 3, 3), 0);
    assert_int_equal(procplan_gpu_pick(g, 3, 5), -1);
    g[0].used = 4;
    g[1].used = 4;
    g[2].used = 1;
    assert_int_equal(procplan_gpu_pick(g, 3, 1), 2);
    assert_int_equal(procplan_gpu_pick(g, 3, 2), -1);
    assert_int_equal(procplan_gpu_pick(g, 0, 1), -1);
}

static void test_probe_delay_is_fast_then_capped(void **state)
{
    assert_int_equal(probe_delay_ms(0), 2);
    assert_int_equal(probe_delay_ms(1), 4);
    assert_int_equal(probe_delay_ms(2), 8);
    assert_int_equal(probe_delay_ms(3), 16);
    assert_int_equal(probe_delay_ms(4), 20);
    assert_int_equal(probe_delay_ms(1000), 20);
    /* A 5-minute load: probes stay near 50 per second. */
    uint64_t t = 0;
    unsigned probes = 0;
    while (t < 300000) {
        t += probe_delay_ms(probes++);
    }
    assert_in_range(probes, 14000, 15100);
}

static void test_probe_pacing_refused_and_by_history(void **state)
{
    /* A closed port is probed tightly: 1, 2, 4, 4 ms. */
    assert_int_equal(probe_next_delay_ms(0, true, 0, 0), 1);
    assert_int_equal(probe_next_delay_ms(1, true, 0, 0), 2);
    assert_int_equal(probe_next_delay_ms(2, true, 0, 0), 4);
    assert_int_equal(probe_next_delay_ms(50, true, 0, 0), 4);
    /* An answer other than 2xx, no history: the 2..20 ms schedule. */
    assert_int_equal(probe_next_delay_ms(0, false, 0, 0), 2);
    assert_int_equal(probe_next_delay_ms(9, false, 0, 0), 20);
    /* A model that took 60 s last time: slow early (an eighth of what is
     * left, at most 250 ms), tight from 80% of the expected time on. */
    assert_int_equal(probe_next_delay_ms(3, true, 0, 60000), 250);
    assert_int_equal(probe_next_delay_ms(3, false, 47000, 60000), 250);
    assert_int_equal(probe_next_delay_ms(3, true, 48000, 60000), 4);
    assert_int_equal(probe_next_delay_ms(3, false, 70000, 60000), 16);
    /* Near the end of a short expected time the eighth is small: tight. */
    assert_int_equal(probe_next_delay_ms(0, true, 100, 200), 1);
    /* A 10-minute load expected at 10 minutes: a bare-connect probe every
     * 250 ms for the first 8 minutes, then at most every 4 ms. */
    uint64_t t = 0;
    unsigned probes = 0;
    while (t < 480000) {
        t += probe_next_delay_ms(probes++, true, t, 600000);
    }
    assert_in_range(probes, 1900, 2000);
}

static void test_restart_backoff(void **state)
{
    assert_int_equal(procplan_restart_backoff_ms(0), 0);
    assert_int_equal(procplan_restart_backoff_ms(1), 1000);
    assert_int_equal(procplan_restart_backoff_ms(2), 2000);
    assert_int_equal(procplan_restart_backoff_ms(4), 8000);
    assert_int_equal(procplan_restart_backoff_ms(7), 60000);
    assert_int_equal(procplan_restart_backoff_ms(100), 60000);
}

static void test_mps_share(void **state)
{
    assert_int_equal(procplan_mps_percentage(1, 4), 25);
    assert_int_equal(procplan_mps_percentage(3, 4), 75);
    assert_int_equal(procplan_mps_percentage(1, 3), 34);
    assert_int_equal(procplan_mps_percentage(4, 4), 100);
    assert_int_equal(procplan_mps_percentage(1, 0), 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_pick_packs_and_refuses),
        cmocka_unit_test(test_probe_delay_is_fast_then_capped),
        cmocka_unit_test(test_probe_pacing_refused_and_by_history),
        cmocka_unit_test(test_restart_backoff),
        cmocka_unit_test(test_mps_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

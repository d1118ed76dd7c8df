/* Process backend decisions, on a fake clock: placement on GPU slices,
 * probe pacing, restart backoff and the replica target (scale from zero,
 * grace, scale to zero, min/max). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/procplan.h"

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
    assert_int_equal(procplan_probe_delay_ms(0), 2);
    assert_int_equal(procplan_probe_delay_ms(1), 4);
    assert_int_equal(procplan_probe_delay_ms(2), 8);
    assert_int_equal(procplan_probe_delay_ms(3), 16);
    assert_int_equal(procplan_probe_delay_ms(4), 20);
    assert_int_equal(procplan_probe_delay_ms(1000), 20);
    /* A 5-minute load: probes stay near 50 per second. */
    uint64_t t = 0;
    unsigned probes = 0;
    while (t < 300000) {
        t += procplan_probe_delay_ms(probes++);
    }
    assert_in_range(probes, 14000, 15100);
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

static struct procplan_model base(void)
{
    struct procplan_model pm = {.min_replicas = 0, .max_replicas = 3, .idle_timeout_ms = 1000};
    return pm;
}

static void test_target_scale_from_zero_on_demand(void **state)
{
    struct procplan_model pm = base();
    assert_int_equal(procplan_target(&pm, 5000), 0); /* nothing asked */
    pm.queued = 50;
    assert_int_equal(procplan_target(&pm, 5000), 1); /* one start for all fifty */
    pm.starting = 1;
    assert_int_equal(procplan_target(&pm, 5000), 1); /* and not a second */
}

static void test_target_backoff_holds_starts(void **state)
{
    struct procplan_model pm = base();
    pm.queued = 1;
    pm.backoff_until_ms = 6000;
    assert_int_equal(procplan_target(&pm, 5000), 0);
    assert_int_equal(procplan_target(&pm, 6000), 1);
}

static void test_target_grace_then_zero(void **state)
{
    struct procplan_model pm = base();
    pm.ready = 2;
    pm.idle_since_ms = 10000;
    assert_int_equal(procplan_target(&pm, 10500), 2); /* within idle_timeout */
    assert_int_equal(procplan_target(&pm, 10999), 2);
    assert_int_equal(procplan_target(&pm, 11000), 0); /* scale to zero */
    pm.min_replicas = 1;
    assert_int_equal(procplan_target(&pm, 11000), 1); /* min kept */
}

static void test_target_never_drops_serving_replicas(void **state)
{
    struct procplan_model pm = base();
    pm.ready = 3;
    pm.inflight = 1;
    pm.idle_since_ms = 0;
    assert_int_equal(procplan_target(&pm, 99999), 3);
    pm.max_replicas = 2; /* but max wins */
    assert_int_equal(procplan_target(&pm, 99999), 2);
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
        cmocka_unit_test(test_restart_backoff),
        cmocka_unit_test(test_target_scale_from_zero_on_demand),
        cmocka_unit_test(test_target_backoff_holds_starts),
        cmocka_unit_test(test_target_grace_then_zero),
        cmocka_unit_test(test_target_never_drops_serving_replicas),
        cmocka_unit_test(test_mps_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

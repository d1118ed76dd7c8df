/* The shared scaling driver: the capacity cap both scaling backends plan
 * against, and the planning cadence and hook order of one step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "thaw/clock.h"
#include "thaw/scale_driver.h"

static void test_capacity_cap(void **state)
{
    struct config_warm_pool wp;
    memset(&wp, 0, sizeof wp);
    assert_int_equal(scale_driver_capacity(0, &wp), 0);  /* unknown, no cap: unlimited */
    assert_int_equal(scale_driver_capacity(8, &wp), 8);  /* the hardware's */
    wp.capacity_slices = 4;
    assert_int_equal(scale_driver_capacity(8, &wp), 4);  /* capped */
    assert_int_equal(scale_driver_capacity(2, &wp), 2);  /* a cap never adds slices */
    assert_int_equal(scale_driver_capacity(0, &wp), 4);  /* the cap alone */
}

struct hooks_seen {
    int counted, collected, asked_gpus, applied;
    size_t applied_n;
};

static size_t count(void *ud)
{
    ((struct hooks_seen *)ud)->counted++;
    return 0;
}

static size_t collect(void *ud, uint64_t now_ms, struct scaler_model **sms, size_t max)
{
    struct hooks_seen *s = ud;
    assert_int_equal(s->counted, 1); /* sized first */
    s->collected++;
    return 0;
}

static unsigned gpus(void *ud)
{
    ((struct hooks_seen *)ud)->asked_gpus++;
    return 0;
}

static void apply(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms)
{
    struct hooks_seen *s = ud;
    assert_int_equal(s->collected, 1); /* applied after collecting */
    s->applied++;
    s->applied_n = n;
}

static const struct scale_driver_ops ops = {count, collect, gpus, apply, NULL};

static void test_one_step_and_cadence(void **state)
{
    struct config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.autoscaler.tick_ms = 60000;
    struct hooks_seen seen = {0};
    struct scale_driver d;
    scale_driver_init(&d, &ops, &seen);
    uint64_t now = clock_now_ms();
    assert_true(scale_driver_due(&d, now)); /* the first step is due at once */
    scale_driver_plan(&d, &cfg);
    assert_int_equal(seen.applied, 1);
    assert_int_equal(seen.asked_gpus, 1);
    assert_int_equal(seen.applied_n, 0);
    assert_false(scale_driver_due(&d, clock_now_ms())); /* next one tick_ms later */
    assert_true(scale_driver_due(&d, now + 60000 + 1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_cap),
        cmocka_unit_test(test_one_step_and_cadence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

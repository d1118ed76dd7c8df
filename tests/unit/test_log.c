/* log: a recurring warning written at most once per interval. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/log.h"

static void test_log_limit_passes_once_per_interval(void **state)
{
    struct log_limit l = {0};
    uint64_t held = 99;
    assert_true(log_limit_pass(&l, 5000, 1000, &held));
    assert_int_equal(held, 0);
    assert_false(log_limit_pass(&l, 5001, 1000, &held));
    assert_false(log_limit_pass(&l, 5999, 1000, &held));
    assert_true(log_limit_pass(&l, 6000, 1000, &held));
    assert_int_equal(held, 2); /* the two held back, counted on this line */
    assert_true(log_limit_pass(&l, 9000, 1000, &held));
    assert_int_equal(held, 0);
    /* At the clock's very start (0) too: the next one within the interval waits. */
    struct log_limit z = {0};
    assert_true(log_limit_pass(&z, 0, 1000, &held));
    assert_false(log_limit_pass(&z, 500, 1000, &held));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_limit_passes_once_per_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* fdbudget: client connections a descriptor limit allows, the reserve kept
 * free, and the limit to ask for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "thaw/fdbudget.h"

static void test_a_client_costs_two_descriptors_past_the_reserve(void **state)
{
    struct fdbudget b;
    /* 64: 8 open + 32 + 64/32 = 42 kept free, 22 left: 11 clients. */
    fdbudget_derive(&b, 64, 8);
    assert_int_equal(b.reserve, 42);
    assert_int_equal(b.max_connections, 11);
    assert_int_equal(b.max_refused, 8);
    /* 1024: 8 + 32 + 32 = 72, 952 left. */
    fdbudget_derive(&b, 1024, 8);
    assert_int_equal(b.max_connections, 476);
    assert_int_equal(b.max_refused, 16);
    /* Containers' usual 1048576: far above the default 10000. */
    fdbudget_derive(&b, 1048576, 8);
    assert_int_equal(b.reserve, 8 + 32 + 32768);
    assert_int_equal(b.max_connections, (1048576 - 32808) / 2);
    assert_int_equal(b.max_refused, 1024);
}

static void test_a_limit_with_no_room_still_allows_one(void **state)
{
    struct fdbudget b;
    fdbudget_derive(&b, 40, 10);
    assert_int_equal(b.max_connections, 1);
    fdbudget_derive(&b, 0, 10);
    assert_int_equal(b.max_connections, 1);
    /* Unlimited (RLIM_INFINITY) does not wrap around. */
    fdbudget_derive(&b, UINT64_MAX, 10);
    assert_true(b.max_connections > 1000000);
    fdbudget_derive(&b, 100, UINT64_MAX - 8);
    assert_int_equal(b.max_connections, 1);
}

static void test_the_lower_figure_is_in_force(void **state)
{
    struct fdbudget b = {0};
    /* Not worked out (limit 0): the configured figure stands. */
    assert_int_equal(fdbudget_connections(&b, 10000), 10000);
    fdbudget_derive(&b, 128, 8);
    assert_int_equal(b.max_connections, 42);
    assert_int_equal(fdbudget_connections(&b, 10000), 42);
    assert_int_equal(fdbudget_connections(&b, 42), 42);
    assert_int_equal(fdbudget_connections(&b, 5), 5);
}

static void test_the_limit_to_ask_for_is_the_least_that_allows_it(void **state)
{
    struct fdbudget b;
    fdbudget_derive(&b, 64, 8);
    uint64_t wanted[] = {2, 11, 12, 100, 10000, 1000000};
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        uint64_t l = fdbudget_limit_for(&b, wanted[i]);
        struct fdbudget t;
        fdbudget_derive(&t, l, 8);
        assert_true(t.max_connections >= wanted[i]);
        fdbudget_derive(&t, l - 1, 8);
        assert_true(t.max_connections < wanted[i]);
    }
    /* The default 10000 with 8 open: 2 x 10000 + 40, plus about 3%. */
    assert_int_equal(fdbudget_limit_for(&b, 10000), 20686);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_client_costs_two_descriptors_past_the_reserve),
        cmocka_unit_test(test_a_limit_with_no_room_still_allows_one),
        cmocka_unit_test(test_the_lower_figure_is_in_force),
        cmocka_unit_test(test_the_limit_to_ask_for_is_the_least_that_allows_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

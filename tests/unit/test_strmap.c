/* strmap: put/get/replace/delete through growth and tombstones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/strmap.h"

static void test_many_keys(void **state)
{
    struct strmap m;
    strmap_init(&m);
    static int vals[5000];
    char k[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof k, "model-%d", i);
        assert_int_equal(strmap_put(&m, k, strlen(k), &vals[i]), 0);
    }
    assert_int_equal(m.count, 5000);
    for (int i = 0; i < 5000; i += 7) {
        snprintf(k, sizeof k, "model-%d", i);
        assert_ptr_equal(strmap_get(&m, k, strlen(k)), &vals[i]);
    }
    for (int i = 0; i < 5000; i += 2) {
        snprintf(k, sizeof k, "model-%d", i);
        assert_ptr_equal(strmap_del(&m, k, strlen(k)), &vals[i]);
    }
    assert_int_equal(m.count, 2500);
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof k, "model-%d", i);
        void *want = i % 2 ? &vals[i] : NULL;
        assert_ptr_equal(strmap_get(&m, k, strlen(k)), want);
    }
    /* Re-insert after deletion reuses tombstones. */
    for (int i = 0; i < 5000; i += 2) {
        snprintf(k, sizeof k, "model-%d", i);
        assert_int_equal(strmap_put(&m, k, strlen(k), &vals[i]), 0);
    }
    assert_int_equal(m.count, 5000);
    strmap_dispose(&m);
}

static void test_replace_and_del_value(void **state)
{
    struct strmap m;
    strmap_init(&m);
    int a, b;
    strmap_put(&m, "x", 1, &a);
    strmap_put(&m, "x", 1, &b);
    assert_int_equal(m.count, 1);
    assert_ptr_equal(strmap_get(&m, "x", 1), &b);
    strmap_put(&m, "y", 1, &b);
    strmap_put(&m, "z", 1, &a);
    assert_int_equal(strmap_del_value(&m, &b), 2);
    assert_null(strmap_get(&m, "x", 1));
    assert_ptr_equal(strmap_get(&m, "z", 1), &a);
    assert_null(strmap_get(&m, "xy", 2));
    strmap_dispose(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_keys),
        cmocka_unit_test(test_replace_and_del_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Warm pool and admission decisions: budget and its ordering, eviction of
 * idle warm replicas, preemption only of strictly lower priority, min held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "thaw/warmpool.h"

static struct wp_model M(const char *name, enum tier t, unsigned slices, unsigned cur,
                         unsigned want, bool idle, double value)
{
    struct wp_model m = {name, t, slices, cur, want, 0, idle, value, 0, 0};
    return m;
}

static int count(const struct wp_plan *p, enum wp_action a, size_t model)
{
    int n = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (p->d[i].action == a && p->d[i].model == model) {
            n += (int)p->d[i].replicas;
        }
    }
    return n;
}

static void test_warm_budget_by_priority_then_value(void **state)
{
    struct wp_model m[] = {
        M("batch-hot", TIER_BATCH, 1, 1, 0, true, 500),
        M("crit", TIER_CRITICAL, 2, 1, 0, true, 1),
        M("std-cold", TIER_STANDARD, 1, 1, 0, true, 10),
        M("std-hot", TIER_STANDARD, 1, 1, 0, true, 90),
    };
    struct wp_plan p;
    warmpool_plan(m, 4, 8, 3, &p); /* budget: 3 slices of idle replicas */
    assert_int_equal(m[1].target, 1); /* critical first (2 slices) */
    assert_int_equal(m[3].target, 1); /* then the standard one worth more */
    assert_int_equal(m[2].target, 0); /* budget full */
    assert_int_equal(m[0].target, 0); /* value does not beat priority */
    assert_int_equal(count(&p, WP_KEEP_WARM, 1), 1);
    assert_int_equal(count(&p, WP_TO_ZERO, 0), 1);
    assert_int_equal(p.warm_slices, 3);
}

static void test_min_replicas_always_kept(void **state)
{
    struct wp_model m[] = {M("a", TIER_BATCH, 1, 2, 0, true, 0)};
    m[0].min_replicas = 2;
    struct wp_plan p;
    warmpool_plan(m, 1, 4, 0, &p);
    assert_int_equal(m[0].target, 2);
}

static void test_critical_evicts_idle_batch_and_is_admitted(void **state)
{
    /* 4 slices full of idle warm batch replicas; a critical model wakes. */
    struct wp_model m[] = {
        M("b1", TIER_BATCH, 1, 1, 0, true, 5),
        M("b2", TIER_BATCH, 1, 1, 0, true, 1),
        M("b3", TIER_BATCH, 2, 1, 0, true, 9),
        M("crit", TIER_CRITICAL, 1, 0, 1, false, 0),
    };
    struct wp_plan p;
    warmpool_plan(m, 4, 4, 4, &p);
    assert_int_equal(m[3].target, 1);
    assert_int_equal(count(&p, WP_ADMIT, 3), 1);
    assert_int_equal(count(&p, WP_EVICT, 1), 1); /* the lowest value went */
    assert_int_equal(m[1].target, 0);
    assert_int_equal(m[0].target + m[2].target, 2);
    for (size_t i = 0; i < p.n; i++) {
        if (p.d[i].action == WP_EVICT) {
            assert_int_equal(p.d[i].by, 3);
        }
    }
}

static void test_preempts_only_strictly_lower_priority(void **state)
{
    struct wp_model m[] = {
        M("batch-busy", TIER_BATCH, 1, 3, 3, false, 1),
        M("std-busy", TIER_STANDARD, 1, 1, 1, false, 1),
        M("std-new", TIER_STANDARD, 1, 0, 2, false, 100),
    };
    m[0].min_replicas = 1;
    struct wp_plan p;
    warmpool_plan(m, 3, 4, 0, &p);
    assert_int_equal(m[2].target, 2);       /* room from batch... */
    assert_int_equal(m[0].target, 1);       /* ...down to its min... */
    assert_int_equal(m[1].target, 1);       /* ...never from an equal tier */
    assert_int_equal(count(&p, WP_PREEMPT, 0), 2);
    assert_int_equal(count(&p, WP_PREEMPT, 1), 0);

    /* Batch never takes from standard: it is denied instead. */
    struct wp_model q[] = {
        M("std", TIER_STANDARD, 2, 2, 2, false, 1),
        M("batch", TIER_BATCH, 1, 0, 1, false, 1000),
    };
    warmpool_plan(q, 2, 4, 0, &p);
    assert_int_equal(q[0].target, 2);
    assert_int_equal(q[1].target, 0);
    assert_int_equal(count(&p, WP_DENY, 1), 1);
}

static void test_equal_tier_evicts_idle_warm_of_lower_value_only(void **state)
{
    struct wp_model m[] = {
        M("warm-low", TIER_BATCH, 2, 1, 0, true, 1),
        M("new", TIER_BATCH, 2, 0, 1, false, 50),
    };
    struct wp_plan p;
    warmpool_plan(m, 2, 2, 2, &p);
    assert_int_equal(m[1].target, 1);
    assert_int_equal(m[0].target, 0);
    struct wp_model q[] = {
        M("warm-high", TIER_BATCH, 2, 1, 0, true, 80),
        M("new", TIER_BATCH, 2, 0, 1, false, 5),
    };
    warmpool_plan(q, 2, 2, 2, &p);
    assert_int_equal(q[1].target, 0); /* denied: the warm one is worth more */
    assert_int_equal(q[0].target, 1);
}

static void test_partial_admission_and_no_gpu_models(void **state)
{
    struct wp_model m[] = {
        M("big", TIER_STANDARD, 2, 0, 3, false, 1),
        M("cpu", TIER_BATCH, 0, 0, 5, false, 1),
    };
    struct wp_plan p;
    warmpool_plan(m, 2, 5, 0, &p);
    assert_int_equal(m[0].target, 2); /* 2 of 3 fit in 5 slices */
    assert_int_equal(count(&p, WP_DENY, 0), 1);
    assert_int_equal(m[1].target, 5); /* needs no GPU: not limited */
    assert_int_equal(p.used_slices, 4);
}

static void test_unlimited_capacity(void **state)
{
    struct wp_model m[] = {M("a", TIER_BATCH, 4, 0, 10, false, 1)};
    struct wp_plan p;
    warmpool_plan(m, 1, 0, 0, &p);
    assert_int_equal(m[0].target, 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warm_budget_by_priority_then_value),
        cmocka_unit_test(test_min_replicas_always_kept),
        cmocka_unit_test(test_critical_evicts_idle_batch_and_is_admitted),
        cmocka_unit_test(test_preempts_only_strictly_lower_priority),
        cmocka_unit_test(test_equal_tier_evicts_idle_warm_of_lower_value_only),
        cmocka_unit_test(test_partial_admission_and_no_gpu_models),
        cmocka_unit_test(test_unlimited_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

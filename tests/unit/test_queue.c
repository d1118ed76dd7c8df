/* Queue: tier order, aging, FIFO, bounds, displacement, deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "thaw/queue.h"

struct item {
    struct queue_item qi;
    int id;
};

static int id_of(struct queue_item *it)
{
    return it ? container_of(it, struct item, qi)->id : -1;
}

static void push(struct queue *q, struct item *it, enum tier t, uint64_t now, int expect_rc)
{
    struct queue_item *displaced = (struct queue_item *)1;
    assert_int_equal(queue_push(q, &it->qi, t, now, now + 1000, &displaced), expect_rc);
    assert_null(displaced);
}

static void test_tiers_served_in_priority_order(void **state)
{
    struct queue_global g = {0, 100};
    struct queue q;
    queue_init(&q, 10, 10000, &g);
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    push(&q, &a, TIER_BATCH, 0, 0);
    push(&q, &b, TIER_STANDARD, 1, 0);
    push(&q, &c, TIER_CRITICAL, 2, 0);
    assert_int_equal(q.count, 3);
    assert_int_equal(g.total, 3);
    assert_int_equal(id_of(queue_pop(&q)), 3);
    assert_int_equal(id_of(queue_pop(&q)), 2);
    assert_int_equal(id_of(queue_pop(&q)), 1);
    assert_null(queue_pop(&q));
    assert_int_equal(g.total, 0);
}

static void test_fifo_within_a_tier(void **state)
{
    struct queue q;
    queue_init(&q, 10, 10000, NULL);
    struct item it[5];
    for (int i = 0; i < 5; i++) {
        it[i].id = i;
        push(&q, &it[i], TIER_STANDARD, (uint64_t)i, 0);
    }
    for (int i = 0; i < 5; i++) {
        assert_int_equal(id_of(queue_pop(&q)), i);
    }
}

static void test_aging_lets_old_batch_beat_new_critical(void **state)
{
    struct queue q;
    queue_init(&q, 10, 1000, NULL); /* batch ranks +2000 ms, standard +1000 */
    struct item old_batch = {.id = 1}, new_crit = {.id = 2}, newer_crit = {.id = 3};
    push(&q, &old_batch, TIER_BATCH, 0, 0);
    push(&q, &new_crit, TIER_CRITICAL, 1999, 0);
    push(&q, &newer_crit, TIER_CRITICAL, 2001, 0);
    /* batch rank 2000; critical ranks 1999 and 2001 */
    assert_int_equal(id_of(queue_pop(&q)), 2);
    assert_int_equal(id_of(queue_pop(&q)), 1);
    assert_int_equal(id_of(queue_pop(&q)), 3);
}

static void test_per_queue_bound(void **state)
{
    struct queue q;
    queue_init(&q, 2, 1000, NULL);
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    push(&q, &a, TIER_STANDARD, 0, 0);
    push(&q, &b, TIER_STANDARD, 0, 0);
    push(&q, &c, TIER_STANDARD, 0, -ENOSPC);
    push(&q, &c, TIER_BATCH, 0, -ENOSPC);
    assert_int_equal(q.count, 2);
}

static void test_global_bound_spans_queues(void **state)
{
    struct queue_global g = {0, 2};
    struct queue q1, q2;
    queue_init(&q1, 10, 1000, &g);
    queue_init(&q2, 10, 1000, &g);
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    push(&q1, &a, TIER_STANDARD, 0, 0);
    push(&q2, &b, TIER_STANDARD, 0, 0);
    push(&q2, &c, TIER_STANDARD, 0, -ENOSPC);
    queue_remove(&q1, &a.qi);
    push(&q2, &c, TIER_STANDARD, 0, 0);
    assert_int_equal(g.total, 2);
}

static void test_critical_displaces_newest_batch(void **state)
{
    struct queue q;
    queue_init(&q, 3, 1000, NULL);
    struct item b1 = {.id = 1}, b2 = {.id = 2}, s = {.id = 3}, c = {.id = 4}, c2 = {.id = 5};
    push(&q, &b1, TIER_BATCH, 0, 0);
    push(&q, &b2, TIER_BATCH, 1, 0);
    push(&q, &s, TIER_STANDARD, 2, 0);
    struct queue_item *displaced = NULL;
    assert_int_equal(queue_push(&q, &c.qi, TIER_CRITICAL, 3, 1000, &displaced), 0);
    assert_int_equal(id_of(displaced), 2); /* the newest batch request */
    assert_int_equal(q.count, 3);
    assert_int_equal(q.len[TIER_BATCH], 1);
    /* Standard requests never displace anyone. */
    struct item s2 = {.id = 6};
    push(&q, &s2, TIER_STANDARD, 4, -ENOSPC);
    /* With no batch left to displace, critical is refused too. */
    assert_int_equal(queue_push(&q, &c2.qi, TIER_CRITICAL, 5, 1000, &displaced), 0);
    assert_int_equal(id_of(displaced), 1);
    struct item c3 = {.id = 7};
    assert_int_equal(queue_push(&q, &c3.qi, TIER_CRITICAL, 6, 1000, &displaced), -ENOSPC);
    assert_null(displaced);
}

static void test_deadlines(void **state)
{
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    struct queue_item *d;
    assert_int_equal(queue_next_deadline(&q), UINT64_MAX);
    queue_push(&q, &a.qi, TIER_BATCH, 0, 500, &d);
    queue_push(&q, &b.qi, TIER_CRITICAL, 100, 600, &d);
    queue_push(&q, &c.qi, TIER_CRITICAL, 200, 700, &d);
    assert_int_equal(queue_next_deadline(&q), 500);
    assert_null(queue_pop_expired(&q, 499));
    assert_int_equal(id_of(queue_pop_expired(&q, 650)), 1);
    assert_int_equal(id_of(queue_pop_expired(&q, 650)), 2);
    assert_null(queue_pop_expired(&q, 650));
    assert_int_equal(queue_next_deadline(&q), 700);
    assert_int_equal(queue_oldest_age(&q, 1200), 1000);
}

static void test_push_front_keeps_place(void **state)
{
    struct queue q;
    queue_init(&q, 1, 1000, NULL);
    struct item a = {.id = 1}, b = {.id = 2};
    push(&q, &a, TIER_STANDARD, 0, 0);
    struct queue_item *it = queue_pop(&q);
    push(&q, &b, TIER_STANDARD, 5, 0);
    queue_push_front(&q, it); /* past the bound: a retry is not a new arrival */
    assert_int_equal(q.count, 2);
    assert_int_equal(id_of(queue_pop(&q)), 1);
    assert_int_equal(id_of(queue_pop(&q)), 2);
}

/* A request sent straight to a replica and put back after a failed connect
 * keeps the tier and deadline it was stamped with, not stale or zero ones. */
static void test_stamped_item_pushed_front_keeps_its_deadline(void **state)
{
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    struct item a = {.id = 1};
    a.qi.deadline_ms = 0; /* what a never-queued item carried before */
    queue_item_stamp(&a.qi, TIER_CRITICAL, 100, 60100);
    queue_push_front(&q, &a.qi);
    assert_null(queue_pop_expired(&q, 200));
    assert_int_equal(queue_next_deadline(&q), 60100);
    assert_int_equal(id_of(queue_pop_expired(&q, 60100)), 1);
    assert_int_equal(a.qi.tier, TIER_CRITICAL);
}

static void test_remove_from_middle(void **state)
{
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    struct item it[3];
    for (int i = 0; i < 3; i++) {
        it[i].id = i;
        push(&q, &it[i], TIER_STANDARD, (uint64_t)i, 0);
    }
    queue_remove(&q, &it[1].qi);
    assert_int_equal(id_of(queue_pop(&q)), 0);
    assert_int_equal(id_of(queue_pop(&q)), 2);
    assert_int_equal(q.count, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiers_served_in_priority_order),
        cmocka_unit_test(test_fifo_within_a_tier),
        cmocka_unit_test(test_aging_lets_old_batch_beat_new_critical),
        cmocka_unit_test(test_per_queue_bound),
        cmocka_unit_test(test_global_bound_spans_queues),
        cmocka_unit_test(test_critical_displaces_newest_batch),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_push_front_keeps_place),
        cmocka_unit_test(test_stamped_item_pushed_front_keeps_its_deadline),
        cmocka_unit_test(test_remove_from_middle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

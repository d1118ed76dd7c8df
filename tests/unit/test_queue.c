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
    struct queue_global g = {.max_total = 100};
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
    struct queue_global g = {.max_total = 2};
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

static void test_critical_at_global_bound_displaces_other_queues_batch(void **state)
{
    struct queue_global g = {.max_total = 4};
    struct queue q1, q2, q3;
    queue_init(&q1, 10, 1000, &g);
    queue_init(&q2, 10, 1000, &g);
    queue_init(&q3, 10, 1000, &g);
    struct item b1 = {.id = 1}, b2 = {.id = 2}, b3 = {.id = 3}, s = {.id = 4};
    struct item c = {.id = 5}, c2 = {.id = 6}, s2 = {.id = 7};
    push(&q1, &b1, TIER_BATCH, 0, 0);
    push(&q2, &b2, TIER_BATCH, 1, 0);
    push(&q2, &b3, TIER_BATCH, 2, 0);
    push(&q1, &s, TIER_STANDARD, 3, 0);
    /* q3 is empty and below its own bound; the global one is reached. A
     * standard request is refused, a critical one takes the newest batch
     * item of the queue with the most of them (q2). */
    push(&q3, &s2, TIER_STANDARD, 4, -ENOSPC);
    struct queue_item *displaced = NULL;
    assert_int_equal(queue_push(&q3, &c.qi, TIER_CRITICAL, 5, 1000, &displaced), 0);
    assert_int_equal(id_of(displaced), 3);
    assert_int_equal(q2.count, 1);
    assert_int_equal(q3.count, 1);
    assert_int_equal(g.total, 4);
    /* q1 and q2 tie at one batch item each: the pushing queue's own first. */
    assert_int_equal(queue_push(&q1, &c2.qi, TIER_CRITICAL, 6, 1000, &displaced), 0);
    assert_int_equal(id_of(displaced), 1);
    /* A queue that leaves no longer takes part. */
    queue_remove(&q3, &c.qi);
    queue_dispose(&q3);
    assert_int_equal(g.total, 3);
    queue_remove(&q2, &b2.qi);
    queue_remove(&q1, &c2.qi);
    queue_remove(&q1, &s.qi);
    queue_dispose(&q1);
    queue_dispose(&q2);
    assert_true(list_empty(&g.queues));
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

/* ---- flows (tenants) ---- */

static void push_flow(struct queue *q, struct item *it, uint32_t flow, enum tier t, uint64_t now,
                      int expect_rc);

/* A tenant at its own concurrency cap waits whatever the replica count:
 * the autoscaler must not scale up for those requests. */
static void test_waiting_at_a_tenant_cap_is_not_demand(void **state)
{
    struct queue_global g = {.max_total = 100};
    struct queue q;
    queue_init(&q, 50, 10000, &g);
    struct item it[12];
    /* Tenant 1: cap 2, both running, 6 waiting: none of them can start. */
    queue_flow_set(&q, 1, 1, 2, QUEUE_NO_CAP);
    queue_flow_started(&q, 1);
    queue_flow_started(&q, 1);
    for (int i = 0; i < 6; i++) {
        push_flow(&q, &it[i], 1, TIER_STANDARD, 0, 0);
    }
    assert_int_equal(q.count, 6);
    assert_int_equal(queue_runnable(&q), 0);
    /* Tenant 2: cap 3, 1 running, 4 waiting: 2 more may start. */
    queue_flow_set(&q, 2, 1, 3, QUEUE_NO_CAP);
    queue_flow_started(&q, 2);
    for (int i = 6; i < 10; i++) {
        push_flow(&q, &it[i], 2, TIER_BATCH, 0, 0);
    }
    assert_int_equal(queue_runnable(&q), 2);
    /* The default tenant, uncapped: both of its waiting requests count. */
    push_flow(&q, &it[10], 0, TIER_CRITICAL, 0, 0);
    push_flow(&q, &it[11], 0, TIER_CRITICAL, 0, 0);
    assert_int_equal(q.count, 12);
    assert_int_equal(queue_runnable(&q), 4);
    /* Tenant 1's cap rises to 5: 3 of its 6 may start. */
    queue_flow_set(&q, 1, 1, 5, QUEUE_NO_CAP);
    assert_int_equal(queue_runnable(&q), 7);
    while (queue_pop_any(&q)) {
    }
    assert_int_equal(queue_runnable(&q), 0);
    queue_dispose(&q);
}

static void push_flow(struct queue *q, struct item *it, uint32_t flow, enum tier t, uint64_t now,
                      int expect_rc)
{
    struct queue_item *displaced = (struct queue_item *)1;
    assert_int_equal(queue_push_flow(q, &it->qi, flow, t, now, now + 100000, &displaced),
                     expect_rc);
    assert_null(displaced);
}

/* A burst of 1,000 batch items from one flow does not hold back the 10 of
 * another flow queued after it: they alternate, so the small flow is done
 * within its first 20 pops. */
static void test_round_robin_across_flows(void **state)
{
    static struct item big[1000], small[10];
    struct queue q;
    queue_init(&q, 2000, 10000, NULL);
    assert_int_equal(queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, QUEUE_NO_CAP), 0);
    assert_int_equal(queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP), 0);
    for (int i = 0; i < 1000; i++) {
        big[i].id = i;
        push_flow(&q, &big[i], 1, TIER_BATCH, (uint64_t)i, 0);
    }
    for (int i = 0; i < 10; i++) {
        small[i].id = 10000 + i;
        push_flow(&q, &small[i], 2, TIER_BATCH, 1000 + (uint64_t)i, 0);
    }
    int small_seen = 0, pops = 0, big_next = 0;
    while (small_seen < 10) {
        int id = id_of(queue_pop(&q));
        pops++;
        if (id >= 10000) {
            assert_int_equal(id, 10000 + small_seen); /* FIFO inside a flow */
            small_seen++;
        } else {
            assert_int_equal(id, big_next++);
        }
    }
    assert_true(pops <= 20);
    /* Then the big flow's rest, in order. */
    for (int i = big_next; i < 1000; i++) {
        assert_int_equal(id_of(queue_pop(&q)), i);
    }
    assert_null(queue_pop(&q));
    assert_int_equal(q.count, 0);
    queue_dispose(&q);
}

/* Flows 1 (weight w1) and 2 (weight 1) with six items each; then flow 1's
 * weight set to w1_later while they wait (0: left), and the pop order
 * checked: three of flow 1 per turn to flow 2's one. */
static void check_weighted_turns(uint32_t w1, uint32_t w1_later)
{
    struct item a[6], b[6];
    struct queue q;
    queue_init(&q, 100, 10000, NULL);
    queue_flow_set(&q, 1, w1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    for (int i = 0; i < 6; i++) {
        a[i].id = 100 + i;
        b[i].id = 200 + i;
        push_flow(&q, &a[i], 1, TIER_STANDARD, 0, 0);
        push_flow(&q, &b[i], 2, TIER_STANDARD, 0, 0);
    }
    if (w1_later) {
        queue_flow_set(&q, 1, w1_later, QUEUE_NO_CAP, QUEUE_NO_CAP);
    }
    int want[] = {100, 101, 102, 200, 103, 104, 105, 201, 202, 203, 204, 205};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(id_of(queue_pop(&q)), want[i]);
    }
    queue_dispose(&q);
}

/* A flow of weight 3 gets three items per turn to the other's one. */
static void test_weighted_turns(void **state)
{
    check_weighted_turns(3, 0);
}

/* A weight raised while items wait (a reload) counts from the flow's
 * current turn: the same order as with that weight from the start. */
static void test_a_new_weight_applies_to_what_waits(void **state)
{
    check_weighted_turns(1, 3);
}

/* Aging across tiers still goes by each tier's oldest item. */
static void test_flows_keep_aging_across_tiers(void **state)
{
    struct item old_batch = {.id = 1}, crit = {.id = 2}, later_batch = {.id = 3};
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    push_flow(&q, &old_batch, 1, TIER_BATCH, 0, 0);
    push_flow(&q, &later_batch, 2, TIER_BATCH, 1500, 0);
    push_flow(&q, &crit, 2, TIER_CRITICAL, 2500, 0);
    /* batch rank 0 + 2000 < critical 2500 */
    assert_int_equal(id_of(queue_pop(&q)), 1);
    /* now batch's oldest is 1500 + 2000 = 3500 > 2500 */
    assert_int_equal(id_of(queue_pop(&q)), 2);
    assert_int_equal(id_of(queue_pop(&q)), 3);
    queue_dispose(&q);
}

/* Deadlines are checked at the head of every flow, not only the first. */
static void test_deadlines_across_flows(void **state)
{
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    struct queue q;
    struct queue_item *d;
    queue_init(&q, 10, 1000, NULL);
    queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_push_flow(&q, &a.qi, 1, TIER_BATCH, 0, 900, &d);
    queue_push_flow(&q, &b.qi, 1, TIER_BATCH, 1, 901, &d);
    queue_push_flow(&q, &c.qi, 2, TIER_BATCH, 2, 300, &d);
    assert_int_equal(queue_next_deadline(&q), 300);
    assert_null(queue_pop_expired(&q, 299));
    assert_int_equal(id_of(queue_pop_expired(&q, 300)), 3);
    assert_int_equal(id_of(queue_pop_expired(&q, 1000)), 1);
    assert_int_equal(id_of(queue_pop_expired(&q, 1000)), 2);
    assert_int_equal(queue_next_deadline(&q), UINT64_MAX);
    queue_dispose(&q);
}

/* A critical request at a full queue displaces the newest item of the
 * longest batch flow. */
static void test_displacement_takes_from_the_longest_batch_flow(void **state)
{
    struct item s1 = {.id = 1}, b1 = {.id = 2}, b2 = {.id = 3}, b3 = {.id = 4}, c = {.id = 5};
    struct queue q;
    queue_init(&q, 4, 1000, NULL);
    queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    push_flow(&q, &s1, 1, TIER_BATCH, 0, 0);
    push_flow(&q, &b1, 2, TIER_BATCH, 1, 0);
    push_flow(&q, &b2, 2, TIER_BATCH, 2, 0);
    push_flow(&q, &b3, 1, TIER_STANDARD, 3, 0);
    struct queue_item *displaced = NULL;
    assert_int_equal(queue_push_flow(&q, &c.qi, 1, TIER_CRITICAL, 4, 1000, &displaced), 0);
    assert_int_equal(id_of(displaced), 3);
    assert_int_equal(queue_flow(&q, 2)->queued, 1);
    queue_dispose(&q);
}

/* A flow at its running cap is skipped; the others are served; it comes
 * back when one of its items finishes. */
static void test_running_cap_skips_the_flow(void **state)
{
    struct item a1 = {.id = 1}, a2 = {.id = 2}, b1 = {.id = 3};
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    queue_flow_set(&q, 1, 1, 1, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    push_flow(&q, &a1, 1, TIER_STANDARD, 0, 0);
    push_flow(&q, &a2, 1, TIER_STANDARD, 1, 0);
    push_flow(&q, &b1, 2, TIER_STANDARD, 2, 0);
    assert_int_equal(id_of(queue_pop(&q)), 1);
    queue_flow_started(&q, 1);
    assert_false(queue_flow_may_run(&q, 1));
    assert_int_equal(id_of(queue_peek(&q)), 3);
    assert_int_equal(id_of(queue_pop(&q)), 3);
    assert_null(queue_pop(&q)); /* a2 waits for its flow's slot */
    assert_int_equal(q.count, 1);
    queue_flow_finished(&q, 1);
    assert_int_equal(id_of(queue_pop(&q)), 2);
    queue_dispose(&q);
}

/* A flow's own bound: -EDQUOT, and nobody is displaced for it. */
static void test_flow_queue_cap(void **state)
{
    struct item a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, 1);
    push_flow(&q, &a, 1, TIER_BATCH, 0, 0);
    push_flow(&q, &b, 1, TIER_CRITICAL, 0, -EDQUOT);
    push_flow(&q, &c, 0, TIER_BATCH, 0, 0); /* other flows are not bound by it */
    assert_int_equal(q.count, 2);
    queue_dispose(&q);
}

/* An item put back after a failed connect goes first in its flow, and its
 * flow takes the next turn. */
static void test_push_front_with_flows(void **state)
{
    struct item a1 = {.id = 1}, a2 = {.id = 2}, b1 = {.id = 3};
    struct queue q;
    queue_init(&q, 10, 1000, NULL);
    queue_flow_set(&q, 1, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    queue_flow_set(&q, 2, 1, QUEUE_NO_CAP, QUEUE_NO_CAP);
    push_flow(&q, &a1, 1, TIER_STANDARD, 0, 0);
    push_flow(&q, &b1, 2, TIER_STANDARD, 1, 0);
    struct queue_item *it = queue_pop(&q);
    assert_int_equal(id_of(it), 1);
    push_flow(&q, &a2, 1, TIER_STANDARD, 2, 0);
    queue_push_front(&q, it);
    assert_int_equal(id_of(queue_pop(&q)), 1);
    assert_int_equal(id_of(queue_pop(&q)), 3);
    assert_int_equal(id_of(queue_pop(&q)), 2);
    queue_dispose(&q);
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
        cmocka_unit_test(test_critical_at_global_bound_displaces_other_queues_batch),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_push_front_keeps_place),
        cmocka_unit_test(test_round_robin_across_flows),
        cmocka_unit_test(test_weighted_turns),
        cmocka_unit_test(test_a_new_weight_applies_to_what_waits),
        cmocka_unit_test(test_flows_keep_aging_across_tiers),
        cmocka_unit_test(test_deadlines_across_flows),
        cmocka_unit_test(test_displacement_takes_from_the_longest_batch_flow),
        cmocka_unit_test(test_running_cap_skips_the_flow),
        cmocka_unit_test(test_flow_queue_cap),
        cmocka_unit_test(test_push_front_with_flows),
        cmocka_unit_test(test_stamped_item_pushed_front_keeps_its_deadline),
        cmocka_unit_test(test_remove_from_middle),
        cmocka_unit_test(test_waiting_at_a_tenant_cap_is_not_demand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

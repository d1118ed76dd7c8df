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
    struct wp_model m = {.name = name,
                         .tier = t,
                         .slices = slices,
                         .current = cur,
                         .desired = want,
                         .idle = idle,
                         .value = value};
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

/* Live demand evicts an idle warm replica of its own tier worth less than
 * it at once; one worth more only once it has waited past its tier's
 * patience (10 s for standard, 15 min for batch): a warm replica blocks
 * live demand of its tier for a while, never for good. */
static void test_equal_tier_eviction_by_value_then_by_patience(void **state)
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
        M("warm-high", TIER_STANDARD, 2, 1, 0, true, 80),
        M("new", TIER_STANDARD, 2, 0, 1, false, 5),
    };
    q[1].waited_ms = 9999;
    warmpool_plan(q, 2, 2, 2, &p);
    assert_int_equal(q[1].target, 0); /* denied: the warm one is worth more */
    assert_int_equal(q[0].target, 1);
    q[1].waited_ms = 10000;
    q[0].target = q[1].target = 0;
    warmpool_plan(q, 2, 2, 2, &p);
    assert_int_equal(q[1].target, 1); /* waited long enough */
    assert_int_equal(q[0].target, 0);
    assert_int_equal(count(&p, WP_EVICT, 0), 1);
    /* Of two warm ones of its tier, the one worth less goes. */
    struct wp_model r[] = {
        M("warm-high", TIER_BATCH, 2, 1, 0, true, 80),
        M("warm-low", TIER_BATCH, 2, 1, 0, true, 30),
        M("new", TIER_BATCH, 2, 0, 1, false, 5),
    };
    r[2].waited_ms = 900000;
    warmpool_plan(r, 3, 4, 4, &p);
    assert_int_equal(r[2].target, 1);
    assert_int_equal(r[0].target, 1);
    assert_int_equal(r[1].target, 0);
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

/* ---- per node ---------------------------------------------------------- */

#define GPU 0

static struct wp_node N(const char *name, uint64_t gpus) {
    struct wp_node n = {.name = name, .alloc = {gpus}};
    return n;
}

/* A model placed per node: req nvidia.com/gpu = slices. */
static void
place(struct wp_model *m, unsigned *on_node, size_t n_nodes, const unsigned *counts)
{
    m->req[GPU] = m->slices;
    m->on_node = on_node;
    for (size_t k = 0; k < n_nodes; k++) {
        on_node[k] = counts[k];
    }
}

static struct wp_cluster C(struct wp_node *nodes, size_t n) {
    struct wp_cluster c = {.n_res = 1, .res = {"nvidia.com/gpu"}, .nodes = nodes, .n_nodes = n};
    return c;
}

static void
test_two_nodes_one_free_each_do_not_fit_two_slices(void **state)
{
    /* Two nodes of 2, each with one slice held by a busy critical model: 2
     * slices are free in all, but no node has 2. */
    struct wp_node nodes[] = {N("a", 2), N("b", 2)};
    struct wp_model m[] = {
        M("busy", TIER_CRITICAL, 1, 2, 2, false, 1),
        M("big", TIER_STANDARD, 2, 0, 1, false, 1),
    };
    unsigned on0[2], on1[2];
    place(&m[0], on0, 2, (unsigned[]){1, 1});
    place(&m[1], on1, 2, (unsigned[]){0, 0});
    struct wp_cluster c = C(nodes, 2);
    struct wp_plan p;
    warmpool_plan_cluster(m, 2, &c, 0, &p);
    assert_int_equal(m[1].target, 0);
    assert_int_equal(count(&p, WP_DENY, 1), 1);
    assert_true(p.per_node);

    /* The same free slices as one capacity: admitted (what one number says). */
    struct wp_model q[] = {
        M("busy", TIER_CRITICAL, 1, 2, 2, false, 1),
        M("big", TIER_STANDARD, 2, 0, 1, false, 1),
    };
    warmpool_plan(q, 2, 4, 0, &p);
    assert_int_equal(q[1].target, 1);

    /* A node with room: admitted there. */
    struct wp_node three[] = {N("a", 2), N("b", 2), N("c", 2)};
    unsigned on2[3], on3[3];
    place(&m[0], on2, 3, (unsigned[]){1, 1, 0});
    place(&m[1], on3, 3, (unsigned[]){0, 0, 0});
    c = C(three, 3);
    warmpool_plan_cluster(m, 2, &c, 0, &p);
    assert_int_equal(m[1].target, 1);
    assert_int_equal(on3[2], 1);
    assert_int_equal(three[2].used[GPU], 2);
}

static void test_eviction_frees_the_node_where_the_replica_fits(void **state)
{
    /* a: warm w-a (worth more). b: warm w-b (worth less) beside a busy
     * model. Evicting w-b (first by value) would leave b one slice short;
     * only evicting w-a makes room for the 2-slice critical replica. */
    struct wp_node nodes[] = {N("a", 2), N("b", 2)};
    struct wp_model m[] = {
        M("w-a", TIER_BATCH, 1, 1, 0, true, 5),
        M("w-b", TIER_BATCH, 1, 1, 0, true, 1),
        M("busy", TIER_CRITICAL, 1, 1, 1, false, 1),
        M("big", TIER_CRITICAL, 2, 0, 1, false, 0),
    };
    unsigned on[4][2];
    place(&m[0], on[0], 2, (unsigned[]){1, 0});
    place(&m[1], on[1], 2, (unsigned[]){0, 1});
    place(&m[2], on[2], 2, (unsigned[]){0, 1});
    place(&m[3], on[3], 2, (unsigned[]){0, 0});
    struct wp_cluster c = C(nodes, 2);
    struct wp_plan p;
    warmpool_plan_cluster(m, 4, &c, 4, &p);
    assert_int_equal(m[3].target, 1);
    assert_int_equal(on[3][0], 1);    /* on node a */
    assert_int_equal(m[0].target, 0); /* w-a evicted */
    assert_int_equal(m[1].target, 1); /* w-b kept: its going would not help */
    assert_int_equal(count(&p, WP_EVICT, 0), 1);
    assert_int_equal(count(&p, WP_EVICT, 1), 0);
    for (size_t i = 0; i < p.n; i++) {
        if (p.d[i].action == WP_EVICT) {
            assert_int_equal(p.d[i].node, 0);
            assert_int_equal(p.d[i].by, 3);
        }
    }
    assert_int_equal(nodes[0].used[GPU], 2);
    assert_int_equal(nodes[1].used[GPU], 2);
}

static void test_no_victims_taken_when_no_node_can_fit(void **state)
{
    /* Evicting both warm replicas would free a slice on each node: still no
     * node with 2, so nothing is evicted for nothing. */
    struct wp_node nodes[] = {N("a", 2), N("b", 2)};
    struct wp_model m[] = {
        M("w-a", TIER_BATCH, 1, 1, 0, true, 1),
        M("w-b", TIER_BATCH, 1, 1, 0, true, 1),
        M("busy", TIER_CRITICAL, 1, 2, 2, false, 1),
        M("big", TIER_CRITICAL, 2, 0, 1, false, 0),
    };
    unsigned on[4][2];
    place(&m[0], on[0], 2, (unsigned[]){1, 0});
    place(&m[1], on[1], 2, (unsigned[]){0, 1});
    place(&m[2], on[2], 2, (unsigned[]){1, 1});
    place(&m[3], on[3], 2, (unsigned[]){0, 0});
    struct wp_cluster c = C(nodes, 2);
    struct wp_plan p;
    warmpool_plan_cluster(m, 4, &c, 4, &p);
    assert_int_equal(m[3].target, 0);
    assert_int_equal(m[0].target, 1);
    assert_int_equal(m[1].target, 1);
    assert_int_equal(count(&p, WP_EVICT, 0) + count(&p, WP_EVICT, 1), 0);
    assert_int_equal(count(&p, WP_DENY, 3), 1);
}

static void test_ineligible_nodes_are_not_used(void **state)
{
    /* Node a is empty but the model may not go there (cordoned, or a taint
     * it does not tolerate: the backend says which nodes are eligible). */
    struct wp_node nodes[] = {N("a", 4), N("b", 2)};
    struct wp_model m[] = {
        M("w-b", TIER_BATCH, 2, 1, 0, true, 1),
        M("new", TIER_STANDARD, 2, 0, 1, false, 1),
    };
    unsigned on[2][2];
    place(&m[0], on[0], 2, (unsigned[]){0, 1});
    place(&m[1], on[1], 2, (unsigned[]){0, 0});
    bool only_b[] = {false, true};
    m[1].eligible = only_b;
    struct wp_cluster c = C(nodes, 2);
    struct wp_plan p;
    warmpool_plan_cluster(m, 2, &c, 2, &p);
    assert_int_equal(m[1].target, 1);
    assert_int_equal(on[1][1], 1); /* on b, after evicting w-b there */
    assert_int_equal(on[1][0], 0);
    assert_int_equal(count(&p, WP_EVICT, 0), 1);

    /* Eligible nowhere: denied, nothing evicted. */
    struct wp_model q[] = {
        M("w-b", TIER_BATCH, 2, 1, 0, true, 1),
        M("new", TIER_STANDARD, 2, 0, 1, false, 1),
    };
    place(&q[0], on[0], 2, (unsigned[]){0, 1});
    place(&q[1], on[1], 2, (unsigned[]){0, 0});
    bool none[] = {false, false};
    q[1].eligible = none;
    warmpool_plan_cluster(q, 2, &c, 2, &p);
    assert_int_equal(q[1].target, 0);
    assert_int_equal(q[0].target, 1);
    assert_int_equal(count(&p, WP_DENY, 1), 1);
}

static void test_unplaced_replicas_wait_for_a_node_and_make_room(void **state)
{
    /* The cluster already has the critical model's pod (scaled from zero by
     * a request) but no node for it: the warm batch replica on the only node
     * goes, and the model's target stays. */
    struct wp_node nodes[] = {N("a", 2)};
    struct wp_model m[] = {
        M("warm", TIER_BATCH, 1, 1, 0, true, 1),
        M("batch-busy", TIER_BATCH, 1, 1, 1, false, 1),
        M("crit", TIER_CRITICAL, 2, 1, 1, false, 0),
    };
    unsigned on[3][1];
    place(&m[0], on[0], 1, (unsigned[]){1});
    place(&m[1], on[1], 1, (unsigned[]){1});
    place(&m[2], on[2], 1, (unsigned[]){0}); /* pending */
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 3, &c, 2, &p);
    assert_int_equal(m[2].target, 1);
    assert_int_equal(on[2][0], 1);
    assert_int_equal(m[0].target, 0); /* evicted */
    assert_int_equal(m[1].target, 0); /* and batch preempted (min 0) */
    assert_int_equal(count(&p, WP_EVICT, 0), 1);
    assert_int_equal(count(&p, WP_PREEMPT, 1), 1);
    assert_int_equal(count(&p, WP_ADMIT, 2), 0); /* not a new replica */
}

static void test_several_resources_fit_on_one_node(void **state)
{
    /* MIG profiles: a replica asks one 1g.10gb and nothing else; node a has
     * whole GPUs only, node b has the profile. */
    struct wp_node nodes[] = {{.name = "a", .alloc = {4, 0}}, {.name = "b", .alloc = {0, 7}}};
    struct wp_model m[] = {M("mig", TIER_STANDARD, 1, 0, 2, false, 1)};
    unsigned on[2] = {0, 0};
    m[0].req[1] = 1;
    m[0].on_node = on;
    struct wp_cluster c = {.n_res = 2,
                           .res = {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"},
                           .nodes = nodes,
                           .n_nodes = 2};
    struct wp_plan p;
    warmpool_plan_cluster(m, 1, &c, 0, &p);
    assert_int_equal(m[0].target, 2);
    assert_int_equal(on[1], 2);
    assert_int_equal(nodes[1].used[1], 2);
    assert_int_equal(nodes[0].used[0], 0);
}

static void test_cap_applies_on_top_of_nodes(void **state)
{
    struct wp_node nodes[] = {N("a", 8)};
    struct wp_model m[] = {M("a", TIER_STANDARD, 2, 0, 4, false, 1)};
    unsigned on[1];
    place(&m[0], on, 1, (unsigned[]){0});
    struct wp_cluster c = C(nodes, 1);
    c.cap_slices = 5;
    struct wp_plan p;
    warmpool_plan_cluster(m, 1, &c, 0, &p);
    assert_int_equal(m[0].target, 2);
    assert_int_equal(count(&p, WP_DENY, 0), 2);
}

/* A model at zero with demand forecast gets a replica from the warm budget
 * where there is room, after live demand, and never by evicting. */
static void test_prewarm_from_zero_takes_only_free_room(void **state)
{
    struct wp_model m[] = {
        M("live", TIER_BATCH, 2, 0, 1, false, 1),
        M("forecast-a", TIER_CRITICAL, 1, 0, 0, true, 5),
        M("forecast-b", TIER_STANDARD, 1, 0, 0, true, 5),
        M("idle-warm", TIER_BATCH, 1, 1, 0, true, 0),
    };
    m[1].prewarm = m[2].prewarm = true;
    struct wp_plan p;
    /* 4 slices: live demand takes 2, idle-warm holds 1, one is free */
    warmpool_plan(m, 4, 4, 3, &p);
    assert_int_equal(m[0].target, 1);
    assert_int_equal(m[1].target, 1); /* the critical one gets the free slice */
    assert_int_equal(count(&p, WP_PREWARM, 1), 1);
    assert_int_equal(m[2].target, 0); /* no room left: nothing is evicted for it */
    assert_int_equal(count(&p, WP_EVICT, 3), 0);
}

/* Forecast models take the warm budget before others; a known-quiet one is
 * not kept warm even when the budget has room. */
static void test_forecast_orders_the_warm_budget(void **state)
{
    struct wp_model m[] = {
        M("valuable", TIER_STANDARD, 1, 1, 0, true, 100),
        M("forecast", TIER_STANDARD, 1, 1, 0, true, 1),
        M("quiet", TIER_CRITICAL, 1, 1, 0, true, 1000),
    };
    m[1].prewarm = true;
    m[2].quiet = true;
    struct wp_plan p;
    warmpool_plan(m, 3, 8, 1, &p); /* budget: one idle slice */
    assert_int_equal(m[1].target, 1);
    assert_int_equal(count(&p, WP_PREWARM, 1), 1);
    assert_int_equal(m[0].target, 0); /* worth more, but no demand forecast */
    warmpool_plan(m, 3, 8, 8, &p);  /* ample budget */
    assert_int_equal(m[0].target, 1);
    assert_int_equal(m[2].target, 0); /* quiet: its replica goes */
    assert_int_equal(count(&p, WP_TO_ZERO, 2), 1);
}

/* ---- GPU memory ------------------------------------------------------- */

#define GiB (1024ull * 1024 * 1024)

static void test_memory_packs_by_first_fit_decreasing(void **state)
{
    uint64_t two[] = {30 * GiB, 30 * GiB};
    assert_true(wp_memory_packs(two, 2, 1, 80 * GiB)); /* two 30 GiB on one 80 GiB GPU */
    uint64_t three[] = {30 * GiB, 30 * GiB, 30 * GiB};
    assert_false(wp_memory_packs(three, 3, 1, 80 * GiB)); /* a third does not */
    uint64_t pair[] = {30 * GiB, 30 * GiB};
    assert_true(wp_memory_packs(pair, 2, 2, 40 * GiB)); /* one per 40 GiB GPU */
    uint64_t big[] = {50 * GiB};
    assert_false(wp_memory_packs(big, 1, 2, 40 * GiB)); /* 80 GiB in all, 40 on each */
    uint64_t spread[] = {10 * GiB, 30 * GiB, 20 * GiB, 20 * GiB};
    assert_true(wp_memory_packs(spread, 4, 2, 40 * GiB)); /* 30+10, 20+20 */
    uint64_t any[] = {500 * GiB, 0};
    assert_true(wp_memory_packs(any, 2, 1, 0)); /* memory unknown: not limited */
}

/* A node of `gpus` GPUs of mem bytes each, with 8 time-sliced replicas. */
static struct wp_node NM(const char *name, unsigned gpus, uint64_t mem)
{
    struct wp_node n = {.name = name, .alloc = {8}, .gpus = gpus, .gpu_memory = mem};
    return n;
}

static void test_memory_bound_gpu_refuses_a_third_replica(void **state)
{
    /* One 80 GiB GPU, slices to spare: two 30 GiB models run there, a third
     * is denied; on a second node of two 40 GiB GPUs it is admitted, and a
     * 50 GiB one is admitted on neither. */
    struct wp_node one[] = {NM("a", 1, 80 * GiB)};
    struct wp_model m[] = {
        M("m1", TIER_STANDARD, 1, 1, 1, false, 1),
        M("m2", TIER_STANDARD, 1, 1, 1, false, 1),
        M("m3", TIER_STANDARD, 1, 0, 1, false, 1),
    };
    unsigned on[3][2];
    for (size_t i = 0; i < 3; i++) {
        m[i].gpu_memory = 30 * GiB;
        place(&m[i], on[i], 1, (unsigned[]){i < 2 ? 1 : 0});
    }
    struct wp_cluster c = C(one, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 3, &c, 0, &p);
    assert_int_equal(m[2].target, 0);
    assert_int_equal(count(&p, WP_DENY, 2), 1);

    struct wp_node two[] = {NM("a", 1, 80 * GiB), NM("b", 2, 40 * GiB)};
    for (size_t i = 0; i < 3; i++) {
        place(&m[i], on[i], 2, (unsigned[]){i < 2 ? 1 : 0, 0});
        m[i].current = i < 2 ? 1 : 0;
    }
    c = C(two, 2);
    warmpool_plan_cluster(m, 3, &c, 0, &p);
    assert_int_equal(m[2].target, 1);
    assert_int_equal(on[2][1], 1); /* on node b */

    m[2].gpu_memory = 50 * GiB;
    for (size_t i = 0; i < 3; i++) {
        place(&m[i], on[i], 2, (unsigned[]){i < 2 ? 1 : 0, 0});
    }
    m[2].current = 0;
    warmpool_plan_cluster(m, 3, &c, 0, &p);
    assert_int_equal(m[2].target, 0); /* fits no single 40 GiB GPU; node a has 20 left */
}

static void test_memory_eviction_only_when_it_makes_room(void **state)
{
    /* One 80 GiB GPU: a warm idle batch 10 GiB replica and a busy critical
     * 60 GiB one. A critical 30 GiB model wakes: evicting the 10 GiB replica
     * would leave 20 GiB, not 30, so nothing is evicted and it is denied.
     * With a warm 20 GiB replica beside a 50 GiB one instead, evicting it
     * leaves 30 GiB: it goes and the newcomer is admitted. */
    struct wp_node nodes[] = {NM("a", 1, 80 * GiB)};
    struct wp_model m[] = {
        M("warm", TIER_BATCH, 1, 1, 0, true, 1),
        M("busy", TIER_CRITICAL, 1, 1, 1, false, 1),
        M("new", TIER_CRITICAL, 1, 0, 1, false, 1),
    };
    uint64_t mem[] = {10 * GiB, 60 * GiB, 30 * GiB};
    unsigned on[3][1];
    for (size_t i = 0; i < 3; i++) {
        m[i].gpu_memory = mem[i];
        place(&m[i], on[i], 1, (unsigned[]){i < 2 ? 1 : 0});
    }
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 3, &c, 4, &p);
    assert_int_equal(m[2].target, 0);
    assert_int_equal(count(&p, WP_EVICT, 0), 0);
    assert_int_equal(m[0].target, 1);

    m[0].gpu_memory = 20 * GiB;
    m[1].gpu_memory = 50 * GiB;
    for (size_t i = 0; i < 3; i++) {
        m[i].current = i < 2 ? 1 : 0;
        place(&m[i], on[i], 1, (unsigned[]){i < 2 ? 1 : 0});
    }
    warmpool_plan_cluster(m, 3, &c, 4, &p);
    assert_int_equal(m[2].target, 1);
    assert_int_equal(count(&p, WP_EVICT, 0), 1);
    assert_int_equal(m[0].target, 0);
}

static void test_memory_eviction_takes_only_what_is_needed(void **state)
{
    /* One 80 GiB GPU: warm idle 10 GiB (worth least) and 30 GiB (worth
     * more) batch replicas beside a busy 30 GiB one. A 30 GiB critical
     * model: the 10 GiB replica goes first but is not enough; the 30 GiB
     * one's release alone is, so the 10 GiB replica stays. */
    struct wp_node nodes[] = {NM("a", 1, 80 * GiB)};
    struct wp_model m[] = {
        M("small", TIER_BATCH, 1, 1, 0, true, 1),
        M("large", TIER_BATCH, 1, 1, 0, true, 5),
        M("busy", TIER_CRITICAL, 1, 1, 1, false, 1),
        M("new", TIER_CRITICAL, 1, 0, 1, false, 1),
    };
    uint64_t mem[] = {10 * GiB, 30 * GiB, 30 * GiB, 30 * GiB};
    unsigned on[4][1];
    for (size_t i = 0; i < 4; i++) {
        m[i].gpu_memory = mem[i];
        place(&m[i], on[i], 1, (unsigned[]){i < 3 ? 1 : 0});
    }
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 4, &c, 4, &p);
    assert_int_equal(m[3].target, 1);
    assert_int_equal(count(&p, WP_EVICT, 1), 1);
    assert_int_equal(count(&p, WP_EVICT, 0), 0);
    assert_int_equal(m[0].target, 1);
}

static void test_sleep_mode_memory_counts_only_what_cannot_sleep(void **state)
{
    /* One 24 GiB GPU holding an awake 14 GiB replica of a sleep-mode model
     * (its memory is the node's `held`, not counted per replica). A standard
     * 14 GiB model wakes: admitted while the held replica could be put to
     * sleep for it (idle, standard or lower); denied while it is busy, or
     * idle but critical. The sleep-mode model itself is never evicted for
     * memory: sleep frees it. */
    struct wp_held held = {14 * GiB, TIER_STANDARD, true};
    struct wp_node nodes[] = {NM("a", 1, 24 * GiB)};
    nodes[0].held = &held;
    nodes[0].n_held = 1;
    struct wp_model m[] = {
        M("sleepy", TIER_STANDARD, 1, 1, 0, true, 1),
        M("new", TIER_STANDARD, 1, 0, 1, false, 1),
    };
    unsigned on[2][1];
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    struct {
        enum tier tier;
        bool sleepable;
        unsigned admitted;
    } cases[] = {
        {TIER_STANDARD, true, 1},
        {TIER_BATCH, true, 1},
        {TIER_STANDARD, false, 0},
        {TIER_CRITICAL, true, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        held.tier = cases[k].tier;
        held.sleepable = cases[k].sleepable;
        for (size_t i = 0; i < 2; i++) {
            m[i].gpu_memory = 14 * GiB;
            m[i].current = i == 0 ? 1 : 0;
            place(&m[i], on[i], 1, (unsigned[]){i == 0 ? 1 : 0});
        }
        m[0].memory_sleeps = true;
        warmpool_plan_cluster(m, 2, &c, 4, &p);
        assert_int_equal(m[1].target, cases[k].admitted);
        assert_int_equal(m[0].target, 1);
        assert_int_equal(count(&p, WP_EVICT, 0), 0);
    }
}

static void test_busy_lower_tier_sleep_mode_replica_is_preempted_for_memory(void **state)
{
    /* One 24 GiB GPU: a busy batch replica of a sleep-mode model holds 14
     * GiB (the node's held, naming its model). A critical 14 GiB model
     * wakes: the batch one is preempted, its held memory going with it, as
     * a replica without sleep mode would be. A batch newcomer (same tier)
     * preempts nothing; nor does a critical one when the node does not say
     * whose the held memory is. */
    struct wp_held held = {14 * GiB, TIER_BATCH, false};
    size_t whose = 0;
    struct wp_node nodes[] = {NM("a", 1, 24 * GiB)};
    nodes[0].held = &held;
    nodes[0].n_held = 1;
    struct {
        enum tier tier;
        const size_t *held_model;
        unsigned preempted;
    } cases[] = {
        {TIER_CRITICAL, &whose, 1},
        {TIER_BATCH, &whose, 0},
        {TIER_CRITICAL, NULL, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct wp_model m[] = {
            M("sleepy", TIER_BATCH, 1, 1, 1, false, 1),
            M("new", cases[k].tier, 1, 0, 1, false, 1),
        };
        unsigned on[2][1];
        for (size_t i = 0; i < 2; i++) {
            m[i].gpu_memory = 14 * GiB;
            place(&m[i], on[i], 1, (unsigned[]){i == 0 ? 1 : 0});
        }
        m[0].memory_sleeps = true;
        nodes[0].held_model = cases[k].held_model;
        struct wp_cluster c = C(nodes, 1);
        struct wp_plan p;
        warmpool_plan_cluster(m, 2, &c, 4, &p);
        assert_int_equal(count(&p, WP_PREEMPT, 0), cases[k].preempted);
        assert_int_equal(m[1].target, cases[k].preempted);
        assert_int_equal(m[0].target, 1 - cases[k].preempted);
    }
}

static void test_sleep_mode_newcomer_preempts_lower_tier_memory(void **state)
{
    /* A critical sleep-mode model wakes from zero on a 24 GiB GPU whose 14
     * GiB an idle batch replica without sleep mode holds (within its idle
     * timeout: not warm): its memory counts like any model's, so the batch
     * replica is preempted rather than the critical one waiting. */
    struct wp_node nodes[] = {NM("a", 1, 24 * GiB)};
    struct wp_model m[] = {
        M("batch", TIER_BATCH, 1, 1, 1, true, 1),
        M("crit", TIER_CRITICAL, 1, 0, 1, false, 1),
    };
    unsigned on[2][1];
    for (size_t i = 0; i < 2; i++) {
        m[i].gpu_memory = 14 * GiB;
        place(&m[i], on[i], 1, (unsigned[]){i == 0 ? 1 : 0});
    }
    m[1].memory_sleeps = true;
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 2, &c, 4, &p);
    assert_int_equal(m[1].target, 1);
    assert_int_equal(count(&p, WP_PREEMPT, 0), 1);
    assert_int_equal(m[0].target, 0);
}

static void test_sleep_mode_replicas_placed_in_one_plan_count(void **state)
{
    /* One 24 GiB GPU, nothing awake. Two sleep-mode models of 14 GiB wake
     * from zero in the same plan: only one is admitted (the other's pod would
     * start beside it, and a starting pod cannot be put to sleep). */
    struct wp_node nodes[] = {NM("a", 1, 24 * GiB)};
    struct wp_model m[] = {
        M("one", TIER_STANDARD, 1, 0, 1, false, 2),
        M("two", TIER_STANDARD, 1, 0, 1, false, 1),
    };
    unsigned on[2][1];
    for (size_t i = 0; i < 2; i++) {
        m[i].gpu_memory = 14 * GiB;
        m[i].memory_sleeps = true;
        place(&m[i], on[i], 1, (unsigned[]){0});
    }
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 2, &c, 4, &p);
    assert_int_equal(m[0].target + m[1].target, 1);
}

static void test_prewarm_does_not_count_a_sleepable_pod_as_free(void **state)
{
    /* An idle awake sleep-mode pod fills the 24 GiB GPU: live demand could
     * have it put to sleep, a prewarm (free room only) may not. */
    struct wp_held held = {14 * GiB, TIER_BATCH, true};
    struct wp_node nodes[] = {NM("a", 1, 24 * GiB)};
    nodes[0].held = &held;
    nodes[0].n_held = 1;
    struct wp_model m[] = {M("pre", TIER_STANDARD, 1, 0, 0, true, 1)};
    unsigned on[1][1];
    m[0].gpu_memory = 14 * GiB;
    m[0].prewarm = true;
    place(&m[0], on[0], 1, (unsigned[]){0});
    struct wp_cluster c = C(nodes, 1);
    struct wp_plan p;
    warmpool_plan_cluster(m, 1, &c, 4, &p);
    assert_int_equal(m[0].target, 0);
    held.memory = 8 * GiB; /* room for it beside the pod: prewarmed */
    place(&m[0], on[0], 1, (unsigned[]){0});
    warmpool_plan_cluster(m, 1, &c, 4, &p);
    assert_int_equal(m[0].target, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warm_budget_by_priority_then_value),
        cmocka_unit_test(test_min_replicas_always_kept),
        cmocka_unit_test(test_critical_evicts_idle_batch_and_is_admitted),
        cmocka_unit_test(test_preempts_only_strictly_lower_priority),
        cmocka_unit_test(test_equal_tier_eviction_by_value_then_by_patience),
        cmocka_unit_test(test_partial_admission_and_no_gpu_models),
        cmocka_unit_test(test_unlimited_capacity),
        cmocka_unit_test(test_two_nodes_one_free_each_do_not_fit_two_slices),
        cmocka_unit_test(test_eviction_frees_the_node_where_the_replica_fits),
        cmocka_unit_test(test_no_victims_taken_when_no_node_can_fit),
        cmocka_unit_test(test_ineligible_nodes_are_not_used),
        cmocka_unit_test(test_unplaced_replicas_wait_for_a_node_and_make_room),
        cmocka_unit_test(test_several_resources_fit_on_one_node),
        cmocka_unit_test(test_cap_applies_on_top_of_nodes),
        cmocka_unit_test(test_prewarm_from_zero_takes_only_free_room),
        cmocka_unit_test(test_forecast_orders_the_warm_budget),
        cmocka_unit_test(test_memory_packs_by_first_fit_decreasing),
        cmocka_unit_test(test_sleep_mode_memory_counts_only_what_cannot_sleep),
        cmocka_unit_test(test_busy_lower_tier_sleep_mode_replica_is_preempted_for_memory),
        cmocka_unit_test(test_sleep_mode_newcomer_preempts_lower_tier_memory),
        cmocka_unit_test(test_sleep_mode_replicas_placed_in_one_plan_count),
        cmocka_unit_test(test_prewarm_does_not_count_a_sleepable_pod_as_free),
        cmocka_unit_test(test_memory_bound_gpu_refuses_a_third_replica),
        cmocka_unit_test(test_memory_eviction_only_when_it_makes_room),
        cmocka_unit_test(test_memory_eviction_takes_only_what_is_needed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

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

/* A backend that knows nodes: two nodes with one free slice each and a
 * model whose replica needs two. The driver plans per node (denied), where
 * one number (the slices summed) would have admitted it. */
struct two_nodes {
    struct scaler_model sm;
    struct model m;
    struct wp_node nodes[2];
    bool eligible[2];
    unsigned on_node[2];
    unsigned total_slices; /* what gpu_slices would say */
    bool per_node;
};

static size_t tn_count(void *ud)
{
    return 1;
}

static size_t tn_collect(void *ud, uint64_t now_ms, struct scaler_model **sms, size_t max)
{
    struct two_nodes *tn = ud;
    tn->sm.current = 0;
    tn->sm.ready = 0;
    sms[0] = &tn->sm;
    return 1;
}

static unsigned tn_gpus(void *ud)
{
    return ((struct two_nodes *)ud)->total_slices;
}

static void tn_apply(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms) {}

static bool tn_nodes(void *ud, struct scaler_model **sms, size_t n, struct wp_cluster *c)
{
    struct two_nodes *tn = ud;
    if (!tn->per_node) {
        return false;
    }
    for (size_t k = 0; k < 2; k++) {
        tn->nodes[k] = (struct wp_node){.name = k ? "b" : "a", .alloc = {1}};
        tn->eligible[k] = true;
        tn->on_node[k] = 0;
    }
    memset(sms[0]->req, 0, sizeof sms[0]->req);
    sms[0]->req[0] = 2;
    sms[0]->eligible = tn->eligible;
    sms[0]->on_node = tn->on_node;
    c->n_res = 1;
    c->res[0] = "nvidia.com/gpu";
    c->nodes = tn->nodes;
    c->n_nodes = 2;
    return true;
}

static const struct scale_driver_ops tn_ops = {tn_count, tn_collect, tn_gpus, tn_apply, tn_nodes};

static void test_nodes_hook_plans_per_node(void **state)
{
    struct config *cfg = config_new_default();
    assert_non_null(cfg);
    struct two_nodes tn;
    memset(&tn, 0, sizeof tn);
    tn.m.name = "big";
    tn.m.set.max_concurrency = 1;
    scaler_model_init(&tn.sm, &tn.m, cfg, 1, 0, 0, 4, 60000, 2);
    tn.total_slices = 2;
    struct scale_driver d;
    scale_driver_init(&d, &tn_ops, &tn);
    uint64_t now = clock_now_ms();
    for (int i = 0; i < 3; i++) {
        as_record(&tn.sm.ass, now, 1); /* one request waits: one replica wanted */
    }
    tn.per_node = true;
    scale_driver_plan(&d, cfg);
    assert_int_equal(tn.sm.target, 0);
    assert_string_equal(tn.sm.last_action, "deny");
    /* Without nodes, the summed slices admit it. */
    tn.per_node = false;
    scale_driver_plan(&d, cfg);
    assert_int_equal(tn.sm.target, 1);
    config_free(cfg);
}

/* A tenant at its own concurrency cap: its waiting requests cannot start
 * whatever the replica count, so they are not demand. 2 running (the
 * tenant's cap), 6 more waiting, 1 request per replica: 2 replicas, not 8. */
static void test_requests_held_by_a_tenant_cap_are_not_demand(void **state)
{
    struct config *cfg = config_new_default();
    assert_non_null(cfg);
    struct model m;
    memset(&m, 0, sizeof m);
    m.name = "llama";
    m.set.max_concurrency = 1;
    struct queue_global g = {.max_total = 100};
    queue_init(&m.queue, 50, 10000, &g);
    queue_flow_set(&m.queue, 1, 1, 2, QUEUE_NO_CAP);
    queue_flow_started(&m.queue, 1);
    queue_flow_started(&m.queue, 1);
    m.inflight = 2;
    struct queue_item items[6];
    struct queue_item *displaced = NULL;
    for (int i = 0; i < 6; i++) {
        queue_push_flow(&m.queue, &items[i], 1, TIER_STANDARD, 0, 100000, &displaced);
    }
    struct scaler_model sm;
    scaler_model_init(&sm, &m, cfg, 1, 0, 0, 16, 60000, 1);
    uint64_t now = clock_now_ms();
    for (int i = 0; i < 3; i++) {
        scaler_record(&sm, now + (uint64_t)i);
    }
    struct as_decision d;
    as_decide(&sm.ass, &sm.asc, now + 3, 2, 2, &d);
    assert_int_equal(d.desired, 2);
    while (queue_pop_any(&m.queue)) {
    }
    queue_dispose(&m.queue);
    config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_cap),
        cmocka_unit_test(test_one_step_and_cadence),
        cmocka_unit_test(test_nodes_hook_plans_per_node),
        cmocka_unit_test(test_requests_held_by_a_tenant_cap_are_not_demand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Fleet and models: replica lifecycle, least-loaded pick, ejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "thaw/clock.h"
#include "thaw/model.h"

static int capacity_calls;

static void on_capacity(void *ud, struct model *m)
{
    capacity_calls++;
}

static struct model *make(struct fleet *f, struct queue_global *g, uint32_t conc)
{
    fleet_init(f, g, 1000);
    f->on_capacity = on_capacity;
    char *eps[] = {"127.0.0.1:1"};
    struct config_model cm = {.name = "m", .namespace_ = "ns", .endpoints = eps, .n_endpoints = 1,
                              .max_concurrency = conc, .max_queue = 10};
    return fleet_add_model(f, &cm);
}

static void test_least_loaded_with_free_slot(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 2);
    capacity_calls = 0;
    assert_int_equal(fleet_replica_ready(&f, m, "a", "127.0.0.1:9001"), 0);
    assert_int_equal(fleet_replica_ready(&f, m, "b", "127.0.0.1:9002"), 0);
    assert_int_equal(fleet_replica_ready(&f, m, "b", "127.0.0.1:9002"), 0); /* idempotent */
    assert_int_equal(m->n_endpoints, 2);
    assert_int_equal(capacity_calls, 2);
    assert_int_equal(model_capacity(m), 4);
    m->endpoints[0]->head_start_until_ms = m->endpoints[1]->head_start_until_ms = 0;
    m->endpoints[0]->inflight = 1;
    assert_string_equal(model_pick_endpoint(m, 0)->id, "b");
    m->endpoints[1]->inflight = 2; /* full */
    assert_string_equal(model_pick_endpoint(m, 0)->id, "a");
    m->endpoints[0]->inflight = 2;
    assert_null(model_pick_endpoint(m, 0));
    m->endpoints[0]->inflight = m->endpoints[1]->inflight = 0;
    fleet_dispose(&f);
}

static void test_share_limits_this_activators_slots(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 3);
    /* Another activator holds the rest of each replica's 3 slots. */
    assert_int_equal(fleet_replica_ready_with(&f, m, "a", "127.0.0.1:9001", 2, -1), 0);
    assert_int_equal(fleet_replica_ready_with(&f, m, "b", "127.0.0.1:9002", 0, -1), 0);
    assert_int_equal(m->endpoints[0]->share, 2);
    assert_int_equal(model_capacity(m), 2);
    assert_string_equal(model_pick_endpoint(m, 0)->id, "a"); /* b: no share here */
    m->endpoints[0]->inflight = 2;
    assert_null(model_pick_endpoint(m, 0));
    m->endpoints[1]->share = 1;
    assert_string_equal(model_pick_endpoint(m, 0)->id, "b");
    /* A share above max_concurrency is capped by it. */
    m->endpoints[1]->share = 10;
    assert_int_equal(model_capacity(m), 5);
    /* Plain fleet_replica_ready: all the slots. */
    fleet_replica_ready(&f, m, "c", "127.0.0.1:9003");
    assert_int_equal(m->endpoints[2]->share, UINT32_MAX);
    assert_int_equal(model_capacity(m), 8);
    m->endpoints[0]->inflight = 0;
    fleet_dispose(&f);
}

static void test_ejected_skipped_unless_all_are(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 4);
    fleet_replica_ready(&f, m, "a", "127.0.0.1:9001");
    fleet_replica_ready(&f, m, "b", "127.0.0.1:9002");
    m->endpoints[0]->head_start_until_ms = m->endpoints[1]->head_start_until_ms = 0;
    m->endpoints[0]->ejected_until_ms = 1000;
    m->endpoints[1]->inflight = 3;
    assert_string_equal(model_pick_endpoint(m, 500)->id, "b");
    assert_string_equal(model_pick_endpoint(m, 1000)->id, "a"); /* ejection over */
    m->endpoints[1]->ejected_until_ms = 900;
    /* All ejected, replicas that come and go (process, Kubernetes): wait. */
    assert_null(model_pick_endpoint(m, 500));
    assert_int_equal(model_next_opening(m, 500), 900);
    /* Fixed replicas (static): the one whose ejection ends first. */
    m->fixed_replicas = true;
    assert_string_equal(model_pick_endpoint(m, 500)->id, "b");
    m->endpoints[1]->inflight = 0;
    fleet_dispose(&f);
}

/* A replica that just became ready takes its first request alone until it
 * answers (upstream clears the head start) or UPSTREAM_HEAD_START_MS pass;
 * another ready replica is not held back. */
static void test_woken_replica_first_request_goes_alone(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 8);
    uint64_t t0 = clock_now_ms();
    fleet_replica_ready(&f, m, "a", "127.0.0.1:9001");
    struct endpoint *a = m->endpoints[0];
    assert_true(a->head_start_until_ms >= t0 + UPSTREAM_HEAD_START_MS);
    uint64_t until = a->head_start_until_ms;
    assert_ptr_equal(model_pick_endpoint(m, t0), a); /* the first request */
    a->inflight = 1;
    assert_null(model_pick_endpoint(m, t0));
    assert_int_equal(model_next_opening(m, t0), until); /* when the rest may go */
    assert_ptr_equal(model_pick_endpoint(m, until), a);
    /* Answered before that: no wait. */
    a->head_start_until_ms = 0;
    assert_ptr_equal(model_pick_endpoint(m, t0), a);
    assert_int_equal(model_next_opening(m, t0), 0);
    /* A second replica in its head start does not hold the first back. */
    a->inflight = 3;
    fleet_replica_ready(&f, m, "b", "127.0.0.1:9002");
    struct endpoint *b = m->endpoints[1];
    assert_ptr_equal(model_pick_endpoint(m, t0), b);
    b->inflight = 1;
    assert_ptr_equal(model_pick_endpoint(m, t0), a);
    a->inflight = b->inflight = 0;
    fleet_dispose(&f);
}

static void test_replica_gone_keeps_referenced_endpoint(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 4);
    fleet_replica_ready(&f, m, "a", "[::1]:9001");
    struct endpoint *ep = m->endpoints[0];
    endpoint_ref(ep); /* as a pooled connection would */
    fleet_replica_gone(&f, m, "a", "test");
    assert_int_equal(m->n_endpoints, 0);
    assert_null(ep->model);
    assert_int_equal(ep->refs, 1);
    assert_string_equal(ep->addr_text, "[::1]:9001");
    endpoint_unref(ep); /* freed here; ASan would report a leak otherwise */
    assert_null(model_pick_endpoint(m, 0));
    fleet_dispose(&f);
}

static void test_bad_address_rejected(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 4);
    assert_int_not_equal(fleet_replica_ready(&f, m, "x", "not-an-ip:80"), 0);
    assert_int_not_equal(fleet_replica_ready(&f, m, "x", "127.0.0.1"), 0);
    assert_int_equal(m->n_endpoints, 0);
    fleet_dispose(&f);
}

static void test_find_and_route(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 4);
    assert_ptr_equal(fleet_find(&f, "ns", "m"), m);
    assert_null(fleet_find(&f, "other", "m"));
    fleet_remove_model(&f, m, "test");
    assert_int_equal(f.n_models, 0);
    assert_null(fleet_find(&f, "ns", "m"));
    fleet_dispose(&f);
}

/* A removed model leaves the fleet and its routes at once and stays valid
 * for whoever still holds a reference (a request at its replica). */
static void test_removed_model_lives_while_referenced(void **state)
{
    struct fleet f;
    struct queue_global g = {.max_total = 100};
    struct model *m = make(&f, &g, 2);
    assert_int_equal(fleet_replica_ready(&f, m, "a", "127.0.0.1:9001"), 0);
    struct endpoint *ep = m->endpoints[0];
    endpoint_ref(ep); /* a request at the replica */
    model_ref(m);     /* the same request's model */
    fleet_remove_model(&f, m, "removed");
    assert_true(m->removed);
    assert_null(m->backend);
    assert_int_equal(m->n_endpoints, 0);
    assert_null(ep->model);
    assert_int_equal(f.n_models, 0);
    assert_null(fleet_find(&f, "ns", "m"));
    assert_string_equal(m->name, "m"); /* still readable */
    model_unref(m);
    endpoint_unref(ep);
    fleet_dispose(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_loaded_with_free_slot),
        cmocka_unit_test(test_share_limits_this_activators_slots),
        cmocka_unit_test(test_ejected_skipped_unless_all_are),
        cmocka_unit_test(test_woken_replica_first_request_goes_alone),
        cmocka_unit_test(test_replica_gone_keeps_referenced_endpoint),
        cmocka_unit_test(test_bad_address_rejected),
        cmocka_unit_test(test_find_and_route),
        cmocka_unit_test(test_removed_model_lives_while_referenced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Models with revisions: the pick per request (split, tag header, sticky
 * header, fallback to a warm revision), and a rollout driven through the
 * revisions' own counters on a fake clock: a step, then a rollback; and a
 * climb to promotion. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/revisions.h"

static struct http_limits lim = {65536, 100, 1 << 20};

static void parse(struct http_head *h, const char *raw)
{
    struct http_parser p;
    http_parser_init(&p, HTTP_REQUEST, &lim);
    http_head_init(h);
    struct buf body;
    buf_init(&body);
    http_parser_next(&p, h, &body);
    size_t used;
    assert_int_equal(http_parser_execute(&p, raw, strlen(raw), &used), HTTP_EV_HEAD);
    buf_dispose(&body);
}

struct world {
    struct fleet f;
    struct queue_global g;
    struct model *m, *v1, *v2;
    struct config_model opts;
};

static struct model *add(struct world *w, const char *name)
{
    struct config_model cm = {
        .name = (char *)name, .namespace_ = "ns", .max_concurrency = 4, .max_queue = 10};
    return fleet_add_model(&w->f, &cm);
}

/* "m" with v1 and v2 at pct[0], pct[1]. */
static void setup_world(struct world *w, uint32_t p1, uint32_t p2)
{
    memset(w, 0, sizeof *w);
    w->g.max_total = 100;
    fleet_init(&w->f, &w->g, 1000);
    w->m = add(w, "m");
    w->v1 = add(w, "m@v1");
    w->v2 = add(w, "m@v2");
    char *names[] = {"v1", "v2"};
    uint32_t pct[] = {p1, p2};
    assert_int_equal(model_revisions_set(w->m, names, pct, 2, &w->opts, 0), 0);
    model_revisions_link(w->m, "v1", w->v1);
    model_revisions_link(w->m, "v2", w->v2);
    assert_ptr_equal(w->v2->parent, w->m);
    assert_string_equal(w->v2->revision, "v2");
}

static struct model *pick(struct world *w, const char *raw, struct model **wake,
                          enum reject_reason *why)
{
    struct http_head h;
    parse(&h, raw);
    struct model *r = model_pick_revision(w->m, &h, NULL, wake, why);
    http_head_dispose(&h);
    return r;
}

#define PLAIN "POST /v1/completions HTTP/1.1\r\nHost: m\r\n\r\n"

static void test_pick_split_tag_and_sticky(void **state)
{
    struct world w;
    setup_world(&w, 90, 10);
    struct model *wake;
    enum reject_reason why = REJECT_COUNT;
    size_t on_v2 = 0;
    for (int i = 0; i < 100; i++) {
        on_v2 += pick(&w, PLAIN, &wake, &why) == w.v2;
        assert_null(wake);
    }
    assert_int_equal(on_v2, 10);
    assert_ptr_equal(
        pick(&w, "GET / HTTP/1.1\r\nHost: m\r\nThaw-Revision: v2\r\n\r\n", &wake, &why), w.v2);
    assert_null(pick(&w, "GET / HTTP/1.1\r\nHost: m\r\nthaw-revision: v3\r\n\r\n", &wake, &why));
    assert_int_equal(why, REJECT_UNKNOWN_REVISION);
    /* Sticky: one key, one revision, whatever the round robin's turn. */
    w.opts.sticky_header = "x-user";
    char *names[] = {"v1", "v2"};
    uint32_t pct[] = {50, 50};
    model_revisions_set(w.m, names, pct, 2, &w.opts, 0);
    struct model *first = pick(&w, "GET / HTTP/1.1\r\nHost: m\r\nX-User: ann\r\n\r\n", &wake, &why);
    for (int i = 0; i < 10; i++) {
        assert_ptr_equal(pick(&w, "GET / HTTP/1.1\r\nHost: m\r\nX-User: ann\r\n\r\n", &wake, &why),
                         first);
    }
    /* By tenant: the same tenant, the same revision; the default tenant
     * (NULL) follows the round robin. */
    w.opts.sticky_header = NULL;
    w.opts.sticky_tenant = true;
    model_revisions_set(w.m, names, pct, 2, &w.opts, 0);
    struct http_head h;
    parse(&h, PLAIN);
    struct model *acme = model_pick_revision(w.m, &h, "acme", &wake, &why);
    size_t same = 0, rr_v2 = 0;
    for (int i = 0; i < 10; i++) {
        same += model_pick_revision(w.m, &h, "acme", &wake, &why) == acme;
        rr_v2 += model_pick_revision(w.m, &h, NULL, &wake, &why) == w.v2;
    }
    http_head_dispose(&h);
    assert_int_equal(same, 10);
    assert_int_equal(rr_v2, 5);
    /* A revision whose model went: its picks are answered, not crashed. */
    fleet_remove_model(&w.f, w.v2, "test");
    assert_null(pick(&w, "GET / HTTP/1.1\r\nHost: m\r\nthaw-revision: v2\r\n\r\n", &wake, &why));
    assert_int_equal(why, REJECT_NO_REPLICAS);
    fleet_dispose(&w.f);
}

/* "m" at p1/p2 with fallback_to_warm_revision on, and revision v<warm> ready. */
static void setup_fallback(struct world *w, uint32_t p1, uint32_t p2, int warm)
{
    setup_world(w, p1, p2);
    w->opts.fallback_to_warm_revision = true;
    char *names[] = {"v1", "v2"};
    uint32_t pct[] = {p1, p2};
    model_revisions_set(w->m, names, pct, 2, &w->opts, 0);
    assert_int_equal(fleet_replica_ready(&w->f, warm == 1 ? w->v1 : w->v2, "a", "127.0.0.1:9001"),
                     0);
}

static void test_fallback_goes_to_the_warm_revision_and_wakes_the_cold_one(void **state)
{
    struct world w;
    setup_fallback(&w, 50, 50, 1);
    char *names[] = {"v1", "v2"};
    uint32_t pct[] = {50, 50};
    struct model *wake;
    enum reject_reason why;
    for (int i = 0; i < 4; i++) {
        struct model *r = pick(&w, PLAIN, &wake, &why);
        assert_ptr_equal(r, w.v1);
        assert_true(wake == NULL || wake == w.v2);
    }
    /* Without fallback the cold pick stays with its revision. */
    w.opts.fallback_to_warm_revision = false;
    model_revisions_set(w.m, names, pct, 2, &w.opts, 0);
    size_t on_v2 = 0;
    for (int i = 0; i < 4; i++) {
        on_v2 += pick(&w, PLAIN, &wake, &why) == w.v2;
    }
    assert_int_equal(on_v2, 2);
    fleet_dispose(&w.f);
}

/* A canary rolled back to 0% and kept warm is no fallback: the stable
 * revision, cold, is woken and waited for. */
static void test_fallback_never_goes_to_a_revision_at_zero(void **state)
{
    struct world w;
    setup_fallback(&w, 100, 0, 2);
    struct model *wake;
    enum reject_reason why;
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(pick(&w, PLAIN, &wake, &why), w.v1);
        assert_null(wake);
    }
    fleet_dispose(&w.f);
}

/* n requests finished on m, errors of them failed, each with a first byte
 * after ttfb seconds. */
static void serve(struct model *m, uint64_t n, uint64_t errors, double ttfb)
{
    m->stats.proxied += n;
    m->stats.failed += errors;
    for (uint64_t i = 0; i < n; i++) {
        histogram_observe(&m->stats.upstream_ttfb, ttfb);
    }
}

static void rollout_world(struct world *w)
{
    setup_world(w, 90, 10);
    w->opts.rollout = (struct config_rollout){.enabled = true,
                                              .step_percent = 30,
                                              .step_interval_ms = 1000,
                                              .min_requests = 10,
                                              .max_error_rate_increase_pct = 5,
                                              .max_ttfb_p99_ratio_pct = 150,
                                              .ttfb_p99_tolerance_ms = 50};
    char *names[] = {"v1", "v2"};
    uint32_t pct[] = {90, 10};
    model_revisions_set(w->m, names, pct, 2, &w->opts, 0);
    assert_true(w->m->revs->rollout);
}

/* Before the window: 1000 failures on v2 do not count. At t=1000 with 10
 * healthy canary requests: 10 -> 40. Then 12 requests, 3 failed (25%
 * against 0%): rolled back at once, t=1200, split 100/0. */
static void test_rollout_step_then_rollback(void **state)
{
    struct world w;
    rollout_world(&w);
    struct rollout_decision d = model_rollout_tick(w.m, 500);
    assert_int_equal(d.action, ROLLOUT_HOLD);
    serve(w.v1, 90, 0, 0.2);
    serve(w.v2, 10, 0, 0.2);
    assert_int_equal(model_rollout_tick(w.m, 999).action, ROLLOUT_HOLD);
    d = model_rollout_tick(w.m, 1000);
    assert_int_equal(d.action, ROLLOUT_STEP);
    assert_int_equal(model_revision_percent(w.m, 1), 40);
    assert_int_equal(model_revision_percent(w.m, 0), 60);
    serve(w.v1, 20, 0, 0.2);
    serve(w.v2, 12, 3, 0.2);
    d = model_rollout_tick(w.m, 1200);
    assert_int_equal(d.action, ROLLOUT_ROLLBACK);
    assert_non_null(strstr(d.why, "error rate 25.0% (3 of 12)"));
    assert_int_equal(model_revision_percent(w.m, 1), 0);
    assert_int_equal(model_revision_percent(w.m, 0), 100);
    assert_int_equal(w.m->revs->state.stage, ROLLOUT_ROLLED_BACK);
    assert_int_equal(w.m->revs->rollbacks, 1);
    assert_int_equal(model_rollout_tick(w.m, 99999).action, ROLLOUT_HOLD);
    fleet_dispose(&w.f);
}

/* 10 -> 40 -> 70 -> promoted, one healthy window each; then v2 is stable. */
static void test_rollout_promotion(void **state)
{
    struct world w;
    rollout_world(&w);
    uint64_t now = 0;
    uint32_t seen[4];
    int n = 0;
    for (;;) {
        serve(w.v1, 50, 1, 0.3);
        serve(w.v2, 10, 0, 0.3);
        now += 1000;
        struct rollout_decision d = model_rollout_tick(w.m, now);
        seen[n++] = d.canary_percent;
        if (d.action == ROLLOUT_PROMOTE) {
            break;
        }
        assert_int_equal(d.action, ROLLOUT_STEP);
        assert_true(n < 4);
    }
    assert_int_equal(n, 3);
    assert_int_equal(seen[0], 40);
    assert_int_equal(seen[1], 70);
    assert_int_equal(seen[2], 100);
    assert_int_equal(w.m->revs->stable, 1);
    assert_int_equal(model_revision_percent(w.m, 0), 0);
    assert_int_equal(model_revision_percent(w.m, 1), 100);
    /* A restart that reads "progressing at 70%" back continues from there. */
    struct rollout_state back = {ROLLOUT_PROGRESSING, 70, now};
    model_revisions_restore(w.m, &back, now);
    assert_int_equal(model_revision_percent(w.m, 1), 70);
    assert_int_equal(w.m->revs->stable, 0);
    fleet_dispose(&w.f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_split_tag_and_sticky),
        cmocka_unit_test(test_fallback_goes_to_the_warm_revision_and_wakes_the_cold_one),
        cmocka_unit_test(test_fallback_never_goes_to_a_revision_at_zero),
        cmocka_unit_test(test_rollout_step_then_rollback),
        cmocka_unit_test(test_rollout_promotion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

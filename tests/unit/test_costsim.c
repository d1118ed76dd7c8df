/* thaw-costsim's baselines, each on a tiny hand-written trace: what each
 * policy may and may not do, and the CSV trace format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "costsim.h"

/* A box of gpus x slices_per_gpu, horizon seconds, no models yet. */
static void box(struct cs_trace *tr, unsigned gpus, unsigned per_gpu, int horizon)
{
    memset(tr, 0, sizeof *tr);
    snprintf(tr->name, sizeof tr->name, "test");
    tr->gpus = gpus;
    tr->slices_per_gpu = per_gpu;
    tr->horizon = horizon;
}

/* One request every `every` seconds from `from` to `to` (exclusive), 4 s each. */
static void steady(struct cs_trace *tr, size_t model, int from, int to, int every)
{
    for (int t = from; t < to; t += every) {
        cs_trace_add_request(tr, t, (uint32_t)model, tr->models[model].tier, 140);
    }
}

static uint64_t all_served(const struct cs_result *r)
{
    return r->served[0] + r->served[1] + r->served[2];
}

/* Two standard models on a box with room for one: the second waits Pending
 * until the first goes to zero on its own; nothing is evicted or preempted,
 * whatever waits. */
static void test_knative_never_evicts_another_model(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 1, 1200);
    size_t a = cs_trace_add_model(&tr, "a", TIER_STANDARD, 1, 20, 20);
    size_t b = cs_trace_add_model(&tr, "b", TIER_STANDARD, 1, 20, 20);
    steady(&tr, a, 0, 300, 5);
    cs_trace_add_request(&tr, 100, (uint32_t)b, TIER_STANDARD, 140);
    cs_trace_sort(&tr);
    struct cs_result r;
    cs_run(&cs_knative, &tr, &r);
    assert_int_equal(r.evictions, 0);
    assert_int_equal(r.preemptions, 0);
    assert_int_equal(r.failed[TIER_STANDARD], 0);
    /* b's request waited for a's last request (295 s, 4 s long), a stable
     * window (60 s) without demand, then b's cold start. */
    assert_int_equal(all_served(&r), tr.n_reqs);
    const struct cs_waits *w = &r.waits[TIER_STANDARD]; /* sorted */
    assert_true(w->v[w->n - 1] >= 295 - 100 + 4 + 60 + 20 - 1);
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* A critical model is held at min-scale 1 all day without a request, and
 * never cold starts. */
static void test_knative_keeps_critical_at_min_scale_one(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 4, 3600);
    size_t c = cs_trace_add_model(&tr, "c", TIER_CRITICAL, 2, 60, 60);
    size_t s = cs_trace_add_model(&tr, "s", TIER_STANDARD, 1, 60, 60);
    cs_trace_add_request(&tr, 1000, (uint32_t)c, TIER_CRITICAL, 140);
    cs_trace_add_request(&tr, 1000, (uint32_t)s, TIER_STANDARD, 140);
    cs_trace_sort(&tr);
    struct cs_result r;
    cs_run(&cs_knative, &tr, &r);
    assert_int_equal(r.cold_starts[TIER_CRITICAL], 0);
    assert_int_equal(r.cold_starts[TIER_STANDARD], 1);
    assert_true(r.slice_hours[TIER_CRITICAL] > 1.999 && r.slice_hours[TIER_CRITICAL] < 2.001);
    assert_int_equal(r.slo_met[TIER_CRITICAL], 1);
    assert_int_equal(r.slo_met[TIER_STANDARD], 0); /* a 60 s cold start: over 30 s */
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* A box full of batch work: a critical model's burst needs a second replica;
 * kube-scheduler preempts a batch pod for it, and that pod's in-flight
 * requests fail. Batch itself never preempts. */
static void test_knative_priority_preemption_fails_the_victims_requests(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 2, 1800);
    size_t c = cs_trace_add_model(&tr, "c", TIER_CRITICAL, 1, 10, 10);
    size_t b = cs_trace_add_model(&tr, "b", TIER_BATCH, 1, 10, 10);
    size_t b2 = cs_trace_add_model(&tr, "b2", TIER_BATCH, 1, 10, 10);
    for (int t = 0; t < 1200; t++) { /* b always busy */
        cs_trace_add_request(&tr, t, (uint32_t)b, TIER_BATCH, 140);
    }
    steady(&tr, b2, 0, 1200, 1);      /* b2 never finds room: batch does not preempt */
    for (int t = 600; t < 660; t++) { /* c: 4 requests a second, 4 s each */
        for (int k = 0; k < 4; k++) {
            cs_trace_add_request(&tr, t, (uint32_t)c, TIER_CRITICAL, 140);
        }
    }
    cs_trace_sort(&tr);
    struct cs_result r;
    cs_run(&cs_knative, &tr, &r);
    assert_true(r.preemptions >= 1);
    assert_true(r.failed[TIER_BATCH] >= 1);
    assert_int_equal(r.failed[TIER_CRITICAL], 0);
    assert_int_equal(r.served[TIER_CRITICAL], 240);
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* Static packing: one replica each, critical first; what does not fit stays
 * Pending all day and its requests are never served. */
static void test_static_packs_one_replica_each_and_never_scales(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 2, 3600);
    size_t b = cs_trace_add_model(&tr, "b", TIER_BATCH, 1, 10, 10);
    size_t c = cs_trace_add_model(&tr, "c", TIER_CRITICAL, 2, 10, 10);
    for (int t = 0; t < 100; t++) {
        for (int k = 0; k < 4; k++) { /* 16 in flight: twice one replica's slots */
            cs_trace_add_request(&tr, t, (uint32_t)c, TIER_CRITICAL, 140);
        }
    }
    cs_trace_add_request(&tr, 10, (uint32_t)b, TIER_BATCH, 140);
    cs_trace_sort(&tr);
    struct cs_result r;
    cs_run(&cs_static, &tr, &r);
    assert_true(r.slice_hours[TIER_CRITICAL] > 1.999 && r.slice_hours[TIER_CRITICAL] < 2.001);
    assert_true(r.slice_hours[TIER_BATCH] == 0);
    assert_int_equal(r.served[TIER_BATCH], 0);
    assert_int_equal(r.rejected[TIER_BATCH], 1);
    assert_int_equal(r.cold_starts[TIER_CRITICAL], 0);
    assert_true(r.p99[TIER_CRITICAL] > 1); /* no second replica: the burst queues */
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* Dedicated: whole GPUs per replica, enough for the peak minute, never
 * limited by the box. */
static void test_dedicated_bills_whole_gpus_sized_for_the_peak(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 4, 3600);
    size_t a = cs_trace_add_model(&tr, "a", TIER_STANDARD, 1, 10, 10);
    cs_trace_add_request(&tr, 5, (uint32_t)a, TIER_STANDARD, 140);
    size_t p = cs_trace_add_model(&tr, "p", TIER_STANDARD, 1, 10, 10);
    for (int t = 60; t < 120; t++) {
        for (int k = 0; k < 5; k++) { /* 5 a second x 4 s: 20 in flight, 3 replicas */
            cs_trace_add_request(&tr, t, (uint32_t)p, TIER_STANDARD, 140);
        }
    }
    cs_trace_sort(&tr);
    struct cs_result r;
    cs_run(&cs_dedicated, &tr, &r);
    /* a: one GPU (4 slices) for an hour; p: three GPUs. */
    assert_true(r.slice_hours[TIER_STANDARD] > 15.999 && r.slice_hours[TIER_STANDARD] < 16.001);
    assert_int_equal(r.cold_starts[TIER_STANDARD], 0);
    assert_int_equal(r.rejected[TIER_STANDARD], 0);
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* thaw: a batch request waits for the slices a busy critical model holds,
 * longer than the interactive tiers' 5 minutes, and is served rather than
 * turned away; the critical model is never preempted for it. */
static void test_thaw_batch_waits_for_idle_capacity(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 1, 3600);
    size_t c = cs_trace_add_model(&tr, "c", TIER_CRITICAL, 1, 10, 10);
    size_t b = cs_trace_add_model(&tr, "b", TIER_BATCH, 1, 10, 10);
    steady(&tr, c, 0, 1200, 2);
    cs_trace_add_request(&tr, 5, (uint32_t)b, TIER_BATCH, 140);
    cs_trace_sort(&tr);
    cs_thaw_warm_budget = 0;
    struct cs_result r;
    cs_run(&cs_thaw, &tr, &r);
    cs_thaw_warm_budget = UINT32_MAX;
    assert_int_equal(r.served[TIER_BATCH], 1);
    assert_int_equal(r.rejected[TIER_BATCH], 0);
    assert_true(r.p50[TIER_BATCH] > 1200); /* after c went idle past its grace */
    assert_int_equal(r.preemptions, 0);
    assert_int_equal(r.served[TIER_CRITICAL], 600);
    assert_int_equal(r.slo_met[TIER_BATCH], 1);
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* thaw's warm pool keeps an idle critical model warm within the budget (up
 * since the night before, as Knative's min-scale replica is); a batch
 * scale-up may not evict it. */
static void test_thaw_keeps_critical_warm_against_batch(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 1, 3600);
    size_t c = cs_trace_add_model(&tr, "c", TIER_CRITICAL, 1, 60, 60);
    size_t b = cs_trace_add_model(&tr, "b", TIER_BATCH, 1, 10, 10);
    cs_trace_add_request(&tr, 0, (uint32_t)c, TIER_CRITICAL, 140);
    cs_trace_add_request(&tr, 3000, (uint32_t)c, TIER_CRITICAL, 140);
    cs_trace_add_request(&tr, 1000, (uint32_t)b, TIER_BATCH, 140);
    cs_trace_sort(&tr);
    cs_thaw_warm_budget = 1;
    struct cs_result r;
    cs_run(&cs_thaw, &tr, &r);
    cs_thaw_warm_budget = UINT32_MAX;
    assert_int_equal(r.cold_starts[TIER_CRITICAL], 0); /* warm since the night */
    assert_int_equal(r.slo_met[TIER_CRITICAL], 2);
    assert_int_equal(r.evictions, 0);
    assert_int_equal(r.served[TIER_BATCH], 0); /* waits: an hour is past the end */
    cs_result_free(&r);
    cs_trace_free(&tr);
}

/* Every policy accounts for every request once: served or not. */
static void test_every_request_is_accounted_for(void **state)
{
    struct cs_trace tr;
    assert_int_equal(cs_trace_generate(&tr, "fleet24", 3, 1), 0);
    const struct cs_policy *pols[] = {&cs_dedicated, &cs_static, &cs_knative, &cs_thaw};
    for (size_t p = 0; p < 4; p++) {
        struct cs_result r;
        cs_run(pols[p], &tr, &r);
        uint64_t n = 0;
        for (int k = 0; k < TIER_COUNT; k++) {
            n += r.served[k] + r.rejected[k] + r.failed[k];
        }
        assert_int_equal(n, tr.n_reqs);
        cs_result_free(&r);
    }
    cs_trace_free(&tr);
}

static void test_csv_round_trip(void **state)
{
    struct cs_trace a, b;
    assert_int_equal(cs_trace_generate(&a, "bursty-batch", 5, 1), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cs_trace_write(&a, f);
    fclose(f);
    f = fmemopen(text, len, "r");
    char err[256];
    assert_int_equal(cs_trace_read(&b, f, "t.csv", err, sizeof err), 0);
    fclose(f);
    assert_int_equal(a.n_models, b.n_models);
    assert_int_equal(a.n_reqs, b.n_reqs);
    assert_int_equal(a.horizon, b.horizon);
    assert_int_equal(b.gpus, 8);
    for (size_t i = 0; i < a.n_models; i++) {
        assert_string_equal(a.models[i].name, b.models[i].name);
        assert_int_equal(a.models[i].tier, b.models[i].tier);
        assert_int_equal(a.models[i].slices, b.models[i].slices);
        assert_int_equal(a.models[i].cold_cached_s, b.models[i].cold_cached_s);
        assert_int_equal(a.models[i].cold_uncached_s, b.models[i].cold_uncached_s);
    }
    for (size_t i = 0; i < a.n_reqs; i++) {
        assert_int_equal(a.reqs[i].t, b.reqs[i].t);
        assert_int_equal(a.reqs[i].model, b.reqs[i].model);
        assert_int_equal(a.reqs[i].tier, b.reqs[i].tier);
        assert_int_equal(a.reqs[i].tokens, b.reqs[i].tokens);
    }
    free(text);
    cs_trace_free(&a);
    cs_trace_free(&b);
}

static void expect_csv_error(const char *text, const char *want)
{
    struct cs_trace tr;
    char err[256] = "";
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    assert_int_equal(cs_trace_read(&tr, f, "log.csv", err, sizeof err), -1);
    fclose(f);
    if (!strstr(err, want)) {
        fail_msg("error \"%s\" does not contain \"%s\"", err, want);
    }
    cs_trace_free(&tr);
}

static void test_csv_errors_name_the_line(void **state)
{
    expect_csv_error("time,model,tier,tokens\n1,a,critical,10\n2,a,urgent,10\n",
                     "log.csv:3: tier: expected critical, standard or batch");
    expect_csv_error("1,a,batch\n", "log.csv:1: expected 4 fields");
    expect_csv_error("x,a,batch,1\n", "log.csv:1: time");
    expect_csv_error("# model,a,batch,0,10,20\n", "log.csv:1: model");
    expect_csv_error("time,model,tier,tokens\n", "log.csv: no requests");
}

/* A real log needs no model lines: an undescribed model is a 7-8B one. */
static void test_csv_without_model_lines(void **state)
{
    const char *text = "time,model,tier,tokens\n7200.5,llama,standard,300\n3,qwen,batch,40\n";
    struct cs_trace tr;
    char err[256];
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    assert_int_equal(cs_trace_read(&tr, f, "log.csv", err, sizeof err), 0);
    fclose(f);
    assert_int_equal(tr.n_models, 2);
    assert_int_equal(tr.reqs[0].t, 3); /* sorted by time */
    assert_int_equal(tr.models[tr.reqs[0].model].tier, TIER_BATCH);
    assert_int_equal(tr.models[0].slices, 1);
    assert_int_equal(tr.horizon, 3 * 3600); /* to the end of the last request's hour */
    cs_trace_free(&tr);
}

/* A standard model used every morning from 9:00 to 10:00 (a request a
 * minute) and never else: thaw's warm budget keeps it through every night;
 * thaw-prewarm, once a day has taught it, lets it go when its hour is over
 * and has it warm again before 9:00. */
static void test_prewarm_warms_before_a_daily_start(void **state)
{
    struct cs_trace tr;
    box(&tr, 1, 4, 4 * 86400);
    size_t m = cs_trace_add_model(&tr, "team", TIER_STANDARD, 1, 80, 80);
    for (int d = 0; d < 4; d++) {
        steady(&tr, m, d * 86400 + 9 * 3600, d * 86400 + 10 * 3600, 60);
    }
    cs_trace_sort(&tr);
    struct cs_result plain, ahead;
    cs_run(&cs_thaw, &tr, &plain);
    cs_run(&cs_thaw_prewarm, &tr, &ahead);
    /* Both start the run warm (the warm pool kept it through the night
     * before); thaw keeps it all four days. */
    assert_int_equal(plain.cold_starts[TIER_STANDARD], 0);
    assert_true(plain.slice_hours[TIER_STANDARD] > 95.9);
    /* Day one teaches it; then it goes once its hour is over and is warmed
     * ahead of each of the three mornings after, no request waiting. */
    assert_int_equal(ahead.cold_starts[TIER_STANDARD], 0);
    assert_int_equal(ahead.ahead_starts[TIER_STANDARD], 3);
    assert_int_equal(ahead.cold_requests[TIER_STANDARD], 0);
    assert_int_equal(all_served(&ahead), tr.n_reqs);
    assert_true(ahead.slice_hours[TIER_STANDARD] < plain.slice_hours[TIER_STANDARD] / 3);
    cs_result_free(&plain);
    cs_result_free(&ahead);
    cs_trace_free(&tr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prewarm_warms_before_a_daily_start),
        cmocka_unit_test(test_knative_never_evicts_another_model),
        cmocka_unit_test(test_knative_keeps_critical_at_min_scale_one),
        cmocka_unit_test(test_knative_priority_preemption_fails_the_victims_requests),
        cmocka_unit_test(test_static_packs_one_replica_each_and_never_scales),
        cmocka_unit_test(test_dedicated_bills_whole_gpus_sized_for_the_peak),
        cmocka_unit_test(test_thaw_batch_waits_for_idle_capacity),
        cmocka_unit_test(test_thaw_keeps_critical_warm_against_batch),
        cmocka_unit_test(test_every_request_is_accounted_for),
        cmocka_unit_test(test_csv_round_trip),
        cmocka_unit_test(test_csv_errors_name_the_line),
        cmocka_unit_test(test_csv_without_model_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

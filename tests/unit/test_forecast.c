/* Warming ahead of demand: the demand profile's forecasts on daily and
 * weekly patterns, and the scaler warming a model before its daily peak
 * but not at night, with a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "thaw/forecast.h"
#include "thaw/scaler.h"

#define MIN (60ULL * 1000)
#define HOUR (60 * MIN)
#define DAY (24 * HOUR)
/* Monday 2026-11-30 00:00 UTC */
#define MONDAY 1795996800000ULL

/* A working day: 20 requests per 5 minutes from 09:00 to 17:00. */
static uint64_t office_hours(uint64_t t)
{
    uint64_t tod = t % DAY;
    return tod >= 9 * HOUR && tod < 17 * HOUR ? 20 : 0;
}

static void feed_days(struct forecast *f, uint64_t from, int days, int weekdays_only)
{
    for (uint64_t t = from; t < from + (uint64_t)days * DAY; t += FC_SLOT_MS) {
        int weekday = (int)(((t - MONDAY) / DAY) % 7);
        uint64_t n = weekdays_only && weekday >= 5 ? 0 : office_hours(t);
        forecast_record(f, t, n);
    }
}

static void test_learns_a_daily_pattern_in_a_day(void **state)
{
    static struct forecast f;
    forecast_init(&f);
    assert_true(forecast_expected(&f, MONDAY, HOUR) == 0); /* nothing learned */
    feed_days(&f, MONDAY, 1, 0);
    uint64_t tue = MONDAY + DAY;
    /* 09:00-10:00 on Tuesday: 12 slots of 20 */
    assert_true(forecast_expected(&f, tue + 9 * HOUR, HOUR) > 239.0);
    assert_true(forecast_expected(&f, tue + 9 * HOUR, HOUR) < 241.0);
    /* half a slot at the start of the peak */
    double half = forecast_expected(&f, tue + 9 * HOUR - FC_SLOT_MS / 2, FC_SLOT_MS);
    assert_true(half > 9.9 && half < 10.1);
    assert_true(forecast_expected(&f, tue + 3 * HOUR, HOUR) == 0); /* night */
}

static void test_weekly_shape_keeps_weekends_quiet(void **state)
{
    static struct forecast f;
    forecast_init(&f);
    feed_days(&f, MONDAY, 14, 1); /* two weeks, busy on weekdays only */
    uint64_t sat = MONDAY + 19 * DAY, mon = MONDAY + 14 * DAY;
    /* the day profile alone would expect traffic on Saturday morning */
    assert_true(forecast_expected(&f, sat + 9 * HOUR, HOUR) < 1.0);
    assert_true(forecast_expected(&f, mon + 9 * HOUR, HOUR) > 200.0);
}

static void test_pattern_moves_and_bursts_fade(void **state)
{
    static struct forecast f;
    forecast_init(&f);
    feed_days(&f, MONDAY, 3, 0);
    uint64_t t = MONDAY + 3 * DAY;
    /* the peak stops: after three quiet days the forecast for a weekday not
     * seen yet (Sunday) has fallen to a third (0.7^3 of 240) */
    for (uint64_t x = t; x < t + 3 * DAY; x += FC_SLOT_MS) {
        forecast_record(&f, x, 0);
    }
    double sunday = forecast_expected(&f, t + 3 * DAY + 9 * HOUR, HOUR);
    assert_true(sunday > 80.0 && sunday < 85.0);
}

static void test_clock_jumps_do_not_fold_a_gap(void **state)
{
    static struct forecast f;
    forecast_init(&f);
    forecast_record(&f, MONDAY + 9 * HOUR, 50);
    forecast_record(&f, MONDAY + 8 * HOUR, 0); /* back: counting starts afresh */
    forecast_record(&f, MONDAY + 30 * DAY, 0); /* a month later: no month of zeros */
    assert_int_equal(f.day_seen[(MONDAY + 9 * HOUR) / FC_SLOT_MS % FC_DAY_SLOTS], 0);
    assert_int_equal(f.slot, (int64_t)((MONDAY + 30 * DAY) / FC_SLOT_MS));
    /* a horizon is capped at a day */
    feed_days(&f, MONDAY + 30 * DAY, 1, 0);
    double week = forecast_expected(&f, MONDAY + 31 * DAY, 7 * DAY);
    double day = forecast_expected(&f, MONDAY + 31 * DAY, DAY);
    assert_true(week == day);
}

/* ---- the scaler: warm before the peak, not at night ---- */

struct sim {
    struct model m;
    struct scaler_model sm;
    struct config *cfg;
    uint64_t mono;
};

static void sim_init(struct sim *s, enum prewarm_mode mode)
{
    memset(s, 0, sizeof *s);
    s->cfg = config_new_default();
    s->cfg->autoscaler.tick_ms = MIN;
    s->cfg->autoscaler.prewarm_lead_ms = MIN; /* the horizon: the 2-minute cold start + a tick */
    s->m.name = "chat";
    s->m.set.priority = TIER_STANDARD;
    s->m.set.max_concurrency = 4;
    s->m.cold_start_ms = 2 * MIN;
    scaler_model_init(&s->sm, &s->m, s->cfg, 0, 0, 0, 1, 5 * MIN, 1);
    s->sm.prewarm = mode;
    s->mono = 1000000;
}

/* One planning tick at wall time t: the requests of the minute arrive (and
 * are served at once), then forecast and plan; the target is applied. */
static unsigned sim_tick(struct sim *s, uint64_t t)
{
    s->m.stats.proxied += office_hours(t) / 5;
    s->mono += MIN;
    struct scaler_model *sms[] = {&s->sm};
    struct wp_cluster c = {.cap_slices = 4};
    s->sm.current = s->sm.ready = s->sm.target;
    scaler_record(&s->sm, s->mono);
    scaler_forecast(sms, 1, t, &s->cfg->autoscaler);
    scaler_plan(sms, 1, &c, 1, s->mono);
    return s->sm.target;
}

static void run_days(struct sim *s, int days)
{
    for (uint64_t t = MONDAY; t < MONDAY + (uint64_t)days * DAY; t += MIN) {
        sim_tick(s, t);
    }
}

static void test_scaler_warms_before_the_peak_not_at_night(void **state)
{
    static struct sim s;
    sim_init(&s, PREWARM_ON);
    run_days(&s, 3);
    uint64_t day4 = MONDAY + 3 * DAY;
    for (uint64_t t = day4; t < day4 + 8 * HOUR + 50 * MIN; t += MIN) {
        assert_int_equal(sim_tick(&s, t), 0); /* the night and early morning stay cold */
    }
    unsigned at = 0;
    uint64_t t = day4 + 8 * HOUR + 50 * MIN;
    for (; t < day4 + 9 * HOUR && !at; t += MIN) {
        at = sim_tick(&s, t);
    }
    assert_int_equal(at, 1);
    /* warmed within the cold start + a tick before 09:00, not earlier */
    assert_true(t > day4 + 9 * HOUR - 4 * MIN);
    assert_true(s.sm.forecast_due);
    assert_string_equal(s.sm.last_action, "prewarm");
    for (t = day4 + 17 * HOUR + 30 * MIN; t < day4 + 20 * HOUR; t += MIN) {
        sim_tick(&s, t);
    }
    assert_int_equal(s.sm.target, 0); /* gone once the evening is quiet */
    scaler_model_dispose(&s.sm);
    config_free(s.cfg);
}

static void test_shadow_mode_only_forecasts(void **state)
{
    static struct sim s;
    sim_init(&s, PREWARM_SHADOW);
    run_days(&s, 2);
    uint64_t day3 = MONDAY + 2 * DAY;
    for (uint64_t t = day3 + 8 * HOUR; t < day3 + 9 * HOUR; t += MIN) {
        assert_int_equal(sim_tick(&s, t), 0);
    }
    assert_true(s.sm.forecast_due); /* it would have */
    assert_int_equal(s.m.stats.pool_decisions[WP_PREWARM], 0);
    scaler_model_dispose(&s.sm);
    config_free(s.cfg);
}

static void test_off_keeps_no_profile(void **state)
{
    static struct sim s;
    sim_init(&s, PREWARM_INHERIT); /* the default: autoscaler.prewarm off */
    run_days(&s, 1);
    assert_null(s.sm.fc);
    scaler_model_dispose(&s.sm);
    config_free(s.cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learns_a_daily_pattern_in_a_day),
        cmocka_unit_test(test_weekly_shape_keeps_weekends_quiet),
        cmocka_unit_test(test_pattern_moves_and_bursts_fade),
        cmocka_unit_test(test_clock_jumps_do_not_fold_a_gap),
        cmocka_unit_test(test_scaler_warms_before_the_peak_not_at_night),
        cmocka_unit_test(test_shadow_mode_only_forecasts),
        cmocka_unit_test(test_off_keeps_no_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The traffic split: exact shares from smooth weighted round robin, spread
 * picks, sticky keys that only move toward a growing canary, bad splits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "thaw/revsplit.h"

static void count_picks(struct revsplit *s, size_t n_picks, size_t *counts)
{
    for (size_t i = 0; i < n_picks; i++) {
        int k = revsplit_pick(s);
        assert_true(k >= 0 && (size_t)k < s->n);
        counts[k]++;
    }
}

/* 90/10 over 10000 requests: exactly 9000 and 1000, and exactly 90 and 10
 * in every window of 100 consecutive picks. */
static void test_ninety_ten_is_exact(void **state)
{
    (void)state;
    struct revsplit s;
    revsplit_init(&s);
    uint32_t pct[] = {90, 10};
    assert_int_equal(revsplit_set(&s, pct, 2), 0);
    for (int window = 0; window < 100; window++) {
        size_t counts[2] = {0};
        count_picks(&s, 100, counts);
        assert_int_equal(counts[0], 90);
        assert_int_equal(counts[1], 10);
    }
}

/* The canary's picks are spread: never two in a row at 10%. */
static void test_small_share_is_spread(void **state)
{
    (void)state;
    struct revsplit s;
    revsplit_init(&s);
    uint32_t pct[] = {90, 10};
    revsplit_set(&s, pct, 2);
    int last = -1;
    for (int i = 0; i < 1000; i++) {
        int k = revsplit_pick(&s);
        assert_false(k == 1 && last == 1);
        last = k;
    }
}

/* Uneven three-way splits hold within +-1% over any long run. */
static void test_three_way_within_one_percent(void **state)
{
    (void)state;
    uint32_t splits[][3] = {{33, 33, 34}, {1, 98, 1}, {50, 25, 25}, {7, 0, 93}};
    for (size_t t = 0; t < 4; t++) {
        struct revsplit s;
        revsplit_init(&s);
        assert_int_equal(revsplit_set(&s, splits[t], 3), 0);
        size_t counts[3] = {0};
        count_picks(&s, 12345, counts);
        for (int k = 0; k < 3; k++) {
            double share = 100.0 * (double)counts[k] / 12345.0;
            assert_true(share >= (double)splits[t][k] - 1 && share <= (double)splits[t][k] + 1);
        }
        if (splits[t][1] == 0) {
            assert_int_equal(counts[1], 0);
        }
    }
}

static void test_zero_percent_never_picked(void **state)
{
    (void)state;
    struct revsplit s;
    revsplit_init(&s);
    uint32_t pct[] = {100, 0};
    revsplit_set(&s, pct, 2);
    size_t counts[2] = {0};
    count_picks(&s, 1000, counts);
    assert_int_equal(counts[1], 0);
}

static void test_bad_splits_rejected(void **state)
{
    (void)state;
    struct revsplit s;
    revsplit_init(&s);
    uint32_t good[] = {60, 40};
    revsplit_set(&s, good, 2);
    uint32_t short_[] = {60, 30};
    uint32_t over[] = {101, 0};
    uint32_t many[REVSPLIT_MAX + 1] = {100};
    assert_int_equal(revsplit_set(&s, short_, 2), -EINVAL);
    assert_int_equal(revsplit_set(&s, over, 2), -EINVAL);
    assert_int_equal(revsplit_set(&s, many, REVSPLIT_MAX + 1), -EINVAL);
    assert_int_equal(revsplit_set(&s, good, 0), -EINVAL);
    assert_int_equal(s.percent[0], 60); /* unchanged */
    struct revsplit empty;
    revsplit_init(&empty);
    assert_int_equal(revsplit_pick(&empty), -1);
    assert_int_equal(revsplit_pick_sticky(&empty, 7), -1);
}

/* A key keeps its revision; as the canary grows 10 -> 50, keys only move
 * from stable to canary; the shares of many keys follow the split. */
static void test_sticky_keys(void **state)
{
    (void)state;
    struct revsplit s;
    revsplit_init(&s);
    uint32_t ten[] = {90, 10}, fifty[] = {50, 50};
    int before[2000];
    size_t on_canary = 0;
    revsplit_set(&s, ten, 2);
    for (int i = 0; i < 2000; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "user-%d", i);
        uint64_t h = revsplit_hash(key, (size_t)n);
        before[i] = revsplit_pick_sticky(&s, h);
        assert_int_equal(revsplit_pick_sticky(&s, h), before[i]);
        on_canary += before[i] == 1;
    }
    assert_true(on_canary > 120 && on_canary < 280);
    revsplit_set(&s, fifty, 2);
    for (int i = 0; i < 2000; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "user-%d", i);
        int now = revsplit_pick_sticky(&s, revsplit_hash(key, (size_t)n));
        if (before[i] == 1) {
            assert_int_equal(now, 1);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ninety_ten_is_exact),
        cmocka_unit_test(test_small_share_is_spread),
        cmocka_unit_test(test_three_way_within_one_percent),
        cmocka_unit_test(test_zero_percent_never_picked),
        cmocka_unit_test(test_bad_splits_rejected),
        cmocka_unit_test(test_sticky_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

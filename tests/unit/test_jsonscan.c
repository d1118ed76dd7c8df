/* jsonscan: the top-level "model" of a JSON body, fed in pieces. Every case
 * is run whole, split at every byte boundary, and one byte at a time; all
 * must give the same answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/jsonscan.h"

struct outcome {
    enum jsonscan_status status;
    char model[JSONSCAN_MODEL_MAX + 1];
    size_t model_len;
    char error[160];
};

/* Whole scans (jsonscan_init_whole) in the cases that ask for them. */
static bool whole_scan;

static bool reads_on(enum jsonscan_status st)
{
    return st == JSONSCAN_MORE || (whole_scan && st == JSONSCAN_MODEL);
}

static void finish_into(struct jsonscan *s, enum jsonscan_status st, struct outcome *o)
{
    if (reads_on(st)) {
        st = jsonscan_finish(s);
    }
    o->status = st;
    o->model_len = 0;
    o->model[0] = o->error[0] = '\0';
    if (st == JSONSCAN_MODEL) {
        const char *m = jsonscan_model(s, &o->model_len);
        memcpy(o->model, m, o->model_len + 1);
    } else if (st == JSONSCAN_INVALID) {
        jsonscan_error(s, o->error, sizeof o->error);
    }
}

/* Feeds body in pieces that end at the given cut points. */
static void scan_cuts(const char *body, size_t len, const size_t *cuts, size_t n_cuts,
                      struct outcome *o)
{
    struct jsonscan s;
    if (whole_scan) {
        jsonscan_init_whole(&s);
    } else {
        jsonscan_init(&s);
    }
    enum jsonscan_status st = JSONSCAN_MORE;
    size_t at = 0;
    for (size_t i = 0; i <= n_cuts && reads_on(st); i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        st = jsonscan_feed(&s, body + at, end - at);
        at = end;
    }
    finish_into(&s, st, o);
}

static void assert_same(const struct outcome *a, const struct outcome *b, const char *body,
                        const char *how)
{
    if (a->status != b->status || a->model_len != b->model_len ||
        memcmp(a->model, b->model, a->model_len) != 0 || strcmp(a->error, b->error) != 0) {
        fail_msg("%s differs for %s: %d/%s/%s vs %d/%s/%s", how, body, a->status, a->model,
                 a->error, b->status, b->model, b->error);
    }
}

/* The answer for body, checked to be the same however the body is split. */
static struct outcome scan_all_ways(const char *body, size_t len)
{
    struct outcome whole, other;
    scan_cuts(body, len, NULL, 0, &whole);
    for (size_t cut = 0; cut <= len; cut++) {
        scan_cuts(body, len, &cut, 1, &other);
        assert_same(&whole, &other, body, "one split");
    }
    size_t *every = malloc((len + 1) * sizeof *every);
    assert_non_null(every);
    for (size_t i = 0; i < len; i++) {
        every[i] = i + 1;
    }
    scan_cuts(body, len, every, len, &other);
    assert_same(&whole, &other, body, "byte by byte");
    free(every);
    return whole;
}

static void expect_model(const char *body, const char *model, size_t model_len)
{
    struct outcome o = scan_all_ways(body, strlen(body));
    if (o.status != JSONSCAN_MODEL) {
        fail_msg("no model for %s: status %d (%s)", body, o.status, o.error);
    }
    assert_int_equal(o.model_len, model_len);
    assert_memory_equal(o.model, model, model_len);
}

static void expect_status(const char *body, enum jsonscan_status want)
{
    struct outcome o = scan_all_ways(body, strlen(body));
    if (o.status != want) {
        fail_msg("status %d, want %d, for %s (%s)", o.status, want, body, o.error);
    }
}

static void test_plain_and_whitespace(void **state)
{
    expect_model("{\"model\":\"llama\"}", "llama", 5);
    expect_model(" \r\n\t{ \"model\" \n:\t \"llama-3\" , \"x\": 1}", "llama-3", 7);
    expect_model("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                 "\"temperature\":-0.5e+3,\"n\":null,\"model\":\"m\"}",
                 "m", 1);
    expect_model("{\"model\":\"\"}", "", 0);
}

static void test_escapes(void **state)
{
    /* Escaped keys are compared after unescaping. */
    expect_model("{\"mo\\u0064el\":\"a\"}", "a", 1);
    expect_model("{\"\\u006D\\u006f\\u0064\\u0065\\u006c\":\"a\"}", "a", 1);
    /* Values: \/ \" \\ and \u, including a surrogate pair. */
    expect_model("{\"model\":\"meta-llama\\/Llama-3\"}", "meta-llama/Llama-3", 18);
    expect_model("{\"model\":\"a\\\"b\\\\c\"}", "a\"b\\c", 5);
    expect_model("{\"model\":\"caf\\u00e9\"}", "caf\xc3\xa9", 5);
    expect_model("{\"model\":\"x\\ud83d\\ude00\"}", "x\xf0\x9f\x98\x80", 5);
    expect_model("{\"model\":\"\xe2\x82\xac\"}", "\xe2\x82\xac", 3); /* raw UTF-8 */
    /* Escaped quotes inside a skipped string do not end it. */
    expect_model("{\"p\":\"\\\",\\\"model\\\":\\\"decoy\",\"model\":\"real\"}", "real", 4);
    /* A key that only starts like "model", or continues past it. */
    expect_model("{\"mode\":\"a\",\"models\":\"b\",\"Model\":\"c\",\"model\":\"d\"}", "d", 1);
    /* "\u0000" keeps its NUL: no configured name can match it. */
    expect_model("{\"model\":\"a\\u0000b\"}", "a\0b", 3);
}

/* Lone surrogate escapes are valid JSON grammar, and Python's json keeps
 * them (JavaScript writes them for a string cut inside a character): taken,
 * and in a model name they match nothing UTF-8. Raw UTF-8 passes whole. */
static void test_lone_surrogates_and_utf8(void **state)
{
    expect_status("{\"a\":\"\\ud83d\"}", JSONSCAN_NO_MODEL);
    expect_status("{\"a\":\"\\ud83dx\\ude00\\n\"}", JSONSCAN_NO_MODEL);
    expect_status("{\"a\":\"\\ud83d\\ud83d\\ude00\"}", JSONSCAN_NO_MODEL);
    expect_model("{\"a\":\"\\ude00\",\"model\":\"m\"}", "m", 1);
    expect_model("{\"model\":\"\\ud83d\\u0041\"}", "\xed\xa0\xbd" "A", 4);
    expect_model("{\"model\":\"x\\ud83d\"}", "x\xed\xa0\xbd", 4);
    expect_model("{\"p\":\"\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 caf\xc3\xa9\","
                 "\"model\":\"m\"}",
                 "m", 1);
    /* What else Python's json takes: a byte order mark, NaN and the
     * infinities, a surrogate encoded raw (its surrogatepass). */
    expect_model("\xef\xbb\xbf{\"model\":\"m\"}", "m", 1);
    expect_model("{\"t\":NaN,\"u\":[Infinity,-Infinity],\"model\":\"m\"}", "m", 1);
    expect_model("{\"a\":\"\xed\xa0\xbd\",\"model\":\"x\xed\xb8\x80\"}", "x\xed\xb8\x80", 4);
}

static void test_nested_decoys(void **state)
{
    expect_model("{\"a\":{\"model\":\"x\"},\"b\":[{\"model\":\"y\"},[\"model\"]],"
                 "\"c\":\"model\",\"model\":\"real\"}",
                 "real", 4);
    expect_model("{\"a\":{\"b\":{\"c\":{\"model\":\"deep\"}}},\"model\":\"top\"}", "top", 3);
    /* Nested "model" only: no model. */
    expect_status("{\"a\":{\"model\":\"x\"},\"b\":[{\"model\":\"y\"}]}", JSONSCAN_NO_MODEL);
    /* The first top-level "model" decides, as a JSON parser's lookup does. */
    expect_model("{\"model\":\"first\",\"model\":\"second\"}", "first", 5);
    expect_status("{\"model\":42,\"model\":\"second\"}", JSONSCAN_NO_MODEL);
    expect_status("{\"model\":{\"model\":\"x\"}}", JSONSCAN_NO_MODEL);
    expect_status("{\"model\":null}", JSONSCAN_NO_MODEL);
    expect_status("{\"model\":[\"x\"]}", JSONSCAN_NO_MODEL);
    expect_status("{}", JSONSCAN_NO_MODEL);
    expect_status("{\"prompt\":\"x\"} \n", JSONSCAN_NO_MODEL);
}

static void test_stops_early(void **state)
{
    /* The answer is known at the closing quote; what follows is not read. */
    const char *body = "{\"model\":\"m\", this is not JSON";
    struct jsonscan s;
    jsonscan_init(&s);
    assert_int_equal(jsonscan_feed(&s, body, strlen(body)), JSONSCAN_MODEL);
    assert_int_equal(s.offset, strlen("{\"model\":\"m\""));
    assert_int_equal(jsonscan_feed(&s, "]]]", 3), JSONSCAN_MODEL);
    assert_int_equal(jsonscan_finish(&s), JSONSCAN_MODEL);
}

static void expect_invalid(const char *body, const char *error)
{
    struct outcome o = scan_all_ways(body, strlen(body));
    if (o.status != JSONSCAN_INVALID) {
        fail_msg("status %d for invalid %s", o.status, body);
    }
    if (strcmp(o.error, error) != 0) {
        fail_msg("error \"%s\", want \"%s\", for %s", o.error, error, body);
    }
}

static void test_bad_input(void **state)
{
    expect_invalid("", "the body is empty at byte 0");
    expect_invalid("  ", "the body ends before the JSON does at byte 2");
    expect_invalid("[1,2]", "the body is not a JSON object at byte 0");
    expect_invalid("\"model\"", "the body is not a JSON object at byte 0");
    expect_invalid("{\"model\":", "the body ends before the JSON does at byte 9");
    expect_invalid("{\"model\" \"x\"}", "expected ':' after a key at byte 9");
    expect_invalid("{model:\"x\"}", "expected a string key at byte 1");
    expect_invalid("{\"a\":1,}", "expected a string key at byte 7");
    expect_invalid("{\"a\":1 \"b\":2}", "expected ',' or '}' at byte 7");
    expect_invalid("{\"a\":[1 2]}", "expected ',' or ']' at byte 8");
    expect_invalid("{\"a\":[1,]}", "expected a JSON value at byte 8");
    expect_invalid("{\"a\":[}", "expected a JSON value at byte 6");
    expect_invalid("{\"a\":tru}", "invalid literal (true, false or null expected) at byte 8");
    expect_invalid("{\"a\":01}", "expected ',' or '}' at byte 6");
    expect_invalid("{\"a\":1.}", "invalid number at byte 7");
    expect_invalid("{\"a\":-}", "invalid number at byte 6");
    expect_invalid("{\"a\":1e}", "invalid number at byte 7");
    expect_invalid("{\"a\":+1}", "expected a JSON value at byte 5");
    expect_invalid("{\"a\":\"\\x\"}", "invalid escape in a string at byte 7");
    expect_invalid("{\"a\":\"\\u12G4\"}", "invalid \\u escape in a string at byte 10");
    /* Bytes that are not UTF-8 (RFC 8259 8.1), wherever they are. */
    expect_invalid("{\"a\":\"\xff\"}", "invalid UTF-8 in a string at byte 6");
    expect_invalid("{\"a\":\"x\x80\"}", "invalid UTF-8 in a string at byte 7");
    expect_invalid("{\"a\":\"\xc1\xa4\"}", "invalid UTF-8 in a string at byte 6"); /* overlong */
    expect_invalid("{\"a\":\"\xe0\x80\xaf\"}", "invalid UTF-8 in a string at byte 7");
    expect_invalid("{\"a\":\"\xed\xc0\x80\"}", "invalid UTF-8 in a string at byte 7");
    expect_invalid("\xef\xbb{}", "the body is not a JSON object at byte 2");
    expect_invalid("{\"a\":NaNa}", "expected ',' or '}' at byte 8");
    expect_invalid("{\"a\":-Inf}", "invalid literal (true, false or null expected) at byte 9");
    expect_invalid("{\"a\":\"\xf4\x90\x80\x80\"}", "invalid UTF-8 in a string at byte 7");
    expect_invalid("{\"a\":\"\xe2\x82\"}", "invalid UTF-8 in a string at byte 8"); /* cut */
    expect_invalid("{\"\xfe\":1}", "invalid UTF-8 in a string at byte 2");
    expect_invalid("{\"model\":\"m\xc3\"}", "invalid UTF-8 in a string at byte 12");
    expect_invalid("{\"a\":\"x\ny\"}", "control character in a string at byte 7");
    expect_invalid("{\"a\":1}x", "unexpected data after the JSON object at byte 7");
    expect_invalid("{\"a\":1}{}", "unexpected data after the JSON object at byte 7");
    expect_invalid("{\"a\":{\"b\":1]}", "expected ',' or '}' at byte 11");
    /* Invalid before the model is known: invalid, even with a model after. */
    expect_invalid("{\"a\":[1,2}],\"model\":\"m\"}", "expected ',' or ']' at byte 9");
}

static void test_bounds(void **state)
{
    /* Nesting: up to the limit is fine, one more is refused. */
    size_t depth = JSONSCAN_DEPTH_MAX;
    char *deep = malloc(2 * depth + 40);
    assert_non_null(deep);
    size_t n = 0;
    deep[n++] = '{';
    n += (size_t)sprintf(deep + n, "\"a\":");
    for (size_t i = 1; i < depth; i++) {
        deep[n++] = '[';
    }
    for (size_t i = 1; i < depth; i++) {
        deep[n++] = ']';
    }
    n += (size_t)sprintf(deep + n, ",\"model\":\"m\"}");
    struct jsonscan s;
    jsonscan_init(&s);
    assert_int_equal(jsonscan_feed(&s, deep, n), JSONSCAN_MODEL);
    n = 0;
    deep[n++] = '{';
    n += (size_t)sprintf(deep + n, "\"a\":");
    for (size_t i = 0; i < depth; i++) {
        deep[n++] = '[';
    }
    jsonscan_init(&s);
    assert_int_equal(jsonscan_feed(&s, deep, n), JSONSCAN_INVALID);
    char err[100];
    jsonscan_error(&s, err, sizeof err);
    assert_string_equal(err, "nesting too deep at byte 1028");
    free(deep);

    /* The model name: up to JSONSCAN_MODEL_MAX bytes, then refused (even
     * when an escape pushes it over). */
    char body[JSONSCAN_MODEL_MAX + 64];
    char name[JSONSCAN_MODEL_MAX + 2];
    memset(name, 'x', sizeof name);
    name[JSONSCAN_MODEL_MAX] = '\0';
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", name);
    expect_model(body, name, JSONSCAN_MODEL_MAX);
    name[JSONSCAN_MODEL_MAX] = 'x';
    name[JSONSCAN_MODEL_MAX + 1] = '\0';
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", name);
    expect_status(body, JSONSCAN_MODEL_TOO_LONG);
    name[JSONSCAN_MODEL_MAX - 1] = '\0';
    snprintf(body, sizeof body, "{\"model\":\"%s\\u00e9\"}", name);
    expect_status(body, JSONSCAN_MODEL_TOO_LONG);
}

static void test_large_skipped_string(void **state)
{
    /* A multi-megabyte prompt before the model: skipped, not kept. */
    static const char head[] = "{\"prompt\":\"";
    static const char tail[] = "\",\"model\":\"m\"}";
    size_t big = 4 * 1024 * 1024;
    size_t n = sizeof head - 1 + big + sizeof tail - 1;
    char *body = malloc(n);
    if (!body) {
        fail_msg("out of memory");
        return;
    }
    memcpy(body, head, sizeof head - 1);
    memset(body + sizeof head - 1, 'a', big);
    memcpy(body + sizeof head - 1 + big, tail, sizeof tail - 1);
    struct jsonscan s;
    jsonscan_init(&s);
    enum jsonscan_status st = JSONSCAN_MORE;
    for (size_t at = 0; at < n && st == JSONSCAN_MORE; at += 65536) {
        st = jsonscan_feed(&s, body + at, n - at < 65536 ? n - at : 65536);
    }
    assert_int_equal(st, JSONSCAN_MODEL);
    size_t len;
    assert_string_equal(jsonscan_model(&s, &len), "m");
    free(body);
}

/* "stream" as a model server reads it: the last top-level one, true only as
 * the literal true (whole scans, the proxy's). */
static bool stream_of(const char *body)
{
    struct jsonscan s;
    jsonscan_init_whole(&s);
    enum jsonscan_status st = jsonscan_feed(&s, body, strlen(body));
    if (st == JSONSCAN_MORE || st == JSONSCAN_MODEL) {
        st = jsonscan_finish(&s);
    }
    return (st == JSONSCAN_NO_MODEL || st == JSONSCAN_MODEL) && s.stream;
}

static void test_stream_key(void **state)
{
    assert_true(stream_of("{\"model\":\"m\",\"stream\":true}"));
    assert_true(stream_of("{\"str\\u0065am\" : true }"));
    assert_false(stream_of("{\"stream\":false}"));
    assert_false(stream_of("{\"stream\":\"true\"}"));
    assert_true(stream_of("{\"stream\":null,\"stream\":true}")); /* the last decides */
    assert_false(stream_of("{\"stream\":true,\"stream\":false}"));
    assert_false(stream_of("{\"stream\":true,\"stream\":{\"a\":true}}"));
    assert_false(stream_of("{\"a\":{\"stream\":true}}"));
    assert_false(stream_of("{\"a\":[true],\"b\":true}"));
    assert_false(stream_of("{\"stream\":true,]"));
    assert_false(stream_of("{\"streams\":true}"));
    assert_false(stream_of("{\"strea\":true}"));
}

/* The proxy's scan reads the whole body: a second top-level "model" (the one
 * a Python server would use) and a malformed rest are refused, nested
 * "model" keys still do not count, and the model is reported early. */
static void test_whole_body(void **state)
{
    whole_scan = true;
    expect_status("{\"model\":\"first\",\"model\":\"second\"}", JSONSCAN_DUPLICATE_MODEL);
    expect_status("{\"model\":42,\"model\":\"second\"}", JSONSCAN_DUPLICATE_MODEL);
    expect_status("{\"model\":\"a\",\"x\":[1,{\"y\":2}],\"mo\\u0064el\":\"b\"}",
                  JSONSCAN_DUPLICATE_MODEL);
    expect_model("{\"model\":\"m\",\"a\":{\"model\":\"x\"},\"b\":[{\"model\":\"y\"}],"
                 "\"models\":\"z\"} ",
                 "m", 1);
    expect_status("{\"prompt\":\"x\"}", JSONSCAN_NO_MODEL);
    expect_invalid("{\"model\":\"m\", this is not JSON", "expected a string key at byte 14");
    expect_invalid("{\"model\":\"m\"} x", "unexpected data after the JSON object at byte 14");
    expect_invalid("{\"model\":\"m\",\"n\":[1,2", "the body ends before the JSON does at byte 21");

    struct jsonscan s;
    jsonscan_init_whole(&s);
    const char *head = "{\"model\":\"m\",\"messages\":[";
    assert_int_equal(jsonscan_feed(&s, head, strlen(head)), JSONSCAN_MODEL);
    size_t len;
    assert_string_equal(jsonscan_model(&s, &len), "m");
    const char *rest = "],\"model\":\"n\"}";
    assert_int_equal(jsonscan_feed(&s, rest, strlen(rest)), JSONSCAN_DUPLICATE_MODEL);
    assert_int_equal(jsonscan_finish(&s), JSONSCAN_DUPLICATE_MODEL);
    whole_scan = false;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_and_whitespace), cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_nested_decoys),        cmocka_unit_test(test_stops_early),
        cmocka_unit_test(test_bad_input),            cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_large_skipped_string), cmocka_unit_test(test_stream_key),
        cmocka_unit_test(test_whole_body), cmocka_unit_test(test_lone_surrogates_and_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

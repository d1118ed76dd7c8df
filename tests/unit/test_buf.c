/* buf: growth, consume/compact, JSON escaping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/buf.h"

static void test_append_consume(void **state)
{
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(buf_append(&b, "0123456789", 10), 0);
    }
    assert_int_equal(buf_unread(&b), 10000);
    buf_consume(&b, 9995);
    assert_int_equal(buf_unread(&b), 5);
    assert_memory_equal(buf_read_ptr(&b), "56789", 5);
    size_t cap = b.cap;
    /* Appending after most was read compacts instead of growing. */
    char big[8000];
    memset(big, 'x', sizeof big);
    assert_int_equal(buf_append(&b, big, sizeof big), 0);
    assert_int_equal(b.cap, cap);
    assert_memory_equal(buf_read_ptr(&b), "56789x", 6);
    buf_consume(&b, buf_unread(&b));
    assert_int_equal(b.len, 0);
    buf_dispose(&b);
}

static void test_json_escape(void **state)
{
    struct buf b;
    buf_init(&b);
    const char s[] = "a\"b\\c\n\x01";
    buf_append_json_escaped(&b, s, sizeof s - 1);
    buf_append(&b, "", 1);
    assert_string_equal(b.data, "a\\\"b\\\\c\\n\\u0001");
    buf_dispose(&b);
}

static void test_json_escape_keeps_utf8_and_replaces_what_is_not(void **state)
{
    struct buf b;
    buf_init(&b);
    /* é, €, 😀 kept; a stray 0xFF, an overlong '1' (C0 B1), a surrogate
     * (ED A0 80) and a cut-short € replaced, one U+FFFD per byte. */
    const char s[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|m\xff" "1|\xc0\xb1|\xed\xa0\x80|\xe2\x82";
    buf_append_json_escaped(&b, s, sizeof s - 1);
    buf_append(&b, "", 1);
    assert_string_equal(b.data, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|m\\ufffd1|\\ufffd\\ufffd|"
                                "\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd");
    buf_dispose(&b);
}

/* /status prints names and errors that came from files: a byte that is not
 * UTF-8 becomes U+FFFD, valid sequences stay as they are. */
static void test_utf8_repaired(void **state)
{
    struct buf b;
    buf_init(&b);
    const char in[] = "{\"e\":\"x\xff\xfe caf\xc3\xa9 \xe2\x82\"}";
    assert_int_equal(buf_append_utf8_repaired(&b, in, sizeof in - 1), 0);
    const char want[] = "{\"e\":\"x\xef\xbf\xbd\xef\xbf\xbd caf\xc3\xa9 "
                        "\xef\xbf\xbd\xef\xbf\xbd\"}";
    assert_int_equal(b.len, sizeof want - 1);
    assert_memory_equal(b.data, want, b.len);
    buf_dispose(&b);
}

static void test_printf_long(void **state)
{
    struct buf b;
    buf_init(&b);
    char s[2000];
    memset(s, 'q', sizeof s - 1);
    s[sizeof s - 1] = '\0';
    buf_printf(&b, "<%s>", s);
    assert_int_equal(b.len, 2001);
    assert_int_equal(b.data[0], '<');
    assert_int_equal(b.data[2000], '>');
    buf_dispose(&b);
}

static void test_append_u64_is_decimal(void **state)
{
    (void)state;
    const uint64_t vals[] = {0, 7, 9, 10, 99, 100, 1048576, 4294967295u, 4294967296u,
                             18446744073709551615u};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        struct buf b;
        buf_init(&b);
        buf_append(&b, "n=", 2);
        assert_int_equal(buf_append_u64(&b, vals[i]), 0);
        char want[32];
        int n = snprintf(want, sizeof want, "n=%llu", (unsigned long long)vals[i]);
        assert_int_equal(b.len, (size_t)n);
        assert_memory_equal(b.data, want, (size_t)n);
        buf_dispose(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_consume),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_json_escape_keeps_utf8_and_replaces_what_is_not),
        cmocka_unit_test(test_printf_long),
        cmocka_unit_test(test_append_u64_is_decimal),
        cmocka_unit_test(test_utf8_repaired),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* buf: growth, consume/compact, JSON escaping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_consume),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_printf_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

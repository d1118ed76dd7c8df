/* formscan: the "model" field of a multipart/form-data body, fed in pieces.
 * Every case runs whole, split at every byte, and one byte at a time; all
 * must give the same answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/formscan.h"

struct outcome {
    enum formscan_status status;
    char model[FORMSCAN_MODEL_MAX + 1];
    char error[160];
    uint64_t consumed;
};

/* Whole scans (formscan_init_whole) in the cases that ask for them. */
static bool whole_scan;

static bool reads_on(enum formscan_status st)
{
    return st == FORMSCAN_MORE || (whole_scan && st == FORMSCAN_MODEL);
}

static void start(struct formscan *s, const char *boundary)
{
    if (whole_scan) {
        formscan_init_whole(s, boundary, strlen(boundary));
    } else {
        formscan_init(s, boundary, strlen(boundary));
    }
}

static void finish_into(struct formscan *s, enum formscan_status st, struct outcome *o)
{
    if (reads_on(st)) {
        st = formscan_finish(s);
    }
    o->status = st;
    o->model[0] = o->error[0] = '\0';
    o->consumed = s->offset;
    if (st == FORMSCAN_MODEL) {
        size_t n;
        const char *m = formscan_model(s, &n);
        memcpy(o->model, m, n + 1);
    } else if (st == FORMSCAN_INVALID) {
        formscan_error(s, o->error, sizeof o->error);
    }
}

static void scan_step(const char *boundary, const char *body, size_t len, size_t step,
                      struct outcome *o)
{
    struct formscan s;
    start(&s, boundary);
    enum formscan_status st = FORMSCAN_MORE;
    for (size_t at = 0; at < len && reads_on(st); at += step) {
        st = formscan_feed(&s, body + at, at + step > len ? len - at : step);
    }
    finish_into(&s, st, o);
}

static void scan_split(const char *boundary, const char *body, size_t len, size_t cut,
                       struct outcome *o)
{
    struct formscan s;
    start(&s, boundary);
    enum formscan_status st = formscan_feed(&s, body, cut);
    if (reads_on(st)) {
        st = formscan_feed(&s, body + cut, len - cut);
    }
    finish_into(&s, st, o);
}

/* Scans body every way; checks all agree and returns the answer. */
static struct outcome scan(const char *boundary, const char *body, size_t len)
{
    struct outcome whole, other;
    scan_step(boundary, body, len, len ? len : 1, &whole);
    scan_step(boundary, body, len, 1, &other);
    assert_int_equal(other.status, whole.status);
    assert_string_equal(other.model, whole.model);
    assert_string_equal(other.error, whole.error);
    for (size_t cut = 0; cut <= len; cut++) {
        scan_split(boundary, body, len, cut, &other);
        assert_int_equal(other.status, whole.status);
        assert_string_equal(other.model, whole.model);
    }
    return whole;
}

static struct outcome scan_str(const char *boundary, const char *body)
{
    return scan(boundary, body, strlen(body));
}

static void test_model_field(void **state)
{
    const char *body = "--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
                       "Content-Type: audio/wav\r\n\r\n"
                       "RIFF\r\n--XY\r\n--Xy not yet\r\n"
                       "\r\n--XyZ\r\n"
                       "content-disposition: form-data; name=model\r\n\r\n"
                       "whisper-1\r\n--XyZ\r\n"
                       "Content-Disposition: form-data; name=\"model\"\r\n\r\n"
                       "second\r\n--XyZ--\r\n";
    struct outcome o = scan_str("XyZ", body);
    assert_int_equal(o.status, FORMSCAN_MODEL);
    assert_string_equal(o.model, "whisper-1");
    /* It stops at the end of the value's delimiter, before the next part. */
    const char *after = strstr(body, "whisper-1\r\n--XyZ") + strlen("whisper-1\r\n--XyZ");
    assert_int_equal(o.consumed, (uint64_t)(after - body));
}

static void test_quoted_and_preamble(void **state)
{
    struct outcome o = scan_str("b", "ignored preamble\r\n--b\r\n"
                                     "Content-Disposition: form-data; title=\"x;y\"; "
                                     "NAME=\"model\"\r\n\r\n"
                                     "org/Model \"q\"\r\n--b--");
    assert_int_equal(o.status, FORMSCAN_MODEL);
    assert_string_equal(o.model, "org/Model \"q\"");
    o = scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n\r\n--b--");
    assert_int_equal(o.status, FORMSCAN_MODEL);
    assert_string_equal(o.model, "");
    /* No padding after a delimiter, no bare LF or lone CR in part headers:
     * python-multipart reads those otherwise. */
    o = scan_str("b", "--b  \r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--");
    assert_int_equal(o.status, FORMSCAN_INVALID);
    o = scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"x\"\n"
                      "Content-Type: text/plain; name=\"model\"\r\n\r\nm\r\n--b--");
    assert_int_equal(o.status, FORMSCAN_INVALID);
    assert_string_equal(o.error, "part header line not ended by CRLF at byte 45");
    o = scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"x\"\rX\r\n\r\nm\r\n--b--");
    assert_int_equal(o.status, FORMSCAN_INVALID);
}

static void test_no_model(void **state)
{
    struct outcome o = scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"models\"\r\n"
                                     "\r\nx\r\n--b\r\nContent-Disposition: form-data; "
                                     "name=\"modelx\"\r\n\r\ny\r\n--b--\r\n");
    assert_int_equal(o.status, FORMSCAN_NO_MODEL);
    o = scan_str("b", "--b--");
    assert_int_equal(o.status, FORMSCAN_NO_MODEL);
}

static void test_invalid(void **state)
{
    assert_int_equal(scan_str("b", "").status, FORMSCAN_INVALID);
    assert_int_equal(scan_str("b", "{\"model\":\"x\"}").status, FORMSCAN_INVALID);
    assert_int_equal(scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"file\"\r\n"
                                   "\r\nunterminated")
                         .status,
                     FORMSCAN_INVALID);
    struct outcome o = scan_str("b", "--bx\r\n");
    assert_int_equal(o.status, FORMSCAN_INVALID);
    assert_string_equal(o.error, "unexpected byte after a boundary at byte 3");
}

/* A part whose name parsers read differently is refused, wherever it is: a
 * second name parameter (python-multipart keeps the last, others the
 * first), RFC 2231's name*=, a folded header line, two Content-Disposition
 * headers. Other long names are only not "model". */
static void expect_ambiguous(const char *headers, const char *error)
{
    char body[512];
    snprintf(body, sizeof body,
             "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
             "--b\r\n%s\r\n\r\nx\r\n--b--\r\n",
             headers);
    whole_scan = true;
    struct outcome o = scan_str("b", body);
    whole_scan = false;
    if (o.status != FORMSCAN_INVALID || strncmp(o.error, error, strlen(error)) != 0) {
        fail_msg("%s: status %d, error \"%s\"", headers, o.status, o.error);
    }
    /* Before the model field as well, in any scan. */
    snprintf(body, sizeof body, "--b\r\n%s\r\n\r\nx\r\n--b--\r\n", headers);
    o = scan_str("b", body);
    if (o.status != FORMSCAN_INVALID || strncmp(o.error, error, strlen(error)) != 0) {
        fail_msg("%s first: status %d, error \"%s\"", headers, o.status, o.error);
    }
}

static void test_ambiguous_part_names(void **state)
{
    const char *twice = "ambiguous name parameter in a part's Content-Disposition";
    expect_ambiguous("Content-Disposition: form-data; name=\"x\"; name=\"model\"", twice);
    expect_ambiguous("Content-Disposition: form-data; NAME=model; name=x", twice);
    expect_ambiguous("Content-Disposition: form-data; name*=UTF-8''model", twice);
    expect_ambiguous("Content-Disposition: form-data; name*0=\"mo\"; name*1=\"del\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model", twice);
    expect_ambiguous("Content-Disposition: form-data;\r\n name=\"model\"",
                     "folded part header line");
    expect_ambiguous("Content-Disposition: form-data; name=\"x\"\r\n"
                     "Content-Disposition: form-data; name=\"model\"",
                     "two Content-Disposition headers in a part");
    expect_ambiguous("Content-Disposition: attachment; name=\"model\"",
                     "a part's Content-Disposition is not form-data");
    expect_ambiguous(
        "Content-Disposition: form-data; name=\"x\"; q=\"\\\\\"; r=\"; name=model; s=\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"mo\\del\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model\"x", twice);
    expect_ambiguous("Content-Disposition: form-data; name=<model>", twice);
    expect_ambiguous("Content-Disposition: form-data; x\"=\"abc; name=model; y=\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=mo\"del", twice);
    expect_ambiguous("Content-Disposition: form-data; \"weird; name=model", twice);
    expect_ambiguous("Content-Disposition: form-datax; name=\"model\"",
                     "a part's Content-Disposition is not form-data");
    /* Python strips \xa0, \x85, \x0b, \x0c and \x1c-\x1f around keys and
     * values, and reads a bare "name" as name="". */
    expect_ambiguous("Content-Disposition: form-data;\xa0name=\"model\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name\x85=\"model\"", twice);
    expect_ambiguous("Content-Disposition: form-data; \x1fname=model", twice);
    expect_ambiguous("Content-Disposition: form-data; name=model\x0b", twice);
    expect_ambiguous("Content-Disposition: form-data; name=model x", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model\"\xa0", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model\"; name", twice);
    expect_ambiguous("Content-Disposition: form-data; =model", twice);
    expect_ambiguous("Content-Disposition: form-data; filename=\"a\\\"; name=\"model\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model\"; filename=\"m.txt\"",
                     "the model field is a file");
    /* A bare RFC 2231 key: Python's email reads it as the key, valued "". */
    expect_ambiguous("Content-Disposition: form-data; name=model; name*", twice);
    expect_ambiguous("Content-Disposition: form-data; name*0; name=\"model\"", twice);
    expect_ambiguous("Content-Disposition: form-data; name=\"model\"; filename*",
                     "the model field is a file");
    expect_ambiguous("Content-Disposition: form-data name=model",
                     "a part's Content-Disposition is not form-data");
    /* Not ambiguous: long names, filename*, names that only start alike, a
     * Windows path's backslashes in a filename (browsers and curl send
     * them as they are), UTF-8 in a quoted filename. */
    whole_scan = true;
    struct outcome o = scan_str(
        "b", "--b\r\nContent-Disposition: form-data; name=\"a_rather_long_field_name_here\"; "
             "filename*=UTF-8''a%20b.wav\r\n\r\nx\r\n--b\r\n"
             "Content-Disposition: form-data; name=\"f\"; filename=\"C:\\Users\\\xc3\xa9.wav\""
             "\r\n\r\nx\r\n--b\r\n"
             "Content-Disposition: form-data; name=\"modelx\"; names=\"model\"\r\n\r\ny\r\n"
             "--b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--b--");
    whole_scan = false;
    assert_int_equal(o.status, FORMSCAN_MODEL);
    assert_string_equal(o.model, "m");
}

static void test_bounds(void **state)
{
    /* A model value longer than the bound. */
    size_t n = FORMSCAN_MODEL_MAX + 200;
    char *body = malloc(n + 200);
    int len = sprintf(body, "--b\r\nContent-Disposition: form-data; name=model\r\n\r\n");
    memset(body + len, 'm', FORMSCAN_MODEL_MAX + 1);
    len += FORMSCAN_MODEL_MAX + 1;
    len += sprintf(body + len, "\r\n--b--");
    assert_int_equal(scan("b", body, (size_t)len).status, FORMSCAN_MODEL_TOO_LONG);
    /* Exactly the bound is fine. */
    len = sprintf(body, "--b\r\nContent-Disposition: form-data; name=model\r\n\r\n");
    memset(body + len, 'm', FORMSCAN_MODEL_MAX);
    len += FORMSCAN_MODEL_MAX;
    len += sprintf(body + len, "\r\n--b--");
    assert_int_equal(scan("b", body, (size_t)len).status, FORMSCAN_MODEL);
    free(body);
    /* A header line longer than the bound. */
    size_t hn = FORMSCAN_LINE_MAX + 100;
    char *h = malloc(hn + 64);
    len = sprintf(h, "--b\r\nX: ");
    memset(h + len, 'h', FORMSCAN_LINE_MAX);
    len += FORMSCAN_LINE_MAX;
    len += sprintf(h + len, "\r\n\r\n");
    struct formscan s;
    formscan_init(&s, "b", 1);
    assert_int_equal(formscan_feed(&s, h, (size_t)len), FORMSCAN_INVALID);
    free(h);
}

/* A large file part is skipped in pieces with no copy kept; the model after it is found. */
static void test_large_part(void **state)
{
    size_t big = 4 * 1024 * 1024;
    char *body = malloc(big + 512);
    int len = sprintf(body, "--boundary42\r\nContent-Disposition: form-data; name=\"file\"; "
                            "filename=\"f\"\r\n\r\n");
    for (size_t i = 0; i < big; i++) {
        body[len + i] = "\r\n--boundary4"[i % 13]; /* near-misses everywhere */
    }
    len += (int)big;
    len += sprintf(body + len, "\r\n--boundary42\r\nContent-Disposition: form-data; "
                               "name=\"model\"\r\n\r\nbig\r\n--boundary42--\r\n");
    struct formscan s;
    formscan_init(&s, "boundary42", 10);
    enum formscan_status st = FORMSCAN_MORE;
    for (int at = 0; at < len && st == FORMSCAN_MORE; at += 65536) {
        st = formscan_feed(&s, body + at, (size_t)(len - at < 65536 ? len - at : 65536));
    }
    assert_int_equal(st, FORMSCAN_MODEL);
    size_t n;
    assert_string_equal(formscan_model(&s, &n), "big");
    free(body);
}

static void test_boundary_param(void **state)
{
    char b[FORMSCAN_BOUNDARY_MAX + 1];
    const char *ct = "multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxk";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 30);
    assert_string_equal(b, "----WebKitFormBoundary7MA4YWxk");
    ct = "multipart/form-data; charset=utf-8; BOUNDARY=\"a b:c\"";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 5);
    assert_string_equal(b, "a b:c");
    /* Refused where parsers would read another form or other names: a type
     * not in lower case, a charset besides UTF-8, a backslash or bytes after
     * the quote in a quoted value, a bracketed value. */
    const char *refused[] = {
        "Multipart/Form-Data; boundary=a",
        "multipart/form-data; boundary=a; charset=utf-7",
        "multipart/form-data; boundary=a; charset=us-ascii",
        "multipart/form-data; boundary=a;\240charset=latin-1",
        "multipart/form-data; boundary=a; charset",
        "multipart/form-data; boundary=XYZ; boundary*",
        "multipart/form-data; boundary*; boundary=XYZ",
        "multipart/form-data; boundary=\"X\\X\"",
        "multipart/form-data; boundary=\"a\"b",
        "multipart/form-data; q=\"\\\\\"; boundary=YY; r=\"; boundary=XX; s=\"",
        "multipart/form-data; boundary=<XX>",
        "multipart/form-data; x\"=\"; boundary=AAA; y=\"; boundary=BBB"};
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        if (formscan_boundary(refused[k], strlen(refused[k]), b) != 0) {
            fail_msg("accepted: %s", refused[k]);
        }
    }
    ct = "application/json";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    ct = "multipart/form-data";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    ct = "multipart/form-dataX; boundary=a";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    ct = "multipart/form-data; boundary=";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    /* Two boundaries: parsers differ on which one counts. */
    ct = "multipart/form-data; boundary=AAAA; boundary=BBBB";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    ct = "multipart/form-data; boundary=AAAA; BOUNDARY=\"AAAA\"";
    assert_int_equal(formscan_boundary(ct, strlen(ct), b), 0);
    char longer[200];
    snprintf(longer, sizeof longer, "multipart/form-data; boundary=%071d", 0);
    assert_int_equal(formscan_boundary(longer, strlen(longer), b), 0);
}

/* The proxy's scan reads the whole form: a second field named "model" (the
 * one a server's form parser keeps) and a form that never closes are
 * refused; the model is kept across the parts after it. */
static void test_whole_form(void **state)
{
    whole_scan = true;
    const char *twice = "--b\r\n"
                        "Content-Disposition: form-data; name=\"model\"\r\n\r\n"
                        "whisper-1\r\n--b\r\n"
                        "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
                        "RIFF\r\n--b\r\n"
                        "Content-Disposition: form-data; name=model\r\n\r\n"
                        "other\r\n--b--\r\n";
    assert_int_equal(scan_str("b", twice).status, FORMSCAN_DUPLICATE_MODEL);
    const char *once = "--b\r\n"
                       "Content-Disposition: form-data; name=\"model\"\r\n\r\n"
                       "whisper-1\r\n--b\r\n"
                       "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
                       "RIFF and more bytes\r\n--b\r\n"
                       "Content-Disposition: form-data; name=\"models\"\r\n\r\n"
                       "x\r\n--b--\r\n";
    struct outcome o = scan_str("b", once);
    assert_int_equal(o.status, FORMSCAN_MODEL);
    assert_string_equal(o.model, "whisper-1");
    assert_int_equal(o.consumed, (uint64_t)(strstr(once, "--b--") + 5 - once));
    /* The form must close: a body cut after the model is refused. */
    size_t cut = (size_t)(strstr(once, "RIFF") - once);
    assert_int_equal(scan("b", once, cut).status, FORMSCAN_INVALID);
    assert_int_equal(scan_str("b", "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n"
                                   "1\r\n--b--")
                         .status,
                     FORMSCAN_NO_MODEL);
    whole_scan = false;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_field),
        cmocka_unit_test(test_quoted_and_preamble),
        cmocka_unit_test(test_no_model),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_large_part),
        cmocka_unit_test(test_boundary_param),
        cmocka_unit_test(test_whole_form),
        cmocka_unit_test(test_ambiguous_part_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* HTTP parser: heads, pipelining, chunked bodies, limits, strictness, responses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/http.h"
#include "thaw/metrics.h"

static struct http_limits lim = {1024, 8, 100};

struct ctx {
    struct http_parser p;
    struct http_head h;
    struct buf body;
};

static void ctx_init(struct ctx *c, llhttp_type_t type)
{
    http_parser_init(&c->p, type, &lim);
    http_head_init(&c->h);
    buf_init(&c->body);
    http_parser_next(&c->p, &c->h, type == HTTP_REQUEST ? &c->body : NULL);
}

static void ctx_dispose(struct ctx *c)
{
    http_head_dispose(&c->h);
    buf_dispose(&c->body);
}

/* Feeds everything (in pieces of `step` bytes); returns the last event and
 * leaves *rest pointing after what was consumed. */
static enum http_event feed(struct ctx *c, const char *data, size_t len, size_t step,
                            const char **rest, int *saw_head)
{
    size_t off = 0;
    enum http_event ev = HTTP_EV_NEED_MORE;
    while (off < len || ev == HTTP_EV_HEAD) {
        size_t n = len - off < step ? len - off : step;
        size_t used = 0;
        ev = http_parser_execute(&c->p, data + off, n, &used);
        off += used;
        if (ev == HTTP_EV_HEAD && saw_head) {
            (*saw_head)++;
        }
        if (ev == HTTP_EV_DONE || ev == HTTP_EV_ERROR) {
            break;
        }
    }
    if (rest) {
        *rest = data + off;
    }
    return ev;
}

static void test_simple_get_and_headers(void **state)
{
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    const char *req = "GET /a/b?c=d HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nAccept: */*\r\n\r\n";
    int heads = 0;
    assert_int_equal(feed(&c, req, strlen(req), 1000, NULL, &heads), HTTP_EV_DONE);
    assert_int_equal(heads, 1);
    assert_int_equal(c.h.method, HTTP_GET);
    assert_string_equal(http_target(&c.h), "/a/b?c=d");
    assert_int_equal(c.h.n_headers, 3);
    const struct http_header *x = http_head_find(&c.h, "ACCEPT");
    assert_non_null(x);
    assert_string_equal(http_hvalue(&c.h, x), "*/*");
    x = http_head_find(&c.h, "x-empty");
    assert_non_null(x);
    assert_int_equal(x->value_len, 0);
    assert_string_equal(http_hvalue(&c.h, x), "");
    assert_true(c.h.keep_alive);
    ctx_dispose(&c);
}

/* A field value excludes the whitespace around it (RFC 9110, 5.5), at its
 * end too, whether it arrives whole or a byte at a time. */
static void test_whitespace_around_values_is_not_part_of_them(void **state)
{
    const char *req = "GET / HTTP/1.1\r\nHost: x \r\nthaw-priority:\t batch \t \r\n"
                      "Authorization: Bearer k1  \r\nX-Blank:   \r\nX-In: a b\r\n\r\n";
    for (size_t step = 1; step <= 1000; step += 999) {
        struct ctx c;
        ctx_init(&c, HTTP_REQUEST);
        assert_int_equal(feed(&c, req, strlen(req), step, NULL, NULL), HTTP_EV_DONE);
        const struct http_header *x = http_head_find(&c.h, "thaw-priority");
        assert_int_equal(x->value_len, 5);
        assert_string_equal(http_hvalue(&c.h, x), "batch");
        assert_string_equal(http_hvalue(&c.h, http_head_find(&c.h, "host")), "x");
        assert_string_equal(http_hvalue(&c.h, http_head_find(&c.h, "authorization")),
                            "Bearer k1");
        x = http_head_find(&c.h, "x-blank");
        assert_int_equal(x->value_len, 0);
        assert_string_equal(http_hvalue(&c.h, x), "");
        assert_string_equal(http_hvalue(&c.h, http_head_find(&c.h, "x-in")), "a b");
        ctx_dispose(&c);
    }
}

static void test_byte_by_byte_equals_whole(void **state)
{
    const char *req = "POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\nTrailer: t\r\n\r\n";
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    assert_int_equal(feed(&c, req, strlen(req), 1, NULL, NULL), HTTP_EV_DONE);
    assert_int_equal(c.body.len, 9);
    assert_memory_equal(c.body.data, "wikipedia", 9);
    assert_true(c.h.chunked);
    assert_string_equal(http_hvalue(&c.h, http_head_find(&c.h, "host")), "h");
    /* Trailer fields are dropped, not added to the head. */
    assert_null(http_head_find(&c.h, "trailer"));
    assert_int_equal(c.h.n_headers, 2);
    ctx_dispose(&c);
}

static void test_pipelined_requests_one_at_a_time(void **state)
{
    const char *reqs = "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n"
                       "POST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
                       "GET /3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    const char *p = reqs, *end = reqs + strlen(reqs);
    const char *want[] = {"/1", "/2", "/3"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(feed(&c, p, (size_t)(end - p), 4096, &p, NULL), HTTP_EV_DONE);
        assert_string_equal(http_target(&c.h), want[i]);
        if (i == 1) {
            assert_int_equal(c.body.len, 3);
        }
        if (i == 2) {
            assert_false(c.h.keep_alive);
        }
        buf_reset(&c.body);
        http_parser_next(&c.p, &c.h, &c.body);
    }
    assert_ptr_equal(p, end);
    ctx_dispose(&c);
}

static enum http_error error_of(const char *req)
{
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    enum http_event ev = feed(&c, req, strlen(req), 4096, NULL, NULL);
    enum http_error e = ev == HTTP_EV_ERROR ? c.p.error : HTTP_ERR_NONE;
    ctx_dispose(&c);
    return e;
}

/* What a log line says of the refusal of req: never empty. */
static void assert_error_text(const char *req, const char *want)
{
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    assert_int_equal(feed(&c, req, strlen(req), 4096, NULL, NULL), HTTP_EV_ERROR);
    assert_string_equal(http_parser_error_text(&c.p), want);
    ctx_dispose(&c);
}

static void test_strict_rejections(void **state)
{
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n"),
                     HTTP_ERR_BAD_LENGTH);
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
                              "Content-Length: 3\r\n\r\nabc"),
                     HTTP_ERR_BAD_LENGTH);
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3x\r\n\r\n"),
                     HTTP_ERR_BAD_LENGTH);
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "g\r\n"),
                     HTTP_ERR_BAD_CHUNK);
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "3\r\nabcXY0\r\n\r\n"),
                     HTTP_ERR_BAD_CHUNK);
    /* The same, fed one byte at a time (the CRLF check spans reads). */
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    const char *smuggle = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "3\r\nabc\rY0\r\n\r\n";
    assert_int_equal(feed(&c, smuggle, strlen(smuggle), 1, NULL, NULL), HTTP_EV_ERROR);
    assert_int_equal(c.p.error, HTTP_ERR_BAD_CHUNK);
    ctx_dispose(&c);
    assert_int_equal(error_of("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
    /* Other major versions: 505, from llhttp's own check or thaw's. */
    assert_int_equal(error_of("GET / HTTP/9.9\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_VERSION);
    assert_int_equal(error_of("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_VERSION);
    assert_int_equal(error_of("GET / HTTP/0.9\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_VERSION);
    /* The HTTP/2 connection preface, as curl --http2-prior-knowledge sends it. */
    assert_int_equal(error_of("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), HTTP_ERR_BAD_VERSION);
    assert_int_equal(error_of("GET / HTTP/1.x\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
    /* Chunk extensions: 4096 bytes per message at most. */
    char ext[8192];
    int n = snprintf(ext, sizeof ext, "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
                                      "\r\n\r\n");
    for (int i = 0; i < 5; i++) {
        n += snprintf(ext + n, sizeof ext - (size_t)n, "1;e=%01000d\r\nx\r\n", 0);
    }
    snprintf(ext + n, sizeof ext - (size_t)n, "0\r\n\r\n");
    assert_int_equal(error_of(ext), HTTP_ERR_BAD_CHUNK);
    assert_int_equal(error_of(" GET / HTTP/1.1\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
    /* Control bytes in the target (llhttp lets TAB and FF through). */
    assert_int_equal(error_of("GET /a\tb HTTP/1.1\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
    assert_int_equal(error_of("GET /a\fb HTTP/1.1\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
    assert_int_equal(error_of("GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n"), HTTP_ERR_BAD_REQUEST);
}

static void test_limits(void **state)
{
    char big[2048];
    snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: h\r\nX: %01200d\r\n\r\n", 0);
    assert_int_equal(error_of(big), HTTP_ERR_HEAD_TOO_LARGE);
    /* 9 headers with a limit of 8 */
    assert_int_equal(error_of("GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\n"
                              "G: 1\r\nH: 1\r\nI: 1\r\n\r\n"),
                     HTTP_ERR_TOO_MANY_HEADERS);
    assert_error_text("GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\n"
                      "G: 1\r\nH: 1\r\nI: 1\r\n\r\n",
                      "more headers than the limit");
    assert_error_text("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\n\r\n",
                      "the body is over the limit");
    assert_int_equal(error_of("GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\n"
                              "G: 1\r\nH: 1\r\n\r\n"),
                     HTTP_ERR_NONE);
    /* Announced body over 100 bytes: refused at the head. */
    assert_int_equal(error_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\n\r\n"),
                     HTTP_ERR_BODY_TOO_LARGE);
    /* Chunked body growing past it. */
    char chunked[512];
    snprintf(chunked, sizeof chunked,
             "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n%064d\r\n"
             "40\r\n%064d\r\n0\r\n\r\n",
             0, 0);
    assert_int_equal(error_of(chunked), HTTP_ERR_BODY_TOO_LARGE);
}

static void test_head_limit_counts_only_head_bytes(void **state)
{
    /* A head just under the limit followed by a body in the same chunk. */
    char req[1200];
    int n = snprintf(req, sizeof req, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 90\r\nX: ");
    int pad = 1024 - n - 4;
    memset(req + n, 'a', (size_t)pad);
    n += pad;
    memcpy(req + n, "\r\n\r\n", 4);
    n += 4;
    memset(req + n, 'b', 90);
    req[n + 90] = '\0';
    assert_int_equal(error_of(req), HTTP_ERR_NONE);
}

static void test_expect_and_tokens(void **state)
{
    assert_true(http_token_list_has("keep-alive, Upgrade", 19, "upgrade"));
    assert_false(http_token_list_has("keep-alive, Upgrader", 20, "upgrade"));
    assert_true(http_token_list_has(" close ", 7, "close"));
}

static void test_host_values(void **state)
{
    const char *good[] = {"", "llama", "llama.models.svc.cluster.local", "llama.models:8080",
                          "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:8080",
                          "[::1%25lo]:1", "my_host", "a-b.c", "x:65535", "x:"};
    const char *bad[] = {"[::1", "::1", "[::1]:99999", "[]", "a b", "a/b", "a:b", "a:1:2",
                         "x:123456", "[::1]x", "a@b", "a\\b", "x:65536"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        assert_true(http_host_valid(good[i], strlen(good[i])));
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (http_host_valid(bad[i], strlen(bad[i]))) {
            fail_msg("taken for a valid Host: %s", bad[i]);
        }
    }
    assert_false(http_host_valid("a\0b", 3)); /* a NUL inside */
}

static void test_hop_by_hop(void **state)
{
    struct ctx c;
    ctx_init(&c, HTTP_REQUEST);
    const char *req = "GET / HTTP/1.1\r\nHost: h\r\nConnection: X-Secret, keep-alive\r\n"
                      "X-Secret: 1\r\nX-Public: 2\r\nTE: trailers\r\n\r\n";
    assert_int_equal(feed(&c, req, strlen(req), 4096, NULL, NULL), HTTP_EV_DONE);
    int hop = 0;
    for (uint32_t i = 0; i < c.h.n_headers; i++) {
        hop += http_is_hop_by_hop(&c.h, &c.h.headers[i]);
    }
    assert_int_equal(hop, 3); /* Connection, X-Secret, TE */
    assert_false(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "x-public")));
    ctx_dispose(&c);
    /* A header named by a Connection header that comes after it. */
    ctx_init(&c, HTTP_REQUEST);
    req = "GET / HTTP/1.1\r\nX-Secret: 1\r\nHost: h\r\nconnection: x-secret\r\n\r\n";
    assert_int_equal(feed(&c, req, strlen(req), 4096, NULL, NULL), HTTP_EV_DONE);
    assert_true(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "x-secret")));
    assert_false(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "host")));
    ctx_dispose(&c);
    /* Connection naming only close and keep-alive: a header named close is
     * hop-by-hop, the others are not; fed a byte at a time. */
    ctx_init(&c, HTTP_RESPONSE);
    req = "HTTP/1.1 200 OK\r\nClose: 1\r\nConnection: Keep-Alive , close\r\nX-A: 2\r\n"
          "Content-Length: 0\r\n\r\n";
    assert_int_equal(feed(&c, req, strlen(req), 1, NULL, NULL), HTTP_EV_DONE);
    assert_true(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "close")));
    assert_false(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "x-a")));
    assert_false(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "content-length")));
    ctx_dispose(&c);
    /* A second Connection header naming another header. */
    ctx_init(&c, HTTP_RESPONSE);
    req = "HTTP/1.1 200 OK\r\nConnection: close\r\nX-A: 2\r\nX-B: 3\r\n"
          "Connection: x-b\r\nContent-Length: 0\r\n\r\n";
    assert_int_equal(feed(&c, req, strlen(req), 4096, NULL, NULL), HTTP_EV_DONE);
    assert_true(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "x-b")));
    assert_false(http_is_hop_by_hop(&c.h, http_head_find(&c.h, "x-a")));
    ctx_dispose(&c);
    /* The next message on the connection starts with nothing named. */
    ctx_init(&c, HTTP_RESPONSE);
    req = "HTTP/1.1 200 OK\r\nConnection: x-a\r\nContent-Length: 0\r\n\r\n";
    assert_int_equal(feed(&c, req, strlen(req), 4096, NULL, NULL), HTTP_EV_DONE);
    http_head_reset(&c.h);
    assert_false(c.h.connection_names_other || c.h.connection_names_close);
    ctx_dispose(&c);
}

struct sink {
    char data[256];
    size_t len;
};

static void collect(void *ud, const char *d, size_t n)
{
    struct sink *s = ud;
    memcpy(s->data + s->len, d, n);
    s->len += n;
}

static void test_response_modes(void **state)
{
    struct ctx c;
    struct sink s = {.len = 0};
    ctx_init(&c, HTTP_RESPONSE);
    c.p.on_body = collect;
    c.p.ud = &s;
    const char *resp = "HTTP/1.1 200 Fine\r\nContent-Length: 5\r\n\r\nhello";
    assert_int_equal(feed(&c, resp, strlen(resp), 3, NULL, NULL), HTTP_EV_DONE);
    assert_int_equal(c.h.status, 200);
    assert_string_equal(http_target(&c.h), "Fine"); /* reason phrase */
    assert_int_equal(s.len, 5);

    /* No body after 204, 304, or a response to HEAD. */
    http_parser_next(&c.p, &c.h, NULL);
    const char *r204 = "HTTP/1.1 204 No Content\r\n\r\n";
    assert_int_equal(feed(&c, r204, strlen(r204), 4096, NULL, NULL), HTTP_EV_DONE);
    http_parser_next(&c.p, &c.h, NULL);
    c.p.skip_body = true;
    const char *rhead = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
    int heads = 0;
    assert_int_equal(feed(&c, rhead, strlen(rhead), 4096, NULL, &heads), HTTP_EV_DONE);
    assert_int_equal(heads, 1);
    assert_int_equal(c.h.content_length, 1000);

    /* Close-delimited: ends at finish(). */
    http_parser_next(&c.p, &c.h, NULL);
    s.len = 0;
    const char *rclose = "HTTP/1.1 200 OK\r\n\r\nuntil eof";
    assert_int_equal(feed(&c, rclose, strlen(rclose), 4096, NULL, NULL), HTTP_EV_NEED_MORE);
    assert_true(http_parser_needs_eof(&c.p));
    assert_int_equal(http_parser_finish(&c.p), HTTP_EV_DONE);
    assert_int_equal(s.len, 9);
    ctx_dispose(&c);

    /* Truncated Content-Length body: finish() is an error. */
    ctx_init(&c, HTTP_RESPONSE);
    const char *cut = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
    assert_int_equal(feed(&c, cut, strlen(cut), 4096, NULL, NULL), HTTP_EV_NEED_MORE);
    assert_int_equal(http_parser_finish(&c.p), HTTP_EV_ERROR);
    ctx_dispose(&c);
}

/* Every status thaw answers a request with has its reason phrase. */
static void test_every_rejection_status_has_a_reason_phrase(void **state)
{
    for (int r = 0; r < REJECT_COUNT; r++) {
        int status = reject_info((enum reject_reason)r)->status;
        if (strcmp(http_reason_phrase(status), "Unknown") == 0) {
            fail_msg("no reason phrase for %d (%s)", status,
                     reject_info((enum reject_reason)r)->name);
        }
    }
    /* A replica's status named in a message (FastAPI's validation 422). */
    assert_string_equal(http_reason_phrase(422), "Unprocessable Content");
    assert_string_equal(http_reason_phrase(403), "Forbidden");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_get_and_headers),
        cmocka_unit_test(test_whitespace_around_values_is_not_part_of_them),
        cmocka_unit_test(test_byte_by_byte_equals_whole),
        cmocka_unit_test(test_pipelined_requests_one_at_a_time),
        cmocka_unit_test(test_strict_rejections),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_head_limit_counts_only_head_bytes),
        cmocka_unit_test(test_expect_and_tokens),
        cmocka_unit_test(test_host_values),
        cmocka_unit_test(test_hop_by_hop),
        cmocka_unit_test(test_response_modes),
        cmocka_unit_test(test_every_rejection_status_has_a_reason_phrase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

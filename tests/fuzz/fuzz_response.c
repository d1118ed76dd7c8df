/* libFuzzer target: the response parser, driven as src/http/upstream.c drives it
 * on a replica's connection. The first input byte picks the read size and
 * whether the request was a HEAD; the rest is what the replica sent: interim
 * 1xx responses are skipped, each final head goes through the hop-by-hop
 * filter, bodies (chunked, Content-Length or close-delimited) are decoded,
 * keep-alive responses follow one another, and the end of input is the
 * replica closing. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct body_count {
    uint64_t bytes;
};

static void count_body(void *ud, const char *data, size_t len)
{
    struct body_count *bc = ud;
    if (len > 0) {
        /* Touch both ends: ASan checks the span lies inside the input. */
        volatile char first = data[0], last = data[len - 1];
        (void)first;
        (void)last;
    }
    bc->bytes += len;
}

/* What forward_head reads of a final head. */
static void inspect_head(const struct http_head *h)
{
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (x->name_off + x->name_len >= h->bytes.len || x->value_off + x->value_len >= h->bytes.len) {
            __builtin_trap(); /* names and values are NUL-terminated inside bytes */
        }
        (void)http_is_hop_by_hop(h, x);
    }
    if (h->target_off + h->target_len >= h->bytes.len) {
        __builtin_trap();
    }
    (void)http_head_find(h, "content-length");
}

static void arm(struct http_parser *p, struct http_head *h, struct body_count *bc, bool head_req)
{
    http_parser_next(p, h, NULL);
    p->skip_body = head_req;
    p->on_body = count_body;
    p->ud = bc;
    bc->bytes = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    size_t step = (size_t)(data[0] % 64) + 1;
    bool head_req = (data[0] & 0x40) != 0;
    const char *p = (const char *)data + 1;
    size_t left = size - 1;
    static const struct http_limits lim = {4096, 32, 8192};
    struct http_parser parser;
    struct http_head head;
    struct body_count bc = {0};
    http_parser_init(&parser, HTTP_RESPONSE, &lim);
    http_head_init(&head);
    arm(&parser, &head, &bc, head_req);
    bool streaming = false;
    int responses = 0;
    size_t off = 0;
    int again = 0; /* a head or message just ended: run once more on no input */
    bool failed = false;
    while (responses < 64) {
        size_t n = left - off < step ? left - off : step;
        if (n == 0 && !again) {
            break;
        }
        again = 0;
        size_t used = 0;
        enum http_event ev = http_parser_execute(&parser, p + off, n, &used);
        if (used > n) {
            __builtin_trap();
        }
        off += used;
        if (ev == HTTP_EV_ERROR) {
            failed = true;
            break;
        }
        if (ev == HTTP_EV_HEAD) {
            again = 1;
            if (head.status >= 100 && head.status < 200 && head.status != 101) {
                continue; /* interim response */
            }
            inspect_head(&head);
            streaming = true;
        } else if (ev == HTTP_EV_DONE) {
            again = 1;
            if (!streaming) {
                arm(&parser, &head, &bc, head_req);
                continue;
            }
            if (head.has_length && !head.chunked && !head_req && head.status >= 200 &&
                head.status != 204 && head.status != 304 && bc.bytes != head.content_length) {
                __builtin_trap(); /* a Content-Length body ends at its length */
            }
            responses++;
            if (!head.keep_alive) {
                break;
            }
            streaming = false;
            arm(&parser, &head, &bc, head_req);
        }
    }
    if (!failed && streaming && off == left) {
        (void)http_parser_needs_eof(&parser);
        (void)http_parser_finish(&parser); /* the replica closed */
    }
    http_head_dispose(&head);
    return 0;
}

/* HTTP/1.x message parsing on llhttp (strict mode), independent of sockets.
 *
 * A struct http_parser turns bytes into one struct http_head at a time (and,
 * for requests, a de-chunked body in a struct buf). It stops ("pauses") at
 * the end of the head and at the end of each message so the caller can act
 * (send 100 Continue, route, hand off) before feeding more bytes; pipelined
 * messages are therefore processed strictly one after another.
 * Limits (head bytes, header count, body bytes) are enforced here and
 * reported as an enum http_error naming what was wrong. */
#ifndef THAW_HTTP_H
#define THAW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "thaw/buf.h"

struct http_header {
    uint32_t name_off, name_len;
    uint32_t value_off, value_len;
};

/* A parsed request or response head. Names and values live in `bytes`. */
struct http_head {
    struct buf bytes;
    struct http_header *headers;
    uint32_t n_headers, cap_headers;
    uint32_t target_off, target_len; /* request-target, or a response's reason phrase */
    uint8_t method;                  /* llhttp_method_t; valid when method_known */
    bool method_known;               /* the request line got past its method */
    uint8_t http_major, http_minor;
    uint16_t status;       /* responses only */
    bool keep_alive;       /* after this message, per llhttp */
    bool chunked;          /* Transfer-Encoding: chunked */
    bool body_ignored;     /* a 204 (Content-Length) or 304 (chunked) whose head declared
                              a body: none was read, and keep_alive is false */
    bool has_length;       /* Content-Length present */
    uint64_t content_length;
    /* What Connection headers name besides the fixed hop-by-hop headers:
     * "close" (a header of that name would be hop-by-hop too), and whether
     * any other token (then every header is looked up in them). */
    bool connection_names_close;
    bool connection_names_other;
};

enum http_error {
    HTTP_ERR_NONE = 0,
    HTTP_ERR_BAD_REQUEST,     /* malformed syntax */
    HTTP_ERR_BAD_LENGTH,      /* CL with TE, duplicate or invalid CL */
    HTTP_ERR_BAD_CHUNK,       /* bad chunked framing */
    HTTP_ERR_HEAD_TOO_LARGE,  /* header block over max_head_bytes */
    HTTP_ERR_TOO_MANY_HEADERS,
    HTTP_ERR_BODY_TOO_LARGE,
    HTTP_ERR_NO_MEMORY,
    HTTP_ERR_BAD_VERSION,     /* a request's HTTP major version is not 1 */
    HTTP_ERR_TRANSFER_CODING, /* a Transfer-Encoding besides chunked alone */
};

/* Chunk extensions are parsed and dropped; their bytes per request are capped. */
#define HTTP_MAX_CHUNK_EXT_BYTES 4096

struct http_limits {
    size_t max_head_bytes;
    size_t max_headers;
    uint64_t max_body_bytes; /* requests; bodies stored in `body` */
};

enum http_event {
    HTTP_EV_NEED_MORE = 0, /* all input consumed, message not finished */
    HTTP_EV_HEAD,          /* head complete; resume with more execute calls */
    HTTP_EV_DONE,          /* message complete; call http_parser_next before the next one */
    HTTP_EV_ERROR,         /* see parser->error; the stream cannot be resynchronised */
};

/* Receives body bytes of responses (decoded: no chunk framing). */
typedef void (*http_body_cb)(void *ud, const char *data, size_t len);

struct http_parser {
    llhttp_t ll;
    const struct http_limits *limits;
    struct http_head *head; /* filled while parsing; owned by the caller */
    struct buf *body;       /* requests: body is appended here; may be NULL */
    http_body_cb on_body;   /* responses: body spans go here; may be NULL */
    void *ud;
    size_t head_bytes;
    size_t chunk_ext_bytes; /* chunk extensions of this message */
    size_t trailer_bytes;   /* trailer fields of this message (dropped) */
    enum http_error error;
    const char *why; /* thaw's own description of `error`, or NULL (llhttp's applies) */
    bool in_head;
    bool head_done;
    bool head_reported;
    bool msg_done;
    bool last_was_value;
    bool in_connection; /* the header being parsed is Connection */
    bool skip_body; /* responses to HEAD */
    /* Chunk framing check (see http.c). */
    bool chunk_had_data;
    const char *cur;
    uint64_t abs, body_end_abs;
    unsigned char hist[2];
};

void http_head_init(struct http_head *h);
void http_head_reset(struct http_head *h);
void http_head_dispose(struct http_head *h);

/* type: HTTP_REQUEST or HTTP_RESPONSE. */
void http_parser_init(struct http_parser *p, llhttp_type_t type, const struct http_limits *limits);
/* Points the parser at the storage for the next message and re-arms it. */
void http_parser_next(struct http_parser *p, struct http_head *head, struct buf *body);
/* Feeds data; *used says how many bytes were consumed. */
enum http_event http_parser_execute(struct http_parser *p, const char *data, size_t len,
                                    size_t *used);
/* What was wrong with the input, for logs and error bodies: a fixed text,
 * never bytes of the input. */
const char *http_parser_error_text(const struct http_parser *p);
/* Tells the parser the peer closed: completes close-delimited bodies.
 * Returns HTTP_EV_DONE, HTTP_EV_ERROR (truncated message) or HTTP_EV_NEED_MORE
 * when no message had started. */
enum http_event http_parser_finish(struct http_parser *p);
/* Whether a Host value is host[:port] as RFC 3986 writes an authority
 * without userinfo: an IP literal in brackets (hex digits, colons, dots, a
 * zone after %), or a name of unreserved, sub-delims and %-escapes, then
 * optionally a port of at most 5 digits up to 65535. Empty is valid (no
 * authority). */
bool http_host_valid(const char *h, size_t n);
/* Most interim answers (1xx but 101) http_answer_feed skips before the real
 * one: a server that sends nothing else does not hold its caller. */
#define HTTP_MAX_INTERIM 10
/* Reads the answer to a request of thaw's own (a readiness probe, a
 * sleep-mode call) from a response parser pointed at its head by
 * http_parser_next: feeds data, skipping interim answers (103 Early Hints)
 * as *interim counts them. Returns HTTP_EV_DONE with the final answer's
 * head (an interim one past the limit ends it too), HTTP_EV_NEED_MORE, or
 * HTTP_EV_ERROR; *used: the bytes taken (any past a DONE are not part of
 * the answer). */
enum http_event http_answer_feed(struct http_parser *p, unsigned *interim, const char *data,
                                 size_t len, size_t *used);
/* True when this response ends only when the connection closes. */
bool http_parser_needs_eof(const struct http_parser *p);
/* Whether a message has begun (some bytes of it were seen). */
bool http_parser_started(const struct http_parser *p);

/* Header lookup, case-insensitive; the first match. NULL when absent. */
const struct http_header *http_head_find(const struct http_head *h, const char *name);
/* Number of headers with that name. */
unsigned http_head_count(const struct http_head *h, const char *name);
static inline const char *http_hname(const struct http_head *h, const struct http_header *x)
{
    return h->bytes.data + x->name_off;
}
static inline const char *http_hvalue(const struct http_head *h, const struct http_header *x)
{
    return h->bytes.data + x->value_off;
}
static inline const char *http_target(const struct http_head *h)
{
    return h->bytes.data + h->target_off;
}
/* An absolute-form request-target ("http://host:port/path"): its authority
 * without userinfo, which replaces the Host header (RFC 9112 3.2.2).
 * false for other forms. */
bool http_target_authority(const struct http_head *h, const char **auth, size_t *len);
/* The part of a request-target safe to log: the path without its query (keys
 * travel there) and, for absolute-form, without scheme and authority (which
 * may hold userinfo). May be empty. */
void http_target_log_path(const struct http_head *h, const char **path, size_t *len);
/* True when the comma-separated list `list` holds token (case-insensitive). */
bool http_token_list_has(const char *list, size_t len, const char *token);
/* Inline, so that with a literal b the length test, which settles most
 * calls, costs no strlen. */
static inline bool http_name_eq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    return alen == blen && strncasecmp(a, b, alen) == 0;
}
/* Hop-by-hop headers (RFC 9110 7.6.1), plus those named by Connection. */
bool http_is_hop_by_hop(const struct http_head *h, const struct http_header *x);
const char *http_reason_phrase(int status);

#endif

#include "thaw/http.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static struct http_parser *P(llhttp_t *ll)
{
    return (struct http_parser *)ll->data;
}

void http_head_init(struct http_head *h)
{
    memset(h, 0, sizeof *h);
    buf_init(&h->bytes);
}

void http_head_reset(struct http_head *h)
{
    buf_reset(&h->bytes);
    h->n_headers = 0;
    h->target_off = h->target_len = 0;
    h->method = 0;
    h->method_known = false;
    h->http_major = h->http_minor = 0;
    h->status = 0;
    h->keep_alive = h->chunked = h->has_length = h->body_ignored = false;
    h->content_length = 0;
    h->connection_names_close = h->connection_names_other = false;
}

void http_head_dispose(struct http_head *h)
{
    buf_dispose(&h->bytes);
    free(h->headers);
    h->headers = NULL;
    h->n_headers = h->cap_headers = 0;
}

/* why: a fixed description for logs and error bodies (never input bytes). */
static int fail_why(struct http_parser *p, enum http_error e, const char *why)
{
    p->error = e;
    p->why = why;
    return HPE_USER;
}

static int fail(struct http_parser *p, enum http_error e)
{
    return fail_why(p, e, NULL);
}

static int append(struct http_parser *p, const char *at, size_t len)
{
    if (p->head->bytes.len + len > p->limits->max_head_bytes) {
        return fail(p, HTTP_ERR_HEAD_TOO_LARGE);
    }
    if (buf_append(&p->head->bytes, at, len)) {
        return fail(p, HTTP_ERR_NO_MEMORY);
    }
    return 0;
}

static int terminate(struct http_parser *p)
{
    /* NUL after each name, value and target so they read as C strings. */
    return append(p, "", 1);
}

static int on_message_begin(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    p->in_head = true;
    return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t len)
{
    struct http_parser *p = P(ll);
    /* llhttp lets a TAB or a form feed through in a target: a replica that
     * splits its request line on any white space would read another one. */
    for (size_t i = 0; ll->type == HTTP_REQUEST && i < len; i++) {
        unsigned char c = (unsigned char)at[i];
        if (c <= 0x20 || c == 0x7f) {
            return fail_why(p, HTTP_ERR_BAD_REQUEST, "a control byte in the request target");
        }
    }
    if (p->head->target_len == 0) {
        p->head->target_off = (uint32_t)p->head->bytes.len;
        /* The target starts after the method: it is known from here on. */
        if (ll->type == HTTP_REQUEST) {
            p->head->method = ll->method;
            p->head->method_known = true;
        }
    }
    /* Counted only once kept: a target over the head's limit is refused
     * with none of it in the head (a log line still reads the target). */
    int rc = append(p, at, len);
    if (rc == 0) {
        p->head->target_len += (uint32_t)len;
    }
    return rc;
}

/* Responses keep their reason phrase where requests keep the target. */
static int on_status(llhttp_t *ll, const char *at, size_t len)
{
    return on_url(ll, at, len);
}

static int on_url_complete(llhttp_t *ll)
{
    return terminate(P(ll));
}

/* Trailer fields (after a chunked body) arrive through the header callbacks
 * once the head is done. They are dropped, never forwarded: a trailer could
 * otherwise smuggle fields (a second Host, say) past the checks made on the
 * head. Their bytes count against the head limit. */
static int count_trailer(struct http_parser *p, size_t len)
{
    p->trailer_bytes += len;
    if (p->trailer_bytes > p->limits->max_head_bytes) {
        return fail_why(p, HTTP_ERR_HEAD_TOO_LARGE, "trailer fields over the header limit");
    }
    return 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t len)
{
    struct http_parser *p = P(ll);
    struct http_head *h = p->head;
    if (p->head_done) {
        return count_trailer(p, len);
    }
    if (p->last_was_value || h->n_headers == 0) {
        if (h->n_headers >= p->limits->max_headers) {
            return fail(p, HTTP_ERR_TOO_MANY_HEADERS);
        }
        if (h->n_headers == h->cap_headers) {
            uint32_t ncap = h->cap_headers ? h->cap_headers * 2 : 16;
            struct http_header *nh = realloc(h->headers, ncap * sizeof *nh);
            if (!nh) {
                return fail(p, HTTP_ERR_NO_MEMORY);
            }
            h->headers = nh;
            h->cap_headers = ncap;
        }
        struct http_header *x = &h->headers[h->n_headers++];
        x->name_off = (uint32_t)h->bytes.len;
        x->name_len = 0;
        x->value_off = 0;
        x->value_len = 0;
        p->last_was_value = false;
    }
    h->headers[h->n_headers - 1].name_len += (uint32_t)len;
    return append(p, at, len);
}

/* RFC 9110 token characters: a table, as every byte of every header name
 * is looked up. */
static const bool tchar[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1,
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1,
};

static int on_header_field_complete(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    if (p->head_done) {
        return 0;
    }
    struct http_header *x = &p->head->headers[p->head->n_headers - 1];
    const char *name = p->head->bytes.data + x->name_off;
    /* llhttp 8 lets some separators (such as a space) into names. */
    for (uint32_t i = 0; i < x->name_len; i++) {
        if (!tchar[(unsigned char)name[i]]) {
            return fail_why(p, HTTP_ERR_BAD_REQUEST, "a header name is not a token");
        }
    }
    if (x->name_len == 0) {
        return fail_why(p, HTTP_ERR_BAD_REQUEST, "empty header name");
    }
    p->in_connection = http_name_eq(name, x->name_len, "connection");
    int rc = terminate(p);
    if (!rc) {
        struct http_head *h = p->head;
        h->headers[h->n_headers - 1].value_off = (uint32_t)h->bytes.len;
    }
    return rc;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len)
{
    struct http_parser *p = P(ll);
    struct http_head *h = p->head;
    if (p->head_done) {
        return count_trailer(p, len);
    }
    h->headers[h->n_headers - 1].value_len += (uint32_t)len;
    return append(p, at, len);
}

/* The next token of a comma-separated list from *i on (spaces around it
 * left out; empty elements skipped). false at the end of the list. */
static bool next_list_token(const char *list, size_t len, size_t *i, const char **tok,
                            size_t *tlen)
{
    while (*i < len) {
        while (*i < len && (list[*i] == ' ' || list[*i] == '\t' || list[*i] == ',')) {
            (*i)++;
        }
        size_t start = *i;
        while (*i < len && list[*i] != ',') {
            (*i)++;
        }
        size_t end = *i;
        while (end > start && (list[end - 1] == ' ' || list[end - 1] == '\t')) {
            end--;
        }
        if (end > start) {
            *tok = list + start;
            *tlen = end - start;
            return true;
        }
    }
    return false;
}

/* keep-alive is hop-by-hop anyway; close is noted; anything else makes
 * http_is_hop_by_hop look every header up in the Connection values. */
static void note_connection_tokens(struct http_head *h, const char *v, size_t len)
{
    size_t i = 0, tlen;
    const char *tok;
    while (next_list_token(v, len, &i, &tok, &tlen)) {
        if (http_name_eq(tok, tlen, "close")) {
            h->connection_names_close = true;
        } else if (!http_name_eq(tok, tlen, "keep-alive")) {
            h->connection_names_other = true;
        }
    }
}

static int on_header_value_complete(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    struct http_head *h = p->head;
    if (p->head_done) {
        return 0;
    }
    struct http_header *x = &h->headers[h->n_headers - 1];
    /* A field value excludes the whitespace around it (RFC 9110, 5.5);
     * llhttp leaves out what leads, not what trails. The value is the last
     * thing appended, so the trailing part is dropped from the bytes too. */
    while (x->value_len > 0 && (h->bytes.data[h->bytes.len - 1] == ' ' ||
                                h->bytes.data[h->bytes.len - 1] == '\t')) {
        x->value_len--;
        h->bytes.len--;
    }
    if (x->value_len == 0) {
        /* Empty value: llhttp gives no value span, point at the terminator. */
        x->value_off = (uint32_t)h->bytes.len;
    }
    p->last_was_value = true;
    if (p->in_connection) {
        note_connection_tokens(h, h->bytes.data + x->value_off, x->value_len);
    }
    return terminate(p);
}

/* A body coded in anything but chunked alone ("gzip, chunked"): thaw takes
 * the chunked framing off (or passes it on) and would forward the rest as if
 * uncoded. */
static bool has_other_transfer_coding(const struct http_head *h)
{
    for (size_t k = 0; k < h->n_headers; k++) {
        const struct http_header *x = &h->headers[k];
        if (!http_name_eq(http_hname(h, x), x->name_len, "transfer-encoding")) {
            continue;
        }
        const char *v = h->bytes.data + x->value_off, *tok;
        size_t i = 0, tlen;
        while (next_list_token(v, x->value_len, &i, &tok, &tlen)) {
            if (tlen != 7 || strncasecmp(tok, "chunked", 7) != 0) {
                return true;
            }
        }
    }
    return false;
}

static int on_headers_complete(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    struct http_head *h = p->head;
    h->method = ll->method;
    h->method_known = ll->type == HTTP_REQUEST;
    h->http_major = ll->http_major;
    h->http_minor = ll->http_minor;
    h->status = ll->status_code;
    h->keep_alive = llhttp_should_keep_alive(ll);
    h->chunked = (ll->flags & F_CHUNKED) != 0;
    h->has_length = (ll->flags & F_CONTENT_LENGTH) != 0;
    h->content_length = h->has_length ? ll->content_length : 0;
    if (h->target_len == 0) {
        h->target_off = (uint32_t)h->bytes.len;
        if (terminate(p)) {
            return HPE_USER;
        }
    }
    p->head_done = true;
    p->in_head = false;
    if (ll->type == HTTP_REQUEST && h->http_major != 1) {
        /* llhttp takes HTTP/0.9 and HTTP/2.0 request lines; thaw speaks 1.x. */
        return fail_why(p, HTTP_ERR_BAD_VERSION, "the HTTP major version is not 1");
    }
    if (ll->type == HTTP_REQUEST && h->has_length &&
        h->content_length > p->limits->max_body_bytes) {
        return fail(p, HTTP_ERR_BODY_TOO_LARGE);
    }
    /* A coding besides chunked, or a Transfer-Encoding llhttp did not take
     * as chunked ("chunked,"): a response's body would be read to its close
     * and passed on coded. */
    if ((ll->flags & F_TRANSFER_ENCODING) &&
        (!(ll->flags & F_CHUNKED) || has_other_transfer_coding(h))) {
        return fail(p, HTTP_ERR_TRANSFER_CODING);
    }
    if (ll->type == HTTP_RESPONSE && (h->status < 100 || h->status > 599)) {
        return fail_why(p, HTTP_ERR_BAD_REQUEST, "the status code is not between 100 and 599");
    }
    if (p->skip_body) {
        return 1; /* no body follows a response to HEAD */
    }
    if (ll->type == HTTP_RESPONSE && (h->status == 204 || h->status == 304)) {
        /* They end at the blank line whatever their head says (RFC 9112
         * 6.3); llhttp would read a declared body. A 304's Content-Length
         * is the length the 200 would have had, not a body. */
        h->body_ignored = h->chunked ||
                          (h->status == 204 && h->has_length && h->content_length > 0);
        return 1;
    }
    return HPE_PAUSED;
}

/* llhttp 8 skips the two bytes after chunk data without looking at them;
 * thaw checks they are CRLF (else "3\r\nabcXY" would pass). Bytes are
 * addressed by absolute stream offset; the last two bytes of earlier input
 * are kept because the CRLF may straddle reads. */
static int stream_byte(const struct http_parser *p, uint64_t k)
{
    if (k >= p->abs) {
        return (unsigned char)p->cur[k - p->abs];
    }
    if (k + 2 >= p->abs) {
        return p->hist[k + 2 - p->abs];
    }
    return -1;
}

static int on_chunk_header(llhttp_t *ll)
{
    P(ll)->chunk_had_data = false;
    return 0;
}

static int on_chunk_complete(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    if (p->chunk_had_data &&
        (stream_byte(p, p->body_end_abs) != '\r' || stream_byte(p, p->body_end_abs + 1) != '\n')) {
        return fail_why(p, HTTP_ERR_BAD_CHUNK, "chunk data is not followed by CRLF");
    }
    return 0;
}

/* Chunk extensions of requests are not forwarded (the body is re-framed),
 * but a client could send them without end; their bytes are capped per
 * request. Responses pass through byte for byte and are not capped (a long
 * stream could add up to any total). */
static int on_chunk_extension(llhttp_t *ll, const char *at, size_t len)
{
    struct http_parser *p = P(ll);
    if (ll->type != HTTP_REQUEST) {
        return 0;
    }
    p->chunk_ext_bytes += len;
    if (p->chunk_ext_bytes > HTTP_MAX_CHUNK_EXT_BYTES) {
        return fail_why(p, HTTP_ERR_BAD_CHUNK, "chunk extensions over 4096 bytes");
    }
    return 0;
}

static int on_body(llhttp_t *ll, const char *at, size_t len)
{
    struct http_parser *p = P(ll);
    if (p->head->chunked) {
        p->chunk_had_data = true;
        p->body_end_abs = p->abs + (uint64_t)(at + len - p->cur);
    }
    if (p->body) {
        if (p->body->len + len > p->limits->max_body_bytes) {
            return fail(p, HTTP_ERR_BODY_TOO_LARGE);
        }
        if (buf_append(p->body, at, len)) {
            return fail(p, HTTP_ERR_NO_MEMORY);
        }
    } else if (p->on_body) {
        p->on_body(p->ud, at, len);
    }
    return 0;
}

static int on_message_complete(llhttp_t *ll)
{
    struct http_parser *p = P(ll);
    p->msg_done = true;
    /* keep-alive can change with trailers; read it again. A body a 204 or
     * 304 declared would come as bytes nobody asked for: not reusable. */
    p->head->keep_alive = llhttp_should_keep_alive(ll) && !p->head->body_ignored;
    return HPE_PAUSED;
}

static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_url_complete = on_url_complete,
    .on_status = on_status,
    .on_status_complete = on_url_complete,
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
    .on_chunk_complete = on_chunk_complete,
    .on_chunk_extension_name = on_chunk_extension,
    .on_chunk_extension_value = on_chunk_extension,
};

void http_parser_init(struct http_parser *p, llhttp_type_t type, const struct http_limits *limits)
{
    memset(p, 0, sizeof *p);
    llhttp_init(&p->ll, type, &settings);
    p->ll.data = p;
    p->limits = limits;
}

void http_parser_next(struct http_parser *p, struct http_head *head, struct buf *body)
{
    llhttp_errno_t e = llhttp_get_errno(&p->ll);
    if (p->ll.upgrade) {
        /* thaw does not upgrade (Upgrade is dropped as hop-by-hop): the
         * connection goes on as HTTP/1.1. llhttp takes what follows an
         * upgrade as another protocol's, so it starts afresh. */
        llhttp_reset(&p->ll);
    } else if (e == HPE_PAUSED) {
        llhttp_resume(&p->ll);
    }
    p->head = head;
    p->body = body;
    if (head) {
        http_head_reset(head);
    }
    p->head_bytes = 0;
    p->chunk_ext_bytes = 0;
    p->why = NULL;
    p->trailer_bytes = 0;
    p->error = HTTP_ERR_NONE;
    p->in_head = false;
    p->head_done = false;
    p->msg_done = false;
    p->head_reported = false;
    p->last_was_value = false;
    p->skip_body = false;
}

static enum http_error map_llhttp_error(struct http_parser *p, llhttp_errno_t e)
{
    switch (e) {
    case HPE_UNEXPECTED_CONTENT_LENGTH:
    case HPE_INVALID_CONTENT_LENGTH:
        return HTTP_ERR_BAD_LENGTH;
    case HPE_INVALID_CHUNK_SIZE:
        return HTTP_ERR_BAD_CHUNK;
    case HPE_INVALID_VERSION:
        /* "HTTP/3.0" is a version thaw does not speak; "HTTP/1.x" is bad syntax. */
        return p->ll.http_major != 1 ? HTTP_ERR_BAD_VERSION : HTTP_ERR_BAD_REQUEST;
    case HPE_PAUSED_H2_UPGRADE:
        /* The HTTP/2 connection preface ("PRI * HTTP/2.0", prior knowledge). */
        return HTTP_ERR_BAD_VERSION;
    default:
        if (p->head_done && p->head && p->head->chunked) {
            return HTTP_ERR_BAD_CHUNK;
        }
        return HTTP_ERR_BAD_REQUEST;
    }
}

enum http_event http_parser_execute(struct http_parser *p, const char *data, size_t len,
                                    size_t *used)
{
    *used = 0;
    if (p->head_done && !p->head_reported) {
        p->head_reported = true;
        return HTTP_EV_HEAD;
    }
    if (p->msg_done) {
        return HTTP_EV_DONE;
    }
    llhttp_errno_t e = llhttp_get_errno(&p->ll);
    bool resumed = false;
    if (e == HPE_PAUSED) {
        llhttp_resume(&p->ll); /* paused at the end of the head */
        resumed = true;
    } else if (e != HPE_OK) {
        return HTTP_EV_ERROR;
    }
    /* Right after the head, a message without a body completes with no
     * further input, so the parser runs even on an empty chunk then. */
    if (len == 0 && !resumed) {
        return HTTP_EV_NEED_MORE;
    }
    static const char empty[1] = {0};
    if (len == 0) {
        data = empty;
    }
    bool head_was_done = p->head_done;
    p->cur = data;
    e = llhttp_execute(&p->ll, data, len);
    size_t n = len;
    if (e != HPE_OK) {
        /* Paused: where to go on from. Failed: where it failed, so the
         * head's size below counts only bytes up to the error. */
        const char *pos = llhttp_get_error_pos(&p->ll);
        if (pos && pos >= data && pos <= data + len) {
            n = (size_t)(pos - data);
        }
    }
    *used = n;
    if (n >= 2) {
        p->hist[0] = (unsigned char)data[n - 2];
        p->hist[1] = (unsigned char)data[n - 1];
    } else if (n == 1) {
        p->hist[0] = p->hist[1];
        p->hist[1] = (unsigned char)data[0];
    }
    p->abs += n;
    /* When the head ends inside this chunk the parser paused right at its
     * end, so only head bytes are counted here. */
    if (!head_was_done) {
        p->head_bytes += n;
        if (p->error == HTTP_ERR_NONE && p->head_bytes > p->limits->max_head_bytes) {
            p->error = HTTP_ERR_HEAD_TOO_LARGE;
            return HTTP_EV_ERROR;
        }
    }
    switch (e) {
    case HPE_OK:
    case HPE_PAUSED:
    case HPE_PAUSED_UPGRADE:
        if (p->head_done && !p->head_reported) {
            p->head_reported = true;
            return HTTP_EV_HEAD;
        }
        return p->msg_done ? HTTP_EV_DONE : HTTP_EV_NEED_MORE;
    default:
        /* A callback may have named the error already (llhttp reports
         * errors from on_headers_complete under its own code). */
        if (p->error == HTTP_ERR_NONE) {
            p->error = map_llhttp_error(p, e);
        }
        return HTTP_EV_ERROR;
    }
}

const char *http_parser_error_text(const struct http_parser *p)
{
    if (p->why) {
        return p->why;
    }
    switch (p->error) {
    case HTTP_ERR_HEAD_TOO_LARGE:
        return "the header block is over the limit";
    case HTTP_ERR_TOO_MANY_HEADERS:
        return "more headers than the limit";
    case HTTP_ERR_BODY_TOO_LARGE:
        return "the body is over the limit";
    case HTTP_ERR_NO_MEMORY:
        return "out of memory";
    default:
        break;
    }
    /* llhttp's reasons are fixed strings ("Invalid header value char"). */
    const char *r = llhttp_get_error_reason(&p->ll);
    return r && *r ? r : "malformed";
}

enum http_event http_parser_finish(struct http_parser *p)
{
    if (p->msg_done) {
        return HTTP_EV_DONE;
    }
    if (!p->in_head && !p->head_done) {
        return HTTP_EV_NEED_MORE;
    }
    llhttp_errno_t e = llhttp_get_errno(&p->ll);
    if (e == HPE_PAUSED) {
        llhttp_resume(&p->ll);
    }
    e = llhttp_finish(&p->ll);
    if ((e == HPE_OK || e == HPE_PAUSED) && p->msg_done) {
        return HTTP_EV_DONE;
    }
    if (p->error == HTTP_ERR_NONE) {
        p->error = HTTP_ERR_BAD_REQUEST;
    }
    return HTTP_EV_ERROR;
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* RFC 3986 reg-name characters: unreserved, sub-delims and the % of an
 * escape; a table, as tchar, since every request's Host is checked. The
 * hex digits of an IP literal are among them. */
static const bool hostchar[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1,
    ['-'] = 1, ['.'] = 1, ['_'] = 1, ['~'] = 1, ['%'] = 1,
    ['!'] = 1, ['$'] = 1, ['&'] = 1, ['\''] = 1, ['('] = 1, [')'] = 1, ['*'] = 1, ['+'] = 1,
    [','] = 1, [';'] = 1, ['='] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1,
};

bool http_host_valid(const char *h, size_t n)
{
    size_t i = 0;
    if (n && h[0] == '[') {
        for (i = 1; i < n && h[i] != ']'; i++) {
            unsigned char c = (unsigned char)h[i];
            if (c != ':' && !hostchar[c]) {
                return false;
            }
        }
        if (i == n || i == 1) {
            return false; /* unclosed, or empty */
        }
        i++;
    } else {
        while (i < n && h[i] != ':' && hostchar[(unsigned char)h[i]]) {
            i++;
        }
    }
    if (i == n) {
        return true;
    }
    if (h[i] != ':' || n - i - 1 > 5) {
        return false;
    }
    unsigned long port = 0;
    for (size_t j = i + 1; j < n; j++) {
        if (!is_digit((unsigned char)h[j])) {
            return false;
        }
        port = port * 10 + (unsigned long)(h[j] - '0');
    }
    return port <= 65535;
}

enum http_event http_answer_feed(struct http_parser *p, unsigned *interim, const char *data,
                                 size_t len, size_t *used)
{
    size_t off = 0;
    for (;;) {
        size_t n = 0;
        enum http_event ev = http_parser_execute(p, data + off, len - off, &n);
        off += n;
        int status = p->head ? p->head->status : 0;
        if (ev == HTTP_EV_HEAD) {
            continue; /* paused at the head: on, even with no bytes left */
        }
        if (ev == HTTP_EV_DONE && status >= 100 && status < 200 && status != 101 &&
            ++*interim <= HTTP_MAX_INTERIM) {
            http_parser_next(p, p->head, p->body);
            continue;
        }
        *used = off;
        return ev;
    }
}

bool http_parser_needs_eof(const struct http_parser *p)
{
    return llhttp_message_needs_eof(&p->ll);
}

bool http_parser_started(const struct http_parser *p)
{
    return p->in_head || p->head_done;
}

const struct http_header *http_head_find(const struct http_head *h, const char *name)
{
    size_t nlen = strlen(name);
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (x->name_len == nlen && strncasecmp(h->bytes.data + x->name_off, name, nlen) == 0) {
            return x;
        }
    }
    return NULL;
}

unsigned http_head_count(const struct http_head *h, const char *name)
{
    size_t nlen = strlen(name);
    unsigned n = 0;
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (x->name_len == nlen && strncasecmp(h->bytes.data + x->name_off, name, nlen) == 0) {
            n++;
        }
    }
    return n;
}

bool http_target_authority(const struct http_head *h, const char **auth, size_t *len)
{
    const char *t = http_target(h);
    size_t tlen = h->target_len;
    size_t scheme = 0;
    if (tlen > 7 && strncasecmp(t, "http://", 7) == 0) {
        scheme = 7;
    } else if (tlen > 8 && strncasecmp(t, "https://", 8) == 0) {
        scheme = 8;
    } else {
        return false;
    }
    const char *a = t + scheme;
    size_t n = 0;
    while (scheme + n < tlen && a[n] != '/' && a[n] != '?' && a[n] != '#') {
        n++;
    }
    const char *at = NULL;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == '@') {
            at = a + i;
        }
    }
    if (at) {
        n -= (size_t)(at + 1 - a);
        a = at + 1;
    }
    *auth = a;
    *len = n;
    return true;
}

void http_target_log_path(const struct http_head *h, const char **path, size_t *len)
{
    const char *t = http_target(h);
    size_t n = h->target_len;
    const char *auth;
    size_t alen;
    if (n && http_target_authority(h, &auth, &alen)) {
        n -= (size_t)(auth + alen - t);
        t = auth + alen;
    }
    const char *q = n ? memchr(t, '?', n) : NULL; /* no target parsed: t may be NULL */
    *path = t;
    *len = q ? (size_t)(q - t) : n;
}

bool http_token_list_has(const char *list, size_t len, const char *token)
{
    size_t tokenlen = strlen(token), i = 0, tlen;
    const char *tok;
    while (next_list_token(list, len, &i, &tok, &tlen)) {
        if (tlen == tokenlen && strncasecmp(tok, token, tlen) == 0) {
            return true;
        }
    }
    return false;
}

bool http_is_hop_by_hop(const struct http_head *h, const struct http_header *x)
{
    const char *name = http_hname(h, x);
    size_t len = x->name_len;
    if (http_name_eq(name, len, "connection") || http_name_eq(name, len, "keep-alive") ||
        http_name_eq(name, len, "proxy-connection") ||
        http_name_eq(name, len, "transfer-encoding") || http_name_eq(name, len, "te") ||
        http_name_eq(name, len, "trailer") || http_name_eq(name, len, "upgrade") ||
        http_name_eq(name, len, "proxy-authorization") ||
        http_name_eq(name, len, "proxy-authenticate")) {
        return true;
    }
    if (!h->connection_names_other) {
        return h->connection_names_close && http_name_eq(name, len, "close");
    }
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *c = &h->headers[i];
        if (http_name_eq(http_hname(h, c), c->name_len, "connection")) {
            /* Connection: names further hop-by-hop headers. */
            const char *v = http_hvalue(h, c);
            char tok[128];
            if (x->name_len < sizeof tok) {
                memcpy(tok, name, x->name_len);
                tok[x->name_len] = '\0';
                if (http_token_list_has(v, c->value_len, tok)) {
                    return true;
                }
            }
        }
    }
    return false;
}

const char *http_reason_phrase(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Content";
    case 424: return "Failed Dependency";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 451: return "Unavailable For Legal Reasons";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    case 508: return "Loop Detected";
    case 511: return "Network Authentication Required";
    default: return "Unknown";
    }
}

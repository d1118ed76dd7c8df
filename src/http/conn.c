#include "thaw/conn.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <assert.h>
#include <errno.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* A connection may be closed from deep inside its own callbacks; `busy`
 * counts those frames and the struct is freed when the last one returns. */
struct conn_frame {
    int busy;
    bool dead;
};

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static void process_input(struct conn *c, const char *data, size_t len);

/* Per-connection bookkeeping that must survive conn_close until the
 * outermost callback returns. */
struct conn_ext {
    struct conn c;
    struct conn_frame f;
};

static struct conn_frame *frame(struct conn *c)
{
    return &container_of(c, struct conn_ext, c)->f;
}

static void enter(struct conn *c)
{
    frame(c)->busy++;
}

/* Returns true when the connection is still usable. */
static bool leave(struct conn *c)
{
    struct conn_frame *f = frame(c);
    if (--f->busy == 0 && f->dead) {
        free(container_of(c, struct conn_ext, c));
        return false;
    }
    return !f->dead;
}

static bool is_dead(struct conn *c)
{
    return frame(c)->dead;
}

enum timer_kind { TIMER_NONE, TIMER_HEADER, TIMER_BODY, TIMER_KEEPALIVE, TIMER_SEND, TIMER_LINGER };

static void add_timer(struct conn *c, uint64_t now, uint64_t at)
{
    struct timeval tv = clock_timeval(at - now);
    event_add(&c->tev, &tv);
    c->timer_at_ms = at;
}

/* Times out ms from now. Most calls only store the deadline: the timer is
 * added again only when it would fire after it (a keep-alive connection's
 * requests move it back and forth without a heap operation each). */
static void arm_timer(struct conn *c, uint64_t ms)
{
    uint64_t now = clock_now_ms();
    c->deadline_ms = now + ms;
    if (c->timer_at_ms == 0 || c->timer_at_ms > c->deadline_ms) {
        add_timer(c, now, c->deadline_ms);
    }
}

/* The body timer is the idle one (limits.body_timeout_ms, restarted by each
 * read) unless the total deadline (limits.body_total_timeout_ms) comes first:
 * a body trickled a byte at a time must not hold the connection forever. */
static void arm_body_timer(struct conn *c)
{
    struct conn_ctx *s = c->ctx;
    uint64_t now = clock_now_ms();
    uint64_t idle_ms = s->body_timeout_ms;
    c->body_total_armed = c->body_deadline_ms && now + idle_ms >= c->body_deadline_ms;
    if (!c->body_total_armed) {
        arm_timer(c, idle_ms);
        return;
    }
    arm_timer(c, c->body_deadline_ms > now ? c->body_deadline_ms - now : 0);
}

/* A request body being read is looked at again this often (reset_check):
 * a client's reset that came in one readiness report with its last bytes
 * reaches the read callback as a plain short read (libevent reports an
 * error without EV_CLOSED), and no new edge follows it. */
#define CONN_RESET_CHECK_MS 2000

/* The timer of a body being read fires within CONN_RESET_CHECK_MS,
 * whatever its deadline (on_timer looks then and waits on). */
static void check_within(struct conn *c)
{
    uint64_t now = clock_now_ms();
    if (c->timer_at_ms == 0 || c->timer_at_ms > now + CONN_RESET_CHECK_MS) {
        add_timer(c, now, now + CONN_RESET_CHECK_MS);
    }
}

static void set_timer(struct conn *c, enum timer_kind k)
{
    struct conn_ctx *s = c->ctx;
    switch (k) {
    case TIMER_NONE:
        c->deadline_ms = 0; /* a pending timer finds nothing to do */
        break;
    case TIMER_HEADER:
        arm_timer(c, s->header_timeout_ms); /* short: no reset check (a heap operation a request) */
        break;
    case TIMER_BODY:
        arm_body_timer(c);
        check_within(c);
        break;
    case TIMER_KEEPALIVE:
        arm_timer(c, s->keepalive_timeout_ms);
        break;
    case TIMER_SEND:
        arm_timer(c, s->send_timeout_ms);
        break;
    case TIMER_LINGER:
        arm_timer(c, s->linger_ms);
        break;
    }
}

static bool edge_triggered(struct event_base *base)
{
    int f = event_base_get_features(base);
    return (f & EV_FEATURE_ET) && (f & EV_FEATURE_EARLY_CLOSE);
}

short conn_read_events(struct event_base *base)
{
    return EV_READ | EV_PERSIST | (edge_triggered(base) ? EV_ET | EV_CLOSED : 0);
}

short conn_write_events(struct event_base *base)
{
    return EV_WRITE | EV_PERSIST | (edge_triggered(base) ? EV_ET : 0);
}

/* Reading again after a pause. Edge-triggered, bytes (or a FIN) that came
 * meanwhile raise no new edge when the pause and this resume cancel out in
 * the loop's change list: one read now finds them (or EAGAIN). */
static void watch_reads(struct conn *c)
{
    event_add(&c->rev, NULL);
    event_active(&c->rev, EV_READ | EV_CLOSED, 0);
}

struct conn *conn_new(struct conn_ctx *ctx, int fd, const struct http_limits *lim,
                      const struct conn_handler *handler, void *ud,
                      const struct sockaddr *peer)
{
    struct conn_ext *x = calloc(1, sizeof *x);
    if (!x) {
        close(fd);
        return NULL;
    }
    struct conn *c = &x->c;
    c->ctx = ctx;
    c->handler = handler;
    c->ud = ud;
    c->fd = fd;
    c->state = CONN_IDLE;
    c->first_request = true;
    buf_init(&c->in);
    buf_init(&c->out);
    http_parser_init(&c->parser, HTTP_REQUEST, lim);
    netaddr_text(peer, c->peer_ip);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    event_assign(&c->rev, ctx->base, fd, conn_read_events(ctx->base), on_read, c);
    event_assign(&c->wev, ctx->base, fd, conn_write_events(ctx->base), on_write, c);
    event_assign(&c->tev, ctx->base, -1, 0, on_timer, c);
    event_add(&c->rev, NULL);
    set_timer(c, TIMER_HEADER);
    list_push_back(&ctx->conns, &c->node);
    return c;
}

size_t conn_out_pending(const struct conn *c)
{
    return buf_unread(&c->out);
}

static void release_request(struct conn *c, enum abort_reason reason)
{
    struct exchange *x = c->ex;
    if (!x) {
        return;
    }
    c->handler->on_abort(c, x, reason);
    c->ex = NULL;
    c->handler->free_exchange(c, x);
}

void conn_close(struct conn *c, enum abort_reason reason)
{
    struct conn_frame *f = frame(c);
    if (f->dead) {
        return;
    }
    f->dead = true;
    release_request(c, reason);
    event_del(&c->rev);
    event_del(&c->wev);
    event_del(&c->tev);
    close(c->fd);
    c->fd = -1;
    buf_dispose(&c->in);
    buf_dispose(&c->out);
    list_remove(&c->node);
    if (c->count) {
        (*c->count)--;
    }
    if (c->lingering) {
        c->ctx->n_lingering--;
    }
    if (f->busy == 0) {
        free(container_of(c, struct conn_ext, c));
    }
}

static void want_write(struct conn *c, bool on)
{
    if (on && !c->wev_added) {
        event_add(&c->wev, NULL);
        c->wev_added = true;
    } else if (!on && c->wev_added) {
        event_del(&c->wev);
        c->wev_added = false;
    }
}

/* Notes the socket's send queue as output starts waiting in c->out. */
static void note_send_queue(struct conn *c)
{
    if (ioctl(c->fd, SIOCOUTQ, &c->send_queue) != 0) {
        c->send_queue = -1;
    }
}

int conn_write(struct conn *c, const void *data, size_t len)
{
    if (is_dead(c) || c->fd < 0 || c->broken) {
        return -EPIPE;
    }
    const char *p = data;
    if (buf_unread(&c->out) == 0) {
        while (len > 0) {
            ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
            if (n > 0) {
                p += n;
                len -= (size_t)n;
                continue;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            }
            /* The peer is gone; the caller stops producing and the
             * connection is closed from its write callback. */
            buf_reset(&c->out);
            c->broken = true;
            event_active(&c->wev, EV_WRITE, 0);
            return -EPIPE;
        }
        if (len == 0) {
            return 0;
        }
    }
    bool waiting = buf_unread(&c->out) > 0;
    if (buf_append(&c->out, p, len)) {
        return -ENOMEM;
    }
    if (!waiting) {
        note_send_queue(c);
    }
    want_write(c, true);
    if (c->state == CONN_HANDLING || c->state == CONN_CLOSING) {
        set_timer(c, TIMER_SEND);
    }
    return 0;
}

int conn_writev(struct conn *c, const struct iovec *iov, int n)
{
    if (is_dead(c) || c->fd < 0 || c->broken) {
        return -EPIPE;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += iov[i].iov_len;
    }
    size_t written = 0;
    if (buf_unread(&c->out) == 0 && total > 0) {
        for (;;) {
            struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
            ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
            if (w >= 0) {
                written = (size_t)w;
                break;
            }
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            buf_reset(&c->out);
            c->broken = true;
            event_active(&c->wev, EV_WRITE, 0);
            return -EPIPE;
        }
        if (written == total) {
            return 0;
        }
    }
    /* Keep what the socket did not take. */
    bool waiting = buf_unread(&c->out) > 0;
    for (int i = 0; i < n; i++) {
        size_t len = iov[i].iov_len;
        if (written >= len) {
            written -= len;
            continue;
        }
        if (buf_append(&c->out, (const char *)iov[i].iov_base + written, len - written)) {
            return -ENOMEM;
        }
        written = 0;
    }
    if (total > 0) {
        if (!waiting) {
            note_send_queue(c);
        }
        want_write(c, true);
        if (c->state == CONN_HANDLING || c->state == CONN_CLOSING) {
            set_timer(c, TIMER_SEND);
        }
    }
    return 0;
}

/* Starts the polite close: flush, half-close, discard input for a moment so
 * a client still sending does not get a reset that eats our response; at
 * once where nothing of the client's can still come. */
static void begin_close(struct conn *c)
{
    c->state = CONN_CLOSING;
    if (buf_unread(&c->out) > 0) {
        want_write(c, true);
        set_timer(c, TIMER_SEND);
        return;
    }
    if (c->eof || (c->asked_close && buf_unread(&c->in) == 0)) {
        /* The client closed, or asked to close after a request read whole
         * with nothing behind it: nothing of its is in flight, so close
         * (FIN) without the half-close and the linger, as nginx does. */
        conn_close(c, ABORT_CLIENT_CLOSED);
        return;
    }
    shutdown(c->fd, SHUT_WR);
    struct conn_ctx *s = c->ctx;
    if (!c->lingering) {
        if (s->n_lingering >= CONN_MAX_LINGERING) {
            /* Under a flood of bad requests, close at once: lingering costs
             * a descriptor for LINGER_MS each. */
            conn_close(c, ABORT_CLIENT_CLOSED);
            return;
        }
        c->lingering = true;
        s->n_lingering++;
    }
    if (c->read_paused) {
        watch_reads(c);
        c->read_paused = false;
    }
    set_timer(c, TIMER_LINGER);
}

void conn_pause_reading(struct conn *c)
{
    if (!c->read_paused && !is_dead(c)) {
        event_del(&c->rev);
        c->read_paused = true;
    }
}

static void resume_reading(struct conn *c)
{
    if (c->read_paused && !is_dead(c) && !c->eof) {
        watch_reads(c);
        c->read_paused = false;
    }
}

void conn_response_done(struct conn *c)
{
    struct exchange *x = c->ex;
    c->ex = NULL;
    if (x) {
        c->handler->free_exchange(c, x);
    }
    c->requests_served++;
    c->on_drain = NULL;
    if (c->close_after || c->ctx->draining || c->eof) {
        begin_close(c);
        return;
    }
    c->state = CONN_IDLE;
    if (buf_unread(&c->out) == 0) {
        set_timer(c, TIMER_KEEPALIVE);
        buf_dispose(&c->out);
    }
    resume_reading(c);
    /* Pipelined bytes that arrived meanwhile. Processing runs in the
     * caller's frame; reentry from process_input itself is prevented by
     * the state machine (we only get here with CONN_HANDLING). */
    if (buf_unread(&c->in) > 0 && frame(c)->busy == 0) {
        enter(c);
        process_input(c, NULL, 0);
        leave(c);
    } else if (buf_unread(&c->in) > 0) {
        /* Inside a callback of this connection: let the loop go round. */
        event_active(&c->rev, EV_READ, 0);
    }
}

void conn_error_json(struct buf *out, const char *message, size_t message_len, const char *type,
                     const char *param, const char *code, int status)
{
    buf_append_str(out, "{\"error\":{\"message\":\"");
    buf_append_json_escaped(out, message, message_len);
    buf_append_str(out, "\",\"type\":\"");
    buf_append_json_escaped(out, type, strlen(type));
    buf_append_str(out, "\",\"param\":");
    if (param) {
        buf_append_str(out, "\"");
        buf_append_json_escaped(out, param, strlen(param));
        buf_append_str(out, "\"");
    } else {
        buf_append_str(out, "null");
    }
    buf_append_str(out, ",\"code\":");
    if (code) {
        buf_append_str(out, "\"");
        buf_append_json_escaped(out, code, strlen(code));
        buf_append_str(out, "\"");
    } else {
        buf_append_str(out, "null");
    }
    if (status) {
        buf_printf(out, ",\"status\":%d", status);
    }
    buf_append_str(out, "}}\n");
}

const char *conn_error_type(int status)
{
    return status >= 500 ? "server_error" : "invalid_request_error";
}

/* The message of thaw's own error: what went wrong, the detail, and the
 * model asked for, so a person can act on it. */
static void error_message(struct buf *m, enum reject_reason reason, const char *detail,
                          const char *model)
{
    const struct reject_info *ri = reject_info(reason);
    if (reason == REJECT_UNKNOWN_MODEL && model) {
        buf_append_str(m, "The model `");
        buf_append_str(m, model);
        buf_append_str(m, "` does not exist here; GET /v1/models lists the models served");
    } else {
        buf_append_str(m, ri->message);
    }
    if (detail && *detail) {
        buf_append_str(m, ": ");
        buf_append_str(m, detail);
    }
    if (model && reason != REJECT_UNKNOWN_MODEL) {
        buf_append_str(m, " (model `");
        buf_append_str(m, model);
        buf_append_str(m, "`)");
    }
}

void conn_error_body(struct buf *out, enum reject_reason reason, const char *detail,
                     const char *model, bool with_status)
{
    const struct reject_info *ri = reject_info(reason);
    struct buf m;
    buf_init(&m);
    error_message(&m, reason, detail, model);
    /* The request parameter at fault: the model named, or missing. */
    bool about_model = reason == REJECT_NO_MODEL_FIELD || reason == REJECT_DUPLICATE_MODEL ||
                       (reason == REJECT_UNKNOWN_MODEL && model);
    conn_error_json(out, m.data ? m.data : "", m.len, conn_error_type(ri->status),
                    about_model ? "model" : NULL, ri->name, with_status ? ri->status : 0);
    buf_dispose(&m);
}

void conn_respond(struct conn *c, int status, const char *content_type, const char *body,
                  size_t body_len, const char *extra_headers)
{
    struct exchange *r = c->ex;
    bool head_only = r && r->head.method == HTTP_HEAD;
    if (r && r->head.http_major == 1 && r->head.http_minor == 0 && !r->head.keep_alive) {
        c->close_after = true;
    }
    if (r && !r->head.keep_alive) {
        c->close_after = true;
    }
    if (c->ctx->draining) {
        c->close_after = true;
    }
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n",
                     status, http_reason_phrase(status), content_type, body_len,
                     extra_headers ? extra_headers : "",
                     c->close_after ? "Connection: close\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof head) {
        n = 0;
    }
    if (r) {
        r->state = REQ_ANSWERED;
        r->response_started = true;
    }
    if (c->state != CONN_HANDLING) {
        c->state = CONN_HANDLING;
    }
    /* Head and body in one system call: one segment for small answers. */
    struct iovec iov[2] = {{head, (size_t)n}, {(void *)body, body_len}};
    conn_writev(c, iov, !head_only && body_len ? 2 : 1);
    conn_response_done(c);
}

void conn_reject(struct conn *c, enum reject_reason reason, const char *detail)
{
    const struct reject_info *ri = reject_info(reason);
    struct exchange *r = c->ex;
    if (r && c->handler->on_reject) {
        c->handler->on_reject(c, r, reason);
    }
    /* A request whose body was not read leaves the stream out of sync. */
    if (!r || c->state == CONN_READING || reason == REJECT_TOO_MANY_CONNECTIONS) {
        c->close_after = true;
    }
    if (r && c->handler->reject_in_stream && c->handler->reject_in_stream(c, r, reason, detail)) {
        return;
    }
    struct buf body;
    buf_init(&body);
    conn_error_body(&body, reason, detail, r ? r->error_model : NULL, false);
    char extra[64] = "";
    if (ri->retry_after) {
        snprintf(extra, sizeof extra, "Retry-After: %u\r\n",
                 r && c->handler->retry_after_s ? c->handler->retry_after_s(r) : 1);
    }
    if (ri->status == 401) {
        /* RFC 9110 15.5.2: a 401 names the scheme it wants. */
        snprintf(extra, sizeof extra, "WWW-Authenticate: Bearer\r\n");
    }
    conn_respond(c, ri->status, "application/json", body.data, body.len, extra);
    buf_dispose(&body);
}

void conn_drain(struct conn *c)
{
    if (c->state == CONN_IDLE && !c->ex) {
        begin_close(c);
    } else {
        c->close_after = true;
    }
}

void conn_touch_send_timer(struct conn *c)
{
    if (buf_unread(&c->out) > 0) {
        set_timer(c, TIMER_SEND);
    }
}

static enum reject_reason http_error_reason(enum http_error e)
{
    switch (e) {
    case HTTP_ERR_BAD_LENGTH:
        return REJECT_BAD_LENGTH;
    case HTTP_ERR_BAD_CHUNK:
        return REJECT_BAD_CHUNK;
    case HTTP_ERR_HEAD_TOO_LARGE:
        return REJECT_HEADER_TOO_LARGE;
    case HTTP_ERR_TOO_MANY_HEADERS:
        return REJECT_TOO_MANY_HEADERS;
    case HTTP_ERR_BODY_TOO_LARGE:
        return REJECT_BODY_TOO_LARGE;
    case HTTP_ERR_NO_MEMORY:
        return REJECT_INTERNAL;
    case HTTP_ERR_BAD_VERSION:
        return REJECT_VERSION_NOT_SUPPORTED;
    case HTTP_ERR_TRANSFER_CODING:
        return REJECT_TRANSFER_CODING;
    default:
        return REJECT_BAD_REQUEST;
    }
}

static void start_request(struct conn *c)
{
    struct exchange *r = c->handler->new_exchange(c);
    if (!r) {
        /* Out of memory: nothing sensible can be answered. */
        conn_close(c, ABORT_CLIENT_CLOSED);
        return;
    }
    c->ex = r;
    http_parser_next(&c->parser, &r->head, &r->body);
    c->state = CONN_READING;
    c->asked_close = false;
    c->refusal_held = false;
    c->body_deadline_ms = 0;
    if (!c->first_request) {
        set_timer(c, TIMER_HEADER);
    }
    c->first_request = false;
    if (c->handler->on_start) {
        c->handler->on_start(c, r);
    }
}

/* The log line for a request thaw refused as malformed. Raw client input
 * never goes to the log (it carries credentials, keys in query strings and
 * body bytes): only the reason and facts thaw parsed itself. */
static void log_client_fault(struct conn *c, enum reject_reason reason)
{
    if (!log_enabled(LOG_INFO)) {
        return;
    }
    const struct http_head *h = c->ex ? &c->ex->head : NULL;
    char path[200] = "\"\"";
    if (h && h->target_len) {
        const char *t;
        size_t len;
        http_target_log_path(h, &t, &len);
        log_quote(path, sizeof path, t, len, 120);
    }
    LOGI("request rejected",
         "reason=%s client=%s parser=\"%s\" method=%s path=%s head_bytes=%zu body_bytes=%zu",
         reject_info(reason)->name, c->peer_ip, http_parser_error_text(&c->parser),
         h && h->method_known ? llhttp_method_name((llhttp_method_t)h->method) : "-", path,
         c->parser.head_bytes,
         c->ex ? c->ex->body.len : (size_t)0);
}

static bool expects_body(const struct http_head *h)
{
    return h->chunked || (h->has_length && h->content_length > 0);
}

/* Runs the handler's look at a complete head; `ahead` bytes of input follow
 * it, already read. false when the request was answered (and the
 * connection may be closing). */
static bool on_head(struct conn *c, size_t ahead)
{
    struct exchange *r = c->ex;
    struct http_head *h = &r->head;
    if (!h->keep_alive) {
        c->close_after = true;
    }
    const struct http_header *expect = http_head_find(h, "expect");
    bool want_continue = false;
    if (expect) {
        if (!http_name_eq(http_hvalue(h, expect), expect->value_len, "100-continue")) {
            conn_reject(c, REJECT_EXPECTATION_FAILED, NULL);
            return false;
        }
        want_continue = h->http_major == 1 && h->http_minor >= 1 && expects_body(h);
    }
    /* One Host at most, whatever the version (which of two would route?);
     * HTTP/1.1 requires one. */
    unsigned hosts = http_head_count(h, "host");
    if (hosts > 1) {
        conn_reject(c, REJECT_BAD_REQUEST, "more than one Host header");
        return false;
    }
    if (hosts == 0 && h->http_major == 1 && h->http_minor >= 1) {
        conn_reject(c, REJECT_BAD_REQUEST, "HTTP/1.1 request without Host");
        return false;
    }
    /* What routes must be an authority (RFC 3986): the Host header, or the
     * absolute-form target's, which replaces it (RFC 9112 3.2.2). */
    const char *auth = NULL;
    size_t auth_len = 0;
    if (!http_target_authority(h, &auth, &auth_len)) {
        const struct http_header *host = hosts ? http_head_find(h, "host") : NULL;
        auth = host ? http_hvalue(h, host) : NULL;
        auth_len = host ? host->value_len : 0;
    }
    if (auth && !http_host_valid(auth, auth_len)) {
        conn_reject(c, REJECT_BAD_REQUEST, "invalid Host header");
        return false;
    }
    if (c->handler->on_head) {
        int rc = c->handler->on_head(c, r);
        /* Not CONNECT: llhttp reads no body after its head, whatever the
         * Content-Length says. Not a body the buffer budget refused: kept,
         * it would be memory the budget does not count. */
        if (rc != REJECT_COUNT && rc != REJECT_BODY_BUFFER_FULL && rc != REJECT_BODY_TOO_LARGE &&
            !want_continue && h->has_length && !h->chunked && h->method != HTTP_CONNECT &&
            h->content_length <= ahead && h->content_length <= CONN_SCRATCH_BYTES) {
            /* Its body came with the head (as a short JSON body does):
             * read it, then refuse, and the connection goes on (nginx
             * discards such a body too). */
            c->refusal_held = true;
            c->held_reason = rc;
            return true;
        }
        if (rc != REJECT_COUNT) {
            conn_reject(c, (enum reject_reason)rc, NULL);
            return false;
        }
    }
    if (want_continue) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        conn_write(c, cont, sizeof cont - 1);
    }
    if (expects_body(h)) {
        c->body_deadline_ms = clock_now_ms() + c->ctx->body_total_timeout_ms;
        set_timer(c, TIMER_BODY);
    }
    return true;
}

static void on_complete(struct conn *c)
{
    struct exchange *r = c->ex;
    c->state = CONN_HANDLING;
    c->asked_close = !r->head.keep_alive;
    set_timer(c, TIMER_NONE);
    if (c->refusal_held) {
        c->refusal_held = false;
        if (r->body.len != r->head.content_length) {
            c->close_after = true; /* not the body it declared: out of step */
        }
        conn_reject(c, (enum reject_reason)c->held_reason, NULL);
        return;
    }
    c->handler->on_request(c, r);
}

/* Parses what is buffered in c->in, then data[0..len) (not yet buffered).
 * Whatever is left unparsed ends up in c->in. */
static void process_input(struct conn *c, const char *data, size_t len)
{
    bool after_head = false;
    for (;;) {
        if (is_dead(c)) {
            return;
        }
        const char *p;
        size_t n;
        bool from_in = buf_unread(&c->in) > 0;
        if (from_in) {
            if (len) {
                buf_append(&c->in, data, len);
                len = 0;
            }
            p = buf_read_ptr(&c->in);
            n = buf_unread(&c->in);
        } else {
            p = data;
            n = len;
        }
        if (n == 0 && !after_head) {
            return;
        }
        after_head = false;
        if (c->state == CONN_HANDLING || c->state == CONN_CLOSING ||
            buf_unread(&c->out) > CONN_OUT_HIGH_WATER) {
            /* Busy: keep the bytes for later, within bounds. */
            if (!from_in) {
                buf_append(&c->in, p, n);
            }
            if (buf_unread(&c->in) > CONN_PIPELINE_MAX) {
                conn_pause_reading(c);
            }
            return;
        }
        if (c->state == CONN_IDLE) {
            start_request(c);
            if (is_dead(c)) {
                return;
            }
        }
        size_t used = 0;
        enum http_event ev = http_parser_execute(&c->parser, p, n, &used);
        if (from_in) {
            buf_consume(&c->in, used);
        } else {
            data += used;
            len -= used;
        }
        if (c->handler->on_body && c->ex && c->ex->state == REQ_READING && !c->refusal_held &&
            !c->handler->on_body(c, c->ex)) {
            return; /* answered while its body arrived */
        }
        switch (ev) {
        case HTTP_EV_NEED_MORE:
            if (c->state == CONN_READING && c->parser.head_done) {
                set_timer(c, TIMER_BODY);
            }
            break;
        case HTTP_EV_HEAD:
            if (!on_head(c, from_in ? buf_unread(&c->in) : len)) {
                return;
            }
            after_head = true; /* a bodiless request completes without more input */
            break;
        case HTTP_EV_DONE:
            on_complete(c);
            break;
        case HTTP_EV_ERROR: {
            enum reject_reason reason = http_error_reason(c->parser.error);
            log_client_fault(c, reason);
            conn_reject(c, reason, c->parser.why);
            return;
        }
        }
        if (ev == HTTP_EV_NEED_MORE && buf_unread(&c->in) == 0 && len == 0 && !after_head) {
            return;
        }
    }
}

static void handle_eof(struct conn *c)
{
    c->eof = true;
    event_del(&c->rev);
    switch (c->state) {
    case CONN_IDLE:
        conn_close(c, ABORT_CLIENT_CLOSED);
        break;
    case CONN_READING:
        /* Truncated request: nobody to answer. */
        conn_close(c, ABORT_CLIENT_CLOSED);
        break;
    case CONN_HANDLING:
        /* A client that half-closes after its request is treated as gone
         * (as nginx does without proxy_ignore_client_abort) unless the
         * response is already being written. */
        if (c->ex && c->ex->response_started) {
            c->close_after = true;
        } else {
            conn_close(c, ABORT_CLIENT_CLOSED);
        }
        break;
    case CONN_CLOSING:
        if (buf_unread(&c->out) == 0) {
            conn_close(c, ABORT_CLIENT_CLOSED);
        }
        break;
    }
}

/* Reads until the socket is drained (a short read, unless the client's FIN
 * is known to wait behind it), within CONN_READ_BUDGET a turn. */
static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    enter(c);
    char *scratch = c->ctx->scratch;
    size_t budget = CONN_READ_BUDGET;
    for (;;) {
        ssize_t n = recv(fd, scratch, CONN_SCRATCH_BYTES, 0);
        if (n > 0) {
            if (c->state != CONN_CLOSING) {
                process_input(c, scratch, (size_t)n);
            } /* else lingering: discard */
            if (is_dead(c) || c->read_paused || c->eof) {
                break;
            }
            if ((size_t)n < CONN_SCRATCH_BYTES && !(what & EV_CLOSED)) {
                break; /* drained: the next bytes raise a new edge */
            }
            if ((size_t)n >= budget) {
                event_active(&c->rev, what, 0); /* the rest next turn */
                break;
            }
            budget -= (size_t)n;
            continue;
        }
        if (n == 0) {
            handle_eof(c);
        } else if (errno == EINTR) {
            continue;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            conn_close(c, ABORT_CLIENT_CLOSED);
        } else if (buf_unread(&c->in) > 0 && c->state == CONN_IDLE) {
            /* Activated by hand to continue with pipelined input. */
            process_input(c, NULL, 0);
        }
        break;
    }
    leave(c);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    enter(c);
    if (c->broken) {
        conn_close(c, ABORT_CLIENT_CLOSED);
        leave(c);
        return;
    }
    while (buf_unread(&c->out) > 0) {
        ssize_t n = send(fd, buf_read_ptr(&c->out), buf_unread(&c->out), MSG_NOSIGNAL);
        if (n > 0) {
            buf_consume(&c->out, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        conn_close(c, ABORT_CLIENT_CLOSED);
        leave(c);
        return;
    }
    if (buf_unread(&c->out) == 0) {
        want_write(c, false);
        buf_dispose(&c->out);
        if (c->state == CONN_CLOSING) {
            begin_close(c);
        } else if (c->state == CONN_IDLE) {
            set_timer(c, TIMER_KEEPALIVE);
        } else if (c->state == CONN_HANDLING) {
            set_timer(c, TIMER_NONE);
        }
        if (!is_dead(c) && c->state == CONN_IDLE && buf_unread(&c->in) > 0) {
            process_input(c, NULL, 0);
        }
    } else if (c->state != CONN_READING) {
        /* Progress (the last answer's rest, in IDLE, too): the send timeout
         * starts again. A request being read keeps its own timer. */
        set_timer(c, TIMER_SEND);
        note_send_queue(c);
    }
    if (!is_dead(c) && c->on_drain && buf_unread(&c->out) <= CONN_OUT_HIGH_WATER / 2) {
        c->on_drain(c);
    }
    leave(c);
}

/* limits.body_total_timeout_ms passed while the body was still arriving.
 * Before anything went upstream the client gets 408; once part of the
 * request has left (or a response began) it can only be aborted. */
static void body_deadline_passed(struct conn *c)
{
    struct exchange *r = c->ex;
    LOGI("request body not received in total time", "client=%s body_bytes=%zu",
         c->peer_ip, r ? r->body.len : (size_t)0);
    if (r && (r->committed || r->response_started)) {
        conn_close(c, ABORT_BODY_TIMEOUT);
        return;
    }
    conn_reject(c, REJECT_BODY_TIMEOUT, "the whole body took longer than allowed");
}

/* Output waits and its send timeout passed. The kernel reports room only
 * once a good part of a large send buffer is free, so a client reading
 * slowly but steadily raises no write event for long: it is reading if the
 * socket's send queue shrank. Then the timeout starts again. */
static bool still_reading(struct conn *c)
{
    int queued = -1;
    if (c->send_queue < 0 || ioctl(c->fd, SIOCOUTQ, &queued) != 0 || queued >= c->send_queue) {
        return false;
    }
    c->send_queue = queued;
    set_timer(c, TIMER_SEND);
    event_active(&c->wev, EV_WRITE, 0); /* and the room there is, filled */
    return true;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    c->timer_at_ms = 0;
    uint64_t now = clock_now_ms();
    if (c->deadline_ms == 0) {
        return; /* cleared since it was armed */
    }
    if (c->deadline_ms > now) {
        uint64_t at = c->deadline_ms; /* moved later since it was armed */
        if (c->state == CONN_READING && c->parser.head_done && !c->eof) {
            /* reset_check: read to the end of what is there, or its error */
            event_active(&c->rev, EV_READ | EV_CLOSED, 0);
            at = at < now + CONN_RESET_CHECK_MS ? at : now + CONN_RESET_CHECK_MS;
        }
        add_timer(c, now, at);
        return;
    }
    c->deadline_ms = 0;
    enter(c);
    switch (c->state) {
    case CONN_IDLE:
        if (c->first_request) {
            /* Connected but sent nothing within the header timeout. */
            start_request(c);
            if (!is_dead(c)) {
                c->state = CONN_READING;
                conn_reject(c, REJECT_HEADER_TIMEOUT, NULL);
            }
        } else if (buf_unread(&c->out) == 0 || !still_reading(c)) {
            /* keep-alive idle timeout, or the last answer's rest unread */
            conn_close(c, ABORT_CLIENT_CLOSED);
        }
        break;
    case CONN_READING:
        if (c->parser.head_done && c->body_total_armed) {
            body_deadline_passed(c);
        } else {
            conn_reject(c, c->parser.head_done ? REJECT_BODY_TIMEOUT : REJECT_HEADER_TIMEOUT,
                        NULL);
        }
        break;
    case CONN_HANDLING:
        if (buf_unread(&c->out) > 0 && !still_reading(c)) {
            LOGI("client stopped reading", "client=%s", c->peer_ip);
            conn_close(c, ABORT_SEND_TIMEOUT);
        }
        break;
    case CONN_CLOSING:
        if (buf_unread(&c->out) == 0 || !still_reading(c)) {
            conn_close(c, ABORT_CLIENT_CLOSED);
        }
        break;
    }
    leave(c);
}

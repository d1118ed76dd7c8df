#include "thaw/upstream.h"
#include "thaw/clock.h"
#include "thaw/conn.h"
#include "thaw/log.h"

#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* A reused connection closed by the replica within this long of the request
 * going out is taken as closed before the replica read it. */
#define STALE_RACE_MS 250
/* A connection pooled less than this long ago, by a read that emptied its
 * socket, is reused without the peek for a close (take_pooled): no replica's
 * idle timer is that short, a close racing the request is sent again all the
 * same (is_stale_pooled), and bytes nobody asked for raise a read event. */
#define PEEK_AFTER_IDLE_MS 100


static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static void on_body(void *ud, const char *data, size_t len);
static void check_accepts(struct upstream_ctx *ctx, struct endpoint *ep);
static void on_check_retry(evutil_socket_t fd, short what, void *arg);
static void arm_connect_timer(struct upstream *u, uint64_t now);

/* How long an answer under way may be silent before its socket is looked at
 * (check_silence). */
#define SILENCE_CHECK_MS 2000

static const char *owner_name(const struct endpoint *ep)
{
    return ep->model_name[0] ? ep->model_name : "-";
}

static void arm_timer_at(struct upstream *u, uint64_t now, uint64_t at)
{
    struct timeval tv = clock_timeval(at - now);
    event_add(&u->tev, &tv);
    u->timer_at_ms = at;
}

/* Times the connection out ms from now. The timer is added again only when
 * it would fire after the new deadline (see deadline_ms). */
static void arm_ms(struct upstream *u, uint64_t ms)
{
    uint64_t now = clock_now_ms();
    u->deadline_ms = now + ms;
    u->heard_ms = now;
    uint64_t at = u->deadline_ms;
    if (u->state == UP_STREAMING && now + SILENCE_CHECK_MS < at) {
        at = now + SILENCE_CHECK_MS;
    }
    if (u->timer_at_ms == 0 || u->timer_at_ms > at) {
        arm_timer_at(u, now, at);
    }
}

/* A replica's reset can come in the same readiness report as its last bytes,
 * and libevent tells a read callback nothing of it: the short read that took
 * those bytes looks like any other, and no new edge follows. So an answer
 * under way that has been silent for SILENCE_CHECK_MS is looked at (one
 * peek): bytes, an end or an error there are read now. Answers with tokens
 * coming never pay the system call. */
static void check_silence(struct upstream *u, uint64_t now)
{
    if ((u->state != UP_STREAMING && u->state != UP_WAITING) || u->reading_paused ||
        now - u->heard_ms < SILENCE_CHECK_MS) {
        return;
    }
    char c;
    ssize_t n = recv(u->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        event_active(&u->rev, EV_READ, 0);
    }
}

/* Pooled: on its replica's list (most recent first, the one taken next)
 * and on the list of all, whose last is the one a new connection closes
 * when the descriptor budget is used up (make_room). */
static void pool_add(struct upstream *u)
{
    u->state = UP_IDLE;
    list_push_front(&u->ep->idle, &u->node);
    u->ep->n_idle++;
    list_push_front(&u->ctx->pooled, &u->pooled_node);
}

static void pool_remove(struct upstream *u)
{
    list_remove(&u->node);
    u->ep->n_idle--;
    list_remove(&u->pooled_node);
}

static void disarm(struct upstream *u)
{
    event_del(&u->tev);
    u->deadline_ms = u->timer_at_ms = 0;
}

static void destroy(struct upstream *u)
{
    if (u->dead) {
        return;
    }
    u->dead = true;
    accept_forget(u->ep, &u->acc);
    if (u->state == UP_IDLE) {
        pool_remove(u);
    }
    event_del(&u->rev);
    event_del(&u->wev);
    disarm(u);
    if (u->fd >= 0) {
        close(u->fd);
        u->fd = -1;
        u->ctx->n_open--;
    }
    http_head_dispose(&u->head);
    buf_dispose(&u->resp_head);
    buf_dispose(&u->err_body);
    endpoint_unref(u->ep);
    u->ep = NULL;
    if (u->busy == 0) {
        free(u);
    }
}

static void enter(struct upstream *u)
{
    u->busy++;
}

static void leave(struct upstream *u)
{
    if (--u->busy == 0 && u->dead) {
        free(u);
    }
}

/* How long a pooled connection may sit idle: the configured time, or less
 * when the replica said it closes sooner (Keep-Alive: timeout=N), with a
 * margin so thaw closes first and never sends into a closing connection. */
static uint64_t pool_idle_ms(const struct upstream *u, uint64_t configured)
{
    if (u->server_keepalive_ms == 0) {
        return configured;
    }
    uint64_t margin = u->server_keepalive_ms >= 2000 ? 1000 : u->server_keepalive_ms / 2;
    uint64_t server = u->server_keepalive_ms - margin;
    return server < configured ? (server ? server : 1) : configured;
}

/* Remembers the replica's idle timeout from `Keep-Alive: timeout=N`. */
static void learn_keepalive(struct upstream *u)
{
    const struct http_header *h = http_head_find(&u->head, "keep-alive");
    if (!h) {
        return;
    }
    const char *v = http_hvalue(&u->head, h);
    size_t len = h->value_len;
    for (size_t i = 0; i + 8 <= len; i++) {
        bool at_start = i == 0 || v[i - 1] == ' ' || v[i - 1] == '\t' || v[i - 1] == ',';
        if (!at_start || strncasecmp(v + i, "timeout=", 8) != 0) {
            continue;
        }
        uint64_t secs = 0;
        size_t j = i + 8;
        while (j < len && v[j] >= '0' && v[j] <= '9' && secs < 86400) {
            secs = secs * 10 + (uint64_t)(v[j] - '0');
            j++;
        }
        if (j > i + 8) {
            u->server_no_keepalive = secs == 0;
            u->server_keepalive_ms = (uint32_t)(secs * 1000);
        }
        return;
    }
}

/* Lets go of the request: gives its slot back, then pools or closes the
 * connection. Returns the owner the slot belonged to (NULL if gone). */
static struct model *release(struct upstream *u, bool reusable)
{
    struct upstream_req *r = u->req;
    struct endpoint *ep = u->ep;
    struct upstream_ctx *ctx = u->ctx;
    struct model *m = ep->model;
    if (r) {
        r->up = NULL;
        r->ex->committed = false;
        u->req = NULL;
        m = ctx->handler->give_slot(ep);
        if (r->conn->on_drain) {
            r->conn->on_drain = NULL;
        }
    }
    if (reusable && m && !*ctx->draining && !u->server_no_keepalive && !u->reading_fin &&
        ep->n_idle < ctx->keepalive_per_endpoint && !u->dead) {
        if (u->reading_paused) {
            u->reading_paused = false;
            event_add(&u->rev, NULL);
        }
        /* Most recently used first (as nginx does): the connection least
         * likely to be closed by the replica's own idle timer. */
        pool_add(u);
        event_del(&u->wev);
        u->idle_since_ms = clock_now_ms();
        u->pooled_drained = u->reading_drained;
        arm_ms(u, pool_idle_ms(u, ctx->keepalive_timeout_ms));
        http_head_reset(&u->head);
    } else {
        destroy(u);
    }
    return m;
}

/* Connect failed (or the first write on a reused connection failed before
 * anything was accepted): eject the endpoint briefly and try elsewhere. */
static void connect_failed(struct upstream *u, int err)
{
    struct upstream_ctx *ctx = u->ctx;
    struct endpoint *ep = u->ep;
    uint64_t now = clock_now_ms();
    ctx->metrics->upstream_connect_failures++;
    ep->connect_failures++;
    ep->ejected_until_ms = now + ctx->eject_ms;
    LOGW("upstream connect failed", "model=%s endpoint=%s error=\"%s\"", owner_name(ep),
         ep->addr_text, strerror(err));
    struct upstream_req *r = u->req;
    struct model *m = release(u, false);
    if (r) {
        ctx->handler->retry(r);
    }
    if (m) {
        ctx->handler->capacity(ctx->ud, m);
    }
}

static void begin(struct upstream_ctx *ctx, struct upstream_req *r, struct endpoint *ep,
                  bool may_reuse);

static bool out_of_descriptors(int err)
{
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

/* thaw's own limit left no socket for a connection to ep: at most one line
 * a second (a burst of requests would write one each), like the accept
 * pause's. */
static void log_no_socket(struct upstream_ctx *ctx, const struct endpoint *ep, int err)
{
    uint64_t held;
    if (log_limit_pass(&ctx->fd_log, clock_now_ms(), LOG_LIMIT_MS, &held)) {
        LOGW("no socket for a replica connection",
             "model=%s endpoint=%s error=\"%s\" suppressed=%llu", owner_name(ep), ep->addr_text,
             strerror(err), (unsigned long long)held);
    }
}

/* At the replica connections' share of the descriptor budget, a new one
 * first closes the pooled connection idle longest (any replica's): pools
 * of many replicas could otherwise hold the descriptors the clients'
 * requests need. */
static void make_room(struct upstream_ctx *ctx)
{
    if (ctx->max_open && ctx->n_open >= ctx->max_open && !list_empty(&ctx->pooled)) {
        struct upstream *idle = container_of(list_last(&ctx->pooled), struct upstream, pooled_node);
        ctx->metrics->upstream_budget_closed++;
        destroy(idle);
    }
}

static bool nothing_to_read(int fd)
{
    char byte;
    ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Pooled moments ago by a read that emptied the socket with no FIN flagged:
 * whatever the replica sent after that read raises an event at the next
 * poll, which closes the connection (unless it is taken in this very turn,
 * when a close racing the request is sent again). A read that did not empty
 * the socket, or came after a pause for the client (a FIN may wait behind
 * it), leaves bytes that raise no new edge: peeked. */
static bool known_open(const struct upstream *u, uint64_t now)
{
    return u->pooled_drained && now - u->idle_since_ms < PEEK_AFTER_IDLE_MS;
}

/* The most recently pooled connection the replica has not closed. A close
 * the loop has not processed yet (the replica's idle timer, or its death) is
 * seen here with one non-blocking peek, before a request is put on it; not
 * on a connection known open (a system call a request saved). */
static struct upstream *take_pooled(struct upstream_ctx *ctx, struct endpoint *ep)
{
    struct list_node *n;
    uint64_t now = clock_now_ms();
    while ((n = list_first(&ep->idle))) {
        struct upstream *u = container_of(n, struct upstream, node);
        if (known_open(u, now) || nothing_to_read(u->fd)) {
            pool_remove(u);
            return u;
        }
        ctx->metrics->upstream_stale_closed++;
        destroy(u); /* closed, reset, or bytes nobody asked for */
    }
    return NULL;
}

/* A reused pooled connection failed before the replica sent a byte (EOF,
 * reset, or a refused write): the replica closed it while idle and never
 * read the request. That says nothing about the replica's health, so it is
 * not ejected; the request goes out once more on a new connection, and only
 * a failure there counts against the replica. */
static bool is_stale_pooled(const struct upstream *u)
{
    if (!u->reused || u->got_bytes || !u->req || u->req->stale_retried) {
        return false;
    }
    /* A write that failed was never read. A close right after the request
     * went out is the replica's idle close racing it; a close after the
     * replica had time to work on it may mean it did: not sent again. */
    return u->state == UP_SENDING || clock_now_ms() - u->sent_ms <= STALE_RACE_MS;
}

static void stale_pooled(struct upstream *u, int err)
{
    struct upstream_ctx *ctx = u->ctx;
    struct upstream_req *r = u->req;
    struct endpoint *ep = u->ep;
    ctx->metrics->upstream_stale_retries++;
    LOGD("pooled connection closed by the replica; sending again on a new one",
         "model=%s endpoint=%s error=\"%s\"", owner_name(ep), ep->addr_text, strerror(err));
    r->stale_retried = true;
    endpoint_ref(ep);
    struct model *m = release(u, false);
    if (m && ep->model == m) {
        r->tries--; /* the same attempt, not a new one */
        begin(ctx, r, ep, false);
    } else {
        ctx->handler->retry(r); /* the replica is gone meanwhile */
    }
    endpoint_unref(ep);
}

/* why: what was wrong with the replica's answer, for the log (NULL: the
 * reason says it). */
static void fail_because(struct upstream *u, enum reject_reason reason, enum abort_reason abort,
                         const char *why)
{
    struct upstream_ctx *ctx = u->ctx;
    struct upstream_req *r = u->req;
    if (r && u->head_pending && !r->heartbeat) {
        /* The replica's head was parsed but nothing reached the client (bad
         * framing in the same read): the client still gets a clean 502. */
        u->head_pending = false;
        r->ex->response_started = false;
    }
    if (r) {
        LOGW("upstream failed", "model=%s endpoint=%s reason=%s started=%d%s%s", owner_name(u->ep),
             u->ep->addr_text, reject_info(reason)->name, r->ex->response_started,
             why ? " error=" : "", why ? LOG_Q(why) : "");
    }
    struct model *m = release(u, false);
    if (r) {
        ctx->handler->failed(r, reason, abort);
    }
    if (m) {
        ctx->handler->capacity(ctx->ud, m);
    }
}

static void fail(struct upstream *u, enum reject_reason reason, enum abort_reason abort)
{
    fail_because(u, reason, abort, NULL);
}

static void hold_until_alive(struct upstream_ctx *ctx, struct endpoint *ep);

/* The replica reset or closed the connection mid-exchange: the request
 * fails (see fail), and the replica is held back until it shows it is
 * alive, before the freed slot takes the next request. */
static void broke(struct upstream *u)
{
    hold_until_alive(u->ctx, u->ep);
    fail(u, REJECT_UPSTREAM_ERROR, ABORT_UPSTREAM_CLOSED);
}

/* Writing to the client failed mid-response: the client left, the replica
 * did nothing wrong. Drop the exchange and close the client. */
static void client_gone(struct upstream *u)
{
    struct upstream_ctx *ctx = u->ctx;
    struct upstream_req *r = u->req;
    const char *name = owner_name(u->ep);
    struct model *m = release(u, false);
    if (r) {
        LOGD("client went away mid-response", "model=%s", name);
        ctx->handler->client_gone(r);
    }
    if (m) {
        ctx->handler->capacity(ctx->ud, m);
    }
}

/* Why a 2xx answer cannot continue thaw's event stream (its head went
 * out as an uncoded text/event-stream): NULL when it can. */
static const char *unusable_in_stream(const struct http_head *h)
{
    const struct http_header *ce = http_head_find(h, "content-encoding");
    if (ce && ce->value_len && !http_name_eq(http_hvalue(h, ce), ce->value_len, "identity")) {
        return "the model's server answered the streaming request with a content-coded body";
    }
    const struct http_header *ct = http_head_find(h, "content-type");
    static const char sse[] = "text/event-stream";
    if (!ct || ct->value_len < sizeof sse - 1 ||
        strncasecmp(http_hvalue(h, ct), sse, sizeof sse - 1) != 0) {
        return "the model's server answered the streaming request with something other than "
               "an event stream (it read \"stream\" as false?)";
    }
    return NULL;
}

static void complete(struct upstream *u, bool reusable)
{
    struct upstream_ctx *ctx = u->ctx;
    struct upstream_req *r = u->req;
    /* A 2xx that could not continue a heartbeat stream ended it as a 502. */
    int status = u->stream_why ? 502 : u->head.status;
    if (u->stream_error) {
        ctx->handler->stream_error(r, status,
                                   u->err_body.data ? u->err_body.data : "", u->err_body.len,
                                   u->stream_why);
    } else if (u->rechunk) {
        conn_write(r->conn, "0\r\n\r\n", 5);
    }
    if (u->client_close) {
        r->conn->close_after = true;
    }
    u->served++;
    struct model *m = release(u, reusable);
    ctx->handler->done(r, status);
    if (m) {
        ctx->handler->capacity(ctx->ud, m);
    }
}

/* Whether every byte of the request reached the socket. A connection whose
 * replica answered before taking all of the body is never pooled: the rest
 * of the body would be read as the next request's beginning. */
static bool request_sent(const struct upstream *u)
{
    return !u->body_dropped && u->sent >= u->req->head.len + u->req->ex->body.len;
}

/* The replica answers while the body still goes out (it may stream as it
 * reads, or refuse early and stop reading): the body is sent on, as the
 * response is forwarded. A write that fails then ends the sending, not the
 * answer under way. */
static bool sending_after_head(struct upstream *u, int err)
{
    if (u->state != UP_STREAMING) {
        return false;
    }
    u->body_dropped = true;
    event_del(&u->wev);
    LOGD("replica stopped taking the request body after answering", "endpoint=%s error=\"%s\"",
         u->ep->addr_text, strerror(err));
    return true;
}

static void send_request(struct upstream *u)
{
    struct upstream_req *r = u->req;
    size_t hlen = r->head.len, blen = r->ex->body.len;
    while (u->sent < hlen + blen && !u->body_dropped) {
        struct iovec iov[2];
        int n = 0;
        if (u->sent < hlen) {
            iov[n].iov_base = r->head.data + u->sent;
            iov[n].iov_len = hlen - u->sent;
            n++;
            if (blen) {
                iov[n].iov_base = r->ex->body.data;
                iov[n].iov_len = blen;
                n++;
            }
        } else {
            iov[n].iov_base = r->ex->body.data + (u->sent - hlen);
            iov[n].iov_len = blen - (u->sent - hlen);
            n++;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(u->fd, &msg, MSG_NOSIGNAL);
        if (w > 0) {
            u->sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(&u->wev, NULL);
            return;
        }
        int err = errno;
        if (sending_after_head(u, err)) {
            return;
        }
        if (is_stale_pooled(u)) {
            stale_pooled(u, err);
        } else if (u->sent == 0) {
            connect_failed(u, err); /* nothing was accepted: safe elsewhere */
        } else {
            broke(u);
        }
        return;
    }
    event_del(&u->wev);
    if (u->state == UP_SENDING) {
        u->state = UP_WAITING;
        u->sent_ms = clock_now_ms();
        arm_ms(u, r->first_byte_timeout_ms);
    }
}

void upstream_start(struct upstream_ctx *ctx, struct upstream_req *r, struct endpoint *ep)
{
    begin(ctx, r, ep, true);
}

/* Takes the slot and sends r over the most recently pooled connection
 * (may_reuse) or a new one. */
static void begin(struct upstream_ctx *ctx, struct upstream_req *r, struct endpoint *ep,
                  bool may_reuse)
{
    const struct upstream_handler *h = ctx->handler;
    h->take_slot(ep);
    r->tries++;
    r->last_ep = ep;
    r->dispatch_ms = clock_now_ms();
    struct upstream *u = may_reuse ? take_pooled(ctx, ep) : NULL;
    if (u) {
        u->reused = true;
        ctx->metrics->upstream_reused++;
        /* The pool's timer stays: it fires before the new deadline, as a
         * rule, and then arms itself for the rest (a store per request
         * rather than a timer taken off and put back). */
        arm_ms(u, r->first_byte_timeout_ms);
        u->state = UP_SENDING;
    } else {
        u = calloc(1, sizeof *u);
        if (!u) {
            h->give_slot(ep);
            r->ex->state = REQ_ROUTED;
            conn_reject(r->conn, REJECT_INTERNAL, NULL);
            return;
        }
        u->ctx = ctx;
        u->ep = ep;
        endpoint_ref(ep);
        list_node_init(&u->node);
        http_head_init(&u->head);
        buf_init(&u->resp_head);
        buf_init(&u->err_body);
        http_parser_init(&u->parser, HTTP_RESPONSE, ctx->resp_limits);
        make_room(ctx);
        u->fd = socket(ep->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (u->fd >= 0) {
            ctx->n_open++;
        }
        event_assign(&u->rev, ctx->base, u->fd, conn_read_events(ctx->base), on_read, u);
        event_assign(&u->wev, ctx->base, u->fd, conn_write_events(ctx->base), on_write, u);
        event_assign(&u->tev, ctx->base, -1, 0, on_timer, u);
        u->req = r;
        r->up = u;
        r->ex->committed = true;
        ctx->metrics->upstream_connects++;
        if (u->fd < 0) {
            int err = errno;
            if (out_of_descriptors(err)) {
                /* thaw's own limit, not the replica's fault: no ejection. */
                log_no_socket(ctx, ep, err);
                struct model *m = release(u, false);
                r->ex->state = REQ_ROUTED;
                conn_reject(r->conn, REJECT_TOO_MANY_CONNECTIONS, NULL);
                if (m) {
                    h->capacity(ctx->ud, m);
                }
                return;
            }
            connect_failed(u, err);
            return;
        }
        int one = 1;
        setsockopt(u->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int rc = connect(u->fd, (struct sockaddr *)&ep->addr, ep->addrlen);
        if (rc < 0 && errno != EINPROGRESS) {
            connect_failed(u, errno);
            return;
        }
        u->state = rc == 0 ? UP_SENDING : UP_CONNECTING;
        uint64_t now = clock_now_ms();
        accept_opened(ep, &u->acc, rc == 0, now);
        u->connect_deadline_ms = now + r->connect_timeout_ms;
        check_accepts(ctx, ep);
    }
    u->req = r;
    r->up = u;
    r->ex->committed = true;
    u->sent = 0;
    u->body_dropped = false;
    u->got_bytes = false;
    u->decode_body = u->rechunk = u->client_close = u->client_failed = false;
    u->head_pending = false;
    u->stream_error = false;
    u->stream_why = NULL;
    buf_reset(&u->err_body);
    u->reading_paused = false;
    http_parser_next(&u->parser, &u->head, NULL);
    u->parser.skip_body = r->ex->head.method == HTTP_HEAD;
    u->parser.on_body = NULL;
    u->parser.ud = u;
    if (u->state == UP_CONNECTING) {
        event_add(&u->wev, NULL);
        arm_connect_timer(u, clock_now_ms());
        return;
    }
    if (!u->reused) {
        event_add(&u->rev, NULL); /* a pooled connection's is on already */
    }
    enter(u);
    send_request(u);
    leave(u);
}

void upstream_cancel(struct upstream *u)
{
    struct upstream_ctx *ctx = u->ctx;
    struct model *m = release(u, false);
    if (m) {
        ctx->handler->capacity(ctx->ud, m);
    }
}

void upstream_adopt(struct upstream_ctx *ctx, struct endpoint *ep, int fd)
{
    struct upstream *u = calloc(1, sizeof *u);
    if (!u) {
        close(fd);
        return;
    }
    u->ctx = ctx;
    u->ep = ep;
    endpoint_ref(ep);
    list_node_init(&u->node);
    http_head_init(&u->head);
    buf_init(&u->resp_head);
    buf_init(&u->err_body);
    http_parser_init(&u->parser, HTTP_RESPONSE, ctx->resp_limits);
    u->fd = fd;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    event_assign(&u->rev, ctx->base, fd, conn_read_events(ctx->base), on_read, u);
    event_assign(&u->wev, ctx->base, fd, conn_write_events(ctx->base), on_write, u);
    event_assign(&u->tev, ctx->base, -1, 0, on_timer, u);
    ctx->n_open++;
    pool_add(u);
    event_add(&u->rev, NULL);
    arm_ms(u, ctx->keepalive_timeout_ms);
}

static bool reconnect(struct upstream *u);

/* Stalled connects made again as far as the window has room. */
static void remake_stalled(struct endpoint *ep)
{
    struct accept_slot *s;
    while ((s = accept_next_remake(ep))) {
        if (!reconnect(container_of(s, struct upstream, acc))) {
            break; /* thaw's own limits: the next acceptance tries again */
        }
    }
}

/* After an acceptance: stalled connects go again as far as the window has
 * room, and waiting requests when it was full and has room now. */
static void made_room(struct upstream_ctx *ctx, struct endpoint *ep, bool room)
{
    remake_stalled(ep);
    if (room && ep->model) {
        ctx->handler->capacity(ctx->ud, ep->model);
    }
}

/* The replica accepted s (NULL: none in particular) and, where the address
 * has one accept queue, every connection established before it up to seq. */
static void accepted(struct upstream_ctx *ctx, struct endpoint *ep, struct accept_slot *s,
                     uint64_t seq)
{
    made_room(ctx, ep, accept_vouched(ep, s, seq));
}

/* A check that got no answer, or could not be sent: nothing else sends one
 * while the window stays full. */
static void retry_check_later(struct endpoint *ep)
{
    if (accept_wants_check(ep)) {
        struct timeval tv = clock_timeval(ACCEPT_CHECK_RETRY_MS);
        evtimer_add(&ep->check_retry, &tv);
    }
}

static void on_check_done(struct control *c, int status, void *ud)
{
    struct endpoint *ep = ud;
    struct upstream_ctx *ctx = ep->check_ctx;
    (void)c;
    endpoint_ref(ep);
    if (status > 0) {
        /* Any answer: the replica is alive, and it accepted the check's
         * connection and those established before it. */
        bool held = ep->held_for_check;
        if (held) {
            ep->held_for_check = false;
            ep->ejected_until_ms = 0;
            LOGI("replica answered after a broken connection", "model=%s endpoint=%s",
                 owner_name(ep), ep->addr_text);
        }
        accepted(ctx, ep, NULL, ep->check_upto);
        if (held && ep->model) {
            ctx->handler->capacity(ctx->ud, ep->model);
        }
        check_accepts(ctx, ep);
    } else {
        /* No answer: a hold stays until its ejection lapses (eject_ms). */
        ep->held_for_check = false;
        retry_check_later(ep);
    }
    endpoint_unref(ep);
}

static void on_check_retry(evutil_socket_t fd, short what, void *arg)
{
    struct endpoint *ep = arg;
    check_accepts(ep->check_ctx, ep);
}

static bool send_check(struct upstream_ctx *ctx, struct endpoint *ep);

/* At the cap with established connections unanswered, a check finds out
 * whether the replica has accepted them (they may carry requests that take
 * seconds to answer), rather than holding the next requests until then. */
static void check_accepts(struct upstream_ctx *ctx, struct endpoint *ep)
{
    if (accept_wants_check(ep) && send_check(ctx, ep)) {
        ctx->metrics->upstream_accept_checks++;
    }
}

/* The replica reset or closed a connection before its answer ended. A
 * replica that dies (a crash, the OOM killer) does that to every connection
 * at once, and the request sent next into it would meet the same end (its
 * queue accepts the connection until the process is gone): 502, though it
 * was only waiting. So it gets nothing more until a check on a connection
 * of its own is answered, a millisecond for one alive; until then requests
 * go to other replicas or wait, as for an ejected one, and a replica
 * reported gone meanwhile takes none of them. */
static void hold_until_alive(struct upstream_ctx *ctx, struct endpoint *ep)
{
    if (!ep->model) {
        return;
    }
    uint64_t until = clock_now_ms() + ctx->eject_ms;
    if (!ep->held_for_check) {
        ctx->metrics->upstream_break_holds++;
        LOGI("replica held back after a broken connection", "model=%s endpoint=%s", owner_name(ep),
             ep->addr_text);
    }
    ep->held_for_check = true;
    if (ep->ejected_until_ms < until) {
        ep->ejected_until_ms = until;
    }
    send_check(ctx, ep);
}

/* One GET of the replica's health path on a connection of its own, unless
 * one is out: its answer (on_check_done) vouches for the connections
 * established before it, and that the replica is alive. */
static bool send_check(struct upstream_ctx *ctx, struct endpoint *ep)
{
    if (!ep->model || (ep->check_ctx && control_running(&ep->check))) {
        return false;
    }
    if (!ep->check_ctx) {
        control_init(&ep->check, ctx->base);
        evtimer_assign(&ep->check_retry, ctx->base, on_check_retry, ep);
        ep->check_ctx = ctx;
    }
    evtimer_del(&ep->check_retry);
    ep->check_upto = ep->established;
    if (control_send(&ep->check, ep->addr_text, "GET", ep->check_path,
                     ACCEPT_CHECK_TIMEOUT_MS, on_check_done, ep) == 0) {
        return true;
    }
    /* No socket (control logs it) or no route: on_check_done is not called. */
    retry_check_later(ep);
    return false;
}

/* A connecting upstream's timer: the stall check, or its connect timeout
 * when that comes first. */
static void arm_connect_timer(struct upstream *u, uint64_t now)
{
    uint64_t left = u->connect_deadline_ms > now ? u->connect_deadline_ms - now : 0;
    arm_ms(u, left < ACCEPT_STALL_MS ? left : ACCEPT_STALL_MS);
}

/* Makes u's connect again on a new socket (the one that stalled is closed:
 * the kernel would send its SYN again only a second later). The request
 * stays with it; on_write sees the new connect through. false: thaw could
 * not open one (its own limits: descriptors, local ports), and the connect
 * under way goes on as it was. */
static bool reconnect(struct upstream *u)
{
    struct endpoint *ep = u->ep;
    struct upstream_ctx *ctx = u->ctx;
    int fd = socket(ep->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&ep->addr, ep->addrlen) < 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        if (err == EADDRNOTAVAIL || err == EAGAIN || err == ENOBUFS || err == ENOMEM) {
            return false;
        }
        connect_failed(u, err);
        return true;
    }
    uint64_t now = clock_now_ms();
    accept_remade(ep, &u->acc, now);
    ctx->metrics->upstream_connect_stalls++;
    event_del(&u->wev);
    close(u->fd);
    u->fd = fd;
    event_assign(&u->rev, ctx->base, u->fd, conn_read_events(ctx->base), on_read, u);
    event_assign(&u->wev, ctx->base, u->fd, conn_write_events(ctx->base), on_write, u);
    event_add(&u->wev, NULL);
    arm_connect_timer(u, now);
    return true;
}

/* Whether the completed handshake was fast, by the kernel's round-trip
 * time of it (the loop's own delays left out). */
static bool handshake_was_fast(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
           ti.tcpi_rtt < ACCEPT_FAST_HANDSHAKE_MS * 1000u;
}

/* u's connect has had no answer for ACCEPT_STALL_MS on a path known fast:
 * its SYN was dropped, the replica's accept queue being full. It is made
 * again now if the window has room, else when an acceptance makes room. */
static void connect_stalled(struct upstream *u, uint64_t now)
{
    if (accept_stalled(u->ep, &u->acc, now)) {
        if (!reconnect(u)) {
            accept_wait(u->ep, &u->acc);
        } else if (u->dead) {
            return;
        }
    }
    arm_connect_timer(u, now);
    check_accepts(u->ctx, u->ep);
}

void upstream_close_idle(struct endpoint *ep)
{
    while (!list_empty(&ep->idle)) {
        struct upstream *u = container_of(list_first(&ep->idle), struct upstream, node);
        destroy(u);
    }
}

static void on_client_drain(struct conn *c)
{
    struct upstream_req *r = c->drain_ud;
    struct upstream *u = r ? r->up : NULL;
    if (u && u->reading_paused && !u->dead) {
        u->reading_paused = false;
        event_add(&u->rev, NULL);
        /* Edge-triggered, bytes (or the replica's FIN) that came while paused
         * raise no new edge when the pause and this resume cancel out in the
         * loop's change list: read until the socket is drained now (EV_CLOSED
         * made up for that: no FIN is known). */
        u->resumed = true;
        event_active(&u->rev, EV_READ | EV_CLOSED, 0);
        arm_ms(u, r->idle_timeout_ms);
    }
}

/* "HTTP/1.1 NNN " without a printf: once per response. */
static void append_status_line_start(struct buf *b, unsigned status)
{
    char line[] = "HTTP/1.1 000 ";
    if (status > 999) {
        buf_printf(b, "HTTP/1.1 %u ", status);
        return;
    }
    line[9] = (char)('0' + status / 100);
    line[10] = (char)('0' + status / 10 % 10);
    line[11] = (char)('0' + status % 10);
    buf_append(b, line, sizeof line - 1);
}

/* Sends the pending response head (if any) and raw body bytes together. */
static int flush(struct upstream *u, const char *raw, size_t len)
{
    struct iovec iov[2];
    int n = 0;
    if (u->head_pending) {
        iov[n].iov_base = u->resp_head.data;
        iov[n].iov_len = u->resp_head.len;
        n++;
        u->head_pending = false;
    }
    if (len) {
        iov[n].iov_base = (void *)raw;
        iov[n].iov_len = len;
        n++;
    }
    return n ? conn_writev(u->req->conn, iov, n) : 0;
}

/* Builds the client's response head and picks how the body goes. The head
 * is sent with the first body bytes (one system call for small replies). */
static int forward_head(struct upstream *u)
{
    struct upstream_req *r = u->req;
    struct conn *c = r->conn;
    struct http_head *h = &u->head;
    bool client11 = r->ex->head.http_major == 1 && r->ex->head.http_minor >= 1;
    u->client_close = !r->ex->head.keep_alive || c->close_after || *u->ctx->draining;
    bool bodyless = u->parser.skip_body || h->status == 204 || h->status == 304 ||
                    (h->status >= 100 && h->status < 200);
    bool add_te = false;
    if (!bodyless) {
        if (h->chunked) {
            if (client11) {
                add_te = true; /* raw chunked framing passes through */
            } else {
                u->decode_body = true;
                u->client_close = true;
            }
        } else if (!h->has_length) {
            /* Ends when the replica closes: re-frame for a 1.1 client so
             * its connection can stay open. */
            u->decode_body = true;
            if (client11) {
                u->rechunk = add_te = true;
            } else {
                u->client_close = true;
            }
        }
    }
    const char *why = r->heartbeat ? unusable_in_stream(h) : NULL;
    if (r->heartbeat && (h->status < 200 || h->status > 299 || why) &&
        u->ctx->handler->stream_error) {
        u->stream_why = h->status >= 200 && h->status <= 299 ? why : NULL;
        /* An error into thaw's 200 event stream: its body is kept (up to a
         * bound) and becomes an SSE error event at its end. The exchange
         * stays REQ_UPSTREAM, so a failure meanwhile is answered the same
         * way. */
        u->stream_error = true;
        u->decode_body = true;
        u->parser.on_body = on_body;
        buf_reset(&u->resp_head);
        return 0;
    }
    if (r->heartbeat) {
        /* thaw already sent a 200 event-stream head: the replica's body
         * continues that chunked stream (its own head is not sent). */
        u->decode_body = !bodyless;
        u->rechunk = !bodyless;
        u->parser.on_body = on_body;
        buf_reset(&u->resp_head);
        r->ex->state = REQ_ANSWERED;
        c->on_drain = on_client_drain;
        c->drain_ud = r;
        if (bodyless) {
            conn_write(c, "0\r\n\r\n", 5);
        }
        return 0;
    }
    if (u->decode_body) {
        u->parser.on_body = on_body;
    }
    struct buf *b = &u->resp_head;
    buf_reset(b);
    append_status_line_start(b, h->status);
    if (h->target_len) {
        buf_append(b, http_target(h), h->target_len);
    } else {
        buf_append_str(b, http_reason_phrase(h->status));
    }
    buf_append(b, "\r\n", 2);
    for (uint32_t i = 0; i < h->n_headers; i++) {
        const struct http_header *x = &h->headers[i];
        if (http_is_hop_by_hop(h, x)) {
            continue;
        }
        if (!u->decode_body || !http_name_eq(http_hname(h, x), x->name_len, "content-length")) {
            buf_append(b, http_hname(h, x), x->name_len);
            buf_append(b, ": ", 2);
            buf_append(b, http_hvalue(h, x), x->value_len);
            buf_append(b, "\r\n", 2);
        }
    }
    if (add_te) {
        buf_append_str(b, "Transfer-Encoding: chunked\r\n");
    }
    if (u->client_close) {
        buf_append_str(b, "Connection: close\r\n");
    }
    buf_append(b, "\r\n", 2);
    r->ex->response_started = true;
    r->ex->state = REQ_ANSWERED;
    c->on_drain = on_client_drain;
    c->drain_ud = r;
    u->ctx->handler->first_byte(r, clock_now_ms());
    u->head_pending = true;
    /* Decoded bodies are written piecewise from on_body: head first. */
    return u->decode_body ? flush(u, NULL, 0) : 0;
}

static void on_body(void *ud, const char *data, size_t len)
{
    struct upstream *u = ud;
    struct upstream_req *r = u->req;
    if (!r || len == 0) {
        return;
    }
    if (u->stream_error) {
        size_t room = UPSTREAM_STREAM_ERROR_MAX - u->err_body.len;
        buf_append(&u->err_body, data, len < room ? len : room);
        return;
    }
    int rc;
    if (u->rechunk) {
        /* Size line, bytes and CRLF in one system call, not three. */
        char hdr[24];
        int n = snprintf(hdr, sizeof hdr, "%zx\r\n", len);
        struct iovec iov[3] = {{hdr, (size_t)n}, {(void *)data, len}, {"\r\n", 2}};
        rc = conn_writev(r->conn, iov, 3);
    } else {
        rc = conn_write(r->conn, data, len);
    }
    if (rc) {
        u->client_failed = true;
    }
}

/* Feeds response bytes; forwards them; ends the exchange at message end. */
static void process(struct upstream *u, const char *data, size_t n)
{
    size_t off = 0;
    size_t raw_off = 0, raw_len = 0; /* raw body bytes of this read, not yet sent */
    for (;;) {
        struct upstream_req *r = u->req;
        size_t used = 0;
        enum http_event ev = http_parser_execute(&u->parser, data + off, n - off, &used);
        if (u->state == UP_STREAMING && !u->decode_body && used > 0) {
            if (raw_len == 0) {
                raw_off = off;
            }
            raw_len += used;
        }
        off += used;
        if (u->client_failed) {
            client_gone(u);
            return;
        }
        switch (ev) {
        case HTTP_EV_NEED_MORE:
            if (u->state == UP_STREAMING && flush(u, data + raw_off, raw_len) != 0) {
                client_gone(u);
                return;
            }
            goto out;
        case HTTP_EV_HEAD:
            if (u->head.status == 101) {
                /* thaw never asks a replica to switch protocols (Upgrade is
                 * hop-by-hop and not forwarded): an unsolicited 101 is a
                 * broken replica, not something to pass on. */
                fail(u, REJECT_UPSTREAM_ERROR, ABORT_UPSTREAM_CLOSED);
                return;
            }
            if (u->head.status >= 100 && u->head.status < 200) {
                continue; /* interim response: skipped at its end */
            }
            learn_keepalive(u);
            if (forward_head(u) != 0) {
                client_gone(u);
                return;
            }
            u->state = UP_STREAMING;
            arm_ms(u, r->idle_timeout_ms);
            continue;
        case HTTP_EV_DONE:
            if (u->state != UP_STREAMING) {
                /* End of an interim 1xx: wait for the real response. */
                http_parser_next(&u->parser, &u->head, NULL);
                u->parser.skip_body = r->ex->head.method == HTTP_HEAD;
                u->parser.ud = u;
                continue;
            }
            if (flush(u, data + raw_off, raw_len) != 0) {
                client_gone(u);
                return;
            }
            /* Bytes after the answer would be one nobody asked for. */
            complete(u, u->head.keep_alive && off == n && request_sent(u));
            return;
        case HTTP_EV_ERROR:
            fail_because(u, REJECT_UPSTREAM_ERROR, ABORT_UPSTREAM_CLOSED,
                         http_parser_error_text(&u->parser));
            return;
        }
    }
out:
    if (u->req && conn_out_pending(u->req->conn) > CONN_OUT_HIGH_WATER && !u->reading_paused) {
        u->reading_paused = true;
        event_del(&u->rev);
        disarm(u);
    }
}

static void on_eof(struct upstream *u, int err)
{
    switch (u->state) {
    case UP_IDLE:
        destroy(u);
        return;
    case UP_CONNECTING:
        connect_failed(u, err ? err : ECONNREFUSED);
        return;
    case UP_SENDING:
    case UP_WAITING:
        if (is_stale_pooled(u)) {
            stale_pooled(u, err ? err : ECONNRESET);
        } else {
            broke(u);
        }
        return;
    case UP_STREAMING:
        /* A body that ends with the close ends only with a clean one (FIN):
         * a reset cuts it (RFC 9112, 8). */
        if (!(err && http_parser_needs_eof(&u->parser)) &&
            http_parser_finish(&u->parser) == HTTP_EV_DONE) {
            if (flush(u, NULL, 0) != 0) {
                client_gone(u);
                return;
            }
            complete(u, false);
        } else {
            broke(u);
        }
        return;
    }
}

/* One read's bytes. false when the connection is done reading this turn
 * (gone, pooled, or paused by the client's backpressure). */
static bool take_bytes(struct upstream *u, const char *data, size_t n)
{
    if (u->state == UP_IDLE) {
        destroy(u); /* bytes nobody asked for */
        return false;
    }
    u->got_bytes = true;
    if (u->acc.unconfirmed) {
        accepted(u->ctx, u->ep, &u->acc, u->acc.seq);
    }
    if (u->ep->head_start_until_ms && u->ep->model) {
        /* The woken replica answered its first request: the rest may go. */
        u->ep->head_start_until_ms = 0;
        u->ctx->handler->capacity(u->ctx->ud, u->ep->model);
    }
    if (u->state == UP_STREAMING) {
        arm_ms(u, u->req->idle_timeout_ms); /* a store, as a rule */
    }
    process(u, data, n);
    return !u->dead && u->state != UP_IDLE && !u->reading_paused;
}

/* Reads until the socket is drained (a short read, unless the replica's FIN
 * is known to wait behind it), within CONN_READ_BUDGET a turn. */
static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct upstream *u = arg;
    enter(u);
    char *scratch = u->ctx->scratch;
    size_t budget = CONN_READ_BUDGET;
    bool resumed = u->resumed;
    u->resumed = false;
    for (;;) {
        ssize_t n = recv(fd, scratch, CONN_SCRATCH_BYTES, 0);
        if (n > 0) {
            bool drained = (size_t)n < CONN_SCRATCH_BYTES && !(what & EV_CLOSED);
            /* For release, while these bytes are taken. */
            u->reading_drained = drained;
            u->reading_fin = (what & EV_CLOSED) && !resumed;
            bool more = take_bytes(u, scratch, (size_t)n);
            u->reading_drained = u->reading_fin = false;
            if (!more) {
                break;
            }
            if (drained) {
                break; /* the next bytes raise a new edge */
            }
            if ((size_t)n >= budget) {
                u->resumed = resumed; /* with the EV_CLOSED it made up */
                event_active(&u->rev, what, 0); /* the rest next turn */
                break;
            }
            budget -= (size_t)n;
            continue;
        }
        if (n == 0) {
            on_eof(u, 0);
        } else if (errno == EINTR) {
            continue;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
            on_eof(u, errno);
        }
        break;
    }
    leave(u);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    struct upstream *u = arg;
    enter(u);
    if (u->state == UP_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) {
            err = errno;
        }
        if (err) {
            connect_failed(u, err);
            leave(u);
            return;
        }
        bool room = accept_connected(u->ep, &u->acc, handshake_was_fast(fd), clock_now_ms());
        u->state = UP_SENDING;
        event_add(&u->rev, NULL);
        arm_ms(u, u->req->first_byte_timeout_ms); /* the stall timer fires early, as a rule */
        if (u->ep->one_queue) {
            check_accepts(u->ctx, u->ep);
        } else {
            made_room(u->ctx, u->ep, room);
            if (u->dead) {
                leave(u);
                return;
            }
        }
    }
    if (u->state == UP_SENDING || (u->state == UP_STREAMING && !request_sent(u))) {
        send_request(u);
    } else {
        event_del(&u->wev);
    }
    leave(u);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct upstream *u = arg;
    u->timer_at_ms = 0;
    uint64_t now = clock_now_ms();
    if (u->deadline_ms > now) {
        check_silence(u, now);
        uint64_t at = u->deadline_ms; /* activity since it was armed */
        if ((u->state == UP_STREAMING || u->state == UP_WAITING) &&
            now + SILENCE_CHECK_MS < at) {
            at = now + SILENCE_CHECK_MS;
        }
        arm_timer_at(u, now, at);
        return;
    }
    enter(u);
    switch (u->state) {
    case UP_IDLE:
        destroy(u);
        break;
    case UP_CONNECTING:
        if (now >= u->connect_deadline_ms) {
            connect_failed(u, ETIMEDOUT);
        } else if (accept_path_fast(u->ep, now)) {
            connect_stalled(u, now); /* a fast path: its SYN was dropped */
        } else {
            arm_connect_timer(u, now); /* a slow path, or nothing to tell */
        }
        break;
    case UP_SENDING:
    case UP_WAITING:
        fail(u, REJECT_UPSTREAM_TIMEOUT, ABORT_UPSTREAM_TIMEOUT);
        break;
    case UP_STREAMING:
        fail(u, REJECT_UPSTREAM_TIMEOUT, ABORT_UPSTREAM_TIMEOUT);
        break;
    }
    leave(u);
}

/* conn: the client side's HTTP/1.1 state machine, driven over loopback TCP
 * with a real event loop against a fake handler that allocates exchanges,
 * records every callback and answers when the test says so. Every exchange
 * allocated must be freed exactly once, whatever the scenario. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "thaw/conn.h"
#include "thaw/log.h"

#include "loopnet.h"

#define MAX_EX 4096

struct fake_ex {
    struct exchange ex;
    int id;
    int aborts;
    size_t body_seen; /* body bytes on_body had seen */
};

/* The handler's side of the story. */
struct fake {
    int allocs, frees, heads, requests, aborts, rejects;
    bool freed[MAX_EX];
    char
        events[128]; /* N new, S start, H head, B body grew, R request, J reject, A abort, F free */
    size_t n_events;
    int head_answer;          /* what on_head returns (REJECT_COUNT: go on) */
    size_t body_limit;        /* on_body rejects a body past this (0: no limit) */
    uint64_t fx_bytes;        /* body bytes a test trickled */
    bool answer_at_once;      /* on_request answers before returning */
    struct exchange *waiting; /* handed over, not answered yet */
    struct conn *waiting_conn;
    char last_body[64]; /* the body on_request saw */
    int client_fd;      /* peeked at from on_head */
    bool client_had_bytes_at_head;
    enum abort_reason last_abort;
    enum reject_reason last_reject;
    /* A large answer produced against backpressure. */
    bool big_answer;
    size_t big_total, big_written, max_pending;
    int drains;
    bool went_over;
};

#define BIG_CHUNK (16 * 1024)

static void note(struct fake *f, char e)
{
    if (f->n_events < sizeof f->events - 1) {
        f->events[f->n_events++] = e;
    }
}

static struct fake_ex *fx_of(struct exchange *x)
{
    return container_of(x, struct fake_ex, ex);
}

static struct exchange *fk_new_exchange(struct conn *c)
{
    struct fake *f = c->ud;
    assert_true(f->allocs < MAX_EX);
    struct fake_ex *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    http_head_init(&fx->ex.head);
    buf_init(&fx->ex.body);
    fx->ex.state = REQ_READING;
    fx->id = f->allocs++;
    note(f, 'N');
    return &fx->ex;
}

static void fk_free_exchange(struct conn *c, struct exchange *x)
{
    struct fake *f = c->ud;
    struct fake_ex *fx = fx_of(x);
    assert_false(f->freed[fx->id]); /* freed once */
    f->freed[fx->id] = true;
    f->frees++;
    if (f->waiting == x) {
        f->waiting = NULL;
        f->waiting_conn = NULL;
    }
    note(f, 'F');
    http_head_dispose(&x->head);
    buf_dispose(&x->body);
    free(fx);
}

static void fk_on_start(struct conn *c, struct exchange *x)
{
    note(c->ud, 'S');
}

static int fk_on_head(struct conn *c, struct exchange *x)
{
    struct fake *f = c->ud;
    char b;
    f->heads++;
    note(f, 'H');
    f->client_had_bytes_at_head = recv(f->client_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
    return f->head_answer;
}

static bool fk_on_body(struct conn *c, struct exchange *x)
{
    struct fake_ex *fx = fx_of(x);
    struct fake *f = c->ud;
    if (x->body.len > fx->body_seen) {
        fx->body_seen = x->body.len;
        note(f, 'B');
    }
    if (f->body_limit && x->body.len > f->body_limit) {
        conn_reject(c, REJECT_BODY_BUFFER_FULL, NULL);
        return false;
    }
    return true;
}

static void answer(struct conn *c, struct exchange *x)
{
    char body[32];
    int n = snprintf(body, sizeof body, "answer %d.", fx_of(x)->id);
    conn_respond(c, 200, "text/plain", body, (size_t)n, NULL);
}

/* Writes the big answer while the client's output stays under the high
 * water mark, as a producer honouring backpressure does. */
static void produce(struct conn *c)
{
    struct fake *f = c->ud;
    static char chunk[BIG_CHUNK];
    memset(chunk, 'x', sizeof chunk);
    while (f->big_written < f->big_total) {
        if (conn_out_pending(c) > CONN_OUT_HIGH_WATER) {
            f->went_over = true;
            return; /* on_drain calls again */
        }
        size_t n = f->big_total - f->big_written;
        n = n < sizeof chunk ? n : sizeof chunk;
        assert_int_equal(conn_write(c, chunk, n), 0);
        f->big_written += n;
        if (conn_out_pending(c) > f->max_pending) {
            f->max_pending = conn_out_pending(c);
        }
    }
    conn_response_done(c);
}

static void fk_on_drain(struct conn *c)
{
    struct fake *f = c->ud;
    f->drains++;
    produce(c);
}

static void start_big_answer(struct conn *c, struct exchange *x)
{
    struct fake *f = c->ud;
    char head[128];
    int n =
        snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", f->big_total);
    x->state = REQ_ANSWERED;
    x->response_started = true;
    assert_int_equal(conn_write(c, head, (size_t)n), 0);
    c->on_drain = fk_on_drain;
    produce(c);
}

static void fk_on_request(struct conn *c, struct exchange *x)
{
    struct fake *f = c->ud;
    f->requests++;
    note(f, 'R');
    size_t n = x->body.len < sizeof f->last_body - 1 ? x->body.len : sizeof f->last_body - 1;
    if (n) {
        memcpy(f->last_body, x->body.data, n);
    }
    f->last_body[n] = 0;
    x->state = REQ_ROUTED;
    if (f->big_answer) {
        start_big_answer(c, x);
    } else if (f->answer_at_once) {
        answer(c, x);
    } else {
        f->waiting = x;
        f->waiting_conn = c;
    }
}

static void fk_on_abort(struct conn *c, struct exchange *x, enum abort_reason reason)
{
    struct fake *f = c->ud;
    f->aborts++;
    fx_of(x)->aborts++;
    f->last_abort = reason;
    note(f, 'A');
}

static void fk_on_reject(struct conn *c, struct exchange *x, enum reject_reason reason)
{
    struct fake *f = c->ud;
    f->rejects++;
    f->last_reject = reason;
    note(f, 'J');
}

static const struct conn_handler fake_handler = {
    .new_exchange = fk_new_exchange,
    .free_exchange = fk_free_exchange,
    .on_start = fk_on_start,
    .on_head = fk_on_head,
    .on_body = fk_on_body,
    .on_request = fk_on_request,
    .on_abort = fk_on_abort,
    .on_reject = fk_on_reject,
};

struct env {
    struct event_base *base;
    struct conn_ctx ctx;
    struct http_limits lim;
    int lfd;
    uint16_t port;
    struct loopnet_peer client;
    struct loopnet_peer *peers[1];
    struct fake fk;
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->base = event_base_new();
    e->lim = (struct http_limits){8192, 32, 1 << 20};
    e->ctx = (struct conn_ctx){
        .base = e->base,
        .scratch = malloc(CONN_SCRATCH_BYTES),
        .header_timeout_ms = 3000,
        .keepalive_timeout_ms = 3000,
        .send_timeout_ms = 3000,
        .linger_ms = 300,
        .body_timeout_ms = 3000,
        .body_total_timeout_ms = 10000,
    };
    list_init(&e->ctx.conns);
    e->fk.head_answer = REJECT_COUNT;
    e->fk.client_fd = -1;
    e->lfd = loopnet_listen(&e->port);
    assert_true(e->lfd >= 0);
    e->client.fd = -1;
    e->peers[0] = &e->client;
    *state = e;
    return 0;
}

static bool conns_empty(struct env *e)
{
    return list_empty(&e->ctx.conns);
}

static int teardown(void **state)
{
    struct env *e = *state;
    while (!conns_empty(e)) {
        conn_close(container_of(e->ctx.conns.next, struct conn, node), ABORT_SHUTDOWN);
    }
    /* The invariant of every scenario. */
    assert_int_equal(e->fk.frees, e->fk.allocs);
    for (int i = 0; i < e->fk.allocs; i++) {
        assert_true(e->fk.freed[i]);
    }
    loopnet_peer_dispose(&e->client);
    close(e->lfd);
    free(e->ctx.scratch);
    event_base_free(e->base);
    free(e);
    return 0;
}

/* Connects the client and gives the accepted socket to conn_new. rcvbuf and
 * sndbuf > 0 shrink the client's window and the server's send buffer. */
static struct conn *open_conn(struct env *e, int rcvbuf, int sndbuf)
{
    int cfd = loopnet_connect(e->port, rcvbuf);
    assert_true(cfd >= 0);
    struct sockaddr_in peer;
    int sfd = loopnet_accept(e->lfd, &peer);
    assert_true(sfd >= 0);
    if (sndbuf > 0) {
        setsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    }
    loopnet_peer_init(&e->client, cfd);
    e->fk.client_fd = cfd;
    struct conn *c =
        conn_new(&e->ctx, sfd, &e->lim, &fake_handler, &e->fk, (struct sockaddr *)&peer);
    assert_non_null(c);
    assert_string_equal(c->peer_ip, "127.0.0.1");
    return c;
}

#define RUN_UNTIL(cond) LOOPNET_RUN_UNTIL(e->base, e->peers, 1, (cond))
#define RUN_FOR(ms) LOOPNET_RUN_FOR(e->base, e->peers, 1, (ms))

/* Offset of s in what the client got, or -1. */
static long at(struct env *e, const char *s)
{
    const char *p =
        e->client.got.len ? memmem(e->client.got.data, e->client.got.len, s, strlen(s)) : NULL;
    return p ? p - e->client.got.data : -1;
}

static void test_head_then_body_in_order(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd,
                                 "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.heads == 1));
    assert_string_equal(e->fk.events, "NSH");
    assert_true(loopnet_send_str(e->client.fd, "01234"));
    assert_true(RUN_UNTIL(strchr(e->fk.events, 'B') != NULL));
    assert_int_equal(e->fk.requests, 0);
    assert_true(loopnet_send_str(e->client.fd, "56789"));
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    assert_string_equal(e->fk.events, "NSHBBR");
    assert_string_equal(e->fk.last_body, "0123456789");
    assert_ptr_equal(e->fk.waiting_conn, c);

    /* Answered later, from outside any callback. */
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    assert_string_equal(e->fk.events, "NSHBBRF");
    assert_true(at(e, "HTTP/1.1 200 OK\r\n") == 0);
    assert_true(loopnet_has(&e->client, "Content-Length: 9\r\n"));
    assert_false(loopnet_has(&e->client, "Connection: close"));
    assert_int_equal(e->fk.aborts, 0);
    assert_false(conns_empty(e)); /* keep-alive */
}

static void test_keepalive_two_requests(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    assert_true(loopnet_send_str(e->client.fd, "GET /b HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 1.")));
    assert_true(at(e, "answer 0.") < at(e, "answer 1."));
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 200 OK"), 2);
    /* One connection carried both. */
    assert_ptr_equal(e->ctx.conns.next, &c->node);
    assert_ptr_equal(c->node.next, &e->ctx.conns);
    assert_int_equal(c->requests_served, 2);
    assert_int_equal(e->fk.allocs, 2);
    assert_int_equal(e->fk.frees, 2);
    assert_false(e->client.eof);
}

static void test_pipelined_requests_wait_their_turn(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
                                               "GET /b HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    RUN_FOR(50);
    /* The second is not even begun while the first is unanswered. */
    assert_int_equal(e->fk.requests, 1);
    assert_int_equal(e->fk.allocs, 1);
    assert_string_equal(http_target(&e->fk.waiting->head), "/a");

    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(e->fk.requests == 2 && loopnet_has(&e->client, "answer 0.")));
    assert_non_null(e->fk.waiting);
    assert_string_equal(http_target(&e->fk.waiting->head), "/b");
    assert_false(loopnet_has(&e->client, "answer 1."));
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 1.")));
    assert_true(at(e, "answer 0.") < at(e, "answer 1."));
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 200 OK"), 2);
    assert_int_equal(e->fk.frees, 2);
    assert_false(conns_empty(e));
}

static void test_pipelined_requests_answered_at_once(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    struct conn *c = open_conn(e, 0, 0);
    /* Answered from inside on_request: the second is taken up after the
     * callback returns, not inside it. */
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
                                               "GET /b HTTP/1.1\r\nHost: a\r\n\r\n"
                                               "GET /c HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 2.")));
    assert_true(at(e, "answer 0.") < at(e, "answer 1."));
    assert_true(at(e, "answer 1.") < at(e, "answer 2."));
    assert_int_equal(c->requests_served, 3);
    assert_string_equal(e->fk.events, "NSHRFNSHRFNSHRF");
    assert_false(conns_empty(e));
}

static const char expect_head[] = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                                  "Expect: 100-continue\r\n\r\n";

static void test_continue_only_after_head_accepted(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, expect_head));
    assert_true(RUN_UNTIL(e->fk.heads == 1 && loopnet_has(&e->client, "100 Continue")));
    /* Nothing had gone out when on_head decided. */
    assert_false(e->fk.client_had_bytes_at_head);
    assert_int_equal(e->client.got.len, strlen("HTTP/1.1 100 Continue\r\n\r\n"));
    assert_int_equal(at(e, "HTTP/1.1 100 Continue\r\n\r\n"), 0);
    assert_true(loopnet_send_str(e->client.fd, "hello"));
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    assert_string_equal(e->fk.last_body, "hello");
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    assert_int_equal(at(e, "HTTP/1.1 200 OK"), (long)strlen("HTTP/1.1 100 Continue\r\n\r\n"));
    assert_int_equal(loopnet_count(&e->client, "100 Continue"), 1);
}

static void test_rejected_at_head_gets_no_continue_and_closes(void **state)
{
    struct env *e = *state;
    e->fk.head_answer = REJECT_UNKNOWN_MODEL;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, expect_head));
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(e->client.err, 0);
    assert_false(loopnet_has(&e->client, "100 Continue"));
    assert_int_equal(at(e, "HTTP/1.1 404 "), 0);
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    assert_true(loopnet_has(&e->client, "\"code\":\"model_not_found\""));
    assert_int_equal(e->fk.rejects, 1);
    assert_int_equal(e->fk.last_reject, REJECT_UNKNOWN_MODEL);
    assert_int_equal(e->fk.requests, 0);
    assert_int_equal(e->fk.aborts, 0); /* answered, not aborted */
    assert_int_equal(e->fk.frees, 1);
    /* The client closes too: the connection is gone. */
    close(e->client.fd);
    e->client.fd = -1;
    assert_true(RUN_UNTIL(conns_empty(e)));
}

static void test_http10_without_keepalive_closes_after_answer(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET / HTTP/1.0\r\n\r\n"));
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(e->client.err, 0);
    assert_true(loopnet_has(&e->client, "answer 0."));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    assert_int_equal(e->fk.frees, 1);
}

/* A client that asked to close, its request read whole: nothing of its can
 * still come, so the connection closes with the answer (a FIN, no linger),
 * while the client still has it all. */
static void test_asked_close_closes_without_lingering(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(
        e->client.fd,
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"));
    assert_true(RUN_UNTIL(e->client.eof || e->client.err));
    assert_int_equal(e->client.err, 0);
    assert_true(loopnet_has(&e->client, "answer 0."));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    /* Gone with the answer, not waiting for the client's close. */
    assert_true(conns_empty(e));
    assert_int_equal(e->ctx.n_lingering, 0);
}

/* Bytes behind a request that asked to close (a client pipelining anyway),
 * received while it is answered: the connection lingers, so more of them
 * cause no reset of the answer. */
static void test_asked_close_with_bytes_behind_lingers(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(
        loopnet_send_str(e->client.fd, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.waiting != NULL));
    assert_true(loopnet_send_str(e->client.fd, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"));
    RUN_FOR(20);
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    assert_int_equal(e->ctx.n_lingering, 1);
    assert_false(conns_empty(e));
    assert_true(RUN_UNTIL(e->client.eof || e->client.err));
    assert_int_equal(e->client.err, 0);
    assert_false(loopnet_has(&e->client, "answer 1."));
}

static void test_http10_keepalive_stays_open(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    RUN_FOR(30);
    assert_false(e->client.eof);
    assert_false(loopnet_has(&e->client, "Connection: close"));
    assert_false(conns_empty(e));
}

static bool client_has_bytes(struct env *e)
{
    char b;
    return recv(e->client.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

static void test_malformed_request_gets_400_then_lingering_close(void **state)
{
    struct env *e = *state;
    open_conn(e, 0, 0);
    /* A broken header line; the answer arrives while the client, not
     * reading yet, sends more (a body, say). Had the server closed with
     * those bytes unread, the reset would destroy the unread answer. */
    static char tail[32 * 1024];
    memset(tail, 'z', sizeof tail);
    e->client.paused = true;
    assert_true(loopnet_send_str(e->client.fd, "GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n"));
    assert_true(RUN_UNTIL(client_has_bytes(e)));
    assert_true(loopnet_send(e->client.fd, tail, sizeof tail));
    RUN_FOR(50);
    e->client.paused = false;
    assert_true(RUN_UNTIL(e->client.eof || e->client.err));
    assert_int_equal(e->client.err, 0); /* an orderly end, not a reset */
    assert_int_equal(send(e->client.fd, "more", 4, MSG_NOSIGNAL), 4);
    assert_int_equal(at(e, "HTTP/1.1 400 Bad Request\r\n"), 0);
    assert_true(loopnet_has(&e->client, "Content-Type: application/json\r\n"));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    assert_true(loopnet_has(&e->client, "\r\n\r\n{\"error\":{\"message\":\"the request is "
                                        "not valid HTTP/1.1"));
    assert_true(loopnet_has(&e->client, "\"type\":\"invalid_request_error\",\"param\":null,"
                                        "\"code\":\"bad_request\"}}\n"));
    assert_int_equal(e->fk.rejects, 1);
    assert_int_equal(e->fk.last_reject, REJECT_BAD_REQUEST);
    assert_int_equal(e->fk.requests, 0);
    assert_int_equal(e->fk.aborts, 0);
    /* Lingering: still open (discarding) until the client closes or the
     * linger time passes, so a client still sending gets no reset. */
    assert_false(conns_empty(e));
    assert_int_equal(e->ctx.n_lingering, 1);
    assert_int_equal(send(e->client.fd, "more", 4, MSG_NOSIGNAL), 4);
    RUN_FOR(20);
    assert_int_equal(send(e->client.fd, "more", 4, MSG_NOSIGNAL), 4);
    assert_true(RUN_UNTIL(conns_empty(e)));
    assert_int_equal(e->ctx.n_lingering, 0);
}

static void test_partial_head_times_out_with_408(void **state)
{
    struct env *e = *state;
    e->ctx.header_timeout_ms = 100;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET / HTTP/1.1\r\nHo"));
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(at(e, "HTTP/1.1 408 "), 0);
    assert_true(loopnet_has(&e->client, "\"code\":\"header_timeout\""));
    assert_int_equal(e->fk.rejects, 1);
    assert_int_equal(e->fk.last_reject, REJECT_HEADER_TIMEOUT);
    assert_int_equal(e->fk.requests, 0);
    assert_int_equal(e->fk.frees, 1);
}

static void test_silent_connection_times_out_with_408(void **state)
{
    struct env *e = *state;
    e->ctx.header_timeout_ms = 100;
    open_conn(e, 0, 0);
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(at(e, "HTTP/1.1 408 "), 0);
    assert_int_equal(e->fk.last_reject, REJECT_HEADER_TIMEOUT);
    assert_int_equal(e->fk.allocs, 1);
    assert_int_equal(e->fk.frees, 1);
}

static void test_client_gone_mid_body_aborts_once(void **state)
{
    struct env *e = *state;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "POST / HTTP/1.1\r\nHost: a\r\n"
                                               "Content-Length: 100\r\n\r\n0123456789"));
    assert_true(RUN_UNTIL(strchr(e->fk.events, 'B') != NULL));
    close(e->client.fd);
    e->client.fd = -1;
    assert_true(RUN_UNTIL(conns_empty(e)));
    assert_int_equal(e->fk.aborts, 1);
    assert_int_equal(e->fk.last_abort, ABORT_CLIENT_CLOSED);
    assert_int_equal(e->fk.requests, 0);
    assert_int_equal(e->fk.allocs, 1);
    assert_int_equal(e->fk.frees, 1);
    assert_string_equal(e->fk.events, "NSHBAF");
}

static void test_client_gone_while_handled_aborts_once(void **state)
{
    struct env *e = *state;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    close(e->client.fd);
    e->client.fd = -1;
    assert_true(RUN_UNTIL(conns_empty(e)));
    assert_int_equal(e->fk.aborts, 1);
    assert_null(e->fk.waiting); /* the handler was told before the free */
    assert_string_equal(e->fk.events, "NSHRAF");
}

static void test_backpressure_on_a_slow_reader(void **state)
{
    struct env *e = *state;
    e->fk.big_answer = true;
    e->fk.big_total = 1 << 20;
    struct conn *c = open_conn(e, 8192, 8192);
    e->client.step = 4096;
    e->client.paused = true;
    assert_true(loopnet_send_str(e->client.fd, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.went_over));
    /* The producer stopped above the high water mark and waits. */
    assert_true(conn_out_pending(c) > CONN_OUT_HIGH_WATER);
    assert_true(e->fk.big_written < e->fk.big_total);
    size_t written = e->fk.big_written;
    RUN_FOR(30);
    assert_int_equal(e->fk.big_written, written);
    assert_int_equal(e->fk.drains, 0);

    e->client.paused = false;
    const char *end = "\r\n\r\n";
    assert_true(
        RUN_UNTIL(at(e, end) > 0 && e->client.got.len == (size_t)at(e, end) + 4 + e->fk.big_total));
    assert_true(e->fk.drains >= 1);
    assert_true(e->fk.max_pending <= CONN_OUT_HIGH_WATER + BIG_CHUNK);
    assert_int_equal(e->fk.frees, 1);
    assert_null(c->on_drain); /* cleared when the response was done */
    assert_int_equal(conn_out_pending(c), 0);
    assert_false(conns_empty(e));
}

static void test_draining_closes_after_current_answer(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
                                               "GET /b HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    e->ctx.draining = true;
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(e->client.err, 0);
    assert_true(loopnet_has(&e->client, "answer 0."));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    /* The pipelined second request is never taken up. */
    assert_int_equal(e->fk.allocs, 1);
    assert_int_equal(e->fk.requests, 1);
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 "), 1);
}

static void test_drain_closes_an_idle_connection(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    struct conn *c = open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    size_t got = e->client.got.len;
    conn_drain(c);
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(e->client.got.len, got); /* nothing more was sent */
}

static void test_rejected_while_the_body_arrives_closes(void **state)
{
    struct env *e = *state;
    e->fk.body_limit = 8;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "POST / HTTP/1.1\r\nHost: a\r\n"
                                               "Content-Length: 100\r\n\r\n0123456789"));
    assert_true(RUN_UNTIL(e->client.eof || e->client.err));
    assert_int_equal(e->client.err, 0);
    assert_int_equal(at(e, "HTTP/1.1 503 "), 0);
    assert_true(loopnet_has(&e->client, "Retry-After: 1\r\n"));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    assert_int_equal(e->fk.last_reject, REJECT_BODY_BUFFER_FULL);
    assert_int_equal(e->fk.requests, 0);
    assert_int_equal(e->fk.aborts, 0);
    /* The rest of the body is discarded, not parsed as a request. */
    const char *next = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(send(e->client.fd, next, strlen(next), MSG_NOSIGNAL), (ssize_t)strlen(next));
    RUN_FOR(20);
    assert_int_equal(e->fk.allocs, 1);
}

static void test_idle_body_times_out_with_408(void **state)
{
    struct env *e = *state;
    e->ctx.body_timeout_ms = 100;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "POST / HTTP/1.1\r\nHost: a\r\n"
                                               "Content-Length: 100\r\n\r\n0123"));
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(at(e, "HTTP/1.1 408 "), 0);
    assert_true(loopnet_has(&e->client, "\"code\":\"body_timeout\""));
    assert_int_equal(e->fk.last_reject, REJECT_BODY_TIMEOUT);
    assert_int_equal(e->fk.requests, 0);
}

/* Many small requests pipelined behind one that is held: more than
 * CONN_PIPELINE_MAX waits, reading pauses, and every one is answered in
 * order once the first is. */
static void test_pipeline_overflow_pauses_then_all_answered(void **state)
{
    struct env *e = *state;
    struct conn *c = open_conn(e, 0, 0);
    const char *one = "GET /p HTTP/1.1\r\nHost: a\r\n\r\n";
    size_t n = 3000, len = strlen(one);
    char *all = malloc(n * len);
    assert_non_null(all);
    for (size_t i = 0; i < n; i++) {
        memcpy(all + i * len, one, len);
    }
    assert_true(loopnet_send(e->client.fd, all, len)); /* the first, held */
    assert_true(RUN_UNTIL(e->fk.requests == 1));
    size_t off = len;
    /* The rest as the socket takes it, running the loop meanwhile. */
    assert_true(RUN_UNTIL(({
        ssize_t w = send(e->client.fd, all + off, n * len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
        }
        c->read_paused;
    })));
    assert_true(buf_unread(&c->in) > CONN_PIPELINE_MAX);
    assert_int_equal(e->fk.allocs, 1);
    e->fk.answer_at_once = true;
    answer(c, e->fk.waiting);
    assert_true(RUN_UNTIL(({
        ssize_t w = off < n * len
                        ? send(e->client.fd, all + off, n * len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : 0;
        if (w > 0) {
            off += (size_t)w;
        }
        loopnet_count(&e->client, "HTTP/1.1 200 OK") == (int)n;
    })));
    assert_int_equal(c->requests_served, n);
    assert_int_equal(e->fk.frees, (int)n);
    free(all);
}

static void test_keepalive_idle_timeout_closes_quietly(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    e->ctx.keepalive_timeout_ms = 100;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    size_t got = e->client.got.len;
    assert_true(RUN_UNTIL(conns_empty(e)));
    assert_true(RUN_UNTIL(e->client.eof));
    assert_int_equal(e->client.got.len, got); /* no 408 between requests */
    assert_int_equal(e->fk.allocs, 1);
}

static void test_client_not_reading_times_out_and_aborts_once(void **state)
{
    struct env *e = *state;
    e->fk.big_answer = true;
    e->fk.big_total = 1 << 20;
    e->ctx.send_timeout_ms = 150;
    open_conn(e, 8192, 8192);
    e->client.paused = true;
    assert_true(loopnet_send_str(e->client.fd, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_true(RUN_UNTIL(e->fk.went_over));
    assert_true(RUN_UNTIL(conns_empty(e)));
    assert_int_equal(e->fk.aborts, 1);
    assert_int_equal(e->fk.last_abort, ABORT_SEND_TIMEOUT);
    assert_int_equal(e->fk.frees, 1);
    assert_true(e->fk.big_written < e->fk.big_total);
}

static void test_chunked_body_reaches_on_request_decoded(void **state)
{
    struct env *e = *state;
    e->fk.answer_at_once = true;
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "POST / HTTP/1.1\r\nHost: a\r\n"
                                               "Transfer-Encoding: chunked\r\n\r\n"
                                               "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "answer 0.")));
    assert_string_equal(e->fk.last_body, "hello world");
    assert_false(conns_empty(e));
}

static void test_trickled_body_hits_the_total_deadline(void **state)
{
    struct env *e = *state;
    e->ctx.body_total_timeout_ms = 200; /* the idle body timeout stays 3 s */
    open_conn(e, 0, 0);
    assert_true(loopnet_send_str(e->client.fd, "POST / HTTP/1.1\r\nHost: a\r\n"
                                               "Content-Length: 100\r\n\r\n"));
    uint64_t start = loopnet_now_ms();
    /* A byte every 20 ms: never idle for long, never done. */
    assert_true(RUN_UNTIL(({
        if (!e->client.got.len && (loopnet_now_ms() - start) / 20 > e->fk.fx_bytes) {
            e->fk.fx_bytes++;
            send(e->client.fd, "x", 1, MSG_NOSIGNAL);
        }
        e->client.eof || e->client.err;
    })));
    uint64_t took = loopnet_now_ms() - start;
    assert_true(took >= 190 && took < 1500);
    assert_int_equal(at(e, "HTTP/1.1 408 "), 0);
    assert_true(loopnet_has(&e->client, "the whole body took longer than allowed"));
    assert_int_equal(e->fk.last_reject, REJECT_BODY_TIMEOUT);
    assert_true(e->fk.fx_bytes >= 5);
}

int main(void)
{
    log_init(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_head_then_body_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keepalive_two_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_requests_wait_their_turn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_requests_answered_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_continue_only_after_head_accepted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejected_at_head_gets_no_continue_and_closes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_http10_without_keepalive_closes_after_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_http10_keepalive_stays_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_asked_close_closes_without_lingering, setup, teardown),
        cmocka_unit_test_setup_teardown(test_asked_close_with_bytes_behind_lingers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_malformed_request_gets_400_then_lingering_close, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_partial_head_times_out_with_408, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_connection_times_out_with_408, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_mid_body_aborts_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_while_handled_aborts_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_rejected_while_the_body_arrives_closes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_body_times_out_with_408, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_overflow_pauses_then_all_answered, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_keepalive_idle_timeout_closes_quietly, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_not_reading_times_out_and_aborts_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_chunked_body_reaches_on_request_decoded, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_trickled_body_hits_the_total_deadline, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_backpressure_on_a_slow_reader, setup, teardown),
        cmocka_unit_test_setup_teardown(test_draining_closes_after_current_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_closes_an_idle_connection, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

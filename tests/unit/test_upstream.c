/* upstream: requests to a replica and responses streamed back to the
 * client, against a fake handler (slots, outcomes) and a fake replica (a
 * loopback listener the test scripts by hand). The client connection is a
 * real conn on loopback TCP whose handler does what the proxy does: it
 * holds the request, and cancels its upstream when the client goes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "thaw/clock.h"
#include "thaw/conn.h"
#include "thaw/log.h"
#include "thaw/upstream.h"

#include "loopnet.h"

/* The endpoint's owner: upstream never looks into it. */
static char fake_model_storage;
#define FAKE_MODEL ((struct model *)&fake_model_storage)

/* A request as the proxy holds it: conn's view and upstream's view. */
struct fake_req {
    struct exchange ex;
    struct upstream_req up;
    int id;
};

struct fake {
    /* conn side */
    int allocs, frees, aborts;
    struct fake_req *waiting; /* complete, not yet dispatched */
    /* upstream side */
    int takes, gives, retries, dones, fails, gones, first_bytes, capacities;
    int last_status;
    enum reject_reason last_reason;
    enum abort_reason last_abort;
    bool failed_started; /* response_started when failed was called */
    uint64_t dispatch_ms, first_byte_ms;
    char events[64]; /* T take, G give, Y retry, D done, X failed, O client gone,
                        1 first byte, C capacity */
    size_t n_events;
};

static struct fake fk;

static void note(char e)
{
    if (fk.n_events < sizeof fk.events - 1) {
        fk.events[fk.n_events++] = e;
    }
}

static struct fake_req *fr_of_ex(struct exchange *x)
{
    return container_of(x, struct fake_req, ex);
}

/* The client connection's handler (the proxy's part, reduced). */
static struct exchange *c_new_exchange(struct conn *c)
{
    struct fake_req *fr = calloc(1, sizeof *fr);
    assert_non_null(fr);
    http_head_init(&fr->ex.head);
    buf_init(&fr->ex.body);
    buf_init(&fr->up.head);
    fr->ex.state = REQ_READING;
    fr->up.ex = &fr->ex;
    fr->up.conn = c;
    fr->id = fk.allocs++;
    return &fr->ex;
}

static void c_free_exchange(struct conn *c, struct exchange *x)
{
    struct fake_req *fr = fr_of_ex(x);
    assert_null(fr->up.up); /* upstream let go first */
    fk.frees++;
    if (fk.waiting == fr) {
        fk.waiting = NULL;
    }
    http_head_dispose(&fr->ex.head);
    buf_dispose(&fr->ex.body);
    buf_dispose(&fr->up.head);
    free(fr);
}

static void c_on_request(struct conn *c, struct exchange *x)
{
    x->state = REQ_ROUTED;
    fk.waiting = fr_of_ex(x);
}

static void c_on_abort(struct conn *c, struct exchange *x, enum abort_reason reason)
{
    struct fake_req *fr = fr_of_ex(x);
    fk.aborts++;
    if (fr->up.up) {
        upstream_cancel(fr->up.up);
    }
}

static const struct conn_handler client_handler = {
    .new_exchange = c_new_exchange,
    .free_exchange = c_free_exchange,
    .on_request = c_on_request,
    .on_abort = c_on_abort,
};

/* The upstream handler: records, and answers the client as the proxy does. */
static void u_retry(struct upstream_req *r)
{
    fk.retries++;
    note('Y');
    assert_null(r->up);
    r->ex->state = REQ_ROUTED;
    conn_reject(r->conn, REJECT_UPSTREAM_CONNECT, NULL);
}

static void u_done(struct upstream_req *r, int status)
{
    fk.dones++;
    fk.last_status = status;
    note('D');
    assert_null(r->up);
    conn_response_done(r->conn);
}

static void u_failed(struct upstream_req *r, enum reject_reason reason, enum abort_reason abort)
{
    fk.fails++;
    fk.last_reason = reason;
    fk.last_abort = abort;
    fk.failed_started = r->ex->response_started;
    note('X');
    assert_null(r->up);
    if (!r->ex->response_started) {
        r->ex->state = REQ_ROUTED;
        conn_reject(r->conn, reason, NULL);
    } else {
        conn_close(r->conn, abort);
    }
}

static void u_client_gone(struct upstream_req *r)
{
    fk.gones++;
    note('O');
    conn_close(r->conn, ABORT_CLIENT_CLOSED);
}

static void u_first_byte(struct upstream_req *r, uint64_t now_ms)
{
    fk.first_bytes++;
    fk.dispatch_ms = r->dispatch_ms;
    fk.first_byte_ms = now_ms;
    note('1');
}

static void u_take_slot(struct endpoint *ep)
{
    fk.takes++;
    ep->inflight++;
    note('T');
}

static struct model *u_give_slot(struct endpoint *ep)
{
    fk.gives++;
    assert_true(ep->inflight > 0);
    ep->inflight--;
    note('G');
    return ep->model;
}

/* What the proxy does on capacity, when a test asks for it: the next waiting
 * request goes out at once, in the loop turn that freed the slot (after the
 * replica closed its side, if close_first). */
struct env;
static struct {
    struct env *e;
    struct fake_req *next;
    bool close_first;
} on_capacity;
static void dispatch_next(void);

static void u_capacity(void *ud, struct model *m)
{
    assert_ptr_equal(m, FAKE_MODEL);
    fk.capacities++;
    note('C');
    if (on_capacity.next) {
        dispatch_next();
    }
}

/* An error status into a heartbeat stream: what the proxy would turn into
 * an SSE error event. */
static int stream_errors, stream_error_status;
static char stream_error_body[64];

static const char *stream_error_why;

static void u_stream_error(struct upstream_req *r, int status, const char *body, size_t len,
                           const char *why)
{
    stream_errors++;
    stream_error_why = why;
    stream_error_status = status;
    snprintf(stream_error_body, sizeof stream_error_body, "%.*s", (int)len, body);
    assert_non_null(r->up); /* called before the upstream lets go */
    conn_write(r->conn, "<error event>", 13);
}

static const struct upstream_handler fake_handler = {
    .stream_error = u_stream_error,
    .retry = u_retry,
    .done = u_done,
    .failed = u_failed,
    .client_gone = u_client_gone,
    .first_byte = u_first_byte,
    .take_slot = u_take_slot,
    .give_slot = u_give_slot,
    .capacity = u_capacity,
};

struct env {
    struct event_base *base;
    char *scratch;
    struct conn_ctx net;
    struct upstream_ctx up;
    struct server_metrics metrics;
    bool draining;
    struct http_limits req_limits, resp_limits;
    int client_lfd, replica_lfd;
    uint16_t client_port, replica_port;
    struct loopnet_peer client, replica;
    struct loopnet_peer *peers[2];
    struct conn *c;
    struct endpoint *ep;
    /* Bytes the replica writes as the socket takes them (see feed_replica). */
    const char *feed;
    size_t feed_len, feed_off;
    size_t max_pending; /* the most client output conn held */
    /* The same for what the client sends. */
    const char *client_feed;
    size_t client_feed_len, client_feed_off;
};

static int setup(void **state)
{
    memset(&fk, 0, sizeof fk);
    memset(&on_capacity, 0, sizeof on_capacity);
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->base = event_base_new();
    e->scratch = malloc(CONN_SCRATCH_BYTES);
    e->req_limits = (struct http_limits){8192, 32, 1 << 20};
    e->resp_limits = (struct http_limits){8192, 1000, 0};
    e->net = (struct conn_ctx){
        .base = e->base,
        .scratch = e->scratch,
        .header_timeout_ms = 3000,
        .keepalive_timeout_ms = 3000,
        .send_timeout_ms = 3000,
        .linger_ms = 200,
        .body_timeout_ms = 3000,
        .body_total_timeout_ms = 10000,
    };
    list_init(&e->net.conns);
    e->up = (struct upstream_ctx){
        .base = e->base,
        .scratch = e->scratch,
        .resp_limits = &e->resp_limits,
        .handler = &fake_handler,
        .ud = e,
        .metrics = &e->metrics,
        .draining = &e->draining,
        .keepalive_per_endpoint = 4,
        .keepalive_timeout_ms = 3000,
        .eject_ms = 1000,
    };
    list_init(&e->up.pooled);
    e->client_lfd = loopnet_listen(&e->client_port);
    e->replica_lfd = loopnet_listen(&e->replica_port);
    assert_true(e->client_lfd >= 0 && e->replica_lfd >= 0);
    loopnet_peer_init(&e->client, -1);
    loopnet_peer_init(&e->replica, -1);
    e->peers[0] = &e->client;
    e->peers[1] = &e->replica;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", e->replica_port);
    e->ep = endpoint_new("r0", addr);
    assert_non_null(e->ep);
    e->ep->model = FAKE_MODEL;
    snprintf(e->ep->model_name, sizeof e->ep->model_name, "m");
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    while (!list_empty(&e->net.conns)) {
        conn_close(container_of(e->net.conns.next, struct conn, node), ABORT_SHUTDOWN);
    }
    /* Every scenario's invariants: each attempt gave back the slot it took,
     * and each exchange was freed once. */
    assert_int_equal(fk.takes, fk.gives);
    assert_int_equal(e->ep->inflight, 0);
    assert_int_equal(fk.frees, fk.allocs);
    upstream_close_idle(e->ep);
    assert_int_equal(e->ep->refs, 1); /* no upstream connection still holds it */
    endpoint_unref(e->ep);
    loopnet_peer_dispose(&e->client);
    loopnet_peer_dispose(&e->replica);
    close(e->client_lfd);
    if (e->replica_lfd >= 0) {
        close(e->replica_lfd);
    }
    free(e->scratch);
    event_base_free(e->base);
    free(e);
    return 0;
}

/* Writes what the replica still has to send, without blocking, and notes
 * how much client output conn holds. Always true (used inside conditions). */
static bool feed_replica(struct env *e)
{
    while (e->feed && e->feed_off < e->feed_len && e->replica.fd >= 0) {
        ssize_t n = send(e->replica.fd, e->feed + e->feed_off, e->feed_len - e->feed_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
            break;
        }
        e->feed_off += (size_t)n;
    }
    while (e->client_feed && e->client_feed_off < e->client_feed_len && e->client.fd >= 0) {
        ssize_t n = send(e->client.fd, e->client_feed + e->client_feed_off,
                         e->client_feed_len - e->client_feed_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
            break;
        }
        e->client_feed_off += (size_t)n;
    }
    if (e->c && !list_empty(&e->net.conns) && conn_out_pending(e->c) > e->max_pending) {
        e->max_pending = conn_out_pending(e->c);
    }
    return true;
}

#define RUN_UNTIL(cond) LOOPNET_RUN_UNTIL(e->base, e->peers, 2, feed_replica(e) && (cond))
#define RUN_FOR(ms) LOOPNET_RUN_FOR(e->base, e->peers, 2, (ms))

/* The client's connection, as the proxy's listener would make it; bufsize
 * > 0 shrinks the client's window and thaw's send buffer (a slow reader). */
static void open_client_buffered(struct env *e, int bufsize)
{
    int cfd = loopnet_connect(e->client_port, bufsize);
    assert_true(cfd >= 0);
    struct sockaddr_in peer;
    int sfd = loopnet_accept(e->client_lfd, &peer);
    assert_true(sfd >= 0);
    if (bufsize > 0) {
        setsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
    }
    loopnet_peer_init(&e->client, cfd);
    e->c = conn_new(&e->net, sfd, &e->req_limits, &client_handler, e, (struct sockaddr *)&peer);
    assert_non_null(e->c);
}

static void open_client(struct env *e)
{
    open_client_buffered(e, 0);
}

/* The client sends req; returns it once conn has handed it over. */
static struct fake_req *client_request(struct env *e, const char *req)
{
    assert_true(loopnet_send_str(e->client.fd, req));
    assert_true(RUN_UNTIL(fk.waiting != NULL));
    struct fake_req *fr = fk.waiting;
    fk.waiting = NULL;
    return fr;
}

/* Sends fr to the endpoint with the head the proxy would have built. */
static void dispatch(struct env *e, struct fake_req *fr, const char *head)
{
    buf_reset(&fr->up.head);
    buf_append_str(&fr->up.head, head);
    fr->up.connect_timeout_ms = 1000;
    fr->up.first_byte_timeout_ms = 2000;
    fr->up.idle_timeout_ms = 2000;
    fr->ex.state = REQ_UPSTREAM;
    upstream_start(&e->up, &fr->up, e->ep);
}

/* The replica takes the connection upstream opened. */
static void replica_accept(struct env *e)
{
    loopnet_peer_dispose(&e->replica);
    int fd = loopnet_accept(e->replica_lfd, NULL);
    assert_true(fd >= 0);
    loopnet_peer_init(&e->replica, fd);
}

/* No connection waits to be accepted: nothing new was opened. */
static bool replica_no_new_connection(struct env *e)
{
    int fd = accept4(e->replica_lfd, NULL, NULL, SOCK_NONBLOCK);
    if (fd >= 0) {
        close(fd);
        return false;
    }
    return true;
}

static const char simple_get[] = "GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n";
static const char simple_get_up[] = "GET /v1/models HTTP/1.1\r\nHost: replica\r\n\r\n";
static const char ok_response[] =
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-From: replica\r\n\r\nok";

/* One request through to a replica answering on its current connection. */
static void round_trip(struct env *e, bool new_connection)
{
    size_t before = e->replica.got.len;
    int dones = fk.dones;
    size_t client_before = e->client.got.len;
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    if (new_connection) {
        replica_accept(e);
        before = 0;
    }
    assert_true(RUN_UNTIL(e->replica.got.len == before + strlen(simple_get_up)));
    assert_memory_equal(e->replica.got.data + before, simple_get_up, strlen(simple_get_up));
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == dones + 1 && e->client.got.len > client_before &&
                          e->client.got.data[e->client.got.len - 1] == 'k'));
}

/* A client's GET, sent to the replica on a new connection it accepted. */
static struct fake_req *request_at_the_replica(struct env *e)
{
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    return fr;
}

static void test_request_out_response_back_connection_pooled(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, "POST /v1/x HTTP/1.1\r\nHost: a\r\n"
                                            "Content-Length: 5\r\n\r\nhello");
    const char *head = "POST /v1/x HTTP/1.1\r\nHost: replica\r\nContent-Length: 5\r\n\r\n";
    dispatch(e, fr, head);
    assert_int_equal(fk.takes, 1);
    assert_int_equal(fk.gives, 0);
    assert_int_equal(e->ep->inflight, 1);
    assert_ptr_equal(fr->up.last_ep, e->ep);
    assert_int_equal(fr->up.tries, 1);
    assert_true(fr->ex.committed);
    replica_accept(e);
    assert_true(RUN_UNTIL(loopnet_has(&e->replica, "\r\n\r\nhello")));
    assert_int_equal(e->replica.got.len, strlen(head) + 5);
    assert_memory_equal(e->replica.got.data, head, strlen(head));
    assert_int_equal(fk.first_bytes, 0);

    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 1 && loopnet_has(&e->client, "\r\n\r\nok")));
    assert_int_equal(fk.last_status, 200);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 200 OK\r\n"));
    assert_true(loopnet_has(&e->client, "X-From: replica\r\n"));
    assert_true(loopnet_has(&e->client, "Content-Length: 2\r\n"));
    /* The slot was given back before done; then waiting requests may go. */
    assert_string_equal(fk.events, "T1GDC");
    assert_int_equal(fk.first_bytes, 1);
    assert_true(fk.first_byte_ms >= fk.dispatch_ms);
    assert_int_equal(fk.fails + fk.retries, 0);
    /* Pooled, and the client connection stays open for more. */
    assert_int_equal(e->ep->n_idle, 1);
    assert_int_equal(e->metrics.upstream_connects, 1);
    assert_int_equal(fk.frees, 1);
    assert_false(list_empty(&e->net.conns));
}

static void test_pooled_connection_serves_the_next_request(void **state)
{
    struct env *e = *state;
    open_client(e);
    round_trip(e, true);
    assert_int_equal(e->ep->n_idle, 1);
    round_trip(e, false);
    assert_true(replica_no_new_connection(e));
    assert_int_equal(e->metrics.upstream_connects, 1);
    assert_int_equal(e->metrics.upstream_reused, 1);
    assert_int_equal(fk.dones, 2);
    assert_int_equal(fk.takes, 2);
    assert_int_equal(fk.gives, 2);
    assert_int_equal(fk.first_bytes, 2);
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 200 OK"), 2);
    assert_int_equal(e->ep->n_idle, 1);
}

/* Replica connections share the clients' descriptor budget: at it, a new
 * one first closes the connection pooled longest, whichever its replica. */
static void test_a_new_connection_at_the_budget_closes_the_longest_idle(void **state)
{
    struct env *e = *state;
    struct endpoint *other = endpoint_new("r1", e->ep->addr_text);
    assert_non_null(other);
    other->model = FAKE_MODEL;
    int fd = loopnet_connect(e->replica_port, 0);
    int peer = loopnet_accept(e->replica_lfd, NULL);
    assert_true(fd >= 0 && peer >= 0);
    upstream_adopt(&e->up, other, fd); /* a probe's connection, pooled */
    assert_int_equal(other->n_idle, 1);
    assert_int_equal(e->up.n_open, 1);
    e->up.max_open = 1;
    open_client(e);
    round_trip(e, true);
    assert_int_equal(e->metrics.upstream_budget_closed, 1);
    assert_int_equal(other->n_idle, 0);
    assert_int_equal(e->up.n_open, 1);
    assert_int_equal(e->ep->n_idle, 1);
    /* A pooled connection of its own is taken as before: nothing closed. */
    round_trip(e, false);
    assert_int_equal(e->metrics.upstream_budget_closed, 1);
    assert_int_equal(e->metrics.upstream_connects, 1);
    close(peer);
    assert_int_equal(other->refs, 1);
    endpoint_unref(other);
}

/* Every socket the loop watches for reads, as the kernel has it registered
 * (/proc/self/fdinfo of each epoll descriptor): how many, and how many of
 * them edge-triggered. */
static void count_watched_sockets(int *watched, int *edge)
{
    *watched = *edge = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        char link[300], target[64], path[300];
        snprintf(link, sizeof link, "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) {
            continue;
        }
        target[n] = '\0';
        if (strcmp(target, "anon_inode:[eventpoll]") != 0) {
            continue;
        }
        snprintf(path, sizeof path, "/proc/self/fdinfo/%s", de->d_name);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        char line[256];
        while (fgets(line, sizeof line, f)) {
            int tfd;
            unsigned events;
            struct stat st;
            if (sscanf(line, "tfd: %d events: %x", &tfd, &events) == 2 && (events & 0x1) &&
                fstat(tfd, &st) == 0 && S_ISSOCK(st.st_mode)) {
                (*watched)++;
                *edge += (events & 0x80000000u) != 0; /* EPOLLET */
            }
        }
        fclose(f);
    }
    closedir(d);
}

/* The replica's socket stays edge-triggered once the request has been
 * written: a socket's read and write events share one epoll entry, and a
 * level-triggered write event made the entry level-triggered for the rest of
 * the pooled connection's life (every read polled again the next turn). */
static void test_replica_socket_stays_edge_triggered_after_the_request(void **state)
{
    struct env *e = *state;
    if (!(event_base_get_features(e->base) & EV_FEATURE_ET)) {
        skip();
    }
    open_client(e);
    round_trip(e, true);
    assert_int_equal(e->ep->n_idle, 1);
    int watched, edge;
    count_watched_sockets(&watched, &edge);
    assert_true(watched >= 2); /* the client's and the pooled replica's */
    assert_int_equal(edge, watched);
}

static void test_refused_connect_retries_and_ejects(void **state)
{
    struct env *e = *state;
    /* Nobody listens there any more. */
    close(e->replica_lfd);
    e->replica_lfd = -1;
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    uint64_t before = clock_now_ms();
    dispatch(e, fr, simple_get_up);
    assert_true(RUN_UNTIL(fk.retries == 1 && loopnet_has(&e->client, "\r\n\r\n{")));
    assert_int_equal(fk.fails, 0);
    assert_int_equal(fk.first_bytes, 0);
    /* The slot came back before retry was called. */
    assert_string_equal(fk.events, "TGYC");
    assert_int_equal(e->ep->connect_failures, 1);
    assert_true(e->ep->ejected_until_ms >= before + e->up.eject_ms);
    assert_int_equal(e->metrics.upstream_connect_failures, 1);
    assert_int_equal(e->ep->n_idle, 0);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 502 "));
}

static void test_replica_closing_after_the_head_aborts_the_client(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "Content-Length: 100\r\n\r\n")));
    assert_int_equal(fk.first_bytes, 1);
    close(e->replica.fd);
    e->replica.fd = -1;
    assert_true(RUN_UNTIL(fk.fails == 1 && e->client.eof));
    assert_true(fk.failed_started);
    assert_int_equal(fk.last_abort, ABORT_UPSTREAM_CLOSED);
    assert_int_equal(fk.retries + fk.dones, 0);
    assert_string_equal(fk.events, "T1GXC");
    /* The client got the head and then the end, nothing else. */
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 "), 1);
    assert_int_equal(e->ep->n_idle, 0);
    assert_true(list_empty(&e->net.conns));
    assert_int_equal(fk.aborts, 1); /* conn_close told the exchange */
}

static void test_replica_closing_before_the_head_answers_502(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    close(e->replica.fd);
    e->replica.fd = -1;
    assert_true(RUN_UNTIL(fk.fails == 1 && loopnet_has(&e->client, "}}\n")));
    assert_false(fk.failed_started);
    assert_int_equal(fk.last_reason, REJECT_UPSTREAM_ERROR);
    assert_int_equal(fk.retries, 0); /* a new connection: not a stale one */
    assert_true(loopnet_has(&e->client, "HTTP/1.1 502 "));
    assert_int_equal(e->metrics.upstream_stale_retries, 0);
}

static void test_idle_pooled_connection_closed_by_replica_is_not_reused(void **state)
{
    struct env *e = *state;
    open_client(e);
    round_trip(e, true);
    assert_int_equal(e->ep->n_idle, 1);
    /* The replica's idle timer closes it; the loop sees it go. */
    close(e->replica.fd);
    e->replica.fd = -1;
    assert_true(RUN_UNTIL(e->ep->n_idle == 0));
    round_trip(e, true);
    assert_int_equal(e->metrics.upstream_connects, 2);
    assert_int_equal(e->metrics.upstream_reused, 0);
    assert_int_equal(fk.fails + fk.retries, 0);
    assert_int_equal(fk.dones, 2);
}

/* One more client connection and its request (the env's own client has one
 * in flight already). */
static struct fake_req *another_client_request(struct env *e)
{
    int cfd = loopnet_connect(e->client_port, 0);
    assert_true(cfd >= 0);
    struct sockaddr_in peer;
    int sfd = loopnet_accept(e->client_lfd, &peer);
    assert_true(sfd >= 0);
    assert_non_null(
        conn_new(&e->net, sfd, &e->req_limits, &client_handler, e, (struct sockaddr *)&peer));
    assert_true(loopnet_send_str(cfd, simple_get));
    assert_true(RUN_UNTIL(fk.waiting != NULL));
    struct fake_req *fr = fk.waiting;
    fk.waiting = NULL;
    return fr;
}

/* After one round trip: a client's next request, and the replica closing
 * the pooled connection (pooled at idle_since_ms, by a read that emptied the
 * socket or not) without the loop running since. */
static struct fake_req *close_pooled_unseen(struct env *e, uint64_t idle_since_ms, bool drained)
{
    open_client(e);
    round_trip(e, true);
    struct fake_req *fr = client_request(e, simple_get);
    struct upstream *pooled = container_of(list_first(&e->ep->idle), struct upstream, node);
    pooled->idle_since_ms = idle_since_ms;
    pooled->pooled_drained = drained;
    close(e->replica.fd);
    e->replica.fd = -1;
    return fr;
}

/* The request arrives on a new connection and is answered (the dones-th
 * answer), nothing failed. */
static void answered_after(struct env *e, int dones)
{
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == dones));
    assert_int_equal(e->metrics.upstream_connects, 2);
    assert_int_equal(fk.fails + fk.retries, 0);
}

static void answered_on_a_new_connection(struct env *e)
{
    answered_after(e, 2);
}

/* fr goes out; the peek before reuse sees the pooled connection closed, and
 * fr is answered on a new one. */
static void peeked_and_dropped(struct env *e, struct fake_req *fr)
{
    dispatch(e, fr, simple_get_up);
    assert_int_equal(e->metrics.upstream_stale_closed, 1);
    assert_int_equal(e->metrics.upstream_reused, 0);
    answered_on_a_new_connection(e);
}

static void test_pooled_connection_closed_unseen_is_not_reused(void **state)
{
    struct env *e = *state;
    /* Pooled a while ago (a connection pooled moments ago is taken without
     * the peek: the next test): the peek before reuse sees the close. */
    peeked_and_dropped(e, close_pooled_unseen(e, 0, true));
}

static void test_fresh_pooled_connection_closed_unseen_is_sent_again(void **state)
{
    struct env *e = *state;
    /* Closed right after its answer: taken without a peek (pooled just now
     * by a read that emptied the socket), and the failure sends the request
     * again on a new connection. */
    struct fake_req *fr = close_pooled_unseen(e, clock_now_ms(), true);
    dispatch(e, fr, simple_get_up);
    assert_int_equal(e->metrics.upstream_reused, 1);
    assert_true(RUN_UNTIL(e->metrics.upstream_stale_retries == 1));
    answered_on_a_new_connection(e);
}

static void dispatch_next(void)
{
    struct env *e = on_capacity.e;
    struct fake_req *fr = on_capacity.next;
    on_capacity.next = NULL;
    if (on_capacity.close_first) {
        close(e->replica.fd);
        e->replica.fd = -1;
    }
    dispatch(e, fr, simple_get_up);
}

/* A second client's request waits; the replica answers the first. */
static void answer_with_one_waiting(struct env *e, bool close_first, bool fin_with_answer)
{
    open_client(e);
    round_trip(e, true);
    struct fake_req *first = client_request(e, simple_get);
    struct fake_req *second = another_client_request(e);
    dispatch(e, first, simple_get_up);
    assert_true(RUN_UNTIL(e->replica.got.len == 2 * strlen(simple_get_up)));
    on_capacity.e = e;
    on_capacity.next = second;
    on_capacity.close_first = close_first;
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    if (fin_with_answer) {
        shutdown(e->replica.fd, SHUT_WR); /* before the loop polls: flagged with the answer */
    }
    assert_true(RUN_UNTIL(fk.dones == 2));
    assert_null(on_capacity.next); /* sent in the turn the answer was read */
}

static void test_connection_pooled_this_turn_by_a_draining_read_is_taken_without_a_peek(void **state)
{
    struct env *e = *state;
    /* The replica closes after the read that emptied the socket, within the
     * turn: nothing the loop could have seen at the turn's start, so no peek
     * (a system call per request under load), and the close is met as one
     * racing the request: sent again on a new connection. */
    answer_with_one_waiting(e, true, false);
    assert_int_equal(e->metrics.upstream_reused, 2);
    assert_int_equal(e->metrics.upstream_stale_closed, 0);
    assert_true(RUN_UNTIL(e->metrics.upstream_stale_retries == 1));
    answered_after(e, 3);
}

static void test_a_connection_whose_fin_came_with_the_answer_is_not_pooled(void **state)
{
    struct env *e = *state;
    /* The poll flagged the replica's FIN with its answer: the connection is
     * closed, not pooled, and the next request goes on a new one. */
    answer_with_one_waiting(e, false, true);
    assert_int_equal(e->metrics.upstream_reused, 1);
    assert_int_equal(e->metrics.upstream_stale_closed, 0);
    answered_after(e, 3);
    assert_int_equal(e->metrics.upstream_stale_retries, 0);
}

static void test_a_connection_pooled_by_a_read_that_left_bytes_is_peeked(void **state)
{
    struct env *e = *state;
    /* Pooled moments ago, but by a read that did not empty the socket: what
     * is left raises no new edge, so the peek before reuse sees the close. */
    peeked_and_dropped(e, close_pooled_unseen(e, clock_now_ms(), false));
}

/* The client's next request goes out on a new connection and gets its own
 * answer, none of the replica's stray "EVIL!" one. */
static void next_client_gets_its_own_answer(struct env *e)
{
    size_t before = e->client.got.len;
    dispatch(e, client_request(e, simple_get), simple_get_up);
    answered_on_a_new_connection(e);
    assert_true(RUN_UNTIL(e->client.got.len > before && loopnet_has(&e->client, "\r\n\r\nok")));
    assert_false(loopnet_has(&e->client, "EVIL!"));
}

static void test_stray_bytes_behind_an_answer_that_filled_a_read_reach_no_client(void **state)
{
    struct env *e = *state;
    /* The answer ends exactly at the end of a full read, and the replica
     * sent more behind it (a second answer nobody asked for): pooled with
     * bytes that raise no new edge. Taken in a later turn, the peek sees
     * them and the connection is closed; the next client gets its own
     * answer, not the stray one. */
    request_at_the_replica(e);
    const char stray[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!";
    char head[64];
    size_t hl = (size_t)snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %05zu\r\n\r\n",
                                 (size_t)0);
    size_t body = CONN_SCRATCH_BYTES - hl;
    snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %05zu\r\n\r\n", body);
    size_t total = CONN_SCRATCH_BYTES + sizeof stray - 1;
    char *resp = malloc(total);
    assert_non_null(resp);
    memcpy(resp, head, hl);
    memset(resp + hl, 'y', body);
    memcpy(resp + CONN_SCRATCH_BYTES, stray, sizeof stray - 1);
    assert_true(send(e->replica.fd, resp, total, MSG_NOSIGNAL) == (ssize_t)total);
    free(resp);
    assert_true(RUN_UNTIL(fk.dones == 1 && e->client.got.len >= body));
    RUN_FOR(5); /* a later turn */
    next_client_gets_its_own_answer(e);
    assert_int_equal(e->metrics.upstream_stale_closed, 1);
}

static void test_an_answer_nobody_asked_for_on_a_pooled_connection_reaches_no_client(void **state)
{
    struct env *e = *state;
    /* Pooled by a read that emptied the socket (taken without a peek), then
     * the replica sends a second answer while it is idle: its read event
     * closes the connection before the next request comes. */
    open_client(e);
    round_trip(e, true);
    assert_int_equal(e->ep->n_idle, 1);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"));
    assert_true(RUN_UNTIL(e->ep->n_idle == 0));
    next_client_gets_its_own_answer(e);
}

static void test_pooled_connection_closing_under_a_request_is_sent_again(void **state)
{
    struct env *e = *state;
    open_client(e);
    round_trip(e, true);
    size_t before = e->replica.got.len;
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    assert_int_equal(e->metrics.upstream_reused, 1);
    /* The replica closed it as the request arrived (its idle close racing
     * thaw's send): sent again on a new connection, not failed. */
    assert_true(RUN_UNTIL(e->replica.got.len == before + strlen(simple_get_up)));
    close(e->replica.fd);
    e->replica.fd = -1;
    assert_true(RUN_UNTIL(e->metrics.upstream_stale_retries == 1));
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    assert_int_equal(fr->up.tries, 1); /* the same attempt */
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 2));
    assert_int_equal(fk.fails + fk.retries, 0);
    assert_int_equal(e->metrics.upstream_connects, 2);
    /* Each connection took and gave a slot once. */
    assert_int_equal(fk.takes, 3);
    assert_int_equal(fk.gives, 3);
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 200 OK"), 2);
}

/* The replica's accept queue holds one connection, and one waits in it:
 * the next SYN is dropped (the kernel sends it again only a second later). */
static int fill_the_accept_queue(struct env *e)
{
    assert_int_equal(listen(e->replica_lfd, 0), 0);
    int filler = loopnet_connect(e->replica_port, 0);
    assert_true(filler >= 0);
    return filler;
}

static void test_a_stalled_connect_is_left_alone_without_a_fast_one_beside_it(void **state)
{
    struct env *e = *state;
    int filler = fill_the_accept_queue(e);
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    /* No handshake here is known fast (a distant replica's may take longer
     * than a stall period): the connect is not made again. */
    RUN_FOR(120);
    assert_int_equal(e->metrics.upstream_connect_stalls, 0);
    assert_int_equal(e->ep->accept_window, ACCEPT_WINDOW_START);
    upstream_cancel(fr->up.up);
    assert_int_equal(e->ep->connecting, 0);
    assert_int_equal(e->ep->unconfirmed, 0);
    close(filler);
}

static void test_a_stalled_connect_is_made_again_once_the_queue_has_room(void **state)
{
    struct env *e = *state;
    int filler = fill_the_accept_queue(e);
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    uint64_t t0 = clock_now_ms();
    dispatch(e, fr, simple_get_up);
    e->ep->fast_handshake_ms = clock_now_ms(); /* the path is known fast */
    assert_true(RUN_UNTIL(e->metrics.upstream_connect_stalls >= 1));
    assert_true(e->ep->accept_window < ACCEPT_WINDOW_START);
    /* The replica takes the connection that filled its queue: room. */
    int fd = loopnet_accept(e->replica_lfd, NULL);
    assert_true(fd >= 0);
    close(fd);
    close(filler);
    assert_true(RUN_UNTIL(e->ep->connecting == 0)); /* made again, into the room */
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 1));
    assert_true(clock_now_ms() - t0 < 800); /* not the kernel's second */
    assert_int_equal(fk.fails + fk.retries, 0);
    assert_int_equal(e->ep->connecting, 0);
    assert_int_equal(e->ep->remade, 0);
}

/* The next connection in the replica's accept queue, taken by the test. */
static int replica_takes_next(struct env *e)
{
    int fd = -1;
    for (int i = 0; i < 200 && fd < 0; i++) {
        fd = accept4(e->replica_lfd, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0) {
            RUN_FOR(5);
        }
    }
    assert_true(fd >= 0);
    return fd;
}

/* Lowers the descriptor limit to the lowest free descriptor: no socket can
 * be opened. Returns the limit to put back. */
static struct rlimit no_descriptor_left(void)
{
    int lowest = dup(0);
    close(lowest);
    struct rlimit saved, low;
    getrlimit(RLIMIT_NOFILE, &saved);
    low = saved;
    low.rlim_cur = (rlim_t)lowest;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    return saved;
}

/* A replica's own queue, a window of one new connection, and a request on
 * it that the replica accepted. */
static void window_of_one_taken(struct env *e)
{
    e->ep->one_queue = true;
    e->ep->accept_window = 1;
    strcpy(e->ep->check_path, "/health");
    open_client(e);
    dispatch(e, client_request(e, simple_get), simple_get_up);
    replica_accept(e);
}

static void test_an_accept_check_that_got_no_answer_is_sent_again(void **state)
{
    struct env *e = *state;
    window_of_one_taken(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    /* The window is full of a connection the replica works on: a check. */
    assert_true(RUN_UNTIL(e->metrics.upstream_accept_checks == 1));
    assert_int_equal(e->ep->unconfirmed, 1);
    close(replica_takes_next(e)); /* no answer: reset */
    /* Sent again (before, nothing did while the window stayed full: the
     * next requests waited for the first one's answer). */
    assert_true(RUN_UNTIL(e->metrics.upstream_accept_checks == 2));
    struct loopnet_peer check;
    loopnet_peer_init(&check, replica_takes_next(e));
    struct loopnet_peer *peers[] = {&check};
    assert_true(LOOPNET_RUN_UNTIL(e->base, peers, 1, loopnet_has(&check, "\r\n\r\n")));
    assert_true(loopnet_has(&check, "GET /health HTTP/1.1\r\n"));
    assert_true(loopnet_send_str(check.fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
    /* Its answer vouches for the request's connection: room again. */
    int capacities = fk.capacities;
    assert_true(RUN_UNTIL(e->ep->unconfirmed == 0));
    assert_int_equal(fk.capacities, capacities + 1);
    assert_int_equal(fk.dones + fk.fails, 0);
    loopnet_peer_dispose(&check);
}

static void test_an_accept_check_that_could_not_be_sent_is_sent_later(void **state)
{
    struct env *e = *state;
    window_of_one_taken(e);
    /* No descriptor left for the check when the window fills. */
    struct rlimit saved = no_descriptor_left();
    bool sent = RUN_UNTIL(e->replica.got.len == strlen(simple_get_up));
    RUN_FOR(30);
    uint64_t checks_without = e->metrics.upstream_accept_checks;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    assert_true(sent);
    assert_int_equal(checks_without, 0);
    /* Sent once a descriptor is there (before, never while the window
     * stayed full). */
    assert_true(RUN_UNTIL(e->metrics.upstream_accept_checks == 1));
}

static void test_no_descriptor_for_a_stalled_connect_does_not_spin(void **state)
{
    struct env *e = *state;
    e->ep->one_queue = true; /* a replica's own queue: the stalled connect waits for room */
    assert_int_equal(listen(e->replica_lfd, 1), 0); /* the queue holds two */
    open_client(e);
    dispatch(e, client_request(e, simple_get), simple_get_up);
    dispatch(e, another_client_request(e), simple_get_up);
    assert_true(RUN_UNTIL(e->ep->connecting == 0 && e->ep->fast_handshake_ms != 0));
    dispatch(e, another_client_request(e), simple_get_up); /* its SYN is dropped */
    assert_true(RUN_UNTIL(!list_empty(&e->ep->stalled)));
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    /* No descriptor left to make the stalled connect again when the answer
     * makes room: it waits on (before, the loop tried again forever). */
    struct rlimit saved = no_descriptor_left();
    alarm(10); /* a spinning loop ends the test */
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    bool answered = RUN_UNTIL(fk.dones == 1);
    alarm(0);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    assert_true(answered);
    assert_false(list_empty(&e->ep->stalled));
}

static void test_unsolicited_101_fails_with_502(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd,
                                 "HTTP/1.1 101 Switching Protocols\r\n"
                                 "Upgrade: websocket\r\nConnection: upgrade\r\n\r\n"));
    assert_true(RUN_UNTIL(fk.fails == 1 && loopnet_has(&e->client, "}}\n")));
    assert_false(fk.failed_started);
    assert_int_equal(fk.last_reason, REJECT_UPSTREAM_ERROR);
    assert_int_equal(fk.first_bytes, 0);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 502 "));
    assert_false(loopnet_has(&e->client, "101"));
    assert_int_equal(e->ep->n_idle, 0);
    /* The replica's connection is closed, not pooled. */
    assert_true(RUN_UNTIL(e->replica.eof));
}

/* The replica answers the request at it with `answer`: the client gets a
 * 502 and the connection is closed, not pooled. */
static void answered_502_and_closed(struct env *e, const char *answer)
{
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, answer));
    assert_true(RUN_UNTIL(fk.fails == 1 && loopnet_has(&e->client, "}}\n")));
    assert_int_equal(fk.last_reason, REJECT_UPSTREAM_ERROR);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 502 "));
    assert_int_equal(e->ep->n_idle, 0);
    assert_true(RUN_UNTIL(e->replica.eof));
}

static void test_a_status_code_out_of_range_is_502(void **state)
{
    /* Before, "000" and "099" went to the client as they were. */
    answered_502_and_closed(*state, "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok");
}

static void test_a_status_code_over_599_is_502(void **state)
{
    answered_502_and_closed(*state, "HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok");
}

static void test_an_answer_in_a_transfer_coding_besides_chunked_is_502(void **state)
{
    /* Before, the gzip bytes went out as a plain chunked body. */
    answered_502_and_closed(*state, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                                    "2\r\nok\r\n0\r\n\r\n");
}

static void test_a_204_ends_at_its_head_whatever_body_it_declares(void **state)
{
    struct env *e = *state;
    /* Before, the declared body went to the client after the 204, where it
     * was taken as the answer to the client's next request. */
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 204 No Content\r\nContent-Length: 39\r\n\r\n"
                                                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"));
    assert_true(RUN_UNTIL(fk.dones == 1 && loopnet_has(&e->client, "\r\n\r\n")));
    RUN_FOR(20);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 204 "));
    assert_false(loopnet_has(&e->client, "EVIL!"));
    assert_int_equal(loopnet_count(&e->client, "HTTP/1.1 "), 1);
    assert_int_equal(e->ep->n_idle, 0); /* the declared body would follow: closed */
}

static void test_a_204_whose_declared_body_comes_later_is_not_pooled(void **state)
{
    struct env *e = *state;
    /* The declared body is not in the read that ends the 204: it would come
     * later as an answer nobody asked for. */
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"));
    assert_true(RUN_UNTIL(fk.dones == 1 && loopnet_has(&e->client, "\r\n\r\n")));
    RUN_FOR(20);
    assert_int_equal(e->ep->n_idle, 0);
}

static void test_a_304_with_the_length_of_the_200_is_pooled(void **state)
{
    struct env *e = *state;
    /* A 304's Content-Length says what the 200 would have had (RFC 9110
     * 8.6): no body follows, and the connection is reused. */
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"));
    assert_true(RUN_UNTIL(fk.dones == 1 && e->ep->n_idle == 1));
    assert_int_equal(fk.last_status, 304);
}

static void test_a_transfer_encoding_that_is_not_chunked_is_502(void **state)
{
    /* "chunked," is not chunked to llhttp: the body would be read to the
     * close and passed on with its framing as data. */
    answered_502_and_closed(*state, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n"
                                    "2\r\nok\r\n0\r\n\r\n");
}

static void test_interim_100_is_skipped(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 100 Continue\r\n\r\n"));
    RUN_FOR(20);
    assert_int_equal(fk.first_bytes, 0);
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 1));
    assert_int_equal(fk.last_status, 200);
    assert_false(loopnet_has(&e->client, "100 Continue"));
    assert_int_equal(fk.first_bytes, 1);
}

static void test_client_leaving_cancels_the_upstream(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    close(e->client.fd);
    e->client.fd = -1;
    assert_true(RUN_UNTIL(fk.aborts == 1 && e->replica.eof));
    /* The slot is back and waiting requests may go; the connection, in the
     * middle of an exchange, is not pooled. */
    assert_string_equal(fk.events, "TGC");
    assert_int_equal(fk.fails + fk.retries + fk.dones, 0);
    assert_int_equal(e->ep->n_idle, 0);
}

static void test_slow_client_pauses_reading_from_the_replica(void **state)
{
    struct env *e = *state;
    open_client_buffered(e, 8192);
    e->client.paused = true;
    e->client.step = 16384;
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    int small = 16384;
    setsockopt(e->replica.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    size_t body = 4 << 20;
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n";
    char *resp = malloc(strlen(head) + body);
    assert_non_null(resp);
    memcpy(resp, head, strlen(head));
    memset(resp + strlen(head), 'y', body);
    e->feed = resp;
    e->feed_len = strlen(head) + body;
    /* The client does not read: upstream stops reading the replica once
     * the client's output passes the high water mark. */
    assert_true(RUN_UNTIL(fr->up.up && fr->up.up->reading_paused));
    size_t pending = conn_out_pending(e->c);
    assert_true(pending > CONN_OUT_HIGH_WATER);
    RUN_FOR(50);
    /* Nothing more was read: the client's output only shrinks (as the
     * kernel takes some), and the replica is held back in turn. */
    assert_true(conn_out_pending(e->c) <= pending);
    assert_true(fr->up.up->reading_paused);
    assert_true(e->feed_off < e->feed_len / 2);
    /* The client reads: everything arrives and the exchange completes. */
    e->client.paused = false;
    assert_true(RUN_UNTIL(fk.dones == 1 && e->client.got.len >= body));
    assert_true(loopnet_has(&e->client, "Content-Length: 4194304\r\n"));
    assert_true(e->client.got.data[e->client.got.len - 1] == 'y');
    /* Never much more than a read's worth above the mark. */
    assert_true(e->max_pending <= CONN_OUT_HIGH_WATER + CONN_SCRATCH_BYTES);
    assert_int_equal(e->ep->n_idle, 1);
    e->feed = NULL;
    free(resp);
}

/* The whole answer (body bytes) is in thaw's socket while reading is paused
 * for a slow client; the reads the client's drain starts finish it. */
static void answer_finished_after_a_pause(struct env *e, size_t body)
{
    open_client_buffered(e, 8192);
    e->client.paused = true;
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    int big = 4 << 20;
    setsockopt(fr->up.up->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    setsockopt(e->replica.fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    char head[64];
    snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", body);
    char *resp = malloc(strlen(head) + body);
    assert_non_null(resp);
    memcpy(resp, head, strlen(head));
    memset(resp + strlen(head), 'y', body);
    e->feed = resp;
    e->feed_len = strlen(head) + body;
    assert_true(RUN_UNTIL(fr->up.up && fr->up.up->reading_paused && e->feed_off == e->feed_len));
    RUN_FOR(20);
    e->client.paused = false;
    assert_true(RUN_UNTIL(fk.dones == 1 && e->client.got.len >= body));
    e->feed = NULL;
    free(resp);
}

static void test_an_answer_finished_after_a_pause_for_the_client_is_pooled(void **state)
{
    struct env *e = *state;
    /* The FIN the resumed read is told to look for is not the replica's:
     * the connection is pooled. */
    answer_finished_after_a_pause(e, 160 << 10);
    assert_int_equal(e->ep->n_idle, 1);
}

static void test_close_delimited_body_is_rechunked(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    assert_true(
        loopnet_send_str(e->replica.fd, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "hello")));
    assert_int_equal(fk.dones, 0); /* the body ends when the replica closes */
    close(e->replica.fd);
    e->replica.fd = -1;
    assert_true(RUN_UNTIL(fk.dones == 1 && loopnet_has(&e->client, "0\r\n\r\n")));
    assert_int_equal(fk.last_status, 200);
    assert_true(loopnet_has(&e->client, "Transfer-Encoding: chunked\r\n"));
    assert_true(loopnet_has(&e->client, "\r\n\r\n5\r\nhello\r\n0\r\n\r\n"));
    assert_int_equal(e->ep->n_idle, 0); /* closed by the replica: not pooled */
    /* The client's connection stays open for its next request. */
    RUN_FOR(20);
    assert_false(e->client.eof);
    assert_false(list_empty(&e->net.conns));
}

/* thaw sent its own 200 event-stream head (loading heartbeats): a replica's
 * error answer is kept, not forwarded, and handed to stream_error whole. */
static void test_error_status_into_a_heartbeat_stream_goes_to_stream_error(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    fr->up.heartbeat = true;
    fr->ex.response_started = true;
    stream_errors = 0;
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(simple_get_up)));
    assert_true(loopnet_send_str(e->replica.fd, "HTTP/1.1 503 Service Unavailable\r\n"
                                                "Transfer-Encoding: chunked\r\n\r\n"
                                                "5\r\n{\"a\":\r\n"));
    RUN_FOR(20);
    assert_int_equal(stream_errors, 0);
    assert_int_equal(fk.dones, 0);
    assert_true(loopnet_send_str(e->replica.fd, "3\r\n1}\n\r\n0\r\n\r\n"));
    assert_true(RUN_UNTIL(fk.dones == 1));
    assert_int_equal(stream_errors, 1);
    assert_int_equal(stream_error_status, 503);
    assert_string_equal(stream_error_body, "{\"a\":1}\n");
    assert_int_equal(fk.last_status, 503);
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "<error event>")));
    /* Nothing of the replica's reached the client. */
    assert_false(loopnet_has(&e->client, "503"));
    assert_false(loopnet_has(&e->client, "{\"a\""));
    assert_int_equal(e->ep->n_idle, 1); /* cleanly framed: pooled */
}

static void test_silent_replica_times_out_with_504(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    fr->up.first_byte_timeout_ms = 100; /* read when the request is sent */
    replica_accept(e);
    assert_true(RUN_UNTIL(fk.fails == 1 && loopnet_has(&e->client, "}}\n")));
    assert_false(fk.failed_started);
    assert_int_equal(fk.last_reason, REJECT_UPSTREAM_TIMEOUT);
    assert_true(loopnet_has(&e->client, "HTTP/1.1 504 "));
    assert_int_equal(e->ep->n_idle, 0);
    assert_true(RUN_UNTIL(e->replica.eof));
}

static void test_client_leaving_mid_response(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    assert_true(
        loopnet_send_str(e->replica.fd, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc"));
    assert_true(RUN_UNTIL(loopnet_has(&e->client, "abc")));
    close(e->client.fd);
    e->client.fd = -1;
    /* The replica goes on streaming; the writes to the client fail. */
    static char more[256 * 1024];
    memset(more, 'z', sizeof more);
    e->feed = more;
    e->feed_len = sizeof more;
    assert_true(RUN_UNTIL(fk.gones + fk.fails > 0 && list_empty(&e->net.conns)));
    assert_int_equal(fk.gones, 1);
    assert_int_equal(fk.fails, 0);
    assert_string_equal(fk.events, "T1GOC");
    assert_int_equal(e->ep->n_idle, 0); /* mid-response: not pooled */
    assert_true(RUN_UNTIL(e->replica.eof || e->replica.err));
    e->feed = NULL;
}

/* The replica answers the request just sent on its current connection. */
static void replica_answers(struct env *e, const char *req_up, const char *response)
{
    assert_true(RUN_UNTIL(loopnet_has(&e->replica, req_up)));
    assert_true(loopnet_send_str(e->replica.fd, response));
}

static void test_head_response_has_no_body(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, "HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n");
    dispatch(e, fr, "HEAD /x HTTP/1.1\r\nHost: replica\r\n\r\n");
    replica_accept(e);
    replica_answers(e, "HEAD /x", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
    /* Complete at the end of the head, and the connection is reusable. */
    assert_true(RUN_UNTIL(fk.dones == 1));
    assert_true(loopnet_has(&e->client, "Content-Length: 100\r\n\r\n"));
    assert_int_equal(e->ep->n_idle, 1);
    round_trip(e, false);
    assert_int_equal(e->metrics.upstream_reused, 1);
}

static void test_chunked_to_an_http10_client_is_decoded(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, "GET /x HTTP/1.0\r\n\r\n");
    dispatch(e, fr, "GET /x HTTP/1.1\r\nHost: replica\r\n\r\n");
    replica_accept(e);
    replica_answers(e, "GET /x",
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    assert_true(RUN_UNTIL(fk.dones == 1 && e->client.eof));
    assert_true(loopnet_has(&e->client, "\r\n\r\nabcde"));
    assert_false(loopnet_has(&e->client, "chunked"));
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
    /* The replica's side was complete and keep-alive: pooled. */
    assert_int_equal(e->ep->n_idle, 1);
}

static void test_replica_saying_close_is_not_pooled(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    replica_answers(e, "GET /v1/models",
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    assert_true(RUN_UNTIL(fk.dones == 1 && e->replica.eof));
    assert_int_equal(e->ep->n_idle, 0);
    assert_false(loopnet_has(&e->client, "Connection: close")); /* the client's stays */
}

static void test_replica_keepalive_timeout_zero_is_not_pooled(void **state)
{
    struct env *e = *state;
    open_client(e);
    struct fake_req *fr = client_request(e, simple_get);
    dispatch(e, fr, simple_get_up);
    replica_accept(e);
    replica_answers(e, "GET /v1/models",
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=0\r\n\r\nok");
    assert_true(RUN_UNTIL(fk.dones == 1 && e->replica.eof));
    assert_int_equal(e->ep->n_idle, 0);
}

static void test_nothing_is_pooled_while_draining(void **state)
{
    struct env *e = *state;
    request_at_the_replica(e);
    e->draining = true;
    e->net.draining = true;
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 1 && e->replica.eof && e->client.eof));
    assert_int_equal(e->ep->n_idle, 0);
    assert_true(loopnet_has(&e->client, "Connection: close\r\n"));
}

/* A body larger than the socket takes at once goes out in pieces, after
 * its head, byte for byte. */
static void test_large_body_goes_out_whole(void **state)
{
    struct env *e = *state;
    e->req_limits.max_body_bytes = 8 << 20;
    open_client(e);
    size_t body = 3 << 20;
    const char *head = "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3145728\r\n\r\n";
    char *req = malloc(strlen(head) + body);
    assert_non_null(req);
    memcpy(req, head, strlen(head));
    for (size_t i = 0; i < body; i++) {
        req[strlen(head) + i] = (char)('a' + i % 26);
    }
    e->client_feed = req;
    e->client_feed_len = strlen(head) + body;
    assert_true(RUN_UNTIL(fk.waiting != NULL));
    struct fake_req *fr = fk.waiting;
    fk.waiting = NULL;
    const char *up_head = "POST /v1/x HTTP/1.1\r\nHost: replica\r\nContent-Length: 3145728\r\n\r\n";
    dispatch(e, fr, up_head);
    replica_accept(e);
    e->replica.step = 8192; /* a replica reading slowly: thaw waits for room */
    assert_true(RUN_UNTIL(e->replica.got.len == strlen(up_head) + body));
    assert_memory_equal(e->replica.got.data, up_head, strlen(up_head));
    assert_memory_equal(e->replica.got.data + strlen(up_head), req + strlen(head), body);
    assert_true(loopnet_send_str(e->replica.fd, ok_response));
    assert_true(RUN_UNTIL(fk.dones == 1));
    e->client_feed = NULL;
    free(req);
}

int main(void)
{
    log_init(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_out_response_back_connection_pooled, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pooled_connection_serves_the_next_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_new_connection_at_the_budget_closes_the_longest_idle,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_replica_socket_stays_edge_triggered_after_the_request,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_connect_retries_and_ejects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replica_closing_after_the_head_aborts_the_client,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_replica_closing_before_the_head_answers_502, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_pooled_connection_closed_by_replica_is_not_reused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_pooled_connection_closed_unseen_is_not_reused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_connection_pooled_this_turn_by_a_draining_read_is_taken_without_a_peek, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_connection_whose_fin_came_with_the_answer_is_not_pooled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_connection_pooled_by_a_read_that_left_bytes_is_peeked,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_stray_bytes_behind_an_answer_that_filled_a_read_reach_no_client, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_an_answer_nobody_asked_for_on_a_pooled_connection_reaches_no_client, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_fresh_pooled_connection_closed_unseen_is_sent_again, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_pooled_connection_closing_under_a_request_is_sent_again, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_stalled_connect_is_left_alone_without_a_fast_one_beside_it, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_stalled_connect_is_made_again_once_the_queue_has_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_accept_check_that_got_no_answer_is_sent_again,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_accept_check_that_could_not_be_sent_is_sent_later,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_descriptor_for_a_stalled_connect_does_not_spin,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsolicited_101_fails_with_502, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_status_code_out_of_range_is_502, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_status_code_over_599_is_502, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_an_answer_in_a_transfer_coding_besides_chunked_is_502, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_204_ends_at_its_head_whatever_body_it_declares,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_204_whose_declared_body_comes_later_is_not_pooled,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_304_with_the_length_of_the_200_is_pooled, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_transfer_encoding_that_is_not_chunked_is_502, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_interim_100_is_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaving_cancels_the_upstream, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_an_answer_finished_after_a_pause_for_the_client_is_pooled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_client_pauses_reading_from_the_replica, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_close_delimited_body_is_rechunked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_replica_times_out_with_504, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_error_status_into_a_heartbeat_stream_goes_to_stream_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaving_mid_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_response_has_no_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_to_an_http10_client_is_decoded, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_replica_saying_close_is_not_pooled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replica_keepalive_timeout_zero_is_not_pooled, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_nothing_is_pooled_while_draining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_body_goes_out_whole, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

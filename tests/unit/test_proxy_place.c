/* proxy: placement and retry, with a runtime wired by hand (what the server
 * does at start-up, reduced to what the request path needs), a static model
 * whose endpoints are fake replicas (loopback listeners the test scripts),
 * and real client connections on the proxy's conn handler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/backend.h"
#include "thaw/clock.h"
#include "thaw/config.h"
#include "thaw/conn.h"
#include "thaw/log.h"
#include "thaw/proxy.h"
#include "thaw/runtime.h"
#include "thaw/tenant.h"
#include "thaw/upstream.h"

#include "loopnet.h"

#define MAX_CLIENTS 4
#define MAX_REPLICA_CONNS 4

/* A fake replica: its listener and the connections it accepted. */
struct replica {
    int lfd;
    uint16_t port;
    struct loopnet_peer conns[MAX_REPLICA_CONNS];
    int n_conns;
};

struct env {
    struct runtime rt;
    struct backend *static_backend;
    struct model *m;
    struct replica rep[2];
    int client_lfd;
    uint16_t client_port;
    struct loopnet_peer clients[MAX_CLIENTS];
    struct loopnet_peer *peers[MAX_CLIENTS];
    int n_clients;
};

/* The runtime the proxy needs, as the server sets it up (without its
 * listeners), with short connection timeouts for the tests. */
static void runtime_wire(struct env *e, struct config *cfg)
{
    struct runtime *rt = &e->rt;
    memset(rt, 0, sizeof *rt);
    struct event_base *base = event_base_new();
    assert_non_null(base);
    assert_int_equal(runtime_init(rt, cfg, base), 0);
    proxy_wire(rt);
    rt->net.header_timeout_ms = rt->net.keepalive_timeout_ms = rt->net.send_timeout_ms = 3000;
    rt->net.body_timeout_ms = 3000;
    rt->net.linger_ms = 200;
}

static void add_model_from_text(struct env *e, const char *text);

/* Model "m" on the static backend, its endpoints in this order. */
static void add_static_model_with(struct env *e, unsigned max_concurrency, const char *ep0,
                                  const char *ep1, const char *more_keys)
{
    char text[512];
    snprintf(
        text, sizeof text,
        "{\"models\":[{\"name\":\"m\",\"max_concurrency\":%u,%s\"endpoints\":[\"%s\"%s%s%s]}]}",
        max_concurrency, more_keys, ep0, ep1 ? ",\"" : "", ep1 ? ep1 : "", ep1 ? "\"" : "");
    add_model_from_text(e, text);
}

/* The runtime for the configuration text, and its one static model. */
static void add_model_from_text(struct env *e, const char *text)
{
    struct config_error err;
    struct config *cfg = config_parse(text, strlen(text), "test", &err);
    if (!cfg) {
        fail_msg("config: %s", err.msg);
    }
    runtime_wire(e, cfg);
    e->static_backend = backend_static_new(&e->rt.fleet);
    assert_non_null(e->static_backend);
    e->m = fleet_add_model(&e->rt.fleet, &cfg->models[0]);
    assert_non_null(e->m);
    assert_int_equal(e->static_backend->ops->attach(e->static_backend, e->m, &cfg->models[0]), 0);
}

static void add_static_model(struct env *e, unsigned max_concurrency, const char *ep0,
                             const char *ep1)
{
    add_static_model_with(e, max_concurrency, ep0, ep1, "");
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->client_lfd = loopnet_listen(&e->client_port);
    assert_true(e->client_lfd >= 0);
    for (int i = 0; i < 2; i++) {
        e->rep[i].lfd = loopnet_listen(&e->rep[i].port);
        assert_true(e->rep[i].lfd >= 0);
        for (int j = 0; j < MAX_REPLICA_CONNS; j++) {
            loopnet_peer_init(&e->rep[i].conns[j], -1);
        }
    }
    for (int i = 0; i < MAX_CLIENTS; i++) {
        loopnet_peer_init(&e->clients[i], -1);
        e->peers[i] = &e->clients[i];
    }
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    struct runtime *rt = &e->rt;
    while (!list_empty(&rt->net.conns)) {
        conn_close(container_of(rt->net.conns.next, struct conn, node), ABORT_SHUTDOWN);
    }
    /* Every request was counted once and every slot given back. */
    assert_int_equal(rt->inflight, 0);
    assert_int_equal(e->m->inflight, 0);
    assert_int_equal(e->m->queue.count, 0);
    fleet_dispose(&rt->fleet);
    e->static_backend->ops->free(e->static_backend);
    runtime_dispose(rt);
    event_base_free(rt->base);
    config_free(rt->cfg);
    for (int i = 0; i < MAX_CLIENTS; i++) {
        loopnet_peer_dispose(&e->clients[i]);
    }
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < MAX_REPLICA_CONNS; j++) {
            loopnet_peer_dispose(&e->rep[i].conns[j]);
        }
        if (e->rep[i].lfd >= 0) {
            close(e->rep[i].lfd);
        }
    }
    close(e->client_lfd);
    free(e);
    return 0;
}

/* Accepts what connected to the replicas and reads what they were sent. */
static bool replicas_pump(struct env *e)
{
    for (int i = 0; i < 2; i++) {
        struct replica *r = &e->rep[i];
        int fd;
        while (r->lfd >= 0 && r->n_conns < MAX_REPLICA_CONNS &&
               (fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
            loopnet_peer_init(&r->conns[r->n_conns++], fd);
        }
        for (int j = 0; j < r->n_conns; j++) {
            loopnet_pump(&r->conns[j]);
        }
    }
    return true;
}

#define RUN_UNTIL(cond)                                                                            \
    LOOPNET_RUN_UNTIL(e->rt.base, e->peers, e->n_clients, replicas_pump(e) && (cond))
#define RUN_FOR(ms)                                                                                \
    do {                                                                                           \
        uint64_t stop_ = loopnet_now_ms() + (ms);                                                  \
        while (loopnet_now_ms() < stop_) {                                                         \
            LOOPNET_RUN_FOR(e->rt.base, e->peers, e->n_clients, 1);                                \
            replicas_pump(e);                                                                      \
        }                                                                                          \
    } while (0)

static char addr_buf[2][32];

static const char *rep_addr(struct env *e, int i)
{
    snprintf(addr_buf[i], sizeof addr_buf[i], "127.0.0.1:%u", e->rep[i].port);
    return addr_buf[i];
}

/* A new client on the proxy port; returns its index. */
static int open_client(struct env *e)
{
    assert_true(e->n_clients < MAX_CLIENTS);
    int cfd = loopnet_connect(e->client_port, 0);
    assert_true(cfd >= 0);
    struct sockaddr_in peer;
    int sfd = loopnet_accept(e->client_lfd, &peer);
    assert_true(sfd >= 0);
    int i = e->n_clients++;
    loopnet_peer_init(&e->clients[i], cfd);
    struct conn *c = conn_new(&e->rt.net, sfd, &e->rt.req_limits, &proxy_conn_handler, &e->rt,
                              (struct sockaddr *)&peer);
    assert_non_null(c);
    return i;
}

/* A completion request for model m, tagged so the replica can tell it. */
static void client_send(struct env *e, int client, const char *tag)
{
    char body[128], req[512];
    int n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\"}", tag);
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: thaw\r\nContent-Type: application/json\r\n"
             "Content-Length: %d\r\n\r\n%s",
             n, body);
    assert_true(loopnet_send_str(e->clients[client].fd, req));
}

/* Which replica connection got the request tagged tag: rep*16+conn, or -1. */
static int where(struct env *e, const char *tag)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"prompt\":\"%s\"", tag);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < e->rep[i].n_conns; j++) {
            if (loopnet_has(&e->rep[i].conns[j], needle)) {
                return i * 16 + j;
            }
        }
    }
    return -1;
}

static void replica_answer(struct env *e, int at, const char *text)
{
    char resp[256];
    snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s", strlen(text),
             text);
    assert_true(loopnet_send_str(e->rep[at / 16].conns[at % 16].fd, resp));
}

static struct endpoint *endpoint_at(struct env *e, int i)
{
    return e->m->endpoints[i];
}

static void test_least_loaded_first(void **state)
{
    struct env *e = *state;
    add_static_model(e, 2, rep_addr(e, 0), rep_addr(e, 1));
    assert_int_equal(e->m->n_endpoints, 2);
    int a = open_client(e), b = open_client(e), c = open_client(e);

    client_send(e, a, "one");
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    assert_int_equal(where(e, "one") / 16, 0); /* both idle: the first */
    client_send(e, b, "two");
    assert_true(RUN_UNTIL(where(e, "two") >= 0));
    assert_int_equal(where(e, "two") / 16, 1); /* the one with nothing on it */
    assert_int_equal(endpoint_at(e, 0)->inflight, 1);
    assert_int_equal(endpoint_at(e, 1)->inflight, 1);

    /* Replica 1 finishes: it is now the least loaded. */
    replica_answer(e, where(e, "two"), "B2");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[b], "B2")));
    assert_int_equal(endpoint_at(e, 1)->inflight, 0);
    client_send(e, c, "three");
    assert_true(RUN_UNTIL(where(e, "three") >= 0));
    assert_int_equal(where(e, "three") / 16, 1);
    assert_int_equal(e->rt.metrics.upstream_reused, 1); /* on replica 1's pooled connection */

    replica_answer(e, where(e, "one"), "A1");
    replica_answer(e, where(e, "three"), "B3");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "A1") && loopnet_has(&e->clients[c], "B3")));
    assert_int_equal(e->m->inflight, 0);
    assert_int_equal(e->m->stats.proxied, 3);
}

static void test_max_concurrency_queues_until_a_slot_frees(void **state)
{
    struct env *e = *state;
    add_static_model(e, 1, rep_addr(e, 0), NULL);
    int a = open_client(e), b = open_client(e);
    client_send(e, a, "one");
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    client_send(e, b, "two");
    /* The only slot is busy: the second waits in the queue, not at the
     * replica. */
    assert_true(RUN_UNTIL(e->m->queue.count == 1));
    RUN_FOR(30);
    assert_int_equal(where(e, "two"), -1);
    assert_int_equal(e->rep[0].n_conns, 1);
    assert_int_equal(endpoint_at(e, 0)->inflight, 1);

    replica_answer(e, where(e, "one"), "A1");
    /* Its slot freed: the waiting request goes (on the pooled connection). */
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "A1") && where(e, "two") >= 0));
    assert_int_equal(e->m->queue.count, 0);
    assert_int_equal(where(e, "two"), 0);
    assert_int_equal(e->rep[0].n_conns, 1);
    replica_answer(e, where(e, "two"), "A2");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[b], "A2")));
    assert_int_equal(e->m->stats.proxied, 2);
}

static void test_refused_connect_retries_elsewhere_and_ejects(void **state)
{
    struct env *e = *state;
    /* Replica 0's port refuses: its listener is gone. */
    const char *dead = rep_addr(e, 0);
    close(e->rep[0].lfd);
    e->rep[0].lfd = -1;
    add_static_model(e, 4, dead, rep_addr(e, 1));
    int a = open_client(e), b = open_client(e);
    uint64_t before = clock_now_ms();
    client_send(e, a, "one");
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    assert_int_equal(where(e, "one") / 16, 1);
    struct endpoint *refusing = endpoint_at(e, 0);
    assert_int_equal(refusing->connect_failures, 1);
    assert_true(refusing->ejected_until_ms >= before + e->rt.cfg->upstream.eject_ms);
    assert_int_equal(refusing->inflight, 0);
    assert_int_equal(e->rt.metrics.upstream_connect_failures, 1);
    replica_answer(e, where(e, "one"), "B1");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "B1")));
    assert_true(loopnet_has(&e->clients[a], "HTTP/1.1 200 OK"));

    /* While ejected, the refusing replica is not tried again. */
    client_send(e, b, "two");
    assert_true(RUN_UNTIL(where(e, "two") >= 0));
    assert_int_equal(where(e, "two") / 16, 1);
    assert_int_equal(refusing->connect_failures, 1);
    replica_answer(e, where(e, "two"), "B2");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[b], "B2")));
    assert_int_equal(e->m->stats.proxied, 2);
    assert_int_equal(e->m->stats.upstream_errors, 0);
}

static void test_client_leaving_the_queue_is_not_dispatched(void **state)
{
    struct env *e = *state;
    add_static_model(e, 1, rep_addr(e, 0), NULL);
    int a = open_client(e), b = open_client(e), c = open_client(e);
    client_send(e, a, "one");
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    client_send(e, b, "two");
    client_send(e, c, "three");
    assert_true(RUN_UNTIL(e->m->queue.count == 2));
    /* "two" gives up while it waits. */
    close(e->clients[b].fd);
    e->clients[b].fd = -1;
    assert_true(RUN_UNTIL(e->m->queue.count == 1));
    replica_answer(e, where(e, "one"), "A1");
    assert_true(RUN_UNTIL(where(e, "three") >= 0));
    assert_int_equal(where(e, "two"), -1);
    replica_answer(e, where(e, "three"), "A3");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[c], "A3")));
    assert_int_equal(e->m->stats.proxied, 2);
    assert_int_equal(e->m->stats.aborted, 1);
}

static void test_queue_deadline_answers_504(void **state)
{
    struct env *e = *state;
    add_static_model_with(e, 1, rep_addr(e, 0), NULL, "\"queue_timeout_ms\":100,");
    int a = open_client(e), b = open_client(e);
    client_send(e, a, "one");
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    client_send(e, b, "two");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[b], "}}\n")));
    assert_true(loopnet_has(&e->clients[b], "HTTP/1.1 504 "));
    assert_true(loopnet_has(&e->clients[b], "\"code\":\"queue_timeout\""));
    assert_true(loopnet_has(&e->clients[b], "(model `m`)"));
    assert_int_equal(e->m->queue.count, 0);
    assert_int_equal(e->m->stats.rejections[REJECT_QUEUE_TIMEOUT], 1);
    /* The request at the replica is not disturbed. */
    replica_answer(e, where(e, "one"), "A1");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "A1")));
    assert_int_equal(where(e, "two"), -1);
}

static void test_every_replica_refusing_answers_502(void **state)
{
    struct env *e = *state;
    const char *a0 = rep_addr(e, 0), *a1 = rep_addr(e, 1);
    for (int i = 0; i < 2; i++) {
        close(e->rep[i].lfd);
        e->rep[i].lfd = -1;
    }
    add_static_model(e, 4, a0, a1);
    int a = open_client(e);
    client_send(e, a, "one");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "}}\n")));
    assert_true(loopnet_has(&e->clients[a], "HTTP/1.1 502 "));
    assert_true(loopnet_has(&e->clients[a], "\"code\":\"upstream_connect_failed\""));
    /* Each replica was tried once. */
    assert_int_equal(endpoint_at(e, 0)->connect_failures, 1);
    assert_int_equal(endpoint_at(e, 1)->connect_failures, 1);
    assert_int_equal(e->m->stats.rejections[REJECT_UPSTREAM_CONNECT], 1);
}

/* Two requests pipelined on one client connection: the second is taken up
 * when the first's response ends, from inside the replica connection's
 * callback, and goes out on that same connection, just pooled. */
static void test_pipelined_requests_reuse_the_replica_connection(void **state)
{
    struct env *e = *state;
    add_static_model(e, 1, rep_addr(e, 0), NULL);
    int a = open_client(e);
    char body1[64], body2[64], req[512];
    int n1 = snprintf(body1, sizeof body1, "{\"model\":\"m\",\"prompt\":\"one\"}");
    int n2 = snprintf(body2, sizeof body2, "{\"model\":\"m\",\"prompt\":\"two\"}");
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: thaw\r\nContent-Length: %d\r\n\r\n%s"
             "POST /v1/completions HTTP/1.1\r\nHost: thaw\r\nContent-Length: %d\r\n\r\n%s",
             n1, body1, n2, body2);
    assert_true(loopnet_send_str(e->clients[a].fd, req));
    assert_true(RUN_UNTIL(where(e, "one") >= 0));
    RUN_FOR(20);
    assert_int_equal(where(e, "two"), -1); /* in order: not before the first is answered */
    replica_answer(e, where(e, "one"), "A1");
    assert_true(RUN_UNTIL(where(e, "two") >= 0));
    assert_int_equal(where(e, "two"), 0); /* the same connection */
    assert_int_equal(e->rep[0].n_conns, 1);
    replica_answer(e, where(e, "two"), "A2");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[a], "A2")));
    const char *got = e->clients[a].got.data;
    size_t len = e->clients[a].got.len;
    assert_true((const char *)memmem(got, len, "A1", 2) < (const char *)memmem(got, len, "A2", 2));
    assert_int_equal(e->m->stats.proxied, 2);
    assert_int_equal(e->rt.metrics.upstream_reused, 1);
}

/* A completion request for model m with an API key. */
static void client_send_key(struct env *e, int client, const char *tag, const char *key)
{
    char body[128], req[512];
    int n = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\"}", tag);
    snprintf(req, sizeof req,
             "POST /v1/completions HTTP/1.1\r\nHost: thaw\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
             key, n, body);
    assert_true(loopnet_send_str(e->clients[client].fd, req));
}

/* A tenant at its concurrency cap waits while another tenant's request goes
 * past it to a free slot; the capped tenant's slot is free again (and its
 * waiting request dispatched) when one of its requests finishes or its
 * client leaves mid-request. */
static void test_tenant_cap_is_skipped_then_released(void **state)
{
    struct env *e = *state;
    char ka[80], kb[80], text[1024];
    tenant_format_digest("key-a", 5, ka, sizeof ka);
    tenant_format_digest("key-b", 5, kb, sizeof kb);
    snprintf(text, sizeof text,
             "{\"tenants\":{\"required\":true,\"list\":["
             "{\"name\":\"a\",\"api_keys\":[\"%s\"],\"max_concurrency\":1},"
             "{\"name\":\"b\",\"api_keys\":[\"%s\"]}]},"
             "\"models\":[{\"name\":\"m\",\"max_concurrency\":4,\"endpoints\":[\"%s\"]}]}",
             ka, kb, rep_addr(e, 0));
    add_model_from_text(e, text);
    int c0 = open_client(e), c1 = open_client(e), c2 = open_client(e), c3 = open_client(e);
    client_send_key(e, c0, "a1", "key-a");
    assert_true(RUN_UNTIL(where(e, "a1") >= 0));
    client_send_key(e, c1, "a2", "key-a");
    assert_true(RUN_UNTIL(e->m->queue.count == 1));
    client_send_key(e, c2, "b1", "key-b");
    assert_true(RUN_UNTIL(where(e, "b1") >= 0)); /* past a's waiting request */
    assert_int_equal(where(e, "a2"), -1);
    struct tenant *a = tenants_find_name(&e->rt.tenants, "a", 1);
    assert_int_equal(queue_flow(&e->m->queue, a->id)->running, 1);

    replica_answer(e, where(e, "a1"), "A1");
    assert_true(RUN_UNTIL(loopnet_has(&e->clients[c0], "A1") && where(e, "a2") >= 0));
    assert_int_equal(e->m->queue.count, 0);

    client_send_key(e, c3, "a3", "key-a");
    assert_true(RUN_UNTIL(e->m->queue.count == 1));
    /* a2's client leaves while a2 is at the replica: a3 may go. */
    close(e->clients[c1].fd);
    e->clients[c1].fd = -1;
    assert_true(RUN_UNTIL(where(e, "a3") >= 0));
    assert_int_equal(queue_flow(&e->m->queue, a->id)->running, 1);
    replica_answer(e, where(e, "b1"), "B1");
    replica_answer(e, where(e, "a3"), "A3");
    assert_true(
        RUN_UNTIL(loopnet_has(&e->clients[c2], "B1") && loopnet_has(&e->clients[c3], "A3")));
    assert_int_equal(queue_flow(&e->m->queue, a->id)->running, 0);
    assert_int_equal(a->stats.requests, 3);
    assert_int_equal(e->m->stats.aborted, 1);
}

int main(void)
{
    log_init(LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_least_loaded_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_concurrency_queues_until_a_slot_frees, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_refused_connect_retries_elsewhere_and_ejects, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_leaving_the_queue_is_not_dispatched, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_queue_deadline_answers_504, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_replica_refusing_answers_502, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_requests_reuse_the_replica_connection, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tenant_cap_is_skipped_then_released, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

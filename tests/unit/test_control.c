/* control: one-shot control requests (sleep mode's POST /sleep, /wake_up)
 * against a replica the test scripts by hand over loopback TCP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "loopnet.h"
#include "thaw/control.h"

struct outcome {
    int status;
    int calls;
};

static void on_done(struct control *c, int status, void *ud)
{
    struct outcome *o = ud;
    o->status = status;
    o->calls++;
}

/* Runs the loop until the callback came or LOOPNET_WAIT_MS passed. */
static void run_until_done(struct event_base *base, const struct outcome *o)
{
    uint64_t until = loopnet_now_ms() + LOOPNET_WAIT_MS;
    while (o->calls == 0 && loopnet_now_ms() < until) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        loopnet_nap();
    }
}

/* Reads what the client sent until the end of its head. */
static void read_head(struct event_base *base, int fd, char *out, size_t cap)
{
    size_t len = 0;
    uint64_t until = loopnet_now_ms() + LOOPNET_WAIT_MS;
    out[0] = '\0';
    while (!strstr(out, "\r\n\r\n") && loopnet_now_ms() < until) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
        if (n > 0) {
            len += (size_t)n;
            out[len] = '\0';
        } else {
            loopnet_nap();
        }
    }
}

/* A loop, a listener standing in for the replica (its address in addr),
 * and a control on the loop. */
static struct event_base *start(int *lfd, char *addr, size_t len, struct control *c)
{
    struct event_base *base = event_base_new();
    uint16_t port = 0;
    *lfd = loopnet_listen(&port);
    snprintf(addr, len, "127.0.0.1:%u", port);
    control_init(c, base);
    return base;
}

static void test_sends_the_request_and_reports_the_status(void **state)
{
    char addr[32];
    int lfd;
    struct control c;
    struct event_base *base = start(&lfd, addr, sizeof addr, &c);
    struct outcome o = {0};
    assert_int_equal(control_send(&c, addr, "POST", "/sleep?level=2", 1000, on_done, &o), 0);
    assert_true(control_running(&c));
    assert_int_equal(control_send(&c, addr, "POST", "/wake_up", 1000, on_done, &o), -EBUSY);
    for (int i = 0; i < 20; i++) { /* let the connect go out */
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    int fd = loopnet_accept(lfd, NULL);
    assert_true(fd >= 0);
    char head[2048];
    read_head(base, fd, head, sizeof head);
    assert_non_null(strstr(head, "POST /sleep?level=2 HTTP/1.1\r\n"));
    assert_non_null(strstr(head, "Content-Length: 0\r\n"));
    assert_non_null(strstr(head, "Connection: close\r\n"));
    /* vLLM answers 200 with an empty body; sent in two pieces. */
    const char *a = "HTTP/1.1 200 OK\r\nContent-Le";
    const char *b = "ngth: 0\r\n\r\n";
    assert_int_equal(send(fd, a, strlen(a), 0), (ssize_t)strlen(a));
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    assert_int_equal(o.calls, 0);
    assert_int_equal(send(fd, b, strlen(b), 0), (ssize_t)strlen(b));
    run_until_done(base, &o);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.status, 200);
    assert_false(control_running(&c));
    close(fd);

    /* The same struct again: an error status with a body is an answer too. */
    o = (struct outcome){0};
    assert_int_equal(control_send(&c, addr, "POST", "/wake_up", 1000, on_done, &o), 0);
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    fd = loopnet_accept(lfd, NULL);
    assert_true(fd >= 0);
    read_head(base, fd, head, sizeof head);
    assert_non_null(strstr(head, "POST /wake_up HTTP/1.1\r\n"));
    const char *err = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nnope!";
    assert_int_equal(send(fd, err, strlen(err), 0), (ssize_t)strlen(err));
    run_until_done(base, &o);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.status, 500);
    size_t len = 0;
    const char *kept = control_body(&c, &len); /* what GET /is_sleeping reads */
    assert_int_equal(len, 5);
    assert_memory_equal(kept, "nope!", 5);
    close(fd);
    close(lfd);
    event_base_free(base);
}

static void test_timeout_refusal_and_garbage(void **state)
{
    char addr[32];
    int lfd;
    struct control c;
    struct event_base *base = start(&lfd, addr, sizeof addr, &c);

    /* Accepted, never answered. */
    struct outcome o = {0};
    assert_int_equal(control_send(&c, addr, "POST", "/sleep", 100, on_done, &o), 0);
    run_until_done(base, &o);
    assert_int_equal(o.status, -ETIMEDOUT);
    int first = loopnet_accept(lfd, NULL);
    assert_true(first >= 0);
    close(first);

    /* Not HTTP. */
    o = (struct outcome){0};
    assert_int_equal(control_send(&c, addr, "POST", "/sleep", 1000, on_done, &o), 0);
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    int fd = loopnet_accept(lfd, NULL);
    assert_true(fd >= 0);
    const char *junk = "SSH-2.0-OpenSSH\r\n\r\n";
    assert_int_equal(send(fd, junk, strlen(junk), 0), (ssize_t)strlen(junk));
    run_until_done(base, &o);
    assert_int_equal(o.status, -EPROTO);
    close(fd);

    /* Nobody listening. */
    close(lfd);
    o = (struct outcome){0};
    int rc = control_send(&c, addr, "POST", "/sleep", 1000, on_done, &o);
    if (rc == 0) {
        run_until_done(base, &o);
        assert_int_equal(o.calls, 1);
        assert_int_equal(o.status, -ECONNREFUSED);
    } else {
        assert_int_equal(rc, -ECONNREFUSED);
    }

    /* A bad address is refused at once, without a callback. */
    o = (struct outcome){0};
    assert_int_equal(control_send(&c, "not an address", "POST", "/sleep", 1000, on_done, &o),
                     -EINVAL);
    assert_int_equal(o.calls, 0);
    event_base_free(base);
}

/* Answers the request control sends to lfd with `answer` sent in one piece. */
static int answer_with(struct event_base *base, struct control *c, int lfd, const char *addr,
                       const char *answer, size_t len)
{
    struct outcome o = {0};
    assert_int_equal(control_send(c, addr, "POST", "/wake_up", 1000, on_done, &o), 0);
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    int fd = loopnet_accept(lfd, NULL);
    assert_true(fd >= 0);
    char head[2048];
    read_head(base, fd, head, sizeof head);
    size_t off = 0;
    uint64_t until = loopnet_now_ms() + LOOPNET_WAIT_MS;
    while (off < len && o.calls == 0 && loopnet_now_ms() < until) {
        ssize_t n = send(fd, answer + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        off += n > 0 ? (size_t)n : 0;
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    run_until_done(base, &o);
    assert_int_equal(o.calls, 1);
    close(fd);
    return o.status;
}

/* The status is the real answer's: interim ones (103 Early Hints) before it
 * are skipped, and a body of any size is read and dropped. Before, a 103
 * was taken for the answer (a wake_up "failed", its pod deleted), and a
 * body over 64 KiB was an error. */
static void test_interim_answers_and_big_bodies(void **state)
{
    char addr[32];
    int lfd;
    struct control c;
    struct event_base *base = start(&lfd, addr, sizeof addr, &c);
    const char *hinted = "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
                         "HTTP/1.1 100 Continue\r\n\r\n"
                         "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    assert_int_equal(answer_with(base, &c, lfd, addr, hinted, strlen(hinted)), 200);

    size_t body = 200 * 1024;
    char *big = malloc(body + 128);
    assert_non_null(big);
    int h = snprintf(big, 128, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", body);
    memset(big + h, 'x', body);
    assert_int_equal(answer_with(base, &c, lfd, addr, big, (size_t)h + body), 200);
    size_t len = 0;
    control_body(&c, &len);
    assert_int_equal(len, CONTROL_BODY_KEPT);
    free(big);

    /* A server that sends nothing but interim answers gets no further. */
    char many[1024] = "";
    for (int i = 0; i < 12; i++) {
        strcat(many, "HTTP/1.1 103 Early Hints\r\n\r\n");
    }
    assert_int_equal(answer_with(base, &c, lfd, addr, many, strlen(many)), 103);
    close(lfd);
    event_base_free(base);
}

static void test_cancel_calls_nothing(void **state)
{
    char addr[32];
    int lfd;
    struct control c;
    struct event_base *base = start(&lfd, addr, sizeof addr, &c);
    struct outcome o = {0};
    assert_int_equal(control_send(&c, addr, "POST", "/sleep", 50, on_done, &o), 0);
    control_cancel(&c);
    assert_false(control_running(&c));
    uint64_t until = loopnet_now_ms() + 150;
    while (loopnet_now_ms() < until) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        loopnet_nap();
    }
    assert_int_equal(o.calls, 0);
    control_cancel(&c); /* twice is harmless */
    close(lfd);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sends_the_request_and_reports_the_status),
        cmocka_unit_test(test_timeout_refusal_and_garbage),
        cmocka_unit_test(test_interim_answers_and_big_bodies),
        cmocka_unit_test(test_cancel_calls_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

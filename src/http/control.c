#include "thaw/control.h"
#include "thaw/clock.h"
#include "thaw/log.h"
#include "thaw/netaddr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A control answer's head; its body is dropped as it comes. */
static const struct http_limits control_limits = {8192, 64, 0};

static void on_io(evutil_socket_t fd, short what, void *arg);

void control_init(struct control *c, struct event_base *base)
{
    memset(c, 0, sizeof *c);
    c->base = base;
    c->fd = -1;
    event_assign(&c->io, base, -1, 0, on_io, c); /* so event_del is always valid */
    http_head_init(&c->head);
}

bool control_running(const struct control *c)
{
    return c->running;
}

static void close_conn(struct control *c)
{
    if (c->fd >= 0) {
        event_del(&c->io);
        close(c->fd);
        c->fd = -1;
    }
    c->running = false;
    http_head_dispose(&c->head);
}

void control_cancel(struct control *c)
{
    close_conn(c);
}

/* Keeps the first bytes of the body; the rest is dropped as it comes. */
static void keep_body(void *ud, const char *data, size_t len)
{
    struct control *c = ud;
    size_t room = sizeof c->body - c->body_len;
    size_t n = len < room ? len : room;
    memcpy(c->body + c->body_len, data, n);
    c->body_len += n;
}

const char *control_body(const struct control *c, size_t *len)
{
    *len = c->body_len;
    return c->body;
}

static void finish(struct control *c, int status)
{
    close_conn(c);
    c->done(c, status, c->ud);
}

/* Waits for fd to be ready for `what`, within what is left of the timeout. */
static void wait_for(struct control *c, short what)
{
    uint64_t now = clock_now_ms();
    uint64_t left = c->deadline_ms > now ? c->deadline_ms - now : 0;
    event_del(&c->io);
    event_assign(&c->io, c->base, c->fd, what | EV_PERSIST, on_io, c);
    struct timeval tv = clock_timeval(left);
    event_add(&c->io, &tv);
}

int control_send(struct control *c, const char *addr, const char *method, const char *path,
                 uint64_t timeout_ms, control_done_cb done, void *ud)
{
    if (c->running) {
        return -EBUSY;
    }
    if (netaddr_parse(addr, &c->addr, &c->addrlen) || strlen(addr) >= sizeof c->host) {
        return -EINVAL;
    }
    snprintf(c->host, sizeof c->host, "%s", addr);
    int n = snprintf(c->request, sizeof c->request,
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: thaw\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n",
                     method, path, c->host);
    if (n < 0 || (size_t)n >= sizeof c->request) {
        return -EINVAL;
    }
    c->request_len = (size_t)n;
    int s = socket(c->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        /* thaw's own limit (descriptors, memory), which its owner may only
         * retry: said here, once a second at most, for every kind of call. */
        int err = errno;
        uint64_t held;
        if (log_limit_pass(&c->fd_log, clock_now_ms(), LOG_LIMIT_MS, &held)) {
            LOGW("no socket for a replica control request", "endpoint=%s method=%s path=%s "
                 "error=\"%s\" suppressed=%llu", c->host, method, path, strerror(err),
                 (unsigned long long)held);
        }
        return -err;
    }
    if (connect(s, (struct sockaddr *)&c->addr, c->addrlen) < 0 && errno != EINPROGRESS) {
        int err = errno;
        close(s);
        return -err;
    }
    c->fd = s;
    c->sent = false;
    c->interim = 0;
    c->body_len = 0;
    c->running = true;
    c->done = done;
    c->ud = ud;
    c->deadline_ms = clock_now_ms() + timeout_ms;
    http_head_init(&c->head);
    http_parser_init(&c->parser, HTTP_RESPONSE, &control_limits);
    http_parser_next(&c->parser, &c->head, NULL);
    c->parser.on_body = keep_body; /* the body is not stored whole */
    c->parser.ud = c;
    wait_for(c, EV_WRITE);
    return 0;
}

static void send_request(struct control *c)
{
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        finish(c, -err);
        return;
    }
    /* The request is a few hundred bytes: one send on a fresh socket. */
    ssize_t n = send(c->fd, c->request, c->request_len, MSG_NOSIGNAL);
    if (n != (ssize_t)c->request_len) {
        finish(c, n < 0 ? -errno : -EIO);
        return;
    }
    c->sent = true;
    wait_for(c, EV_READ);
}

static void read_answer(struct control *c)
{
    char data[2048];
    ssize_t n = recv(c->fd, data, sizeof data, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    if (n <= 0) {
        /* Closed before the head: no answer. After it, a close-delimited
         * body ended; the status stands. */
        finish(c, c->head.status ? c->head.status : (n < 0 ? -errno : -EPROTO));
        return;
    }
    size_t used = 0;
    enum http_event ev = http_answer_feed(&c->parser, &c->interim, data, (size_t)n, &used);
    if (ev == HTTP_EV_ERROR) {
        finish(c, -EPROTO);
    } else if (ev == HTTP_EV_DONE) {
        finish(c, c->head.status);
    }
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    struct control *c = arg;
    if (what & EV_TIMEOUT) {
        finish(c, -ETIMEDOUT);
        return;
    }
    if (!c->sent) {
        send_request(c);
    } else {
        read_answer(c);
    }
}

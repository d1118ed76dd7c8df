#include "thaw/probe.h"
#include "thaw/clock.h"
#include "thaw/log.h"
#include "thaw/netaddr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PROBE_TIMEOUT_MS 1000
/* A health answer's head; its body, whatever its size, is dropped as it comes. */
static const struct http_limits probe_limits = {4096, 32, 0};

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void on_io(evutil_socket_t fd, short what, void *arg);

int probe_init(struct probe *p, struct event_base *base, const char *addr, const char *path,
               probe_ready_cb ready, void *ud)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->kept_fd = -1;
    if (netaddr_parse(addr, &p->addr, &p->addrlen)) {
        return -EINVAL;
    }
    p->base = base;
    snprintf(p->host, sizeof p->host, "%s", addr);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->ready = ready;
    p->ud = ud;
    http_head_init(&p->head);
    event_assign(&p->timer, base, -1, 0, on_timer, p);
    return 0;
}

static void close_fd(struct probe *p)
{
    if (p->fd >= 0) {
        event_del(&p->io);
        close(p->fd);
        p->fd = -1;
    }
}

static void arm(struct probe *p, uint32_t ms)
{
    struct timeval tv = clock_timeval(ms);
    event_add(&p->timer, &tv);
}

static void again(struct probe *p)
{
    close_fd(p);
    if (p->running) {
        uint64_t elapsed = clock_now_ms() - p->started_ms;
        arm(p, probe_next_delay_ms(p->attempt++, p->refused, elapsed, p->expected_ms));
    }
}

void probe_start(struct probe *p, uint64_t expected_ms)
{
    p->running = true;
    p->attempt = 0;
    p->refused = true;
    p->started_ms = clock_now_ms();
    p->listening_ms = 0;
    p->expected_ms = expected_ms;
    arm(p, 0);
}

void probe_stop(struct probe *p)
{
    p->running = false;
    close_fd(p);
    if (p->kept_fd >= 0) {
        close(p->kept_fd);
        p->kept_fd = -1;
    }
    event_del(&p->timer);
    http_head_dispose(&p->head);
}

int probe_take_conn(struct probe *p)
{
    int fd = p->kept_fd;
    p->kept_fd = -1;
    return fd;
}

static void send_get(struct probe *p, int fd)
{
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: thaw-probe\r\n\r\n", p->path,
                     p->host);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        again(p);
        return;
    }
    p->sent = true;
    p->http_probes++;
    http_parser_init(&p->parser, HTTP_RESPONSE, &probe_limits);
    http_parser_next(&p->parser, &p->head, NULL); /* the body is dropped */
    event_del(&p->io);
    event_assign(&p->io, p->base, fd, EV_READ | EV_PERSIST, on_io, p);
    struct timeval tv = clock_timeval(PROBE_TIMEOUT_MS);
    event_add(&p->io, &tv);
}

/* The replica answered 2xx. Its connection is kept for the owner when the
 * answer ended cleanly and the server did not say it closes. */
static void succeeded(struct probe *p, bool reusable)
{
    int fd = p->fd;
    if (reusable) {
        event_del(&p->io);
        p->fd = -1;
    }
    probe_stop(p);
    p->kept_fd = reusable ? fd : -1;
    p->ready(p, p->ud);
    if (p->kept_fd >= 0) {
        close(p->kept_fd); /* not taken */
        p->kept_fd = -1;
    }
}

/* A whole answer: 2xx is ready; anything else (503 while loading) is not yet. */
static void answered(struct probe *p, bool reusable)
{
    if (p->head.status >= 200 && p->head.status < 300) {
        succeeded(p, reusable);
    } else {
        again(p);
    }
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    struct probe *p = arg;
    if (what & EV_TIMEOUT) {
        again(p);
        return;
    }
    if (!p->sent) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || netaddr_self_connected(fd)) {
            p->refused = true; /* not listening yet */
            again(p);
            return;
        }
        p->refused = false;
        if (!p->listening_ms) {
            p->listening_ms = clock_now_ms();
            if (p->listening) {
                p->listening(p, p->ud);
            }
        }
        send_get(p, fd);
        return;
    }
    char data[1024];
    ssize_t n = recv(fd, data, sizeof data, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    if (n == 0 && http_parser_finish(&p->parser) == HTTP_EV_DONE) {
        /* An answer with no length (HTTP/1.0 servers, Python's http.server)
         * ends with the close. */
        answered(p, false);
        return;
    }
    if (n <= 0) {
        again(p); /* closed or reset before a whole answer */
        return;
    }
    size_t used = 0;
    enum http_event ev = http_answer_feed(&p->parser, &p->interim, data, (size_t)n, &used);
    if (ev == HTTP_EV_NEED_MORE) {
        return;
    }
    if (ev != HTTP_EV_DONE) {
        again(p);
        return;
    }
    /* Bytes past the answer would belong to no request: not reusable. */
    answered(p, p->head.keep_alive && used == (size_t)n);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct probe *p = arg;
    if (!p->running) {
        return;
    }
    int s = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        /* thaw's own limit (descriptors, memory): the replica is not seen
         * ready while it lasts, so it is said, once a second at most. */
        int err = errno;
        uint64_t held;
        if (log_limit_pass(&p->fd_log, clock_now_ms(), LOG_LIMIT_MS, &held)) {
            LOGW("no socket for a readiness probe", "replica=%s endpoint=%s error=\"%s\" "
                 "suppressed=%llu", p->replica ? p->replica : "-", p->host, strerror(err),
                 (unsigned long long)held);
        }
        again(p);
        return;
    }
    p->fd = s;
    p->sent = false;
    p->interim = 0;
    http_head_reset(&p->head);
    p->probes++;
    int rc = connect(s, (struct sockaddr *)&p->addr, p->addrlen);
    if (rc < 0 && errno != EINPROGRESS) {
        p->refused = errno == ECONNREFUSED;
        again(p);
        return;
    }
    event_assign(&p->io, p->base, s, EV_WRITE, on_io, p);
    struct timeval tv = clock_timeval(PROBE_TIMEOUT_MS);
    event_add(&p->io, &tv);
}

static uint32_t doubling(unsigned attempt, uint32_t first, uint32_t cap)
{
    uint32_t d = first;
    for (unsigned i = 0; i < attempt && d < cap; i++) {
        d *= 2;
    }
    return d > cap ? cap : d;
}

uint32_t probe_delay_ms(unsigned attempt)
{
    return doubling(attempt, 2, 20);
}

uint32_t probe_next_delay_ms(unsigned attempt, bool refused, uint64_t elapsed_ms,
                             uint64_t expected_ms)
{
    if (expected_ms && elapsed_ms * 5 < expected_ms * 4) {
        uint64_t step = (expected_ms - elapsed_ms) / 8;
        if (step > 250) {
            step = 250;
        }
        if (step > 20) {
            return (uint32_t)step;
        }
    }
    return refused ? doubling(attempt, 1, 4) : probe_delay_ms(attempt);
}

#include "thaw/probe.h"
#include "thaw/clock.h"
#include "thaw/netaddr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PROBE_TIMEOUT_MS 1000

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void on_io(evutil_socket_t fd, short what, void *arg);

int probe_init(struct probe *p, struct event_base *base, const char *addr, const char *path,
               probe_ready_cb ready, void *ud)
{
    memset(p, 0, sizeof *p);
    if (netaddr_parse(addr, &p->addr, &p->addrlen)) {
        return -EINVAL;
    }
    p->base = base;
    p->fd = -1;
    snprintf(p->host, sizeof p->host, "%s", addr);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->ready = ready;
    p->ud = ud;
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
        arm(p, probe_delay_ms(p->attempt++));
    }
}

void probe_start(struct probe *p)
{
    p->running = true;
    p->attempt = 0;
    arm(p, 0);
}

void probe_stop(struct probe *p)
{
    p->running = false;
    close_fd(p);
    event_del(&p->timer);
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
        if (err) {
            again(p); /* not listening yet */
            return;
        }
        char req[512];
        int n = snprintf(req, sizeof req,
                         "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: thaw-probe\r\n"
                         "Connection: close\r\n\r\n",
                         p->path, p->host);
        if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
            again(p);
            return;
        }
        p->sent = true;
        event_del(&p->io);
        event_assign(&p->io, p->base, fd, EV_READ | EV_PERSIST, on_io, p);
        struct timeval tv = clock_timeval(PROBE_TIMEOUT_MS);
        event_add(&p->io, &tv);
        return;
    }
    ssize_t n = recv(fd, p->buf + p->len, sizeof p->buf - 1 - p->len, 0);
    if (n > 0) {
        p->len += (size_t)n;
        p->buf[p->len] = '\0';
        if (p->len < 12 && !memchr(p->buf, '\n', p->len)) {
            return; /* status line not complete */
        }
        int status = 0;
        if (sscanf(p->buf, "HTTP/1.%*d %d", &status) == 1 && status >= 200 && status < 300) {
            probe_stop(p);
            p->ready(p, p->ud);
            return;
        }
        again(p); /* 503 while loading, or anything else */
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    again(p);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct probe *p = arg;
    if (!p->running) {
        return;
    }
    int s = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        again(p);
        return;
    }
    p->fd = s;
    p->sent = false;
    p->len = 0;
    p->probes++;
    int rc = connect(s, (struct sockaddr *)&p->addr, p->addrlen);
    if (rc < 0 && errno != EINPROGRESS) {
        again(p);
        return;
    }
    event_assign(&p->io, p->base, s, EV_WRITE, on_io, p);
    struct timeval tv = clock_timeval(PROBE_TIMEOUT_MS);
    event_add(&p->io, &tv);
}

uint32_t probe_delay_ms(unsigned attempt)
{
    uint32_t d = 2;
    for (unsigned i = 0; i < attempt && d < 20; i++) {
        d *= 2;
    }
    return d > 20 ? 20 : d;
}

/* Helpers for unit tests that drive a real libevent loop over loopback TCP:
 * a listener, a connected pair, and a client end the test reads by hand.
 * Header-only (static functions): each test links only its own layer. */
#ifndef THAW_TEST_LOOPNET_H
#define THAW_TEST_LOOPNET_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "thaw/buf.h"

/* Every wait in these tests gives up after this long (a failing test must
 * not hang the suite). */
#define LOOPNET_WAIT_MS 3000

static inline uint64_t loopnet_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void loopnet_nap(void)
{
    struct timespec ts = {0, 500 * 1000};
    nanosleep(&ts, NULL);
}

/* A non-blocking listening socket on 127.0.0.1 at an ephemeral port;
 * *port gets it. */
static inline int loopnet_listen(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* Accepts one connection (waiting up to LOOPNET_WAIT_MS); non-blocking. */
static inline int loopnet_accept(int lfd, struct sockaddr_in *peer)
{
    struct sockaddr_in tmp;
    socklen_t len = sizeof tmp;
    uint64_t until = loopnet_now_ms() + LOOPNET_WAIT_MS;
    for (;;) {
        int fd = accept4(lfd, (struct sockaddr *)&tmp, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            if (peer) {
                *peer = tmp;
            }
            return fd;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return -1;
        }
        if (loopnet_now_ms() > until) {
            return -1;
        }
        loopnet_nap();
    }
}

/* A non-blocking client connected to 127.0.0.1:port. rcvbuf > 0 sets its
 * receive buffer first (a slow reader with a small window). */
static inline int loopnet_connect(uint16_t port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if (rcvbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    }
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Sends all of data on a non-blocking socket, waiting (without running the
 * loop) while the socket is full: for payloads the kernel buffers take. */
static inline bool loopnet_send(int fd, const void *data, size_t len)
{
    const char *p = data;
    uint64_t until = loopnet_now_ms() + LOOPNET_WAIT_MS;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR) && loopnet_now_ms() < until) {
            loopnet_nap();
        } else {
            return false;
        }
    }
    return true;
}

static inline bool loopnet_send_str(int fd, const char *s)
{
    return loopnet_send(fd, s, strlen(s));
}

/* One end the test reads by hand: what arrived, whether it ended and how. */
struct loopnet_peer {
    int fd;
    struct buf got;
    bool eof;
    int err;     /* errno of a failed read (ECONNRESET: a reset) */
    size_t step; /* read at most this much per pump; 0: all there is */
    bool paused; /* do not read at all */
};

static inline void loopnet_peer_init(struct loopnet_peer *p, int fd)
{
    memset(p, 0, sizeof *p);
    p->fd = fd;
    buf_init(&p->got);
}

static inline void loopnet_peer_dispose(struct loopnet_peer *p)
{
    if (p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
    }
    buf_dispose(&p->got);
}

/* Reads what is there (within step) without blocking. */
static inline void loopnet_pump(struct loopnet_peer *p)
{
    if (p->fd < 0 || p->eof || p->err || p->paused) {
        return;
    }
    char tmp[65536];
    size_t want = p->step && p->step < sizeof tmp ? p->step : sizeof tmp;
    for (;;) {
        ssize_t n = recv(p->fd, tmp, want, MSG_DONTWAIT);
        if (n > 0) {
            buf_append(&p->got, tmp, (size_t)n);
            if (p->step) {
                return;
            }
            continue;
        }
        if (n == 0) {
            p->eof = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            p->err = errno;
        }
        return;
    }
}

/* True when got holds the NUL-free text s. */
static inline bool loopnet_has(const struct loopnet_peer *p, const char *s)
{
    return p->got.len && memmem(p->got.data, p->got.len, s, strlen(s)) != NULL;
}

/* Times `needle` occurs in what arrived. */
static inline int loopnet_count(const struct loopnet_peer *p, const char *needle)
{
    int n = 0;
    size_t nl = strlen(needle);
    const char *at = p->got.data, *end = p->got.data + p->got.len;
    while (at && at < end) {
        at = memmem(at, (size_t)(end - at), needle, nl);
        if (at) {
            n++;
            at += nl;
        }
    }
    return n;
}

/* Runs the loop without blocking, pumping the peers given, until cond holds
 * or LOOPNET_WAIT_MS passes. Evaluates to cond's final value. */
#define LOOPNET_RUN_UNTIL(base, peers, npeers, cond)                                               \
    __extension__({                                                                                \
        uint64_t until_ = loopnet_now_ms() + LOOPNET_WAIT_MS;                                      \
        bool ok_;                                                                                  \
        for (;;) {                                                                                 \
            event_base_loop((base), EVLOOP_NONBLOCK);                                              \
            for (int i_ = 0; i_ < (npeers); i_++) {                                                \
                loopnet_pump((peers)[i_]);                                                         \
            }                                                                                      \
            if ((ok_ = (cond)) || loopnet_now_ms() > until_) {                                     \
                break;                                                                             \
            }                                                                                      \
            loopnet_nap();                                                                         \
        }                                                                                          \
        ok_;                                                                                       \
    })

/* Runs the loop for about ms milliseconds (to see that nothing happens). */
#define LOOPNET_RUN_FOR(base, peers, npeers, ms)                                                   \
    do {                                                                                           \
        uint64_t until_ = loopnet_now_ms() + (ms);                                                 \
        while (loopnet_now_ms() < until_) {                                                        \
            event_base_loop((base), EVLOOP_NONBLOCK);                                              \
            for (int i_ = 0; i_ < (npeers); i_++) {                                                \
                loopnet_pump((peers)[i_]);                                                         \
            }                                                                                      \
            loopnet_nap();                                                                         \
        }                                                                                          \
    } while (0)

#endif

/* thaw-coldstart-client: N concurrent requests, each on its own connection,
 * timing each one's first response byte on CLOCK_MONOTONIC (the clock
 * thaw-model-sim --ready-file writes), in one epoll loop so the client adds
 * no per-connection delay of its own.
 *
 *   thaw-coldstart-client HOST PORT CLIENTS PATH BODY TIMEOUT_MS
 *
 * Prints one line per client: "<first byte ns> <status> <bytes>"; a client
 * that got no response prints "0 0 0". Exit 0 when it ran (not on results). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct client {
    int fd;
    size_t sent;
    long long first_ns;
    int status;
    size_t bytes;
    char head[16];
    size_t head_len;
    int done;
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s HOST PORT CLIENTS PATH BODY TIMEOUT_MS\n", argv[0]);
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);
    int n = atoi(argv[3]);
    const char *path = argv[4];
    const char *body = argv[5];
    long long timeout_ns = atoll(argv[6]) * 1000000LL;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    char req[4096];
    int reqlen = snprintf(req, sizeof req,
                          "POST %s HTTP/1.1\r\nHost: thaw\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                          path, strlen(body), body);
    struct client *cs = calloc((size_t)n, sizeof *cs);
    int ep = epoll_create1(0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sin.sin_addr);
    int open_count = 0;
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            cs[i].fd = -1;
            cs[i].done = 1;
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        connect(fd, (struct sockaddr *)&sin, sizeof sin);
        cs[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        open_count++;
    }
    long long deadline = now_ns() + timeout_ns;
    int left = open_count;
    struct epoll_event evs[512];
    char buf[65536];
    while (left > 0 && now_ns() < deadline) {
        int k = epoll_wait(ep, evs, 512, 100);
        long long t = now_ns();
        for (int e = 0; e < k; e++) {
            struct client *c = &cs[evs[e].data.u32];
            if (c->done) {
                continue;
            }
            if ((evs[e].events & EPOLLOUT) && c->sent < (size_t)reqlen) {
                ssize_t w = send(c->fd, req + c->sent, (size_t)reqlen - c->sent, MSG_NOSIGNAL);
                if (w > 0) {
                    c->sent += (size_t)w;
                }
                if (c->sent == (size_t)reqlen) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = evs[e].data.u32};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                for (;;) {
                    ssize_t r = recv(c->fd, buf, sizeof buf, 0);
                    if (r > 0) {
                        if (!c->first_ns) {
                            c->first_ns = t;
                        }
                        if (c->head_len < sizeof c->head - 1) {
                            size_t take = sizeof c->head - 1 - c->head_len;
                            take = take < (size_t)r ? take : (size_t)r;
                            memcpy(c->head + c->head_len, buf, take);
                            c->head_len += take;
                        }
                        c->bytes += (size_t)r;
                        continue;
                    }
                    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
                        break;
                    }
                    /* EOF (Connection: close) or reset: done. */
                    c->head[c->head_len] = '\0';
                    sscanf(c->head, "HTTP/1.%*d %d", &c->status);
                    c->done = 1;
                    close(c->fd);
                    left--;
                    break;
                }
            }
        }
    }
    for (int i = 0; i < n; i++) {
        printf("%lld %d %zu\n", cs[i].done ? cs[i].first_ns : 0, cs[i].status, cs[i].bytes);
    }
    return 0;
}

/* thaw-sse-upstream: an SSE model server for the streaming benchmark
 * (loadtest/sse_bench.py). One thread, epoll (level-triggered), non-blocking
 * sockets, HTTP/1.1 keep-alive.
 *
 *   thaw-sse-upstream [PORT]        (0 or nothing: an ephemeral port)
 *
 * Prints "listening <port>" on stdout once it accepts connections.
 *
 *   POST /v1/chat/completions?events=E&rate=R   (any body, Content-Length)
 *     200 text/event-stream, chunked: E events of about 100 bytes, one chunk
 *     each, `data: {...}\n\n`, R per second (0: as fast as the socket takes
 *     them), then `data: [DONE]\n\n` and the last chunk. Each event carries
 *     "t": its send time on CLOCK_MONOTONIC in ns, so a client on the same
 *     machine measures its delivery delay. The first event of a paced
 *     stream goes out at a random point of the first interval, so that many
 *     streams opened at once do not tick in step.
 *   GET /small, /health, /v1/models: a 70-byte JSON 200.
 *   anything else: 404. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IN_CAP 16384
#define OUT_CAP (256 * 1024)  /* a paced stream whose client stalls stops here */
#define BULK_FILL (32 * 1024) /* bytes of events queued per write for a bulk stream */
#define DEFAULT_EVENTS 16
#define DEFAULT_RATE 50

static const char SMALL_BODY[] =
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"ok\"}]}";

enum state { READ_HEAD, READ_BODY, STREAMING };

struct conn {
    int fd;
    enum state state;
    unsigned mask; /* epoll events currently registered */
    int close_after;
    char in[IN_CAP];
    size_t in_len;
    long long body_left;
    char *out;
    size_t out_len, out_off, out_cap;
    /* the stream being sent */
    long events_left;
    long seq;
    long long interval_ns; /* 0: bulk */
    long long next_ns;
    int heap_idx; /* -1: not scheduled */
};

static int ep;
static struct conn **heap; /* paced streams, earliest next_ns first */
static int heap_len, heap_cap;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void heap_swap(int a, int b)
{
    struct conn *t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
    heap[a]->heap_idx = a;
    heap[b]->heap_idx = b;
}

static void heap_up(int i)
{
    while (i > 0 && heap[(i - 1) / 2]->next_ns > heap[i]->next_ns) {
        heap_swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_len && heap[l]->next_ns < heap[m]->next_ns)
            m = l;
        if (r < heap_len && heap[r]->next_ns < heap[m]->next_ns)
            m = r;
        if (m == i)
            return;
        heap_swap(i, m);
        i = m;
    }
}

static void heap_push(struct conn *c)
{
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, (size_t)heap_cap * sizeof *heap);
        if (!heap) {
            perror("realloc");
            exit(1);
        }
    }
    c->heap_idx = heap_len;
    heap[heap_len++] = c;
    heap_up(c->heap_idx);
}

static void heap_remove(struct conn *c)
{
    int i = c->heap_idx;
    if (i < 0)
        return;
    heap_len--;
    if (i != heap_len) {
        heap[i] = heap[heap_len];
        heap[i]->heap_idx = i;
        heap_down(i);
        heap_up(i);
    }
    c->heap_idx = -1;
}

static void set_mask(struct conn *c, unsigned mask)
{
    if (c->mask == mask)
        return;
    struct epoll_event ev = {.events = mask, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->mask = mask;
}

static void conn_close(struct conn *c)
{
    heap_remove(c);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Appends n bytes to the output; 0 when they do not fit under OUT_CAP. */
static int out_append(struct conn *c, const char *p, size_t n)
{
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n > c->out_cap) {
        if (c->out_off > 0) {
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        if (cap > OUT_CAP)
            return 0;
        if (cap != c->out_cap) {
            char *o = realloc(c->out, cap);
            if (!o)
                return 0;
            c->out = o;
            c->out_cap = cap;
        }
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 1;
}

/* Writes what is pending; -1 when the connection failed. */
static int flush_out(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

/* One event as one chunk: "<hex>\r\ndata: {...}\n\n\r\n". */
static int append_event(struct conn *c)
{
    char data[256], chunk[300];
    int dl = snprintf(data, sizeof data,
                      "data: {\"object\":\"chat.completion.chunk\",\"seq\":%ld,"
                      "\"t\":%lld,\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n",
                      c->seq, now_ns());
    int cl = snprintf(chunk, sizeof chunk, "%x\r\n%s\r\n", dl, data);
    if (!out_append(c, chunk, (size_t)cl))
        return 0;
    c->seq++;
    c->events_left--;
    return 1;
}

static const char DONE_TAIL[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

static void process_input(struct conn *c);

/* Pending output decides whether EPOLLOUT is wanted; a bulk stream always wants it. */
static void update_mask(struct conn *c)
{
    unsigned m = EPOLLIN | EPOLLRDHUP;
    if (c->out_off < c->out_len || (c->state == STREAMING && c->interval_ns == 0))
        m |= EPOLLOUT;
    set_mask(c, m);
}

/* The stream's last events went out (or were queued): the end, then the next request. */
static int finish_stream(struct conn *c)
{
    if (!out_append(c, DONE_TAIL, sizeof DONE_TAIL - 1))
        return -1;
    heap_remove(c);
    c->state = READ_HEAD;
    if (flush_out(c) < 0)
        return -1;
    if (c->close_after && c->out_off == c->out_len)
        return -1;
    process_input(c);
    return 0;
}

static int bulk_write(struct conn *c)
{
    /* bounded work per wake-up so other connections get their turn */
    for (int round = 0; round < 8 && c->events_left > 0; round++) {
        while (c->events_left > 0 && c->out_len - c->out_off < BULK_FILL)
            if (!append_event(c))
                break;
        if (flush_out(c) < 0)
            return -1;
        if (c->out_off < c->out_len)
            return 0;
    }
    if (c->events_left == 0)
        return finish_stream(c);
    return 0;
}

static long query_long(const char *target, const char *key, long def)
{
    const char *q = strchr(target, '?');
    size_t kl = strlen(key);
    while (q) {
        q++;
        if (strncmp(q, key, kl) == 0 && q[kl] == '=')
            return strtol(q + kl + 1, NULL, 10);
        q = strchr(q, '&');
    }
    return def;
}

static void start_stream(struct conn *c, const char *target)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    long events = query_long(target, "events", DEFAULT_EVENTS);
    long rate = query_long(target, "rate", DEFAULT_RATE);
    c->events_left = events < 0 ? 0 : events;
    c->seq = 0;
    c->interval_ns = rate > 0 ? 1000000000LL / rate : 0;
    c->state = STREAMING;
    out_append(c, head, sizeof head - 1);
    if (c->events_left == 0) {
        out_append(c, DONE_TAIL, sizeof DONE_TAIL - 1);
        c->state = READ_HEAD;
    } else if (c->interval_ns > 0) {
        c->next_ns = now_ns() + (long long)(random() % c->interval_ns);
        heap_push(c);
    }
}

static void reply_small(struct conn *c, int status)
{
    char resp[512];
    int n = status == 200
                ? snprintf(resp, sizeof resp,
                           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\n\r\n%s",
                           sizeof SMALL_BODY - 1, SMALL_BODY)
                : snprintf(resp, sizeof resp,
                           "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                           "Content-Length: 32\r\n\r\n{\"error\":{\"message\":\"not found\"}}");
    out_append(c, resp, (size_t)n);
}

static int header_is(const char *line, const char *name, const char **value)
{
    size_t n = strlen(name);
    if (strncasecmp(line, name, n) != 0 || line[n] != ':')
        return 0;
    *value = line + n + 1;
    while (**value == ' ' || **value == '\t')
        (*value)++;
    return 1;
}

/* Parses one request head from c->in; 1 when one was handled, 0 when more
 * bytes are needed, -1 on a request it cannot serve (the connection closes). */
static int handle_head(struct conn *c)
{
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end)
        return c->in_len == IN_CAP ? -1 : 0;
    size_t head_len = (size_t)(end - c->in) + 4;
    *end = '\0';
    char method[16], target[2048], version[16];
    if (sscanf(c->in, "%15s %2047s %15s", method, target, version) != 3)
        return -1;
    c->close_after = strcmp(version, "HTTP/1.1") != 0;
    c->body_left = 0;
    for (char *line = strstr(c->in, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        const char *v;
        if (header_is(line, "Content-Length", &v))
            c->body_left = strtoll(v, NULL, 10);
        else if (header_is(line, "Transfer-Encoding", &v))
            return -1; /* a chunked request body: not needed here */
        else if (header_is(line, "Connection", &v) && strncasecmp(v, "close", 5) == 0)
            c->close_after = 1;
    }
    memmove(c->in, c->in + head_len, c->in_len - head_len);
    c->in_len -= head_len;
    size_t skip = c->body_left < (long long)c->in_len ? (size_t)c->body_left : c->in_len;
    memmove(c->in, c->in + skip, c->in_len - skip);
    c->in_len -= skip;
    c->body_left -= (long long)skip;
    char *q = strchr(target, '?');
    size_t plen = q ? (size_t)(q - target) : strlen(target);
    if (strcmp(method, "POST") == 0 && plen == 20 &&
        strncmp(target, "/v1/chat/completions", 20) == 0) {
        start_stream(c, target);
    } else if (strcmp(method, "GET") == 0 &&
               (strcmp(target, "/small") == 0 || strcmp(target, "/health") == 0 ||
                strcmp(target, "/v1/models") == 0)) {
        reply_small(c, 200);
    } else {
        reply_small(c, 404);
    }
    if (c->body_left > 0 && c->state != STREAMING)
        c->state = READ_BODY;
    return 1;
}

/* Handles every complete request in the input while no stream is running. */
static void process_input(struct conn *c)
{
    while (c->state == READ_HEAD && c->in_len > 0) {
        int r = handle_head(c);
        if (r <= 0) {
            if (r < 0)
                c->close_after = 1, c->in_len = 0;
            break;
        }
    }
}

static void on_readable(struct conn *c, int *dead)
{
    for (;;) {
        if (c->in_len == IN_CAP) {
            *dead = 1; /* a client that pipelines this much is not ours */
            return;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, IN_CAP - c->in_len, 0);
        if (r == 0) {
            *dead = 1;
            return;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                *dead = 1;
            return;
        }
        c->in_len += (size_t)r;
        /* a body still arriving (the stream may already run) is discarded */
        if (c->body_left > 0) {
            size_t skip = c->body_left < (long long)c->in_len ? (size_t)c->body_left : c->in_len;
            memmove(c->in, c->in + skip, c->in_len - skip);
            c->in_len -= skip;
            c->body_left -= (long long)skip;
            if (c->body_left == 0 && c->state == READ_BODY)
                c->state = READ_HEAD;
        }
        process_input(c);
    }
}

static void accept_all(int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->heap_idx = -1;
        c->mask = EPOLLIN | EPOLLRDHUP;
        struct epoll_event ev = {.events = c->mask, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

/* Sends every paced event that is due; returns the epoll timeout (ms) to the next. */
static int send_due_events(void)
{
    long long now = now_ns();
    while (heap_len > 0 && heap[0]->next_ns <= now) {
        struct conn *c = heap[0];
        int dead = 0;
        if (!append_event(c)) {
            /* the client stopped reading: try again later, the event is late */
            c->next_ns = now + c->interval_ns;
            heap_down(0);
            continue;
        }
        if (c->events_left == 0) {
            dead = finish_stream(c) < 0;
        } else {
            c->next_ns += c->interval_ns;
            heap_down(0);
            dead = flush_out(c) < 0;
        }
        if (dead)
            conn_close(c);
        else
            update_mask(c);
    }
    if (heap_len == 0)
        return -1;
    long long wait = heap[0]->next_ns - now_ns();
    return wait <= 0 ? 0 : (int)((wait + 999999) / 1000000);
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0;
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    srandom(1);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (bind(lfd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(lfd, 4096) < 0) {
        perror("bind/listen");
        return 1;
    }
    socklen_t sl = sizeof sin;
    getsockname(lfd, (struct sockaddr *)&sin, &sl);
    printf("listening %d\n", ntohs(sin.sin_port));
    fflush(stdout);
    ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    struct epoll_event evs[512];
    int timeout = -1;
    for (;;) {
        int n = epoll_wait(ep, evs, 512, timeout);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                accept_all(lfd);
                continue;
            }
            int dead = (evs[i].events & (EPOLLERR | EPOLLHUP)) != 0;
            if (!dead && (evs[i].events & (EPOLLIN | EPOLLRDHUP)))
                on_readable(c, &dead);
            if (!dead && c->out_off < c->out_len)
                dead = flush_out(c) < 0;
            if (!dead && c->state == STREAMING && c->interval_ns == 0 &&
                c->out_off == c->out_len)
                dead = bulk_write(c) < 0;
            if (!dead && c->close_after && c->state == READ_HEAD && c->out_off == c->out_len)
                dead = 1;
            if (dead)
                conn_close(c);
            else
                update_mask(c);
        }
        timeout = send_due_events();
    }
}

/* thaw-sse-client: the streaming benchmark's client (loadtest/sse_bench.py),
 * one thread, epoll.
 *
 *   thaw-sse-client stream HOST PORT HOSTHDR STREAMS EVENTS RATE REQUESTS TIMEOUT_S
 *     STREAMS keep-alive connections, each sending REQUESTS streaming requests
 *     one after the other (POST /v1/chat/completions?events=EVENTS&rate=RATE),
 *     decoding the chunked SSE answer and, for every event, recording its
 *     delivery delay: receive time - the send time ("t", CLOCK_MONOTONIC ns)
 *     that thaw-sse-upstream put in it. Connections are opened with at most
 *     256 waiting for their response head, so the accept queues stay short.
 *   thaw-sse-client short HOST PORT HOSTHDR CONNECTIONS SECONDS
 *     CONNECTIONS keep-alive connections sending GET /small back to back for
 *     SECONDS; latency per request.
 *
 * Prints one JSON line: events (or requests), errors, p50/p99/p999/max in µs,
 * elapsed seconds. Exit 0 when it ran (whatever the results). */
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

#define BUF_CAP_MANY 8192     /* per connection when there are many */
#define BUF_CAP_ONE (256 * 1024) /* a single (bulk) stream reads in larger pieces */
#define EVENT_CAP 1024
#define MAX_PENDING_HEADS 256

/* Histogram of µs: 1 µs steps below 10 ms, then 100 µs steps up to 10 s. */
#define FINE_US 10000
#define COARSE_STEP 100
#define COARSE_BUCKETS ((10000000 - FINE_US) / COARSE_STEP)
static unsigned long long hist[FINE_US + COARSE_BUCKETS + 1];
static unsigned long long hist_n;
static long long hist_max;

static void hist_add(long long us)
{
    if (us < 0)
        us = 0;
    if (us > hist_max)
        hist_max = us;
    size_t i = us < FINE_US ? (size_t)us : FINE_US + (size_t)((us - FINE_US) / COARSE_STEP);
    if (i > FINE_US + COARSE_BUCKETS)
        i = FINE_US + COARSE_BUCKETS;
    hist[i]++;
    hist_n++;
}

static double hist_pct(double p)
{
    if (hist_n == 0)
        return -1;
    unsigned long long want = (unsigned long long)(p / 100.0 * (double)hist_n);
    if (want >= hist_n)
        want = hist_n - 1;
    unsigned long long seen = 0;
    for (size_t i = 0; i <= FINE_US + COARSE_BUCKETS; i++) {
        seen += hist[i];
        if (seen > want)
            return i < FINE_US ? (double)i : (double)(FINE_US + (i - FINE_US) * COARSE_STEP);
    }
    return (double)hist_max;
}

enum phase { IDLE, CONNECTING, SENDING, HEAD, BODY, FINISHED };
enum chunk_state { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };

struct stream {
    int fd;
    enum phase phase;
    int requests_left;
    size_t sent;
    long long started_ns;
    char *buf;
    size_t len;
    /* response body: chunked (SSE) or Content-Length (short requests) */
    int chunked;
    long long content_left;
    enum chunk_state cs;
    long long chunk_left;
    int size_digits;
    int size_done; /* past the size digits, skipping to the line end */
    int line_chars; /* in CH_TRAILER: characters on the current trailer line */
    char ev[EVENT_CAP];
    size_t ev_len;
    int done_seen;
};

static int ep;
static struct sockaddr_in target;
static char request[1024];
static size_t request_len;
static int short_mode;
static long long events_total, responses_total;
static long long err_connect, err_status, err_closed, err_timeout, err_parse;
static int pending_heads;
static int active;
static size_t buf_cap;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void set_events(struct stream *s, unsigned events, int op)
{
    struct epoll_event ev = {.events = events, .data.ptr = s};
    epoll_ctl(ep, op, s->fd, &ev);
}

static void stream_fail(struct stream *s, long long *counter)
{
    if (s->phase == CONNECTING || s->phase == SENDING || s->phase == HEAD)
        pending_heads--;
    (*counter)++;
    close(s->fd);
    s->fd = -1;
    s->phase = FINISHED;
    active--;
}

static int stream_connect(struct stream *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&target, sizeof target) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    s->fd = fd;
    s->phase = CONNECTING;
    s->sent = 0;
    pending_heads++;
    active++;
    set_events(s, EPOLLOUT, EPOLL_CTL_ADD);
    return 0;
}

static void begin_request(struct stream *s)
{
    s->phase = SENDING;
    s->sent = 0;
    s->started_ns = now_ns();
}

static void send_request(struct stream *s)
{
    while (s->sent < request_len) {
        ssize_t w = send(s->fd, request + s->sent, request_len - s->sent, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_events(s, EPOLLOUT | EPOLLIN, EPOLL_CTL_MOD);
                return;
            }
            stream_fail(s, &err_closed);
            return;
        }
        s->sent += (size_t)w;
    }
    s->phase = HEAD;
    s->len = 0;
    set_events(s, EPOLLIN, EPOLL_CTL_MOD);
}

/* One complete SSE event (text up to and including the blank line). */
static void on_event(struct stream *s, long long recv_ns)
{
    if (s->ev_len >= 12 && memcmp(s->ev, "data: [DONE]", 12) == 0) {
        s->done_seen = 1;
        return;
    }
    s->ev[s->ev_len < EVENT_CAP ? s->ev_len : EVENT_CAP - 1] = '\0';
    const char *t = strstr(s->ev, "\"t\":");
    if (!t) {
        err_parse++;
        return;
    }
    long long sent = strtoll(t + 4, NULL, 10);
    hist_add((recv_ns - sent) / 1000);
    events_total++;
}

static void feed_sse(struct stream *s, const char *p, size_t n, long long recv_ns)
{
    for (size_t i = 0; i < n; i++) {
        if (s->ev_len < EVENT_CAP - 1)
            s->ev[s->ev_len] = p[i];
        s->ev_len++;
        if (p[i] == '\n' && s->ev_len >= 2 && s->ev[s->ev_len - 2] == '\n') {
            on_event(s, recv_ns);
            s->ev_len = 0;
        }
    }
}

/* Decodes chunked bytes; returns how many were used, sets *complete at the end. */
static size_t feed_chunked(struct stream *s, const char *p, size_t n, long long recv_ns,
                           int *complete, int *bad)
{
    size_t i = 0;
    while (i < n && !*complete && !*bad) {
        switch (s->cs) {
        case CH_SIZE: {
            char c = p[i++];
            if (c == '\n') {
                if (s->size_digits == 0) {
                    *bad = 1;
                    break;
                }
                s->cs = s->chunk_left == 0 ? CH_TRAILER : CH_DATA;
                s->size_digits = 0;
                s->size_done = 0;
                s->line_chars = 0;
                break;
            }
            if (c == '\r' || c == ';')
                s->size_done = 1; /* the size ends here; an extension is skipped */
            if (s->size_done)
                break;
            int v = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (v < 0 || s->size_digits >= 15) {
                *bad = 1;
                break;
            }
            s->chunk_left = s->chunk_left * 16 + v;
            s->size_digits++;
            break;
        }
        case CH_DATA: {
            size_t take = n - i < (size_t)s->chunk_left ? n - i : (size_t)s->chunk_left;
            feed_sse(s, p + i, take, recv_ns);
            i += take;
            s->chunk_left -= (long long)take;
            if (s->chunk_left == 0)
                s->cs = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            if (p[i++] == '\n') {
                s->cs = CH_SIZE;
                s->chunk_left = 0;
            }
            break;
        case CH_TRAILER:
            if (p[i] == '\n') {
                if (s->line_chars == 0)
                    *complete = 1;
                s->line_chars = 0;
            } else if (p[i] != '\r') {
                s->line_chars++;
            }
            i++;
            break;
        }
    }
    return i;
}

/* Parses the response head in s->buf; 1 done, 0 need more, -1 failed. */
static int parse_head(struct stream *s)
{
    char *end = memmem(s->buf, s->len, "\r\n\r\n", 4);
    if (!end)
        return s->len == buf_cap ? -1 : 0;
    *end = '\0';
    int status = 0;
    if (sscanf(s->buf, "HTTP/1.%*d %d", &status) != 1 || status != 200)
        return -1;
    s->chunked = 0;
    s->content_left = -1;
    for (char *line = strstr(s->buf, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strstr(line, "chunked"))
            s->chunked = 1;
        else if (strncasecmp(line, "Content-Length:", 15) == 0)
            s->content_left = strtoll(line + 15, NULL, 10);
    }
    if (!s->chunked && s->content_left < 0)
        return -1;
    size_t head_len = (size_t)(end - s->buf) + 4;
    memmove(s->buf, s->buf + head_len, s->len - head_len);
    s->len -= head_len;
    s->cs = CH_SIZE;
    s->chunk_left = 0;
    s->size_digits = 0;
    s->size_done = 0;
    s->ev_len = 0;
    s->done_seen = 0;
    return 1;
}

static void response_done(struct stream *s, long long recv_ns, long long deadline_ns)
{
    responses_total++;
    if (short_mode)
        hist_add((recv_ns - s->started_ns) / 1000);
    else if (!s->done_seen)
        err_parse++;
    s->requests_left--;
    if (s->len > 0 || s->requests_left <= 0 || recv_ns >= deadline_ns) {
        /* finished (or the server sent more than was asked: not reused) */
        close(s->fd);
        s->fd = -1;
        s->phase = FINISHED;
        active--;
        return;
    }
    begin_request(s);
    send_request(s);
}

static void on_readable(struct stream *s, long long deadline_ns)
{
    for (;;) {
        ssize_t r = recv(s->fd, s->buf + s->len, buf_cap - s->len, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r <= 0) {
            stream_fail(s, &err_closed);
            return;
        }
        long long recv_ns = now_ns();
        s->len += (size_t)r;
        if (s->phase == HEAD) {
            int h = parse_head(s);
            if (h < 0) {
                stream_fail(s, &err_status);
                return;
            }
            if (h == 0)
                continue;
            pending_heads--;
            s->phase = BODY;
        }
        int complete = 0, bad = 0;
        size_t used;
        if (s->chunked) {
            used = feed_chunked(s, s->buf, s->len, recv_ns, &complete, &bad);
        } else {
            used = s->len < (size_t)s->content_left ? s->len : (size_t)s->content_left;
            s->content_left -= (long long)used;
            complete = s->content_left == 0;
        }
        if (bad) {
            stream_fail(s, &err_parse);
            return;
        }
        memmove(s->buf, s->buf + used, s->len - used);
        s->len -= used;
        if (complete) {
            response_done(s, recv_ns, deadline_ns);
            return;
        }
    }
}

static void on_event_ready(struct stream *s, unsigned events, long long deadline_ns)
{
    if (s->phase == CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err || (events & (EPOLLERR | EPOLLHUP))) {
            stream_fail(s, &err_connect);
            return;
        }
        begin_request(s);
        send_request(s);
        return;
    }
    if (s->phase == SENDING && (events & EPOLLOUT)) {
        send_request(s);
        return;
    }
    if (s->phase == HEAD || s->phase == BODY)
        on_readable(s, deadline_ns);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s stream HOST PORT HOSTHDR STREAMS EVENTS RATE REQUESTS TIMEOUT_S\n"
            "       %s short HOST PORT HOSTHDR CONNECTIONS SECONDS\n",
            argv0, argv0);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "stream") == 0 ? argc != 10
                     : strcmp(argv[1], "short") == 0 ? argc != 7
                                                       : 1)) {
        usage(argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    short_mode = strcmp(argv[1], "short") == 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &target.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[2]);
        return 2;
    }
    const char *hosthdr = argv[4];
    int n = atoi(argv[5]);
    int requests;
    long long run_ns;
    if (short_mode) {
        run_ns = atoll(argv[6]) * 1000000000LL;
        requests = 1 << 30;
        request_len = (size_t)snprintf(request, sizeof request,
                                       "GET /small HTTP/1.1\r\nHost: %s\r\n\r\n", hosthdr);
    } else {
        static const char body[] =
            "{\"model\":\"bench\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
        run_ns = atoll(argv[9]) * 1000000000LL;
        requests = atoi(argv[8]);
        request_len = (size_t)snprintf(
            request, sizeof request,
            "POST /v1/chat/completions?events=%s&rate=%s HTTP/1.1\r\nHost: %s\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            "Content-Length: %zu\r\n\r\n%s",
            argv[6], argv[7], hosthdr, sizeof body - 1, body);
    }
    struct stream *ss = calloc((size_t)n, sizeof *ss);
    if (!ss) {
        perror("calloc");
        return 1;
    }
    buf_cap = n == 1 ? BUF_CAP_ONE : BUF_CAP_MANY;
    for (int i = 0; i < n; i++) {
        ss[i].buf = malloc(buf_cap);
        if (!ss[i].buf) {
            perror("malloc");
            return 1;
        }
        ss[i].fd = -1;
        ss[i].phase = IDLE;
        ss[i].requests_left = requests;
    }
    ep = epoll_create1(0);
    long long start = now_ns();
    long long deadline = start + run_ns;
    int next = 0;
    struct epoll_event evs[512];
    while (next < n || active > 0) {
        while (next < n && pending_heads < MAX_PENDING_HEADS) {
            if (stream_connect(&ss[next]) < 0) {
                err_connect++;
                ss[next].phase = FINISHED;
            }
            next++;
        }
        long long now = now_ns();
        /* streaming runs end by completion; TIMEOUT_S only bounds a stuck run */
        if (now >= deadline)
            break;
        int wait_ms = (int)((deadline - now) / 1000000) + 1;
        int k = epoll_wait(ep, evs, 512, wait_ms < 100 ? wait_ms : 100);
        for (int i = 0; i < k; i++)
            on_event_ready(evs[i].data.ptr, evs[i].events, short_mode ? deadline : 1LL << 62);
    }
    double elapsed = (double)(now_ns() - start) / 1e9;
    if (!short_mode) {
        for (int i = 0; i < n; i++)
            if (ss[i].phase != FINISHED && ss[i].phase != IDLE) {
                err_timeout++;
            }
    }
    for (int i = 0; i < n; i++) {
        if (ss[i].fd >= 0)
            close(ss[i].fd);
        free(ss[i].buf);
    }
    printf("{\"mode\":\"%s\",\"connections\":%d,\"events\":%lld,\"responses\":%lld,"
           "\"errors\":%lld,\"err_connect\":%lld,\"err_status\":%lld,\"err_closed\":%lld,"
           "\"err_timeout\":%lld,\"err_parse\":%lld,\"p50_us\":%.0f,\"p99_us\":%.0f,"
           "\"p999_us\":%.0f,\"max_us\":%lld,\"elapsed_s\":%.3f}\n",
           short_mode ? "short" : "stream", n, events_total, responses_total,
           err_connect + err_status + err_closed + err_timeout + err_parse, err_connect, err_status, err_closed, err_timeout,
           err_parse, hist_pct(50), hist_pct(99), hist_pct(99.9), hist_max, elapsed);
    free(ss);
    return 0;
}

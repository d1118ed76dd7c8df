/* thaw-model-sim: a stand-in for an OpenAI-style model server (vLLM,
 * llama.cpp) with a cold start and a shared "GPU".
 *
 *   --host ADDR          address to listen on (default 127.0.0.1)
 *   --port N             port (0: any; see --port-file)
 *   --port-file FILE     write the bound port once listening
 *   --model NAME         model id reported by /v1/models (default "sim")
 *   --load-ms N          cold start: time until the model is "loaded"
 *   --load-mode MODE     listen-late (listen only once loaded) or 503
 *                        (listen at once, answer 503 until loaded)
 *   --token-ms N         time per generated token at full speed
 *   --tokens N           tokens per completion unless max_tokens says less
 *   --capacity N         requests served at full speed; beyond that every
 *                        token slows by active/capacity (a time-sliced GPU)
 *   --crash-after N      exit abruptly during the Nth completion, mid-stream
 *   --fail-start         exit with status 1 instead of finishing the load
 *   --error-pct N        answer N% of completions with a 500 (spread evenly:
 *                        completion k fails when k*N/100 passes a whole number)
 *   --ready-file FILE    write CLOCK_MONOTONIC nanoseconds when /health first
 *                        answers 200 (load tests measure from that moment)
 *   --sleep-ms N         sleep mode: time POST /sleep takes (default 10)
 *   --wake-ms N          sleep mode: time POST /wake_up takes (default 50), the
 *                        short wake that replaces a --load-ms cold start
 *   --fail-sleep         answer POST /sleep with 500 (the model stays awake)
 *   --fail-wake          answer POST /wake_up with 500 (the model stays asleep)
 *
 * Sleep mode as vLLM's --enable-sleep-mode serves it: POST /sleep?level=1|2
 * answers 200 with no body once asleep; POST /wake_up answers 200 once awake;
 * GET /is_sleeping gives {"is_sleeping": bool}. While asleep (or waking),
 * completions answer 503; /health, /v1/models and /stats still answer.
 *
 * Paths: /health, /v1/models, /v1/chat/completions, /v1/completions
 * (JSON, or SSE chunks ending in "data: [DONE]" with "stream": true), and
 * /stats: {"active", "peak_active", "completions"} (completions in progress
 * now, the most ever in progress at once, and how many were started; with
 * "sleeping", "sleeps" and "wakes" for sleep mode).
 *
 * SIGTERM stops accepting connections and finishes the completions in
 * progress (each connection closes after its response), then exits, as
 * uvicorn's graceful shutdown does; a second SIGTERM, or SIGINT, exits at
 * once. */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "thaw/http.h"

struct sim {
    struct event_base *base;
    const char *host;
    int port;
    const char *port_file;
    const char *model;
    long load_ms, token_ms, tokens, capacity, crash_after, error_pct;
    bool mode_503;
    bool loaded;
    bool fail_start;
    const char *ready_file;
    bool ready_written;
    long sleep_ms, wake_ms;
    bool fail_sleep, fail_wake;
    bool sleeping; /* asleep, or waking: completions answer 503 */
    long sleeps, wakes;
    long active;
    long peak_active; /* most completions ever in progress at once (GET /stats) */
    long completions;
    struct evconnlistener *listener;
    struct http_limits limits;
    /* SIGTERM: stop accepting and finish the completions in progress, as
     * uvicorn's graceful shutdown does; exit when none is left (a second
     * SIGTERM, or SIGINT, exits at once). */
    bool draining;
    struct event *drained;
};

struct client {
    struct sim *sim;
    struct bufferevent *bev;
    struct http_parser parser;
    struct http_head head;
    struct buf body;
    bool busy; /* a completion is being generated */
    bool close_after;
    /* generation state */
    struct event *tick;
    long sent, total;
    bool stream, chat, counted_active;
    long id;
    bool crash_here;
    struct event *control; /* a /sleep or /wake_up finishing */
    bool control_is_wake;
};

static void exit_when_drained(struct sim *s);

static void client_free(struct client *c)
{
    if (c->counted_active) {
        c->sim->active--;
        exit_when_drained(c->sim);
    }
    if (c->tick) {
        event_free(c->tick);
    }
    if (c->control) {
        event_free(c->control);
    }
    bufferevent_free(c->bev);
    http_head_dispose(&c->head);
    buf_dispose(&c->body);
    free(c);
}

static void respond(struct client *c, int status, const char *ctype, const char *body)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n%s",
                        status, http_reason_phrase(status), ctype, strlen(body),
                        c->close_after ? "Connection: close\r\n" : "", body);
}

static long token_delay_ms(struct sim *s)
{
    if (s->token_ms <= 0) {
        return 0;
    }
    if (s->active <= s->capacity) {
        return s->token_ms;
    }
    /* Time-sliced: the GPU is shared by all active requests. */
    return s->token_ms * s->active / s->capacity;
}

static void process(struct client *c);

static void exit_when_drained(struct sim *s)
{
    if (s->draining && s->active == 0) {
        /* A moment for the last responses to leave. */
        struct timeval tv = {0, 50000};
        event_add(s->drained, &tv);
    }
}

static void finish_completion(struct client *c)
{
    c->busy = false;
    if (c->counted_active) {
        c->sim->active--;
        c->counted_active = false;
        exit_when_drained(c->sim);
    }
    http_parser_next(&c->parser, &c->head, &c->body);
    buf_reset(&c->body);
    process(c); /* pipelined requests */
}

static void send_chunk(struct evbuffer *out, const char *data, size_t len)
{
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    struct sim *s = c->sim;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (c->crash_here && c->sent >= c->total / 2) {
        fprintf(stderr, "thaw-model-sim: crashing as asked (--crash-after %ld)\n", s->crash_after);
        _exit(3);
    }
    if (c->stream) {
        char piece[512];
        int n;
        if (c->chat) {
            n = snprintf(piece, sizeof piece,
                         "data: {\"id\":\"cmpl-%ld\",\"object\":\"chat.completion.chunk\","
                         "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                         "\"tok%ld \"},\"finish_reason\":null}]}\n\n",
                         c->id, s->model, c->sent);
        } else {
            n = snprintf(piece, sizeof piece,
                         "data: {\"id\":\"cmpl-%ld\",\"object\":\"text_completion\","
                         "\"model\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"tok%ld \","
                         "\"finish_reason\":null}]}\n\n",
                         c->id, s->model, c->sent);
        }
        send_chunk(out, piece, (size_t)n);
    }
    c->sent++;
    if (c->sent < c->total) {
        long ms = token_delay_ms(s);
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        event_add(c->tick, &tv);
        return;
    }
    if (c->stream) {
        send_chunk(out, "data: [DONE]\n\n", 14);
        evbuffer_add(out, "0\r\n\r\n", 5);
    } else {
        cJSON *root = cJSON_CreateObject();
        char id[32];
        snprintf(id, sizeof id, "cmpl-%ld", c->id);
        cJSON_AddStringToObject(root, "id", id);
        cJSON_AddStringToObject(root, "object", c->chat ? "chat.completion" : "text_completion");
        cJSON_AddStringToObject(root, "model", s->model);
        cJSON *choices = cJSON_AddArrayToObject(root, "choices");
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", 0);
        struct buf text;
        buf_init(&text);
        for (long i = 0; i < c->total; i++) {
            buf_printf(&text, "tok%ld ", i);
        }
        buf_append(&text, "", 1);
        if (c->chat) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddStringToObject(msg, "content", text.data);
        } else {
            cJSON_AddStringToObject(ch, "text", text.data);
        }
        buf_dispose(&text);
        cJSON_AddStringToObject(ch, "finish_reason", "length");
        cJSON_AddItemToArray(choices, ch);
        cJSON *usage = cJSON_AddObjectToObject(root, "usage");
        cJSON_AddNumberToObject(usage, "completion_tokens", (double)c->total);
        char *json = cJSON_PrintUnformatted(root);
        respond(c, 200, "application/json", json);
        free(json);
        cJSON_Delete(root);
    }
    finish_completion(c);
}

static void start_completion(struct client *c, bool chat)
{
    struct sim *s = c->sim;
    cJSON *req = cJSON_ParseWithLength(c->body.data ? c->body.data : "", c->body.len);
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        respond(c, 400, "application/json",
                "{\"error\":{\"message\":\"body must be a JSON object\",\"type\":"
                "\"invalid_request_error\"}}");
        return;
    }
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(req, "stream");
    const cJSON *max_tokens = cJSON_GetObjectItemCaseSensitive(req, "max_tokens");
    c->stream = cJSON_IsTrue(stream);
    c->chat = chat;
    c->total = s->tokens;
    if (cJSON_IsNumber(max_tokens) && max_tokens->valuedouble >= 1 &&
        max_tokens->valuedouble < (double)c->total) {
        c->total = (long)max_tokens->valuedouble;
    }
    if (c->total < 1) {
        c->total = 1;
    }
    cJSON_Delete(req);
    long k = s->completions + 1;
    if (s->error_pct > 0 && (k * s->error_pct) / 100 != ((k - 1) * s->error_pct) / 100) {
        s->completions = k;
        respond(c, 500, "application/json",
                "{\"error\":{\"message\":\"simulated failure\",\"type\":\"server_error\"}}");
        return;
    }
    c->sent = 0;
    c->busy = true;
    c->id = ++s->completions;
    c->crash_here = s->crash_after > 0 && c->id >= s->crash_after;
    s->active++;
    if (s->active > s->peak_active) {
        s->peak_active = s->active;
    }
    c->counted_active = true;
    if (c->stream) {
        bufferevent_write(c->bev,
                          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
                          strlen("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"));
    }
    if (!c->tick) {
        c->tick = evtimer_new(s->base, on_tick, c);
    }
    long ms = token_delay_ms(s);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(c->tick, &tv);
}

/* A /sleep or /wake_up whose delay has passed: the state changes, then the
 * answer goes out (vLLM answers once the engine has slept or woken). */
static void on_control_done(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    struct sim *s = c->sim;
    if (c->control_is_wake) {
        s->sleeping = false;
        s->wakes++;
        fprintf(stderr, "thaw-model-sim: model %s awake\n", s->model);
    } else {
        s->sleeping = true;
        s->sleeps++;
        fprintf(stderr, "thaw-model-sim: model %s asleep\n", s->model);
    }
    respond(c, 200, "application/json", "");
    finish_completion(c);
}

/* level=N in the query (q with its '?', qlen bytes); 1 when absent, -1 when
 * not one digit. */
static long query_level(const char *q, size_t qlen)
{
    for (size_t i = 0; q && i + 6 < qlen; i++) {
        if (memcmp(q + i, "level=", 6) == 0 && (q[i - (i > 0)] == '?' || q[i - 1] == '&')) {
            bool one_digit = i + 7 == qlen || q[i + 7] == '&';
            return one_digit ? q[i + 6] - '0' : -1;
        }
    }
    return 1;
}

/* POST /sleep?level=N and POST /wake_up. Returns true when answered at once. */
static bool sleep_control(struct client *c, bool wake, const char *query, size_t qlen)
{
    struct sim *s = c->sim;
    if (!wake) {
        long level = query_level(query, qlen);
        if (level != 1 && level != 2) {
            respond(c, 400, "application/json",
                    "{\"error\":{\"message\":\"level must be 1 or 2\"}}");
            return true;
        }
    }
    if ((wake && s->fail_wake) || (!wake && s->fail_sleep)) {
        respond(c, 500, "application/json",
                "{\"error\":{\"message\":\"simulated failure\"}}");
        return true;
    }
    if (wake == !s->sleeping) {
        respond(c, 200, "application/json", ""); /* already there */
        return true;
    }
    if (wake) {
        /* Waking: still not serving until the weights are back. */
        s->sleeping = true;
    }
    c->control_is_wake = wake;
    c->busy = true;
    if (!c->control) {
        c->control = evtimer_new(s->base, on_control_done, c);
    }
    long ms = wake ? s->wake_ms : s->sleep_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(c->control, &tv);
    return false;
}

/* Handles one complete request. Returns true when it finished at once. */
static bool handle(struct client *c)
{
    struct sim *s = c->sim;
    const char *t = http_target(&c->head);
    size_t len = c->head.target_len;
    const char *q = memchr(t, '?', len);
    size_t qlen = 0;
    if (q) {
        qlen = len - (size_t)(q - t);
        len = (size_t)(q - t);
    }
    c->close_after = !c->head.keep_alive || s->draining;
    if (!s->loaded) {
        respond(c, 503, "application/json", "{\"status\":\"loading\"}");
        return true;
    }
    if (http_name_eq(t, len, "/health")) {
        if (s->ready_file && !s->ready_written) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            FILE *f = fopen(s->ready_file, "w");
            if (f) {
                fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
                fclose(f);
            }
            s->ready_written = true;
        }
        respond(c, 200, "application/json", "{\"status\":\"ok\"}");
    } else if (http_name_eq(t, len, "/stats")) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"active\":%ld,\"peak_active\":%ld,\"completions\":%ld,\"sleeping\":%s,"
                 "\"sleeps\":%ld,\"wakes\":%ld}",
                 s->active, s->peak_active, s->completions, s->sleeping ? "true" : "false",
                 s->sleeps, s->wakes);
        respond(c, 200, "application/json", body);
    } else if (http_name_eq(t, len, "/is_sleeping")) {
        respond(c, 200, "application/json",
                s->sleeping ? "{\"is_sleeping\":true}" : "{\"is_sleeping\":false}");
    } else if (c->head.method == HTTP_POST &&
               (http_name_eq(t, len, "/sleep") || http_name_eq(t, len, "/wake_up"))) {
        return sleep_control(c, http_name_eq(t, len, "/wake_up"), q, qlen);
    } else if (s->sleeping && c->head.method == HTTP_POST &&
               (http_name_eq(t, len, "/v1/chat/completions") ||
                http_name_eq(t, len, "/v1/completions"))) {
        respond(c, 503, "application/json",
                "{\"error\":{\"message\":\"the model is sleeping\",\"type\":"
                "\"service_unavailable\"}}");
    } else if (http_name_eq(t, len, "/v1/models")) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
                 "\"owned_by\":\"thaw-model-sim\"}]}",
                 s->model);
        respond(c, 200, "application/json", body);
    } else if (c->head.method == HTTP_POST && http_name_eq(t, len, "/v1/chat/completions")) {
        start_completion(c, true);
        return !c->busy;
    } else if (c->head.method == HTTP_POST && http_name_eq(t, len, "/v1/completions")) {
        start_completion(c, false);
        return !c->busy;
    } else {
        respond(c, 404, "application/json", "{\"error\":{\"message\":\"not found\"}}");
    }
    return true;
}

static void process(struct client *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    bool after_head = false;
    while (!c->busy) {
        size_t n = evbuffer_get_length(in);
        if (n == 0 && !after_head) {
            return;
        }
        after_head = false;
        const char *data = n ? (const char *)evbuffer_pullup(in, -1) : "";
        size_t used = 0;
        enum http_event ev = http_parser_execute(&c->parser, data, n, &used);
        evbuffer_drain(in, used);
        if (ev == HTTP_EV_ERROR) {
            c->close_after = true;
            respond(c, 400, "application/json", "{\"error\":{\"message\":\"bad request\"}}");
            bufferevent_disable(c->bev, EV_READ);
            return;
        }
        if (ev == HTTP_EV_HEAD) {
            after_head = true;
            continue;
        }
        if (ev == HTTP_EV_DONE) {
            if (handle(c)) {
                http_parser_next(&c->parser, &c->head, &c->body);
                buf_reset(&c->body);
                if (c->close_after) {
                    bufferevent_disable(c->bev, EV_READ);
                    return;
                }
            }
            continue;
        }
        return; /* need more */
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    process(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct client *c = arg;
    if (c->close_after && !c->busy && evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        client_free(c);
    }
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        client_free(arg);
    }
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    struct sim *s = arg;
    struct client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->sim = s;
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    http_head_init(&c->head);
    buf_init(&c->body);
    http_parser_init(&c->parser, HTTP_REQUEST, &s->limits);
    http_parser_next(&c->parser, &c->head, &c->body);
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static int start_listening(struct sim *s)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    if (inet_pton(AF_INET, s->host, &sin.sin_addr) != 1) {
        fprintf(stderr, "thaw-model-sim: bad --host %s\n", s->host);
        return -1;
    }
    s->listener = evconnlistener_new_bind(s->base, on_accept, s,
                                          LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                          (struct sockaddr *)&sin, sizeof sin);
    if (!s->listener) {
        fprintf(stderr, "thaw-model-sim: cannot listen on %s:%d: %s\n", s->host, s->port,
                strerror(errno));
        return -1;
    }
    struct sockaddr_in bound;
    socklen_t blen = sizeof bound;
    getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.sin_port);
    if (s->port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", s->port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", s->port) < 0 || fclose(f) != 0 ||
            rename(tmp, s->port_file) != 0) {
            fprintf(stderr, "thaw-model-sim: cannot write %s\n", s->port_file);
            return -1;
        }
    }
    return 0;
}

static void on_loaded(evutil_socket_t fd, short what, void *arg)
{
    struct sim *s = arg;
    if (s->fail_start) {
        fprintf(stderr, "thaw-model-sim: CUDA out of memory while loading %s (simulated)\n",
                s->model);
        exit(1);
    }
    if (!s->mode_503 && start_listening(s)) {
        event_base_loopbreak(s->base);
        return;
    }
    s->loaded = true;
    fprintf(stderr, "thaw-model-sim: model %s loaded, serving on %s:%d\n", s->model, s->host,
            s->port);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct sim *s = arg;
    if (sig != SIGTERM || s->draining || s->active == 0) {
        event_base_loopbreak(s->base);
        return;
    }
    s->draining = true;
    if (s->listener) {
        evconnlistener_free(s->listener);
        s->listener = NULL;
    }
    fprintf(stderr, "thaw-model-sim: SIGTERM: finishing %ld completion(s), accepting none\n",
            s->active);
}

static void on_drained(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static long num_arg(const char *name, const char *v)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 0) {
        fprintf(stderr, "thaw-model-sim: --%s wants a number >= 0, got \"%s\"\n", name, v);
        exit(2);
    }
    return n;
}

int main(int argc, char **argv)
{
    struct sim s = {.host = "127.0.0.1", .model = "sim", .token_ms = 20, .tokens = 16,
                    .sleep_ms = 10, .wake_ms = 50,
                    .capacity = 4, .limits = {65536, 100, 16 << 20}};
    static const struct option opts[] = {
        {"host", required_argument, NULL, 'H'},      {"port", required_argument, NULL, 'p'},
        {"port-file", required_argument, NULL, 'f'}, {"model", required_argument, NULL, 'm'},
        {"load-ms", required_argument, NULL, 'l'},   {"load-mode", required_argument, NULL, 'L'},
        {"token-ms", required_argument, NULL, 't'},  {"tokens", required_argument, NULL, 'n'},
        {"capacity", required_argument, NULL, 'c'},  {"crash-after", required_argument, NULL, 'x'},
        {"fail-start", no_argument, NULL, 'F'},      {"ready-file", required_argument, NULL, 'R'},
        {"sleep-ms", required_argument, NULL, 's'},  {"wake-ms", required_argument, NULL, 'w'},
        {"fail-sleep", no_argument, NULL, 'S'},      {"fail-wake", no_argument, NULL, 'W'},
        {"error-pct", required_argument, NULL, 'e'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'H': s.host = optarg; break;
        case 'p': s.port = (int)num_arg("port", optarg); break;
        case 'f': s.port_file = optarg; break;
        case 'm': s.model = optarg; break;
        case 'l': s.load_ms = num_arg("load-ms", optarg); break;
        case 'L':
            if (strcmp(optarg, "503") == 0) {
                s.mode_503 = true;
            } else if (strcmp(optarg, "listen-late") != 0) {
                fprintf(stderr, "thaw-model-sim: --load-mode is listen-late or 503\n");
                return 2;
            }
            break;
        case 't': s.token_ms = num_arg("token-ms", optarg); break;
        case 'n': s.tokens = num_arg("tokens", optarg); break;
        case 'c': s.capacity = num_arg("capacity", optarg); break;
        case 'x': s.crash_after = num_arg("crash-after", optarg); break;
        case 'F': s.fail_start = true; break;
        case 'R': s.ready_file = optarg; break;
        case 's': s.sleep_ms = num_arg("sleep-ms", optarg); break;
        case 'w': s.wake_ms = num_arg("wake-ms", optarg); break;
        case 'S': s.fail_sleep = true; break;
        case 'W': s.fail_wake = true; break;
        case 'e': s.error_pct = num_arg("error-pct", optarg); break;
        case 'h':
            printf("usage: thaw-model-sim [--host A] [--port N] [--port-file F] [--model NAME]\n"
                   "       [--load-ms N] [--load-mode listen-late|503] [--token-ms N]\n"
                   "       [--tokens N] [--capacity N] [--crash-after N] [--fail-start]\n"
                   "       [--ready-file FILE] [--sleep-ms N] [--wake-ms N] [--fail-sleep]\n"
                   "       [--fail-wake] [--error-pct N]\n");
            return 0;
        default: return 2;
        }
    }
    if (s.capacity < 1) {
        s.capacity = 1;
    }
    signal(SIGPIPE, SIG_IGN);
    s.base = event_base_new();
    struct event *term = evsignal_new(s.base, SIGTERM, on_signal, &s);
    struct event *intr = evsignal_new(s.base, SIGINT, on_signal, &s);
    s.drained = evtimer_new(s.base, on_drained, s.base);
    event_add(term, NULL);
    event_add(intr, NULL);
    if (s.mode_503 && start_listening(&s)) {
        return 1;
    }
    struct event *load = evtimer_new(s.base, on_loaded, &s);
    struct timeval tv = {s.load_ms / 1000, (s.load_ms % 1000) * 1000};
    event_add(load, &tv);
    event_base_dispatch(s.base);
    event_free(load);
    event_free(term);
    event_free(intr);
    event_free(s.drained);
    if (s.listener) {
        evconnlistener_free(s.listener);
    }
    event_base_free(s.base);
    return 0;
}

#include "thaw/k8s/client.h"
#include "thaw/clock.h"
#include "thaw/k8s/execcred.h"
#include "thaw/list.h"
#include "thaw/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#define TOKEN_REREAD_MS 60000
#define MAX_RESPONSE_BYTES (256u << 20)
#define MAX_WATCH_LINE (16u << 20)

struct k8s_client {
    struct event_base *base;
    CURLM *multi;
    struct event timer;
    struct k8s_auth auth;
    char *token; /* current bearer token (from auth.token or auth.token_file) */
    uint64_t token_read_ms;
    bool have_exec; /* tokens from an exec plugin instead */
    struct k8s_execcred exec;
    struct list_node calls;
    struct list_node pending; /* watches with unread lines */
    struct k8s_client_stats stats;
};

struct k8s_call {
    struct list_node node;
    struct list_node pnode; /* in c->pending */
    struct k8s_client *c;
    CURL *easy;
    struct curl_slist *headers;
    struct buf resp;
    char *body; /* request body (owned) */
    k8s_done_cb done;
    k8s_line_cb line;
    void *ud;
    bool stopped; /* line callback asked to end */
    char errbuf[CURL_ERROR_SIZE];
};

/* Per-socket libevent state, attached with curl_multi_assign. */
struct sock {
    struct event ev;
    struct k8s_client *c;
    curl_socket_t fd;
};

uint64_t k8s_backoff_ms(unsigned failures, double rand01)
{
    double d = 250;
    for (unsigned i = 1; i < failures && d < 30000; i++) {
        d *= 2;
    }
    if (d > 30000) {
        d = 30000;
    }
    double j = d * (0.5 + rand01); /* 50% .. 150% */
    return (uint64_t)(j > 45000 ? 45000 : j);
}

static void refresh_token(struct k8s_client *c, bool force)
{
    if (c->have_exec) {
        if (force) { /* a 401; expiry has its own timer */
            k8s_execcred_refresh(&c->exec);
        }
        return;
    }
    if (!c->auth.token_file) {
        return;
    }
    uint64_t now = clock_now_ms();
    if (!force && c->token && now - c->token_read_ms < TOKEN_REREAD_MS) {
        return;
    }
    FILE *f = fopen(c->auth.token_file, "r");
    if (!f) {
        LOGW("cannot read the API token file", "path=%s error=\"%s\"", c->auth.token_file,
             strerror(errno));
        return;
    }
    char tok[16384];
    size_t n = fread(tok, 1, sizeof tok - 1, f);
    fclose(f);
    tok[n] = '\0';
    while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) {
        tok[--n] = '\0';
    }
    if (c->token && strcmp(c->token, tok) != 0) {
        LOGI("API token changed: using the new one", "path=%s", c->auth.token_file);
    }
    if (c->token) {
        memset(c->token, 0, strlen(c->token));
        free(c->token);
    }
    c->token = strdup(tok);
    memset(tok, 0, sizeof tok);
    c->token_read_ms = now;
}

static void check_done(struct k8s_client *c);
static void deliver_lines(struct k8s_client *c);

static void on_sock(evutil_socket_t fd, short what, void *arg)
{
    struct sock *s = arg;
    struct k8s_client *c = s->c;
    int flags = (what & EV_READ ? CURL_CSELECT_IN : 0) | (what & EV_WRITE ? CURL_CSELECT_OUT : 0);
    int running;
    curl_multi_socket_action(c->multi, fd, flags, &running);
    deliver_lines(c);
    check_done(c);
}

static int sock_cb(CURL *e, curl_socket_t fd, int what, void *userp, void *sockp)
{
    struct k8s_client *c = userp;
    struct sock *s = sockp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            event_del(&s->ev);
            free(s);
            curl_multi_assign(c->multi, fd, NULL);
        }
        return 0;
    }
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) {
            return -1;
        }
        s->c = c;
        s->fd = fd;
        curl_multi_assign(c->multi, fd, s);
    } else {
        event_del(&s->ev);
    }
    short ev = EV_PERSIST | (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    event_assign(&s->ev, c->base, fd, ev, on_sock, s);
    event_add(&s->ev, NULL);
    return 0;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_client *c = arg;
    int running;
    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    deliver_lines(c);
    check_done(c);
}

static int timer_cb(CURLM *m, long timeout_ms, void *userp)
{
    struct k8s_client *c = userp;
    if (timeout_ms < 0) {
        event_del(&c->timer);
        return 0;
    }
    struct timeval tv = clock_timeval((uint64_t)timeout_ms);
    event_add(&c->timer, &tv);
    return 0;
}

static void call_free(struct k8s_call *call)
{
    list_remove(&call->node);
    if (list_linked(&call->pnode)) {
        list_remove(&call->pnode);
    }
    curl_multi_remove_handle(call->c->multi, call->easy);
    curl_easy_cleanup(call->easy);
    curl_slist_free_all(call->headers);
    buf_dispose(&call->resp);
    free(call->body);
    free(call);
}

/* Hands complete lines of one watch to its owner. Runs outside libcurl's
 * callbacks (libcurl forbids adding or removing transfers from inside
 * them, and owners do both). Returns false when the owner stopped it. */
static bool call_lines(struct k8s_call *call)
{
    for (;;) {
        const char *start = buf_read_ptr(&call->resp);
        size_t avail = buf_unread(&call->resp);
        const char *nl = avail ? memchr(start, '\n', avail) : NULL;
        if (!nl) {
            return true;
        }
        size_t len = (size_t)(nl - start);
        if (len > 0 && call->line(call->ud, start, len) != 0) {
            return false;
        }
        buf_consume(&call->resp, len + 1);
    }
}

static void finish(struct k8s_call *call, long status, const char *err)
{
    k8s_done_cb done = call->done;
    void *ud = call->ud;
    call_free(call);
    if (done) {
        done(ud, status, NULL, 0, err);
    }
}

static void deliver_lines(struct k8s_client *c)
{
    while (!list_empty(&c->pending)) {
        struct k8s_call *call = container_of(list_first(&c->pending), struct k8s_call, pnode);
        list_remove(&call->pnode);
        if (!call_lines(call)) {
            finish(call, 200, "stopped");
        }
    }
}

static void check_done(struct k8s_client *c)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(c->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) {
            continue;
        }
        struct k8s_call *call = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&call);
        CURLcode result = msg->data.result;
        if (call->line && !call->stopped) {
            long st = 0;
            curl_easy_getinfo(call->easy, CURLINFO_RESPONSE_CODE, &st);
            if (st == 200 && !call_lines(call)) {
                finish(call, 200, "stopped");
                continue;
            }
        }
        long status = 0;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
        const char *err = NULL;
        if (call->stopped) {
            err = "stopped";
        } else if (result != CURLE_OK) {
            err = call->errbuf[0] ? call->errbuf : curl_easy_strerror(result);
            c->stats.errors++;
            status = status ? status : 0;
        } else if (status >= 400) {
            c->stats.errors++;
            if (status == 401) {
                refresh_token(c, true); /* it may have rotated since we read it */
            }
        }
        if (result != CURLE_OK && !call->stopped) {
            status = 0;
        }
        k8s_done_cb done = call->done;
        void *ud = call->ud;
        bool is_watch = call->line != NULL;
        /* Copy what the callback needs: it may free or start calls. */
        struct buf resp = call->resp;
        buf_init(&call->resp);
        char errcopy[CURL_ERROR_SIZE] = "";
        if (err) {
            snprintf(errcopy, sizeof errcopy, "%s", err);
        }
        call_free(call);
        if (resp.data) {
            buf_append(&resp, "", 1);
            resp.len--;
        }
        if (done) {
            done(ud, status, is_watch ? NULL : resp.data, is_watch ? 0 : resp.len,
                 err ? errcopy : NULL);
        }
        buf_dispose(&resp);
    }
}

/* Bodies accumulate; watch streams are cut into lines as they arrive. */
static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct k8s_call *call = ud;
    size_t n = size * nmemb;
    if (!call->line) {
        if (call->resp.len + n > MAX_RESPONSE_BYTES || buf_append(&call->resp, ptr, n)) {
            return 0;
        }
        return n;
    }
    long status = 0;
    curl_easy_getinfo(call->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
        /* An error Status object instead of a stream: keep it for logs. */
        if (call->resp.len < 65536) {
            buf_append(&call->resp, ptr, n);
        }
        return n;
    }
    if (buf_unread(&call->resp) + n > MAX_WATCH_LINE || buf_append(&call->resp, ptr, n)) {
        return 0;
    }
    if (!list_linked(&call->pnode)) {
        list_push_back(&call->c->pending, &call->pnode);
    }
    return n;
}

static struct k8s_call *start_call(struct k8s_client *c, const char *method, const char *path,
                                   const char *content_type, const char *body, size_t body_len,
                                   long timeout_ms, k8s_line_cb line, long idle_timeout_ms,
                                   k8s_done_cb done, void *ud)
{
    struct k8s_call *call = calloc(1, sizeof *call);
    if (!call) {
        return NULL;
    }
    call->c = c;
    list_node_init(&call->pnode);
    call->done = done;
    call->line = line;
    call->ud = ud;
    buf_init(&call->resp);
    call->easy = curl_easy_init();
    if (!call->easy) {
        free(call);
        return NULL;
    }
    /* An absolute http:// URL is a peer activator, not the API server: no
     * credentials go there. */
    bool peer = strncmp(path, "http://", 7) == 0;
    refresh_token(c, false);
    char url[4096];
    snprintf(url, sizeof url, "%s%s", peer ? "" : c->auth.server, path);
    CURL *e = call->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, call);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, call->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, call);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_USERAGENT, "thaw/" THAW_VERSION);
    if (line) {
        /* No overall limit on a watch; silence for idle_timeout_ms ends it. */
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (idle_timeout_ms + 999) / 1000);
    } else {
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 30000L);
    }
    const struct k8s_auth *a = &c->auth;
    if (peer) {
        goto headers;
    }
    if (a->ca_file) {
        curl_easy_setopt(e, CURLOPT_CAINFO, a->ca_file);
    } else if (a->ca_pem.len) {
        struct curl_blob blob = {a->ca_pem.data, a->ca_pem.len, CURL_BLOB_NOCOPY};
        curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &blob);
    }
    if (a->cert_file) {
        curl_easy_setopt(e, CURLOPT_SSLCERT, a->cert_file);
    } else if (a->cert_pem.len) {
        struct curl_blob blob = {a->cert_pem.data, a->cert_pem.len, CURL_BLOB_NOCOPY};
        curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &blob);
        curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    }
    if (a->key_file) {
        curl_easy_setopt(e, CURLOPT_SSLKEY, a->key_file);
    } else if (a->key_pem.len) {
        struct curl_blob blob = {a->key_pem.data, a->key_pem.len, CURL_BLOB_NOCOPY};
        curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &blob);
        curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    }
    if (a->insecure) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }
headers:
    call->headers = curl_slist_append(call->headers, "Accept: application/json");
    const char *tok = peer         ? NULL
                      : c->have_exec ? c->exec.token
                      : c->token     ? c->token
                                     : a->token;
    if (tok && *tok) {
        size_t n = strlen(tok) + 32;
        char *h = malloc(n);
        if (h) {
            snprintf(h, n, "Authorization: Bearer %s", tok);
            call->headers = curl_slist_append(call->headers, h);
            memset(h, 0, n);
            free(h);
        }
    }
    if (content_type) {
        char h[256];
        snprintf(h, sizeof h, "Content-Type: %s", content_type);
        call->headers = curl_slist_append(call->headers, h);
    }
    call->headers = curl_slist_append(call->headers, "Expect:");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, call->headers);
    if (strcmp(method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    }
    if (body) {
        call->body = malloc(body_len + 1);
        if (!call->body) {
            curl_easy_cleanup(e);
            curl_slist_free_all(call->headers);
            free(call);
            return NULL;
        }
        memcpy(call->body, body, body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, call->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    list_push_back(&c->calls, &call->node);
    curl_multi_add_handle(c->multi, e);
    c->stats.requests++;
    if (line) {
        c->stats.watches++;
    }
    return call;
}

struct k8s_call *k8s_request(struct k8s_client *c, const char *method, const char *path,
                             const char *content_type, const char *body, size_t body_len,
                             long timeout_ms, k8s_done_cb done, void *ud)
{
    return start_call(c, method, path, content_type, body, body_len, timeout_ms, NULL, 0, done,
                      ud);
}

struct k8s_call *k8s_watch(struct k8s_client *c, const char *path, long idle_timeout_ms,
                           k8s_line_cb line, k8s_done_cb done, void *ud)
{
    return start_call(c, "GET", path, NULL, NULL, 0, 0, line, idle_timeout_ms, done, ud);
}

void k8s_call_cancel(struct k8s_call *call)
{
    if (call) {
        call_free(call);
    }
}

struct k8s_client *k8s_client_new(struct event_base *base, struct k8s_auth *auth, char *err,
                                  size_t errlen)
{
    struct k8s_client *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->base = base;
    c->auth = *auth;
    k8s_auth_init(auth); /* taken over */
    list_init(&c->calls);
    list_init(&c->pending);
    c->multi = curl_multi_init();
    if (!c->multi) {
        snprintf(err, errlen, "curl_multi_init failed");
        k8s_auth_dispose(&c->auth);
        free(c);
        return NULL;
    }
    event_assign(&c->timer, base, -1, 0, on_timer, c);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, sock_cb);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    if (c->auth.exec_argv) {
        if (k8s_execcred_init(&c->exec, base, &c->auth, err, errlen)) {
            k8s_execcred_dispose(&c->exec);
            k8s_client_free(c);
            return NULL;
        }
        c->have_exec = true;
    } else {
        refresh_token(c, true);
    }
    if (c->auth.token_file && !c->token) {
        snprintf(err, errlen, "cannot read the token file %s", c->auth.token_file);
        k8s_client_free(c);
        return NULL;
    }
    return c;
}

void k8s_client_free(struct k8s_client *c)
{
    if (!c) {
        return;
    }
    while (!list_empty(&c->calls)) {
        call_free(container_of(list_first(&c->calls), struct k8s_call, node));
    }
    event_del(&c->timer);
    if (c->have_exec) {
        k8s_execcred_dispose(&c->exec);
    }
    curl_multi_cleanup(c->multi);
    if (c->token) {
        memset(c->token, 0, strlen(c->token));
        free(c->token);
    }
    k8s_auth_dispose(&c->auth);
    free(c);
}

const struct k8s_auth *k8s_client_auth(const struct k8s_client *c)
{
    return &c->auth;
}

const struct k8s_client_stats *k8s_client_stats(const struct k8s_client *c)
{
    return &c->stats;
}

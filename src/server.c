#include "thaw/server.h"
#include "thaw/netaddr.h"
#include "thaw/clock.h"
#include "thaw/admin.h"
#include "thaw/backend.h"
#include "thaw/conn.h"
#include "thaw/k8s/auth.h"
#include "thaw/log.h"
#include "thaw/proxy.h"
#include "thaw/reload.h"
#include "thaw/upstream.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event_struct.h>

/* Lingering close: how long a closing connection's input is discarded. */
/* Connections taken per accept event, so one busy listener cannot starve
 * the others. */
#define ACCEPT_BATCH 64
/* How long the listeners stop accepting when descriptors run out. The
 * pending connection stays readable on the listening socket, so accepting
 * again at once would spin (nginx and HAProxy pause the same way). */
#define ACCEPT_PAUSE_MS 100


static void on_accept(evutil_socket_t fd, short what, void *arg);

static int listener_open(struct server *srv, struct listener *l, const char *addr,
                         enum listener_kind kind)
{
    l->srv = srv;
    l->kind = kind;
    l->fd = -1;
    struct sockaddr_storage ss;
    socklen_t len;
    if (netaddr_parse(addr, &ss, &len)) {
        LOGE("bad listen address", "address=%s", addr);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        LOGE("socket failed", "error=\"%s\"", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 4096) < 0) {
        LOGE("cannot listen", "address=%s error=\"%s\"", addr, strerror(errno));
        close(fd);
        return -1;
    }
    l->bound_len = sizeof l->bound;
    getsockname(fd, (struct sockaddr *)&l->bound, &l->bound_len);
    l->fd = fd;
    event_assign(&l->ev, srv->rt.base, fd, EV_READ | EV_PERSIST, on_accept, l);
    event_add(&l->ev, NULL);
    l->active = true;
    return 0;
}

static void listener_close(struct listener *l)
{
    if (l->active) {
        event_del(&l->ev);
        close(l->fd);
        l->fd = -1;
        l->active = false;
    }
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t len)
{
    char ip[64] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
        port = ntohs(s4->sin_port);
        snprintf(out, len, "%s:%u", ip, port);
    } else {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
        port = ntohs(s6->sin6_port);
        snprintf(out, len, "[%s]:%u", ip, port);
    }
}

static int write_port_file(struct server *srv)
{
    char tmp[4096];
    char a[96], b[96];
    format_addr(&srv->proxy_l.bound, a, sizeof a);
    format_addr(&srv->admin_l.bound, b, sizeof b);
    snprintf(tmp, sizeof tmp, "%s.tmp", srv->port_file);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        LOGE("cannot write port file", "path=%s error=\"%s\"", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"listen\":\"%s\",\"admin_listen\":\"%s\"}\n", a, b);
    if (fclose(f) != 0 || rename(tmp, srv->port_file) != 0) {
        LOGE("cannot write port file", "path=%s error=\"%s\"", srv->port_file, strerror(errno));
        return -1;
    }
    return 0;
}

static void reject_connection(struct server *srv, int fd, const struct sockaddr *peer)
{
    srv->rt.metrics.connections_rejected++;
    srv->rt.metrics.rejections[REJECT_TOO_MANY_CONNECTIONS]++;
    if (srv->rt.net.n_lingering >= CONN_MAX_LINGERING) {
        close(fd); /* under a flood, not even a polite answer */
        return;
    }
    struct conn *c = conn_new(&srv->rt.net, fd, &srv->rt.req_limits, &proxy_conn_handler, &srv->rt, peer);
    if (!c) {
        return;
    }
    /* Not counted against the limit it is refused by (it only ever carries
     * this one answer), but against the refusals the reserve has room for. */
    c->count = &srv->rt.n_refused;
    srv->rt.n_refused++;
    conn_reject(c, REJECT_TOO_MANY_CONNECTIONS, NULL);
}

static const char *listener_name(const struct listener *l)
{
    return l->kind == LISTENER_PROXY ? "proxy" : "admin";
}

static void log_out_of_fds(struct server *srv, const struct listener *l, int err)
{
    uint64_t held;
    if (log_limit_pass(&srv->fd_log, clock_now_ms(), LOG_LIMIT_MS, &held)) {
        LOGW("out of file descriptors: pausing accepts", "listener=%s error=\"%s\" pause_ms=%d "
             "suppressed=%llu", listener_name(l), strerror(err), ACCEPT_PAUSE_MS,
             (unsigned long long)held);
    }
}

static void listener_pause(struct listener *l)
{
    if (l->active && !l->paused) {
        event_del(&l->ev);
        l->paused = true;
    }
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg);

/* Stops l accepting for ACCEPT_PAUSE_MS (a later pause of either listener
 * moves the end of both on). */
static void pause_listener(struct server *srv, struct listener *l)
{
    if (!srv->accept_resume) {
        srv->accept_resume = evtimer_new(srv->rt.base, on_accept_resume, srv);
        if (!srv->accept_resume) {
            return;
        }
    }
    listener_pause(l);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    event_add(srv->accept_resume, &tv);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct server *srv = arg;
    struct listener *ls[] = {&srv->proxy_l, &srv->admin_l};
    for (size_t i = 0; i < 2; i++) {
        if (ls[i]->active && ls[i]->paused) {
            event_add(&ls[i]->ev, NULL);
        }
        ls[i]->paused = false;
    }
}

/* The listener that found no descriptor stops for ACCEPT_PAUSE_MS, and
 * connections closing meanwhile give some back. Only that one: the admin
 * port's /healthz must not go dark on the proxy port's account (it fails
 * and pauses on its own when it is short too). */
static void pause_accepting(struct server *srv, struct listener *l, int err)
{
    srv->rt.metrics.accept_paused++;
    log_out_of_fds(srv, l, err);
    pause_listener(srv, l);
}

static void accept_admin(struct server *srv, int cfd, const struct sockaddr *peer)
{
    if (srv->rt.n_admin_conns >= SERVER_ADMIN_MAX_CONNECTIONS) {
        close(cfd); /* the admin port is for a few scrapers and probes */
        return;
    }
    struct conn *c = conn_new(&srv->rt.net, cfd, &srv->rt.admin_limits, &admin_conn_handler, &srv->admin,
                              peer);
    if (c) {
        c->count = &srv->rt.n_admin_conns;
        srv->rt.n_admin_conns++;
    }
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
    struct listener *l = arg;
    struct server *srv = l->srv;
    if (l->kind == LISTENER_PROXY && srv->rt.n_conns >= srv->rt.max_conns &&
        srv->rt.n_refused >= srv->rt.max_refused) {
        pause_listener(srv, l); /* as below: no room for another refusal yet */
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int cfd = accept4(fd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            int err = errno;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                pause_accepting(srv, l, err);
            }
            return;
        }
        if (l->kind == LISTENER_PROXY) {
            srv->rt.metrics.connections_accepted++;
            if (srv->rt.n_conns >= srv->rt.max_conns) {
                reject_connection(srv, cfd, (struct sockaddr *)&peer);
                if (srv->rt.n_refused >= srv->rt.max_refused) {
                    /* The reserve's room for refusals is taken: the rest
                     * wait in the backlog (for a 503, or a slot come free)
                     * rather than take descriptors probes and the admin
                     * port need. */
                    pause_listener(srv, l);
                    return;
                }
                continue;
            }
            struct conn *c = conn_new(&srv->rt.net, cfd, &srv->rt.req_limits, &proxy_conn_handler,
                                      &srv->rt, (struct sockaddr *)&peer);
            if (c) {
                c->count = &srv->rt.n_conns;
                srv->rt.n_conns++;
            }
        } else {
            accept_admin(srv, cfd, (struct sockaddr *)&peer);
        }
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct server *srv = arg;
    if (srv->rt.net.draining) {
        LOGW("second signal: exiting now", "signal=%d", (int)sig);
        event_base_loopbreak(srv->rt.base);
        return;
    }
    LOGI("signal received: draining", "signal=%d inflight=%llu", (int)sig,
         (unsigned long long)srv->rt.inflight);
    server_begin_drain(srv);
}

static bool output_pending(struct server *srv)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->rt.net.conns)
    {
        struct conn *c = container_of(pos, struct conn, node);
        if (conn_out_pending(c) > 0) {
            return true;
        }
    }
    return false;
}

static void close_all_connections(struct server *srv)
{
    while (!list_empty(&srv->rt.net.conns)) {
        struct conn *c = container_of(list_first(&srv->rt.net.conns), struct conn, node);
        conn_close(c, ABORT_SHUTDOWN);
    }
}

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    struct server *srv = arg;
    if (srv->rt.inflight == 0 && !output_pending(srv)) {
        LOGI("drained", NULL);
        event_base_loopexit(srv->rt.base, NULL);
        return;
    }
    if (clock_now_ms() >= srv->drain_deadline_ms) {
        LOGW("drain timeout: answering held requests and closing", "inflight=%llu",
             (unsigned long long)srv->rt.inflight);
        struct list_node *pos, *tmp;
        list_for_each_safe(pos, tmp, &srv->rt.fleet.models)
        {
            proxy_flush_queue(&srv->rt, container_of(pos, struct model, node), REJECT_SHUTTING_DOWN,
                              NULL);
        }
        /* A request whose answer has not started still gets one. */
        proxy_give_up_forwarded(&srv->rt, REJECT_SHUTTING_DOWN, ABORT_SHUTDOWN);
        /* Give the 503s a moment to leave, then close whatever remains. */
        srv->drain_deadline_ms = UINT64_MAX;
        srv->drain_hard_stop = true;
    }
    if (srv->drain_hard_stop && !output_pending(srv)) {
        close_all_connections(srv);
        event_base_loopexit(srv->rt.base, NULL);
        return;
    }
    struct timeval tv = {0, 20000};
    event_add(srv->drain_timer, &tv);
}

void server_begin_drain(struct server *srv)
{
    if (srv->rt.net.draining) {
        return;
    }
    srv->rt.net.draining = true;
    listener_close(&srv->proxy_l);
    if (srv->process_backend && srv->process_backend->ops->draining) {
        srv->process_backend->ops->draining(srv->process_backend);
    }
    /* The admin port stays up so /readyz can say "draining". */
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->rt.net.conns)
    {
        struct conn *c = container_of(pos, struct conn, node);
        if (c->handler == &proxy_conn_handler) {
            conn_drain(c);
        }
    }
    srv->drain_deadline_ms = clock_now_ms() + srv->rt.cfg->limits.drain_timeout_ms;
    srv->drain_timer = evtimer_new(srv->rt.base, on_drain_tick, srv);
    struct timeval tv = {0, 0};
    event_add(srv->drain_timer, &tv);
}

static bool admin_is_ready(void *ud)
{
    return server_is_ready(ud);
}

static size_t admin_backends(void *ud, struct backend **out)
{
    return server_backends(ud, out);
}

/* Descriptors open now: /proc/self/fd's entries but the one reading it;
 * without /proc, those below 1024 that fcntl finds. */
static uint64_t count_open_fds(void)
{
    uint64_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            n += e->d_name[0] != '.';
        }
        closedir(d);
        return n ? n - 1 : 0;
    }
    for (int fd = 0; fd < 1024; fd++) {
        n += fcntl(fd, F_GETFD) != -1;
    }
    return n;
}

void server_apply_fd_budget(struct server *srv, const struct config *before)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return; /* no budget: the configured figures stand */
    }
    if (!before) {
        srv->fds_at_start = count_open_fds();
    }
    uint64_t was_allowed = srv->rt.fds.max_connections;
    struct fdbudget b;
    fdbudget_derive(&b, rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur,
                    srv->fds_at_start);
    runtime_set_fds(&srv->rt, &b);
    const struct config *cfg = srv->rt.cfg;
    uint64_t wanted = cfg->limits.max_connections;
    if (wanted <= b.max_connections ||
        (before && before->limits.max_connections == wanted && was_allowed == b.max_connections)) {
        return; /* fits, or said already */
    }
    LOGW("the file descriptor limit allows fewer client connections than configured",
         "file=%s key=limits.max_connections max_connections=%llu allowed=%llu nofile=%llu "
         "reserve=%llu nofile_needed=%llu hint=\"raise the hard RLIMIT_NOFILE (ulimit -Hn, "
         "systemd LimitNOFILE=, the container runtime's nofile ulimit) to nofile_needed, or "
         "lower limits.max_connections\"",
         cfg->path ? LOG_Q(cfg->path) : "-", (unsigned long long)wanted,
         (unsigned long long)b.max_connections, (unsigned long long)b.limit,
         (unsigned long long)b.reserve, (unsigned long long)fdbudget_limit_for(&b, wanted));
}

bool server_is_ready(struct server *srv)
{
    if (!srv->ready || srv->rt.net.draining) {
        return false;
    }
    struct backend *backends[] = {srv->static_backend, srv->process_backend, srv->k8s_backend};
    for (size_t i = 0; i < 3; i++) {
        if (backends[i] && backends[i]->ops->synced && !backends[i]->ops->synced(backends[i])) {
            return false;
        }
    }
    return true;
}

int server_init(struct server *srv, struct config *cfg, const char *port_file,
                const char *kubeconfig_flag)
{
    memset(srv, 0, sizeof *srv);
    srv->rt.cfg = cfg; /* owned from here on, whatever happens */
    srv->port_file = port_file;
    srv->kubeconfig_flag = kubeconfig_flag;
    signal(SIGPIPE, SIG_IGN);

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    /* Changes to a socket's epoll registration are gathered until the loop
     * polls again: a connection's read and write events made or dropped in
     * one turn cost one epoll_ctl, not one each (thaw never dup()s a socket,
     * the case the flag cannot handle). */
    struct event_config *ecfg = event_config_new();
    struct event_base *base = NULL;
    if (ecfg) {
        event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
        base = event_base_new_with_config(ecfg);
        event_config_free(ecfg);
    }
    if (!base || runtime_init(&srv->rt, cfg, base)) {
        if (base) {
            srv->rt.base = base;
        }
        LOGE("out of memory at start-up", NULL);
        return -1;
    }
    proxy_wire(&srv->rt);
    srv->admin = (struct admin_ctx){&srv->rt, srv, admin_is_ready, admin_backends};

    srv->static_backend = backend_static_new(&srv->rt.fleet);
    if (!srv->static_backend) {
        return -1;
    }
    if (server_start_process_backend(srv, cfg, cfg, NULL)) {
        return -1;
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        struct model *m = fleet_add_model(&srv->rt.fleet, &cfg->models[i]);
        if (!m) {
            LOGE("out of memory adding model", "model=%s", cfg->models[i].name);
            return -1;
        }
        struct backend *b =
            cfg->models[i].n_command ? srv->process_backend : srv->static_backend;
        if (b->ops->attach(b, m, &cfg->models[i])) {
            return -1;
        }
    }
    if (proxy_link_revisions(&srv->rt, cfg)) {
        LOGE("out of memory linking models to their revisions", NULL);
        return -1;
    }

    if (cfg->kubernetes.enabled) {
        struct k8s_auth auth;
        k8s_auth_init(&auth);
        char err[512];
        if (k8s_auth_resolve(&auth, kubeconfig_flag, cfg->kubernetes.kubeconfig,
                             cfg->kubernetes.context, err, sizeof err)) {
            LOGE("cannot configure the Kubernetes client", "error=%s", LOG_Q(err));
            k8s_auth_dispose(&auth);
            return -1;
        }
        srv->k8s_backend = backend_k8s_new(&srv->rt.fleet, srv->rt.base, cfg, &auth, err, sizeof err);
        k8s_auth_dispose(&auth);
        if (!srv->k8s_backend) {
            LOGE("cannot start the Kubernetes backend", "error=%s", LOG_Q(err));
            return -1;
        }
        if (cfg->tenants.source.kind != TENANTS_SOURCE_NONE &&
            backend_k8s_watch_tenants(srv->k8s_backend, &cfg->tenants.source,
                                      reload_apply_source_tenants, srv)) {
            LOGE("cannot watch the tenants source", "name=%s", cfg->tenants.source.name);
            return -1;
        }
    }
    if (listener_open(srv, &srv->proxy_l, cfg->listen, LISTENER_PROXY) ||
        listener_open(srv, &srv->admin_l, cfg->admin_listen, LISTENER_ADMIN)) {
        return -1;
    }
    srv->sig_term = evsignal_new(srv->rt.base, SIGTERM, on_signal, srv);
    srv->sig_int = evsignal_new(srv->rt.base, SIGINT, on_signal, srv);
    event_add(srv->sig_term, NULL);
    event_add(srv->sig_int, NULL);
    if (port_file && write_port_file(srv)) {
        return -1;
    }
    /* Last, with everything thaw holds for good open and counted. */
    server_apply_fd_budget(srv, NULL);
    char a[96], b[96];
    format_addr(&srv->proxy_l.bound, a, sizeof a);
    format_addr(&srv->admin_l.bound, b, sizeof b);
    LOGI("thaw started", "listen=%s admin_listen=%s models=%zu max_connections=%llu nofile=%llu",
         a, b, srv->rt.fleet.n_models, (unsigned long long)srv->rt.max_conns,
         (unsigned long long)srv->rt.fds.limit);
    srv->ready = true;
    return 0;
}

int server_run(struct server *srv)
{
    event_base_dispatch(srv->rt.base);
    if (srv->rt.inflight > 0) {
        LOGW("exiting with requests unfinished", "inflight=%llu",
             (unsigned long long)srv->rt.inflight);
    }
    return srv->exit_code;
}

void server_dispose(struct server *srv)
{
    if (srv->process_starting) {
        backend_process_start_cancel(srv->process_starting); /* its command killed */
        srv->process_starting = NULL;
    }
    config_free(srv->reload_waiting);
    srv->reload_waiting = NULL;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &srv->rt.fleet.models)
    {
        struct model *m = container_of(pos, struct model, node);
        proxy_flush_queue(&srv->rt, m, REJECT_SHUTTING_DOWN, NULL);
    }
    close_all_connections(srv);
    list_for_each_safe(pos, tmp, &srv->rt.fleet.models)
    {
        struct model *m = container_of(pos, struct model, node);
        for (size_t i = 0; i < m->n_endpoints; i++) {
            upstream_close_idle(m->endpoints[i]);
        }
    }
    struct backend *backends[] = {srv->static_backend, srv->process_backend, srv->k8s_backend};
    for (size_t i = 0; i < 3; i++) {
        if (backends[i]) {
            backends[i]->ops->stop(backends[i]);
        }
    }
    fleet_dispose(&srv->rt.fleet);
    for (size_t i = 0; i < 3; i++) {
        if (backends[i]) {
            backends[i]->ops->free(backends[i]);
        }
    }
    runtime_dispose(&srv->rt);
    listener_close(&srv->proxy_l);
    listener_close(&srv->admin_l);
    if (srv->sig_term) {
        event_free(srv->sig_term);
    }
    if (srv->sig_int) {
        event_free(srv->sig_int);
    }
    if (srv->sig_hup) {
        event_free(srv->sig_hup);
    }
    if (srv->drain_timer) {
        event_free(srv->drain_timer);
    }
    if (srv->accept_resume) {
        event_free(srv->accept_resume);
    }
    if (srv->rt.base) {
        event_base_free(srv->rt.base);
    }
    config_free(srv->rt.cfg);
}

static bool has_command(const struct config *cfg)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        if (cfg->models[i].n_command) {
            return true;
        }
    }
    return false;
}

static void on_process_started(void *ud, struct backend *b)
{
    struct server *srv = ud;
    server_started_fn done = srv->process_started;
    srv->process_starting = NULL;
    srv->process_started = NULL;
    if (!b) {
        LOGE("cannot start the process backend (see the lines above)", NULL);
    } else {
        srv->process_backend = b;
        if (srv->rt.net.draining && b->ops->draining) {
            b->ops->draining(b);
        }
    }
    done(srv, b != NULL);
}

int server_start_process_backend(struct server *srv, const struct config *wanted,
                                 const struct config *cfg, server_started_fn done)
{
    if (srv->process_backend || !has_command(wanted)) {
        return 0;
    }
    if (cfg->gpu_discovery && done) {
        /* The loop keeps serving while the discovery command runs. */
        srv->process_starting =
            backend_process_start(&srv->rt.fleet, srv->rt.base, cfg, on_process_started, srv);
        if (!srv->process_starting) {
            LOGE("cannot start the process backend (see the lines above)", NULL);
            return -1;
        }
        srv->process_started = done;
        return 1;
    }
    srv->process_backend = backend_process_new(&srv->rt.fleet, srv->rt.base, cfg);
    if (!srv->process_backend) {
        LOGE("cannot start the process backend (see the lines above)", NULL);
        return -1;
    }
    return 0;
}

size_t server_backends(const struct server *srv, struct backend **out)
{
    struct backend *all[ADMIN_MAX_BACKENDS] = {srv->static_backend, srv->process_backend,
                                               srv->k8s_backend};
    size_t n = 0;
    for (size_t i = 0; i < ADMIN_MAX_BACKENDS; i++) {
        if (all[i]) {
            out[n++] = all[i];
        }
    }
    return n;
}

/* The top-level context: one per process, passed down to every module that
 * needs the event loop, limits, the fleet or the counters. */
#ifndef THAW_SERVER_H
#define THAW_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/config.h"
#include "thaw/http.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/model.h"
#include "thaw/queue.h"
#include "thaw/reload.h"
#include "thaw/request.h"

struct backend;

enum listener_kind { LISTENER_PROXY, LISTENER_ADMIN };

struct listener {
    struct server *srv;
    enum listener_kind kind;
    int fd;
    struct event ev;
    bool active;
    bool paused; /* out of file descriptors: not accepting for a moment */
    struct sockaddr_storage bound;
    socklen_t bound_len;
};

/* Read chunk size: every socket read goes into one shared buffer of this size
 * first, so idle connections hold no read buffer. */
#define SERVER_SCRATCH_BYTES (64 * 1024)
/* Client output above this pauses reading from the upstream (backpressure). */
#define CONN_OUT_HIGH_WATER (64 * 1024)
/* Pipelined bytes a busy connection may hold before thaw stops reading it. */
#define CONN_PIPELINE_MAX (64 * 1024)
/* Admin-port connections are few; they get their own small bound. Past it a
 * new admin connection is closed at once. */
#define SERVER_ADMIN_MAX_CONNECTIONS 256
/* Connections in their lingering close at most; past it they close at once. */
#define SERVER_MAX_LINGERING 1024
/* Idle request objects kept for reuse. */

struct upstream_handler;

struct server {
    struct event_base *base;
    const struct upstream_handler *up_handler; /* the proxy's, for upstream.c */
    struct config *cfg;
    struct fleet fleet;
    struct queue_global qglobal;
    struct backend *static_backend;
    struct backend *process_backend; /* NULL when no model has a command */
    struct backend *k8s_backend;     /* NULL without a "kubernetes" config object */
    const char *kubeconfig_flag;     /* --kubeconfig */
    struct listener proxy_l, admin_l;
    struct list_node conns;     /* all client connections */
    size_t n_conns;             /* proxy-port connections counted against the limit */
    struct list_node lingering; /* rejected connections being closed politely */
    size_t n_lingering;
    struct request_pool requests; /* request objects and what they count into */
    struct server_metrics metrics;
    uint64_t inflight; /* proxy requests accepted and not yet finished */
    /* Request body bytes held (reserved from Content-Length, or read so
     * far), against limits.max_buffered_body_bytes. */
    uint64_t buffered_body_bytes;
    char *scratch;
    struct http_limits req_limits, resp_limits, admin_limits;
    const struct timeval *tv_header, *tv_body, *tv_keepalive, *tv_send, *tv_linger;
    bool draining;
    bool drain_hard_stop;
    uint64_t drain_deadline_ms;
    bool ready;
    int exit_code;
    uint64_t started_ms;
    struct event *sig_term, *sig_int, *sig_hup, *drain_timer;
    struct reload_status reload;
    const char *port_file;
    size_t n_admin_conns;        /* admin-port connections */
    struct event *accept_resume; /* ends a pause of the listeners (EMFILE) */
    uint64_t fd_log_ms;          /* last "out of file descriptors" line */
    uint64_t fd_log_suppressed;  /* such lines not written since */
};


/* Sets up listeners, models and backends from cfg (which the server takes
 * over). 0, or -1 with the reason logged. */
int server_init(struct server *srv, struct config *cfg, const char *port_file,
                const char *kubeconfig_flag);
/* Ready to take traffic: started, backends synced, not draining. */
bool server_is_ready(struct server *srv);
/* Runs the loop until drained. Returns the process exit code. */
int server_run(struct server *srv);
void server_dispose(struct server *srv);
/* Starts a graceful drain (as SIGTERM does). */
void server_begin_drain(struct server *srv);
/* Called when a proxy request finishes; ends a drain when none are left. */

#define SERVER_MAX_BACKENDS 3
/* The backends in use (static, process, kubernetes: those that exist), for
 * code that reaches them only through backend_ops. Returns how many. */
size_t server_backends(const struct server *srv, struct backend **out);

#endif

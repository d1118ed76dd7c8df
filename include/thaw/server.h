/* The server: listeners, accept, signals, drain, and the wiring of the
 * runtime context (runtime.h) to the backends and the handlers. The only
 * module that names concrete backends and connection handlers. */
#ifndef THAW_SERVER_H
#define THAW_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/admin.h"
#include "thaw/config.h"
#include "thaw/list.h"
#include "thaw/log.h"
#include "thaw/reload.h"
#include "thaw/runtime.h"

struct backend;
struct backend_process_start;
struct server;

/* The process backend a reload asked for is running (ok), or could not
 * start (logged). */
typedef void (*server_started_fn)(struct server *srv, bool ok);

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

/* Admin-port connections are few; they get their own small bound. Past it a
 * new admin connection is closed at once. */
#define SERVER_ADMIN_MAX_CONNECTIONS 256

struct server {
    struct runtime rt; /* what the request path shares */
    struct admin_ctx admin;
    struct backend *static_backend;
    struct backend *process_backend; /* NULL when no model has a command */
    struct backend *k8s_backend;     /* NULL without a "kubernetes" config object */
    const char *kubeconfig_flag;     /* --kubeconfig */
    struct listener proxy_l, admin_l;
    bool drain_hard_stop;
    uint64_t drain_deadline_ms;
    bool ready;
    int exit_code;
    struct event *sig_term, *sig_int, *sig_hup, *drain_timer;
    const char *port_file;
    struct event *accept_resume; /* ends a pause of the listeners (EMFILE) */
    struct log_limit fd_log;     /* "out of file descriptors" lines */
    uint64_t fds_at_start;       /* descriptors open once started (server_apply_fd_budget) */
    /* The process backend while its GPU discovery runs on the loop, and
     * whom to tell when it ends. */
    struct backend_process_start *process_starting;
    server_started_fn process_started;
    /* A reload's file, loaded, waiting for that discovery (reload.c); and a
     * SIGHUP that came meanwhile: the file is read again after. */
    struct config *reload_waiting;
    bool reload_again;
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
/* Works out what the descriptor limit (RLIMIT_NOFILE) allows and applies it
 * to the configuration in force (runtime_set_fds): at the end of start-up
 * (before NULL: the descriptors open then are counted for the reserve) and
 * after a reload (before: the configuration replaced). Warns, once per
 * figure, when limits.max_connections is above what the limit allows. */
void server_apply_fd_budget(struct server *srv, const struct config *before);
/* Starts a graceful drain (as SIGTERM does). */
void server_begin_drain(struct server *srv);

/* The backends in use (static, process, kubernetes: those that exist), for
 * code that reaches them only through backend_ops. Returns how many. */
size_t server_backends(const struct server *srv, struct backend **out);
/* Starts the process backend, on the GPUs of cfg (the configuration in
 * force), if `wanted` has a model with a command and none runs yet. 0:
 * running (or not wanted); -1: it could not start (logged). With "gpus":
 * "discover" and done given (a reload, the loop running), the discovery
 * command runs on the loop: 1, and done is called when it has ended (not
 * if the server is disposed of first). done NULL: it waits (start-up). */
int server_start_process_backend(struct server *srv, const struct config *wanted,
                                 const struct config *cfg, server_started_fn done);

#endif

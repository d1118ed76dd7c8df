/* A Kubernetes API client on libcurl's multi interface, driven by the
 * libevent loop: no call blocks. Requests complete through a callback;
 * watches deliver one JSON line at a time. The bearer token is read from
 * its file when the client starts and again every minute (service-account
 * tokens rotate). The client owns its calls; a call is freed after its
 * completion callback returns, or by k8s_call_cancel (then no callback). */
#ifndef THAW_K8S_CLIENT_H
#define THAW_K8S_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "thaw/k8s/auth.h"

struct k8s_client;
struct k8s_call;

/* status: the HTTP status (0 when the transfer failed: see err). body is the
 * response (requests) or NULL (watches). */
typedef void (*k8s_done_cb)(void *ud, long status, const char *body, size_t len,
                            const char *err);
/* One watch event line. Return non-zero to end the watch (its done callback
 * then runs with err "stopped"). */
typedef int (*k8s_line_cb)(void *ud, const char *line, size_t len);

struct k8s_client_stats {
    uint64_t requests, errors, watches;
};

/* Takes over auth. NULL on failure (err set). */
struct k8s_client *k8s_client_new(struct event_base *base, struct k8s_auth *auth, char *err,
                                  size_t errlen);
void k8s_client_free(struct k8s_client *c);
const struct k8s_auth *k8s_client_auth(const struct k8s_client *c);
const struct k8s_client_stats *k8s_client_stats(const struct k8s_client *c);

/* path includes the query; an absolute "http://..." URL goes to that host
 * without the API credentials (peer activators). body may be NULL.
 * timeout_ms 0: 30 s. */
struct k8s_call *k8s_request(struct k8s_client *c, const char *method, const char *path,
                             const char *content_type, const char *body, size_t body_len,
                             long timeout_ms, k8s_done_cb done, void *ud);
/* A streaming GET; ends when the server ends it, on error, or when line
 * returns non-zero. idle_timeout_ms: no byte for that long ends it. */
struct k8s_call *k8s_watch(struct k8s_client *c, const char *path, long idle_timeout_ms,
                           k8s_line_cb line, k8s_done_cb done, void *ud);
void k8s_call_cancel(struct k8s_call *call);

/* Backoff before retry number `failures` (1-based): 250 ms doubling to a
 * 30 s cap, with up to ±50% jitter from `rand01` in [0,1). Pure. */
uint64_t k8s_backoff_ms(unsigned failures, double rand01);

#endif

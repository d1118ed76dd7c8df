/* One-shot control requests to a replica (a model server's own admin
 * endpoints, such as vLLM's POST /sleep, POST /wake_up and GET
 * /is_sleeping), on the event loop: connect, send one request with no body,
 * read the answer, call back once with its status, close. Of the body only
 * its first CONTROL_BODY_KEPT bytes are kept (control_body).
 *
 * Embedded in its owner (control_init); control_cancel stops it without a
 * callback. The owner outlives it. */
#ifndef THAW_CONTROL_H
#define THAW_CONTROL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"
#include "thaw/http.h"
#include "thaw/log.h"

struct control;
#define CONTROL_BODY_KEPT 256
/* status: the answer's HTTP status, or a negative errno (-ETIMEDOUT,
 * -ECONNREFUSED, -EPROTO for a malformed answer). The request is over by
 * then; the callback may start another on the same struct. */
typedef void (*control_done_cb)(struct control *c, int status, void *ud);

struct control {
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host[64];
    char request[384];
    size_t request_len;
    control_done_cb done;
    void *ud;
    struct event io;
    int fd;
    bool sent;
    bool running;
    unsigned interim; /* 1xx answers skipped */
    char body[CONTROL_BODY_KEPT]; /* the answer's first body bytes */
    size_t body_len;
    uint64_t deadline_ms;
    struct http_parser parser;
    struct http_head head;
    struct log_limit fd_log; /* "no socket for a replica control request" lines */
};

void control_init(struct control *c, struct event_base *base);
/* Sends `method path` (path with its query, e.g. "/sleep?level=1") to addr
 * ("ip:port") and calls done within timeout_ms. 0, or -EINVAL (bad address
 * or path too long), -EBUSY (one is running) or a socket error; on an error
 * done is not called. */
int control_send(struct control *c, const char *addr, const char *method, const char *path,
                 uint64_t timeout_ms, control_done_cb done, void *ud);
/* In the callback: the first bytes of the answer's body (at most
 * CONTROL_BODY_KEPT; more were dropped). */
const char *control_body(const struct control *c, size_t *len);
/* Stops a running request; done is not called. */
void control_cancel(struct control *c);
bool control_running(const struct control *c);

#endif

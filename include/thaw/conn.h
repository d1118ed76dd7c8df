/* Client connections: non-blocking socket I/O and the server side of
 * HTTP/1.1 (keep-alive, pipelining in order, 100-continue, limits and
 * timeouts). A connection carries at most one request at a time; bytes of
 * pipelined requests wait, unparsed, until the current one is answered.
 *
 * Output goes straight to the socket when it can; what does not fit is kept
 * in `out` and sent when the socket is writable. Producers watch
 * conn_out_pending() against CONN_OUT_HIGH_WATER and get on_drain callbacks
 * (backpressure). The server owns connections; a connection owns its
 * current request. */
#ifndef THAW_CONN_H
#define THAW_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"
#include "thaw/http.h"
#include "thaw/list.h"
#include "thaw/metrics.h"
#include "thaw/server.h"

struct request;
struct conn;

/* What a listener does with the requests its connections carry: conn calls
 * up only through these (set per listener), never a module by name. */
struct conn_handler {
    /* A request begins (its first byte arrived). NULL: nothing. */
    void (*on_start)(struct conn *c, struct request *r);
    /* The head is complete. REJECT_COUNT to go on, or a reason to reject
     * the request with. NULL: go on. */
    int (*on_head)(struct conn *c, struct request *r);
    /* More body arrived. false when the request was answered meanwhile.
     * NULL: nothing to do until it is complete. */
    bool (*on_body)(struct conn *c, struct request *r);
    /* The whole request is in: answer it, now or later. */
    void (*on_request)(struct conn *c, struct request *r);
    /* The connection goes away with r unanswered. */
    void (*on_abort)(struct conn *c, struct request *r, enum abort_reason reason);
    /* conn_reject answers r with reason: count it. NULL: not counted. */
    void (*on_reject)(struct conn *c, struct request *r, enum reject_reason reason);
    /* Writes the error `body` inside a response already under way (a 200
     * event stream, say) and returns true; false: answer it normally. */
    bool (*reject_in_stream)(struct conn *c, struct request *r, const struct buf *body);
    /* Retry-After seconds for r's rejections. NULL: 1. */
    unsigned (*retry_after_s)(const struct request *r);
};

enum conn_state {
    CONN_IDLE,     /* between requests */
    CONN_READING,  /* a request's head or body is arriving */
    CONN_HANDLING, /* request complete; its response is being produced */
    CONN_CLOSING,  /* flushing the last output, then close */
};

struct conn {
    struct list_node node;
    struct server *srv;
    enum listener_kind kind; /* which limits and which connection count */
    const struct conn_handler *handler;
    int fd;
    enum conn_state state;
    struct event rev, wev, tev;
    struct http_parser parser;
    struct buf in;  /* unparsed input (pipelined or incomplete) */
    struct buf out; /* output not yet accepted by the socket */
    struct request *req;
    uint64_t requests_served;
    char peer_ip[48];
    bool close_after;  /* close once the current response is done */
    bool read_paused;
    bool wev_added;
    bool eof;           /* client closed its side */
    bool broken;        /* a write failed: closed from the write callback */
    bool first_request; /* nothing received yet on this connection */
    bool lingering;     /* counted in server.n_lingering */
    size_t *count; /* the connection count it is in (per port), decremented at close */
    bool body_total_armed;     /* the body timer is the total one, not the idle one */
    uint64_t body_deadline_ms; /* limits.body_total_timeout_ms from the head; 0: none */
    /* Called whenever `out` has drained below the high-water mark. */
    void (*on_drain)(struct conn *c);
};

/* Takes an accepted socket. Returns NULL (socket closed) on failure. */
struct conn *conn_new(struct server *srv, int fd, enum listener_kind kind,
                      const struct conn_handler *handler, const struct sockaddr *peer);
/* Closes at once; the current request (if any) is aborted with reason. */
void conn_close(struct conn *c, enum abort_reason reason);
/* Queues bytes for the client. 0, or -ENOMEM / -EPIPE (connection dead). */
int conn_write(struct conn *c, const void *data, size_t len);
/* The same for several pieces, in one system call when the socket takes them. */
int conn_writev(struct conn *c, const struct iovec *iov, int n);
size_t conn_out_pending(const struct conn *c);
/* The current response has been fully handed to conn_write. Frees the
 * request and carries on with the next pipelined one (or closes). */
void conn_response_done(struct conn *c);
/* Answers the current request with a complete response built by thaw. */
void conn_respond(struct conn *c, int status, const char *content_type, const char *body,
                  size_t body_len, const char *extra_headers);
/* Answers with the JSON error for reason (and counts it). */
void conn_reject(struct conn *c, enum reject_reason reason, const char *detail);
/* Drain: closes the connection if idle, else marks it to close after. */
void conn_drain(struct conn *c);
/* Starts the send timeout while output waits (streaming responses). */
void conn_touch_send_timer(struct conn *c);
/* Request bodies wait; stop/start reading the client while it is held. */
void conn_pause_reading(struct conn *c);

/* Builds the error body {"error":{...}} for reason into out. */
void conn_error_body(struct buf *out, enum reject_reason reason, const char *detail,
                     const char *model);

#endif

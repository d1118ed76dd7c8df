/* Client connections: non-blocking socket I/O and the server side of
 * HTTP/1.1 (keep-alive, pipelining in order, 100-continue, limits and
 * timeouts). A connection carries at most one request at a time; bytes of
 * pipelined requests wait, unparsed, until the current one is answered.
 *
 * Output goes straight to the socket when it can; what does not fit is kept
 * in `out` and sent when the socket is writable. Producers watch
 * conn_out_pending() against CONN_OUT_HIGH_WATER and get on_drain callbacks
 * (backpressure). The server owns connections; a connection owns its
 * current exchange, which its handler allocates (embedded in its own request
 * object) and which conn sees only as a struct exchange: conn names no
 * module above it. */
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
#include "thaw/netaddr.h"

struct conn;

/* Read chunk size: every socket read goes into one shared buffer of this size
 * first, so idle connections hold no read buffer. */
#define CONN_SCRATCH_BYTES (64 * 1024)
/* Client output above this pauses reading from the upstream (backpressure). */
#define CONN_OUT_HIGH_WATER (64 * 1024)
/* What one connection may read in one turn of the loop before the others
 * get theirs (it goes on in the next turn). */
#define CONN_READ_BUDGET (4 * CONN_SCRATCH_BYTES)
/* Pipelined bytes a busy connection may hold before thaw stops reading it. */
#define CONN_PIPELINE_MAX (64 * 1024)
/* Connections in their lingering close at most; past it they close at once. */
#define CONN_MAX_LINGERING 1024

/* What every client connection shares (one per process, set up by the
 * server): the loop, the read buffer, the timeouts, and the list of
 * connections. */
struct conn_ctx {
    struct event_base *base;
    char *scratch; /* CONN_SCRATCH_BYTES */
    /* limits.header_, keepalive_, send_, body_ and body_total_timeout_ms;
     * linger_ms: how long a closing connection discards input */
    uint64_t header_timeout_ms, keepalive_timeout_ms, send_timeout_ms, linger_ms;
    uint64_t body_timeout_ms, body_total_timeout_ms;
    struct list_node conns; /* every client connection */
    size_t n_lingering;     /* connections in their lingering close */
    bool draining;          /* connections close after their current response */
};

/* Where an exchange stands; the handler moves it through the middle states,
 * conn needs to know only whether the request is still being read and
 * whether an answer is under way. */
enum exchange_state {
    REQ_READING,
    REQ_ROUTED,   /* complete, being placed */
    REQ_QUEUED,
    REQ_UPSTREAM, /* at a replica */
    REQ_ANSWERED, /* an answer is being (or has been) written */
};

/* One HTTP request on a connection, as far as the transport is concerned:
 * its head and body as parsed and where its answer stands. The handler's
 * request object embeds it. */
struct exchange {
    struct http_head head;
    struct buf body;
    enum exchange_state state;
    bool response_started; /* response bytes went to the client */
    bool committed;        /* part of the request left for a replica */
    const char *error_model; /* the model thaw's error bodies name; NULL: none */
};

/* What a listener does with the requests its connections carry: conn calls
 * up only through these (set per listener), never a module by name. */
struct conn_handler {
    /* A request begins (its first byte arrived): a new exchange for it, or
     * NULL when out of memory (the connection closes). */
    struct exchange *(*new_exchange)(struct conn *c);
    /* The exchange is over (answered or aborted): free it. */
    void (*free_exchange)(struct conn *c, struct exchange *x);
    /* A request begins. NULL: nothing. */
    void (*on_start)(struct conn *c, struct exchange *x);
    /* The head is complete. REJECT_COUNT to go on, or a reason to reject
     * the request with. NULL: go on. */
    int (*on_head)(struct conn *c, struct exchange *x);
    /* More body arrived. false when the request was answered meanwhile.
     * NULL: nothing to do until it is complete. */
    bool (*on_body)(struct conn *c, struct exchange *x);
    /* The whole request is in: answer it, now or later. */
    void (*on_request)(struct conn *c, struct exchange *x);
    /* The connection goes away with r unanswered. */
    void (*on_abort)(struct conn *c, struct exchange *x, enum abort_reason reason);
    /* conn_reject answers r with reason: count it. NULL: not counted. */
    void (*on_reject)(struct conn *c, struct exchange *x, enum reject_reason reason);
    /* Writes the error for reason inside a response already under way (a
     * 200 event stream, say) and returns true; false: answer it normally. */
    bool (*reject_in_stream)(struct conn *c, struct exchange *x, enum reject_reason reason,
                             const char *detail);
    /* Retry-After seconds for r's rejections. NULL: 1. */
    unsigned (*retry_after_s)(const struct exchange *x);
};

enum conn_state {
    CONN_IDLE,     /* between requests */
    CONN_READING,  /* a request's head or body is arriving */
    CONN_HANDLING, /* request complete; its response is being produced */
    CONN_CLOSING,  /* flushing the last output, then close */
};

struct conn {
    struct list_node node;
    struct conn_ctx *ctx;
    const struct conn_handler *handler;
    void *ud; /* the handler's context */
    int fd;
    enum conn_state state;
    struct event rev, wev, tev;
    struct http_parser parser;
    struct buf in;  /* unparsed input (pipelined or incomplete) */
    struct buf out; /* output not yet accepted by the socket */
    struct exchange *ex; /* the current request, NULL between requests */
    uint64_t requests_served;
    char peer_ip[NETADDR_TEXT_MAX];
    bool close_after;  /* close once the current response is done */
    bool read_paused;
    bool wev_added;
    bool eof;           /* client closed its side */
    bool broken;        /* a write failed: closed from the write callback */
    bool first_request; /* nothing received yet on this connection */
    bool lingering;     /* counted in ctx->n_lingering */
    /* The request read last was read whole and asked to close the
     * connection (Connection: close, or HTTP/1.0 without keep-alive). */
    bool asked_close;
    /* The handler refused the head of a request whose short body had all
     * arrived with it: the refusal is answered at the body's end, so the
     * connection stays in step and open (see on_head). */
    bool refusal_held;
    int held_reason; /* enum reject_reason */
    size_t *count; /* the connection count it is in (per port), decremented at close */
    bool body_total_armed;     /* the body timer is the total one, not the idle one */
    /* The timer is lazy (as an upstream's): deadline_ms is when the current
     * timeout passes (0: none), timer_at_ms when tev fires (0: not armed),
     * never later than the deadline; a later deadline is only stored. */
    uint64_t deadline_ms, timer_at_ms;
    /* Bytes in the socket's send queue when output began to wait, or at the
     * last send timeout: a client that reads, however slowly, shrinks it
     * even when the kernel reports no room for more (see on_timer). */
    int send_queue;
    uint64_t body_deadline_ms; /* limits.body_total_timeout_ms from the head; 0: none */
    /* Called whenever `out` has drained below the high-water mark. */
    void (*on_drain)(struct conn *c);
    void *drain_ud; /* for on_drain */
};

/* The event flags for a socket on base: edge-triggered (reads with
 * EV_CLOSED) where the backend has both (epoll), so a socket read until it
 * is drained is not looked at again by the next poll; level-triggered
 * otherwise. A socket's read and write events share one epoll entry, whose
 * last change decides the trigger for both: both are edge-triggered, or a
 * write event added or removed would turn the reads level-triggered for the
 * rest of the connection. A reader goes on until a short read (or, after
 * EV_CLOSED, until EOF) and writers write until EAGAIN or empty, which is
 * right under either registration. */
short conn_read_events(struct event_base *base);
short conn_write_events(struct event_base *base);

/* Takes an accepted socket. Requests are parsed within lim and handed to
 * handler (with ud, its context). Returns NULL (socket closed) on failure. */
struct conn *conn_new(struct conn_ctx *ctx, int fd, const struct http_limits *lim,
                      const struct conn_handler *handler, void *ud,
                      const struct sockaddr *peer);
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

/* thaw's error bodies are OpenAI's shape:
 *   {"error":{"message":...,"type":...,"param":...,"code":...}}
 * with "status" added when status is not 0 (an error inside an event stream,
 * where the HTTP status already went out as 200). param and code may be NULL
 * (JSON null). */
void conn_error_json(struct buf *out, const char *message, size_t message_len, const char *type,
                     const char *param, const char *code, int status);
/* OpenAI's error type for an HTTP status: invalid_request_error (4xx) or
 * server_error (5xx). */
const char *conn_error_type(int status);
/* The error body for reason: its message (with detail, and model, the
 * model asked for, when not NULL), type by status, code thaw's reason name
 * (reject_info()->name), param "model" when the model named is at fault;
 * with_status adds the status. */
void conn_error_body(struct buf *out, enum reject_reason reason, const char *detail,
                     const char *model, bool with_status);

#endif

/* Connections to replicas: a keep-alive pool per endpoint, the request sent
 * (head + buffered body, one writev), and the response streamed back to the
 * client as it arrives, with backpressure: when the client's output passes
 * CONN_OUT_HIGH_WATER, reading from the replica stops until it drains.
 * Bodies pass through byte for byte (Content-Length and chunked alike);
 * close-delimited bodies are re-framed as chunked for HTTP/1.1 clients.
 * An upstream connection belongs to its endpoint's pool when idle and to
 * one request while busy; it holds a reference on its endpoint. A new one
 * feeds its endpoint's accept window (endpoint.h): its connect, a connect
 * that stalls and is made again, its first answer, and the accept checks
 * sent from here. */
#ifndef THAW_UPSTREAM_H
#define THAW_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"
#include "thaw/conn.h"
#include "thaw/endpoint.h"
#include "thaw/http.h"
#include "thaw/list.h"
#include "thaw/log.h"
#include "thaw/metrics.h"

struct model; /* the owner of an endpoint: opaque here */
struct upstream;
struct upstream_ctx;

/* What upstream needs of a request it carries: the client's exchange and
 * connection, the head to send (built above), the timeouts that apply, and
 * the attempt's bookkeeping. The request object embeds it. */
struct upstream_req {
    struct exchange *ex;
    struct conn *conn;
    struct buf head;     /* the head sent to the replica */
    struct upstream *up; /* while at a replica */
    struct endpoint *last_ep;
    uint16_t tries;
    bool stale_retried; /* sent again once after a pooled connection failed */
    bool heartbeat; /* thaw sent a 200 event-stream head: the body continues it */
    uint64_t dispatch_ms;
    uint64_t connect_timeout_ms, first_byte_timeout_ms, idle_timeout_ms;
};

/* What an upstream connection reports, and to whom: the request path above
 * it gives these; upstream names no module above it. retry, done, failed
 * and client_gone are called after the upstream has let go of the request
 * (its slot is back), so the callee may answer or close the client freely. */
struct upstream_handler {
    /* Connecting failed before any byte was sent: try elsewhere. */
    void (*retry)(struct upstream_req *r);
    /* The response ended with this status; count it and finish r. */
    void (*done)(struct upstream_req *r, int status);
    /* The replica failed: before the response started, answer `reason`;
     * after, abort the client with `abort`. */
    void (*failed)(struct upstream_req *r, enum reject_reason reason, enum abort_reason abort);
    /* Writing to the client failed mid-response: the client left. */
    void (*client_gone)(struct upstream_req *r);
    /* The replica's response head goes to the client now (time to first byte). */
    void (*first_byte)(struct upstream_req *r, uint64_t now_ms);
    /* A request takes one of ep's slots. */
    void (*take_slot)(struct endpoint *ep);
    /* Gives it back: the owner whose waiting requests may now go (NULL when
     * the endpoint has no owner any more). */
    struct model *(*give_slot)(struct endpoint *ep);
    /* A slot of m came free: waiting requests may go. */
    void (*capacity)(void *ud, struct model *m);
    /* The replica answered an error status (not 2xx) to a request whose
     * client already has thaw's 200 event stream (heartbeat): its body (the
     * first UPSTREAM_STREAM_ERROR_MAX bytes, decoded) is not forwarded; this
     * writes the error into the stream and ends it, before done. Called
     * while the upstream still holds r: it only writes to the client. NULL:
     * the replica's body is forwarded into the stream as it is. */
    /* why: set when a 2xx cannot continue thaw's event stream (not an event
     * stream, or content-coded); the status is then the one to report. */
    void (*stream_error)(struct upstream_req *r, int status, const char *body, size_t len,
                         const char *why);
};

/* How much of a replica's error body is kept for stream_error. */
#define UPSTREAM_STREAM_ERROR_MAX (16 * 1024)

/* What every upstream connection shares (one per process). */
struct upstream_ctx {
    struct event_base *base;
    char *scratch; /* CONN_SCRATCH_BYTES, shared with the client side */
    const struct http_limits *resp_limits;
    const struct upstream_handler *handler;
    void *ud; /* handed to handler->capacity */
    struct server_metrics *metrics;
    const bool *draining; /* connections are not pooled while draining */
    /* The upstream settings in force (config.upstream). */
    uint32_t keepalive_per_endpoint;
    uint64_t keepalive_timeout_ms, eject_ms;
    /* Replica connections open (made, or adopted from a probe), and the
     * share of the descriptor budget they have (one per client connection
     * allowed; 0: no bound): at it, a new connection first closes the
     * longest-idle pooled one, whichever its replica. */
    size_t n_open, max_open;
    struct list_node pooled; /* every pooled connection, most recently pooled first */
    struct log_limit fd_log; /* "no socket for a replica connection" lines */
};

enum upstream_state {
    UP_CONNECTING,
    UP_SENDING,
    UP_WAITING,   /* request sent, no response head yet */
    UP_STREAMING, /* response head sent to the client */
    UP_IDLE,      /* in the pool */
};

struct upstream {
    struct list_node node;        /* in endpoint->idle while pooled */
    struct list_node pooled_node; /* in ctx->pooled while pooled */
    struct upstream_ctx *ctx;
    struct endpoint *ep;
    struct upstream_req *req;
    int fd;
    enum upstream_state state;
    struct event rev, wev, tev;
    struct http_parser parser;
    struct http_head head;
    struct buf resp_head; /* the head written to the client */
    size_t sent; /* bytes of head+body written */
    bool body_dropped; /* the replica answered and stopped taking the request's body */
    uint64_t served;
    int busy;
    bool dead;
    bool reused;
    bool got_bytes;     /* the replica sent something for the current request */
    uint32_t server_keepalive_ms; /* from its Keep-Alive: timeout=N, 0 if never said */
    bool server_no_keepalive;     /* it said timeout=0 */
    uint64_t sent_ms;             /* when the request was handed to it */
    uint64_t idle_since_ms;       /* when it was last pooled */
    bool reading_drained; /* taking the bytes of a read that emptied the socket,
                             no close flagged */
    bool reading_fin;     /* ... of a read the replica's FIN came with: not pooled */
    bool resumed;         /* the next on_read was started by the client's drain */
    bool pooled_drained;  /* pooled by such a read (see take_pooled) */
    /* The timer is lazy: deadline_ms is when the connection times out (0:
     * never), timer_at_ms when tev fires (0: not armed), never later than
     * the deadline. Moving the deadline later (each read of a stream) is a
     * store; the timer re-arms itself for what is left when it fires early. */
    uint64_t deadline_ms, timer_at_ms;
    uint64_t heard_ms; /* when the timeout was last pushed back (activity) */
    bool reading_paused;
    bool decode_body;  /* forward decoded body bytes (not raw framing) */
    bool rechunk;      /* ... wrapped in chunked framing */
    bool client_close; /* the client connection closes after this response */
    bool client_failed; /* a write to the client failed while decoding */
    bool head_pending;  /* resp_head not yet written */
    struct accept_slot acc;       /* new: its place in the replica's accept window */
    uint64_t connect_deadline_ms; /* connecting: when it fails (connect_timeout_ms) */
    bool stream_error;  /* an error status into a heartbeat stream: body kept in err_body */
    const char *stream_why; /* a 2xx that cannot continue the heartbeat stream: why */
    struct buf err_body;
};

/* Sends r (its head already built) to ep over a pooled or new connection.
 * The request's slot on ep is taken here and given back when the upstream
 * lets go of r. */
void upstream_start(struct upstream_ctx *ctx, struct upstream_req *r, struct endpoint *ep);
/* Drops r's upstream connection and frees the slot, reporting nothing: the
 * client is gone, or thaw gives the request up (its caller answers it). */
void upstream_cancel(struct upstream *u);
/* Pools fd, an open connection to ep that is idle and cleanly between
 * answers (a readiness probe's), for the next request. Takes fd. */
void upstream_adopt(struct upstream_ctx *ctx, struct endpoint *ep, int fd);
/* Closes every pooled connection of ep. */
void upstream_close_idle(struct endpoint *ep);

#endif

/* Connections to replicas: a keep-alive pool per endpoint, the request sent
 * (head + buffered body, one writev), and the response streamed back to the
 * client as it arrives, with backpressure: when the client's output passes
 * CONN_OUT_HIGH_WATER, reading from the replica stops until it drains.
 * Bodies pass through byte for byte (Content-Length and chunked alike);
 * close-delimited bodies are re-framed as chunked for HTTP/1.1 clients.
 * An upstream connection belongs to its endpoint's pool when idle and to
 * one request while busy; it holds a reference on its endpoint. */
#ifndef THAW_UPSTREAM_H
#define THAW_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"
#include "thaw/conn.h"
#include "thaw/control.h"
#include "thaw/http.h"
#include "thaw/list.h"
#include "thaw/metrics.h"

struct model; /* the owner of an endpoint: opaque here */
struct upstream;
struct upstream_ctx;

/* A replica's address and connection pool. Its owner (a model) counts its
 * slots through the handler; upstream only holds references while it uses
 * the endpoint. Freed when the last reference is dropped. */
struct endpoint {
    struct model *model;    /* the owner; NULL once it let go */
    const char *model_name; /* the owner's name, for logs; NULL once gone */
    char *id;               /* the backend's name for the replica */
    char addr_text[64];     /* "ip:port", for logs and status */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    uint32_t inflight;
    /* Slots this activator may use here: its part of the model's
     * max_concurrency when several activators share the replica (the others
     * hold the rest). UINT32_MAX: all of them. */
    uint32_t share;
    uint32_t refs; /* in-flight requests + pooled connections + the owner's link */
    uint64_t ejected_until_ms;
    uint64_t requests;
    uint64_t connect_failures;
    struct list_node idle; /* pooled upstream connections */
    uint32_t n_idle;
    /* New connections the replica may not have accepted yet (connecting, or
     * established with no answer and not vouched for). At accept_window,
     * requests wait for a pooled connection or for one of these to be
     * accepted (see model_pick_endpoint). The window starts at
     * UPSTREAM_MAX_UNCONFIRMED; a connect that stalls (its SYN dropped: the
     * accept queue was full) shrinks it to what got in, and each acceptance
     * seen grows it by one again, up to the start. */
    uint32_t unconfirmed;
    uint32_t connecting; /* of those, connects not completed */
    uint32_t accept_window;
    uint64_t window_shrunk_ms; /* last shrink: once per UPSTREAM_CONNECT_STALL_MS */
    /* When a handshake here last took under UPSTREAM_CONNECT_FAST_MS (the
     * kernel's round-trip time of the connection, TCP_INFO): a connect
     * pending for a stall period is taken as dropped only while the path is
     * known fast (within UPSTREAM_FAST_PATH_KNOWN_MS); a slow one never
     * stalls. 0: never. */
    uint64_t fast_handshake_ms;
    bool one_queue; /* one accept queue behind the address (a replica, not a
                       load-balanced address): acceptance is inferred in order */
    /* Of those, the ones established (the handshake done), in that order
     * (struct upstream's accept_node). A replica takes connections from its
     * accept queue first in, first out: an answer on one of them, or on an
     * accept check opened after them, shows it accepted all established
     * before. The check is a connection of its own carrying one GET of
     * check_path, sent when the unconfirmed reach the cap, so that requests
     * that take long to answer do not hold the next ones back. */
    struct list_node accepting;
    struct list_node stalled; /* connects to make again when the window has room */
    uint32_t reissued;        /* connects made again, not completed yet */
    uint64_t established; /* connections established here so far: their order */
    struct control check;
    struct upstream_ctx *check_ctx; /* set once a check has run (check is initialised) */
    uint64_t check_upto;            /* the running check vouches for these */
    char check_path[128];           /* the replica's health path */
    /* A replica that just became ready gets its first request alone until
     * it answers it, or until this time (0: no head start): a model server
     * that meets a crowd of new connections at once sets them all up before
     * it reads the first request (Python's asyncio does), which delays the
     * request that waited longest by the whole crowd. */
    uint64_t head_start_until_ms;
};

/* How long the first request to a woken replica goes alone at most: about
 * what a server takes to answer a small request, far below a cold start. */
#define UPSTREAM_HEAD_START_MS 2

/* New connections to one replica that may wait unanswered at once: fewer
 * than the accept backlog of common model servers (Python's asyncio: 100),
 * so a thousand requests released onto a replica that just woke do not
 * overflow it (a dropped SYN costs a second). */
#define UPSTREAM_MAX_UNCONFIRMED 64

/* A connect not completed after this long, to a replica whose handshakes
 * take under UPSTREAM_CONNECT_FAST_MS, had its SYN dropped (a full accept
 * queue): it is made again at once when the window has room, rather than by
 * the kernel a second later (then 3, 7, 15 s). Where no handshake is known
 * to be that fast (a distant replica, or none completed yet), none is taken
 * as stalled. */
#define UPSTREAM_CONNECT_STALL_MS 30
#define UPSTREAM_CONNECT_FAST_MS 10
#define UPSTREAM_FAST_PATH_KNOWN_MS 60000
#define UPSTREAM_ACCEPT_WINDOW_MIN 2

/* How long an accept check waits for its answer: a replica slow to accept
 * answers it late, and the connections it vouches for wait as long. */
#define UPSTREAM_ACCEPT_CHECK_TIMEOUT_MS 5000

/* An endpoint for the replica `id` at numeric "ip:port" addr, with one
 * reference (the caller's). NULL: bad address or out of memory (errno). */
struct endpoint *endpoint_new(const char *id, const char *addr);
void endpoint_ref(struct endpoint *ep);
void endpoint_unref(struct endpoint *ep);

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
    void (*stream_error)(struct upstream_req *r, int status, const char *body, size_t len);
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
};

enum upstream_state {
    UP_CONNECTING,
    UP_SENDING,
    UP_WAITING,   /* request sent, no response head yet */
    UP_STREAMING, /* response head sent to the client */
    UP_IDLE,      /* in the pool */
};

struct upstream {
    struct list_node node; /* in endpoint->idle while pooled */
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
    uint64_t served;
    int busy;
    bool dead;
    bool reused;
    bool got_bytes;     /* the replica sent something for the current request */
    uint32_t server_keepalive_ms; /* from its Keep-Alive: timeout=N, 0 if never said */
    bool server_no_keepalive;     /* it said timeout=0 */
    uint64_t sent_ms;             /* when the request was handed to it */
    uint64_t idle_since_ms;       /* when it was last pooled */
    uint64_t idle_since_turn;     /* ... the loop turn's time then, in µs */
    /* The timer is lazy: deadline_ms is when the connection times out (0:
     * never), timer_at_ms when tev fires (0: not armed), never later than
     * the deadline. Moving the deadline later (each read of a stream) is a
     * store; the timer re-arms itself for what is left when it fires early. */
    uint64_t deadline_ms, timer_at_ms;
    bool reading_paused;
    bool decode_body;  /* forward decoded body bytes (not raw framing) */
    bool rechunk;      /* ... wrapped in chunked framing */
    bool client_close; /* the client connection closes after this response */
    bool client_failed; /* a write to the client failed while decoding */
    bool head_pending;  /* resp_head not yet written */
    bool unconfirmed;   /* new, and nothing received on it yet (ep->unconfirmed) */
    struct list_node accept_node; /* in ep->accepting (established, unconfirmed) or
                                     ep->stalled (connecting) */
    bool connecting;              /* counted in ep->connecting */
    bool reissued;                /* its connect was made again, within a stall period
                                     (ep->reissued) */
    uint64_t connect_started_ms;  /* its connect, or the last one made again */
    uint64_t established_seq;     /* its place in ep->established's order */
    uint64_t connect_deadline_ms; /* connecting: when it fails (connect_timeout_ms) */
    bool stream_error;  /* an error status into a heartbeat stream: body kept in err_body */
    struct buf err_body;
};

/* Sends r (its head already built) to ep over a pooled or new connection.
 * The request's slot on ep is taken here and given back when the upstream
 * lets go of r. */
void upstream_start(struct upstream_ctx *ctx, struct upstream_req *r, struct endpoint *ep);
/* The client is gone: drop r's upstream connection and free the slot. */
void upstream_cancel(struct upstream *u);
/* Pools fd, an open connection to ep that is idle and cleanly between
 * answers (a readiness probe's), for the next request. Takes fd. */
void upstream_adopt(struct upstream_ctx *ctx, struct endpoint *ep, int fd);
/* Closes every pooled connection of ep. */
void upstream_close_idle(struct endpoint *ep);

#endif

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

#include "thaw/http.h"
#include "thaw/list.h"
#include "thaw/model.h"

struct request;
struct server;

/* What an upstream connection reports, and to whom: the request path above
 * it gives these (server.up_handler); upstream names no module above it.
 * Each is called after the upstream has let go of the request (its slot is
 * back), so the callee may answer or close the client freely. */
struct upstream_handler {
    /* Connecting failed before any byte was sent: try elsewhere. */
    void (*retry)(struct request *r);
    /* The response ended with this status; count it and finish r. */
    void (*done)(struct request *r, int status);
    /* The replica failed: before the response started, answer `reason`;
     * after, abort the client with `abort`. */
    void (*failed)(struct request *r, enum reject_reason reason, enum abort_reason abort);
    /* Writing to the client failed mid-response: the client left. */
    void (*client_gone)(struct request *r);
    /* A slot of m came free: waiting requests may go. */
    void (*capacity)(struct server *srv, struct model *m);
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
    struct server *srv;
    struct endpoint *ep;
    struct request *req;
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
    bool reading_paused;
    bool decode_body;  /* forward decoded body bytes (not raw framing) */
    bool rechunk;      /* ... wrapped in chunked framing */
    bool client_close; /* the client connection closes after this response */
    bool client_failed; /* a write to the client failed while decoding */
    bool head_pending;  /* resp_head not yet written */
};

/* Sends r to ep over a pooled or new connection. The request's slot on ep is
 * taken here and given back when the upstream lets go of r. */
void upstream_start(struct server *srv, struct request *r, struct endpoint *ep);
/* The client is gone: drop r's upstream connection and free the slot. */
void upstream_cancel(struct upstream *u);
/* Closes every pooled connection of ep. */
void upstream_close_idle(struct endpoint *ep);

#endif

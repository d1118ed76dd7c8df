/* A replica's address as thaw's connections to it see it: the pool's list,
 * the slots its owner counts, and its accept window: how many new
 * connections it is sent before it has accepted the earlier ones, learnt
 * from what its listen queue does (first in, first out; SYNs past its
 * backlog dropped). The window's bookkeeping is here, pure; the sockets,
 * timers and accept checks that feed it are upstream's. */
#ifndef THAW_ENDPOINT_H
#define THAW_ENDPOINT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "thaw/control.h"
#include "thaw/list.h"

struct model; /* the owner of an endpoint: opaque here */
struct upstream_ctx;

/* How long the first request to a woken replica goes alone at most: about
 * what a server takes to answer a small request, far below a cold start. */
#define UPSTREAM_HEAD_START_MS 2

/* New connections to one replica that may wait unaccepted at once, to
 * start with: fewer than the accept backlog of common model servers
 * (Python's asyncio: 100), so a thousand requests released onto a replica
 * that just woke do not overflow it (a dropped SYN costs a second). */
#define ACCEPT_WINDOW_START 64
#define ACCEPT_WINDOW_MIN 2

/* A connect not completed after this long, to a replica whose handshakes
 * take under ACCEPT_FAST_HANDSHAKE_MS, had its SYN dropped (a full accept
 * queue): it is made again at once when the window has room, rather than by
 * the kernel a second later (then 3, 7, 15 s). Where no handshake is known
 * to be that fast (a distant replica, or none completed yet), none is taken
 * as stalled. */
#define ACCEPT_STALL_MS 30
#define ACCEPT_FAST_HANDSHAKE_MS 10
#define ACCEPT_FAST_PATH_KNOWN_MS 60000

/* A configured address (no one queue to infer from) takes a completed
 * handshake as the acceptance, except within this long of a stalled
 * connect: its queue overflowed, so new connections count again until
 * each one's own answer, as a replica's do without an accept check. */
#define ACCEPT_CAUTION_MS 10000

/* How long an accept check waits for its answer: a replica slow to accept
 * answers it late, and the connections it vouches for wait as long. */
#define ACCEPT_CHECK_TIMEOUT_MS 5000
/* A check that got no answer (refused, reset, timed out) is sent again this
 * much later while the window still wants one: nothing else would send it
 * while the window is full. */
#define ACCEPT_CHECK_RETRY_MS 100

/* One new connection's place in its replica's accept window (embedded in
 * the connection). */
struct accept_slot {
    struct list_node node; /* in ep->accepting (established) or ep->stalled (connecting) */
    uint64_t seq;          /* its place in the order connections were established here */
    uint64_t started_ms;   /* its connect, or the last one made again */
    bool unconfirmed;      /* counted in ep->unconfirmed */
    bool connecting;       /* counted in ep->connecting */
    bool remade;           /* made again, within a stall period (ep->remade) */
};

/* A replica's address and connection pool. Its owner (a model) counts its
 * slots through the upstream handler; connections only hold references while
 * they use the endpoint. Freed when the last reference is dropped. */
struct endpoint {
    struct model *model; /* the owner; NULL once it let go */
    /* The owner it left with requests still running here (draining): a
     * reference, held until they end, so that they still count as its load
     * (model_demand). */
    struct model *left;
    char model_name[300]; /* the owner's name, for logs; kept once it let go
                             (requests still running there log it) */
    char *id;             /* the backend's name for the replica */
    char addr_text[64];   /* "ip:port", for logs and status */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    uint32_t inflight;
    /* Slots this activator may use here: its part of the model's
     * max_concurrency when several activators share the replica (the others
     * hold the rest). UINT32_MAX: all of them. */
    uint32_t share;
    uint32_t refs; /* in-flight requests + pooled connections + the owner's link */
    uint64_t ejected_until_ms;
    /* Ejected because a connection broke mid-exchange (see upstream's
     * hold_until_alive): any answer to a check ends the ejection. */
    bool held_for_check;
    uint64_t requests;
    uint64_t connect_failures;
    struct list_node idle; /* pooled upstream connections */
    uint32_t n_idle;
    /* New connections the replica may not have accepted yet (connecting, or
     * established with no answer and not vouched for). At accept_window,
     * requests wait for a pooled connection or for one of these to be
     * accepted (see model_pick_endpoint). A connect that stalls shrinks the
     * window to what got into the queue; each acceptance seen while it is
     * full grows it by one again, up to ACCEPT_WINDOW_START. */
    uint32_t unconfirmed;
    uint32_t connecting; /* of those, connects not completed */
    uint32_t remade;     /* of those, made again and not completed yet */
    uint32_t accept_window;
    uint64_t window_shrunk_ms; /* last shrink: once per ACCEPT_STALL_MS */
    uint64_t stalled_ms;       /* the last stalled connect; 0: none */
    /* When a handshake here last took under ACCEPT_FAST_HANDSHAKE_MS (the
     * kernel's round-trip time): a pending connect is taken as dropped only
     * while the path is known fast. 0: never. */
    uint64_t fast_handshake_ms;
    /* One accept queue behind the address (a replica, not a configured
     * address that may be a load balancer's): acceptance is inferred in
     * order. A replica takes connections from its queue first in, first
     * out: an answer on one of them, or on an accept check opened after
     * them, shows it accepted all established before. Where false, a
     * completed handshake counts as accepted (accept_connected). */
    bool one_queue;
    struct list_node accepting; /* established, unconfirmed, in that order */
    struct list_node stalled;   /* connects to make again when the window has room */
    uint64_t established;       /* connections established here so far: their order */
    /* The accept check: a connection of its own carrying one GET of
     * check_path, sent when the window is full of established connections,
     * so that requests that take long to answer do not hold the next ones
     * back (run by upstream). */
    struct control check;
    struct upstream_ctx *check_ctx; /* set once a check has run (check is initialised) */
    struct event check_retry;       /* ... and this timer assigned */
    uint64_t check_upto;            /* the running check vouches for these */
    char check_path[128];           /* the replica's health path */
    /* A replica that just became ready gets its first request alone until
     * it answers it, or until this time (0: no head start): a model server
     * that meets a crowd of new connections at once sets them all up before
     * it reads the first request (Python's asyncio does), which delays the
     * request that waited longest by the whole crowd. */
    uint64_t head_start_until_ms;
};

/* An endpoint for the replica `id` at numeric "ip:port" addr, with one
 * reference (the caller's). NULL: bad address or out of memory (errno). */
struct endpoint *endpoint_new(const char *id, const char *addr);
void endpoint_ref(struct endpoint *ep);
void endpoint_unref(struct endpoint *ep);

/* A new connection: connected at once, or its connect under way. */
void accept_opened(struct endpoint *ep, struct accept_slot *s, bool connected, uint64_t now);
/* Its connect completed (fast: the kernel's round-trip time of the
 * handshake was under ACCEPT_FAST_HANDSHAKE_MS). Where the address may not
 * have one queue, that is all thaw learns of its acceptance, and it counts
 * as such unless a connect stalled within ACCEPT_CAUTION_MS: true, as
 * accept_vouched, when the window was full and has room now. */
bool accept_connected(struct endpoint *ep, struct accept_slot *s, bool fast, uint64_t now);
/* The connection is gone. */
void accept_forget(struct endpoint *ep, struct accept_slot *s);
/* The replica accepted s (NULL: none in particular) and, where the address
 * has one queue, every connection established here up to seq. true: the
 * window was full and has room now (waiting requests may go). */
bool accept_vouched(struct endpoint *ep, struct accept_slot *s, uint64_t seq);
/* Whether a connect pending for a stall period is taken as dropped. */
bool accept_path_fast(const struct endpoint *ep, uint64_t now);
/* s's connect stalled: the window shrinks to what got into the queue (once
 * per stall period). true: make it again now; false: it waits in
 * ep->stalled for room (accept_next_remake). */
bool accept_stalled(struct endpoint *ep, struct accept_slot *s, uint64_t now);
/* A stalled connect it would wait anyway (thaw could not make it again). */
void accept_wait(struct endpoint *ep, struct accept_slot *s);
/* The first stalled connect the window has room for, or NULL. */
struct accept_slot *accept_next_remake(const struct endpoint *ep);
/* s's connect was made again. */
void accept_remade(struct endpoint *ep, struct accept_slot *s, uint64_t now);
/* The window is full of established connections none of which has
 * answered, and no connect is under way but stalled ones: an accept check
 * would tell. */
bool accept_wants_check(const struct endpoint *ep);

#endif

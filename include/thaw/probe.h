/* Readiness probing: GET a health path on a replica until it answers 2xx,
 * on the event loop, so a replica is noticed within milliseconds of being
 * able to serve without hammering it while it loads.
 *
 * While the port refuses connections (a server that binds late), each probe
 * is a bare connect(): a refused connect costs the server nothing, so these
 * run tight. Once it accepts, each probe is one keep-alive GET on a fresh
 * connection (a server answering 503 while it loads), paced wider. With a
 * hint of when the replica should be ready (its model's last cold start),
 * probing is slow early and tight near that time (probe_next_delay_ms).
 *
 * The connection of the successful probe is kept, when its answer was cleanly
 * framed and the server keeps it open, for the owner to take
 * (probe_take_conn): the first request then goes out on a connection the
 * server has already accepted, with no connect or accept in its way.
 * Embedded in its owner (probe_init/probe_stop); the owner outlives it. */
#ifndef THAW_PROBE_H
#define THAW_PROBE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/buf.h"
#include "thaw/http.h"
#include "thaw/log.h"

struct probe;
/* Called once, when the replica answered 2xx; the probe is stopped by then. */
typedef void (*probe_ready_cb)(struct probe *p, void *ud);
/* Called once per probe_start, when the port first accepts a connection
 * (the server is listening; its health check may still fail). */
typedef void (*probe_listening_cb)(struct probe *p, void *ud);

struct probe {
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host[64]; /* Host header value */
    char path[128];
    probe_ready_cb ready;
    probe_listening_cb listening; /* optional: set after probe_init */
    /* Optional, set after probe_init: the replica's name for log lines (its
     * owner's string, which outlives the probe). */
    const char *replica;
    void *ud;
    struct event timer;
    struct event io;
    int fd;
    int kept_fd; /* the successful probe's connection, until taken; -1: none */
    unsigned attempt;
    struct http_parser parser;
    struct http_head head;
    bool sent;
    unsigned interim; /* 1xx answers skipped in this attempt */
    bool running;
    bool refused;          /* the last attempt found the port closed */
    uint64_t started_ms;   /* probe_start */
    uint64_t listening_ms; /* when the port first accepted since probe_start; 0: not yet */
    uint64_t expected_ms;  /* the replica should be ready this long after start; 0: unknown */
    uint64_t probes;       /* attempts (connects) */
    uint64_t http_probes;  /* of which GETs sent */
    struct log_limit fd_log; /* "no socket for a readiness probe" lines */
};

/* addr is numeric "ip:port" (see netaddr_parse). 0 or -EINVAL. */
int probe_init(struct probe *p, struct event_base *base, const char *addr, const char *path,
               probe_ready_cb ready, void *ud);
/* Starts probing now (again, after probe_stop). expected_ms: how long the
 * replica is expected to take to be ready (0: unknown). */
void probe_start(struct probe *p, uint64_t expected_ms);
/* Stops probing; closes any connection it holds (a kept one included). */
void probe_stop(struct probe *p);
/* The successful probe's open connection (the caller owns it from now on),
 * or -1 when there is none. */
int probe_take_conn(struct probe *p);

/* Delay before the next probe (pure). attempt: failed probes so far;
 * refused: the last one found the port closed (cheap: tight, 1 ms doubling
 * to 4 ms) rather than an answer other than 2xx (2 ms doubling to 20 ms);
 * elapsed_ms since the start and expected_ms (0: unknown): until 80% of the
 * expected time has passed, one probe every eighth of the remaining time,
 * 250 ms at most, then the tight schedule. */
uint32_t probe_next_delay_ms(unsigned attempt, bool refused, uint64_t elapsed_ms,
                             uint64_t expected_ms);
/* The schedule for answers other than 2xx with no hint: 2 ms doubling to a
 * 20 ms cap. */
uint32_t probe_delay_ms(unsigned attempt);

#endif

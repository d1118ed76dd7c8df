/* Readiness probing: GET a health path on a replica until it answers 2xx,
 * on the event loop, fast at first and backing off (probe_delay_ms),
 * so a replica is noticed within milliseconds of being able to serve.
 * Embedded in its owner (probe_init/probe_stop); the owner outlives it. */
#ifndef THAW_PROBE_H
#define THAW_PROBE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

struct probe;
/* Called once, when the replica answered 2xx; the probe is stopped by then. */
typedef void (*probe_ready_cb)(struct probe *p, void *ud);

struct probe {
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host[64]; /* Host header value */
    char path[128];
    probe_ready_cb ready;
    void *ud;
    struct event timer;
    struct event io;
    int fd;
    unsigned attempt;
    char buf[64];
    size_t len;
    bool sent;
    bool running;
    uint64_t probes;
};

/* addr is numeric "ip:port" (see netaddr_parse). 0 or -EINVAL. */
int probe_init(struct probe *p, struct event_base *base, const char *addr, const char *path,
               probe_ready_cb ready, void *ud);
/* Starts probing now (again, after probe_stop). */
void probe_start(struct probe *p);
void probe_stop(struct probe *p);

/* Readiness probe delay after `attempt` failed probes: starts at 2 ms and
 * doubles to a 20 ms cap, so a server that just came up is seen within
 * 20 ms while a 5-minute load costs ~50 probes a second on loopback. */
uint32_t probe_delay_ms(unsigned attempt);

#endif

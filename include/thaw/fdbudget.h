/* The file-descriptor budget: how many client connections the process's
 * descriptor limit (RLIMIT_NOFILE) leaves room for (pure).
 *
 * A proxied client connection may hold a replica connection as well, so a
 * client costs two descriptors (HAProxy derives its maxconn from the limit
 * this way; nginx counts upstream sockets within worker_connections). A
 * reserve stays free for everything else, so thaw cannot starve itself:
 *  - what is open when the budget is worked out (stdio, the loop and its
 *    signal pipe, the listeners, the Kubernetes client), counted;
 *  - FDBUDGET_RESERVE_FIXED for what comes and goes whatever the size:
 *    admin-port connections (liveness and readiness probes, scrapes, the
 *    peers' /demand), readiness probes and a replica start's output pipe
 *    and port pick, sleep-mode calls and replica health checks, Kubernetes
 *    API connections and credential plugins, the configuration file and
 *    name lookups of a reload, and connections refused at the limit (a 503
 *    and a lingering close each: at most max_refused at once);
 *  - limit / FDBUDGET_RESERVE_SHARE (about 3%) for what grows with the
 *    deployment: more replicas starting and running (each process replica
 *    keeps its output pipe), more refusals lingering, pooled replica
 *    connections beyond one per client. */
#ifndef THAW_FDBUDGET_H
#define THAW_FDBUDGET_H

#include <stdint.h>

#define FDBUDGET_RESERVE_FIXED 32
#define FDBUDGET_RESERVE_SHARE 32
/* Refused connections lingering at once: 8 + limit / 128, 1024 at most. */
#define FDBUDGET_REFUSED_FIXED 8
#define FDBUDGET_REFUSED_SHARE 128
#define FDBUDGET_REFUSED_MAX 1024

struct fdbudget {
    uint64_t limit;           /* the descriptor limit; 0: unknown, no budget */
    uint64_t in_use;          /* descriptors open when it was worked out */
    uint64_t reserve;         /* kept free of clients: in_use and the parts above */
    uint64_t max_connections; /* client connections the limit allows (at least 1) */
    uint64_t max_refused;     /* connections refused at the limit lingering at once */
};

/* Works out the budget of a limit with in_use descriptors open. */
void fdbudget_derive(struct fdbudget *b, uint64_t limit, uint64_t in_use);
/* The client connections in force: configured, or what the budget allows
 * when that is fewer (configured when the limit is unknown). */
uint64_t fdbudget_connections(const struct fdbudget *b, uint64_t configured);
/* The smallest descriptor limit whose budget (with b's in_use) allows
 * `connections` client connections: what to raise the limit to. */
uint64_t fdbudget_limit_for(const struct fdbudget *b, uint64_t connections);

#endif

/* Numeric socket addresses from text. A leaf: includes nothing of thaw's. */
#ifndef THAW_NETADDR_H
#define THAW_NETADDR_H

#include <stdbool.h>
#include <sys/socket.h>

/* Parses numeric "ip:port" / "[ip6]:port" ("localhost" is 127.0.0.1) into a
 * sockaddr. 0 or -EINVAL. */
int netaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len);

/* True when a connected TCP socket is connected to itself: a connect to a
 * loopback port in the ephemeral range that nothing listens on can be given
 * that very port as its source and complete a "simultaneous open" with
 * itself. Such a connection reaches no server. */
bool netaddr_self_connected(int fd);

#endif

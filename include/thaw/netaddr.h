/* Numeric socket addresses from text. A leaf: includes nothing of thaw's. */
#ifndef THAW_NETADDR_H
#define THAW_NETADDR_H

#include <stdbool.h>
#include <sys/socket.h>

/* Parses numeric "ip:port" / "[ip6]:port" ("localhost" is 127.0.0.1) into a
 * sockaddr. 0 or -EINVAL. */
int netaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len);

/* The address of sa as text ("192.0.2.7", "2001:db8::1"; "unknown" for
 * another family) into out, of at least NETADDR_TEXT_MAX bytes. IPv4 is
 * written by hand: glibc's inet_ntop goes through sprintf, and a client's
 * address is made into text on every accepted connection. */
#define NETADDR_TEXT_MAX 48
void netaddr_text(const struct sockaddr *sa, char *out);

/* True when a connected TCP socket is connected to itself: a connect to a
 * loopback port in the ephemeral range that nothing listens on can be given
 * that very port as its source and complete a "simultaneous open" with
 * itself. Such a connection reaches no server. */
bool netaddr_self_connected(int fd);

#endif

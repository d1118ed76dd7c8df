/* Numeric socket addresses from text. A leaf: includes nothing of thaw's. */
#ifndef THAW_NETADDR_H
#define THAW_NETADDR_H

#include <sys/socket.h>

/* Parses numeric "ip:port" / "[ip6]:port" ("localhost" is 127.0.0.1) into a
 * sockaddr. 0 or -EINVAL. */
int netaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len);

#endif

#include "thaw/netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

int netaddr_parse(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[128];
    const char *port;
    memset(ss, 0, sizeof *ss);
    if (text[0] == '[') {
        const char *rb = strchr(text, ']');
        if (!rb || rb[1] != ':' || (size_t)(rb - text - 1) >= sizeof host) {
            return -EINVAL;
        }
        memcpy(host, text + 1, (size_t)(rb - text - 1));
        host[rb - text - 1] = '\0';
        port = rb + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof host) {
            return -EINVAL;
        }
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (*end || !*port || p < 0 || p > 65535) {
        return -EINVAL;
    }
    if (strcmp(host, "localhost") == 0) {
        strcpy(host, "127.0.0.1");
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)p);
        *len = sizeof *s4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)p);
        *len = sizeof *s6;
        return 0;
    }
    return -EINVAL;
}

void netaddr_text(const struct sockaddr *sa, char *out)
{
    if (sa->sa_family == AF_INET) {
        const unsigned char *a =
            (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr.s_addr;
        char *p = out;
        for (int i = 0; i < 4; i++) {
            unsigned v = a[i];
            if (v >= 100) {
                *p++ = (char)('0' + v / 100);
            }
            if (v >= 10) {
                *p++ = (char)('0' + v / 10 % 10);
            }
            *p++ = (char)('0' + v % 10);
            *p++ = i < 3 ? '.' : '\0';
        }
    } else if (sa->sa_family != AF_INET6 ||
               !inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
                          NETADDR_TEXT_MAX)) {
        strcpy(out, "unknown");
    }
}

bool netaddr_self_connected(int fd)
{
    struct sockaddr_storage local, peer;
    socklen_t llen = sizeof local, plen = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &llen) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &plen) < 0) {
        return false;
    }
    return llen == plen && memcmp(&local, &peer, llen) == 0;
}

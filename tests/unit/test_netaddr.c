/* netaddr: numeric addresses from text, and telling a loopback connection
 * that reached a server from one that connected to itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include "thaw/netaddr.h"

static void test_parses_ipv4_ipv6_and_localhost(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    socklen_t len;
    assert_int_equal(netaddr_parse("127.0.0.1:8080", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 8080);
    assert_int_equal(netaddr_parse("[::1]:9", &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(netaddr_parse("localhost:1", &ss, &len), 0);
    assert_int_equal(((struct sockaddr_in *)&ss)->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
    assert_int_equal(netaddr_parse("127.0.0.1", &ss, &len), -EINVAL);
    assert_int_equal(netaddr_parse("127.0.0.1:65536", &ss, &len), -EINVAL);
    assert_int_equal(netaddr_parse("[::1:80", &ss, &len), -EINVAL);
    assert_int_equal(netaddr_parse("host.example:80", &ss, &len), -EINVAL);
}

/* A socket bound to a port and connected to that same port opens to itself,
 * as a connect to a free ephemeral port sometimes does by chance: a probe
 * must not take it for a server that listens. */
static void test_self_connected_socket_is_told_apart(void **state)
{
    (void)state;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int self = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(self >= 0);
    assert_int_equal(bind(self, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(self, (struct sockaddr *)&a, &len), 0);
    assert_int_equal(connect(self, (struct sockaddr *)&a, sizeof a), 0);
    assert_true(netaddr_self_connected(self));

    /* A real server's connection is not. */
    int lis = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in b = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    len = sizeof b;
    assert_int_equal(bind(lis, (struct sockaddr *)&b, sizeof b), 0);
    assert_int_equal(listen(lis, 1), 0);
    assert_int_equal(getsockname(lis, (struct sockaddr *)&b, &len), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&b, sizeof b), 0);
    assert_false(netaddr_self_connected(c));
    /* Nor is a socket that is not connected at all. */
    int idle = socket(AF_INET, SOCK_STREAM, 0);
    assert_false(netaddr_self_connected(idle));
    close(self);
    close(c);
    close(lis);
    close(idle);
}

/* The hand-written IPv4 text is inet_ntop's, byte for byte; IPv6 and other
 * families are covered too. */
static void test_address_text_matches_inet_ntop(void **state)
{
    (void)state;
    const uint32_t fixed[] = {0, 0xffffffffu, 0x7f000001u, 0x0a006409u, 0x01160b2cu, 0xc0000207u,
                              0x64000000u, 0x000a0064u};
    uint32_t x = 12345;
    for (int i = 0; i < 20000; i++) {
        uint32_t host;
        if (i < (int)(sizeof fixed / sizeof fixed[0])) {
            host = fixed[i];
        } else {
            x = x * 1103515245u + 12345u;
            host = x ^ (x >> 13) * 2654435761u;
        }
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(host)};
        char want[INET_ADDRSTRLEN], got[NETADDR_TEXT_MAX];
        inet_ntop(AF_INET, &a.sin_addr, want, sizeof want);
        netaddr_text((struct sockaddr *)&a, got);
        assert_string_equal(got, want);
    }
    struct sockaddr_in6 six = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "2001:db8::1", &six.sin6_addr);
    char got[NETADDR_TEXT_MAX];
    netaddr_text((struct sockaddr *)&six, got);
    assert_string_equal(got, "2001:db8::1");
    inet_pton(AF_INET6, "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", &six.sin6_addr);
    netaddr_text((struct sockaddr *)&six, got);
    assert_string_equal(got, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
    struct sockaddr other = {.sa_family = AF_UNIX};
    netaddr_text(&other, got);
    assert_string_equal(got, "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parses_ipv4_ipv6_and_localhost),
        cmocka_unit_test(test_self_connected_socket_is_told_apart),
        cmocka_unit_test(test_address_text_matches_inet_ntop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

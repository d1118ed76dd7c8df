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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parses_ipv4_ipv6_and_localhost),
        cmocka_unit_test(test_self_connected_socket_is_told_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The accept window's rules, without sockets: what a replica's listen queue
 * does to how many new connections it is sent at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "thaw/endpoint.h"

#define N 70

struct env {
    struct endpoint *ep;
    struct accept_slot s[N];
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->ep = endpoint_new("r0", "127.0.0.1:9");
    assert_non_null(e->ep);
    e->ep->one_queue = true;
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    for (int i = 0; i < N; i++) {
        accept_forget(e->ep, &e->s[i]);
    }
    /* Every count is back to zero once every connection is gone. */
    assert_int_equal(e->ep->unconfirmed, 0);
    assert_int_equal(e->ep->connecting, 0);
    assert_int_equal(e->ep->remade, 0);
    assert_true(list_empty(&e->ep->accepting) && list_empty(&e->ep->stalled));
    endpoint_unref(e->ep);
    free(e);
    return 0;
}

/* n connects under way at `now`; the first `in` of them complete fast. */
static void burst(struct env *e, int n, int in, uint64_t now)
{
    for (int i = 0; i < n; i++) {
        accept_opened(e->ep, &e->s[i], false, now);
    }
    for (int i = 0; i < in; i++) {
        accept_connected(e->ep, &e->s[i], true, now + 1);
    }
}

static void test_an_answer_vouches_for_the_connections_established_before_it(void **state)
{
    struct env *e = *state;
    burst(e, 10, 10, 1000);
    assert_int_equal(e->ep->unconfirmed, 10);
    /* The 4th answers: the replica took the first four from its queue. */
    accept_vouched(e->ep, &e->s[3], e->s[3].seq);
    assert_int_equal(e->ep->unconfirmed, 6);
    assert_false(e->s[0].unconfirmed || e->s[2].unconfirmed);
    assert_true(e->s[4].unconfirmed);
    /* Behind a load balancer (several queues) only the one that answered. */
    e->ep->one_queue = false;
    accept_vouched(e->ep, &e->s[8], e->s[8].seq);
    assert_int_equal(e->ep->unconfirmed, 5);
    assert_true(e->s[4].unconfirmed && e->s[7].unconfirmed && !e->s[8].unconfirmed);
}

static void test_a_full_queue_shrinks_the_window_to_what_got_in(void **state)
{
    struct env *e = *state;
    /* 64 connects at once onto a backlog of 5: six get in. */
    burst(e, ACCEPT_WINDOW_START, 6, 1000);
    assert_true(accept_path_fast(e->ep, 1031));
    uint64_t t = 1000 + ACCEPT_STALL_MS;
    /* The first stalled connect shrinks the window; no room to make it again. */
    assert_false(accept_stalled(e->ep, &e->s[6], t));
    assert_int_equal(e->ep->accept_window, 6);
    /* The others that stalled with it wait. */
    for (int i = 7; i < ACCEPT_WINDOW_START; i++) {
        assert_false(accept_stalled(e->ep, &e->s[i], t + 1));
    }
    assert_int_equal(e->ep->accept_window, 6);
    assert_null(accept_next_remake(e->ep));
    /* The replica takes two: the window grows by one (it was full), and
     * three stalled connects have room. */
    assert_false(accept_vouched(e->ep, &e->s[1], e->s[1].seq));
    assert_int_equal(e->ep->accept_window, 7);
    for (int k = 0; k < 3; k++) {
        struct accept_slot *s = accept_next_remake(e->ep);
        assert_ptr_equal(s, &e->s[6 + k]);
        accept_remade(e->ep, s, t + 2);
    }
    assert_null(accept_next_remake(e->ep));
    assert_int_equal(e->ep->remade, 3);
    /* Two get in; the third is lost again: it no longer counts as under
     * way, and waits for room (the queue is full again: six in it). */
    accept_connected(e->ep, &e->s[7], true, t + 3);
    accept_connected(e->ep, &e->s[8], true, t + 3);
    assert_int_equal(e->ep->remade, 1);
    assert_false(accept_stalled(e->ep, &e->s[6], t + 2 + ACCEPT_STALL_MS));
    assert_int_equal(e->ep->remade, 0);
    assert_int_equal(e->ep->accept_window, 6);
    assert_ptr_equal(list_first(&e->ep->stalled), &e->s[9].node);
}

static void test_a_slow_path_never_stalls(void **state)
{
    struct env *e = *state;
    assert_false(accept_path_fast(e->ep, 5000)); /* nothing known yet */
    accept_opened(e->ep, &e->s[0], false, 1000);
    accept_connected(e->ep, &e->s[0], false, 1040); /* a 40 ms handshake */
    assert_false(accept_path_fast(e->ep, 1100));
    accept_opened(e->ep, &e->s[1], false, 2000);
    accept_connected(e->ep, &e->s[1], true, 2001);
    assert_true(accept_path_fast(e->ep, 2100));
    assert_false(accept_path_fast(e->ep, 2001 + ACCEPT_FAST_PATH_KNOWN_MS));
}

static void test_an_accept_check_waits_for_the_connects_under_way(void **state)
{
    struct env *e = *state;
    burst(e, ACCEPT_WINDOW_START, 1, 1000);
    /* Full, but 63 connects still under way: a check now would vouch for one. */
    assert_false(accept_wants_check(e->ep));
    for (int i = 1; i < ACCEPT_WINDOW_START; i++) {
        accept_connected(e->ep, &e->s[i], true, 1002);
    }
    assert_true(accept_wants_check(e->ep));
    /* Its answer vouches for all 64, and the waiting requests may go. */
    assert_true(accept_vouched(e->ep, NULL, e->ep->established));
    assert_int_equal(e->ep->unconfirmed, 0);
    assert_false(accept_wants_check(e->ep));
}

static void test_the_connects_that_stalled_together_shrink_it_once(void **state)
{
    struct env *e = *state;
    burst(e, ACCEPT_WINDOW_START, 6, 1000);
    uint64_t t = 1000 + ACCEPT_STALL_MS;
    assert_false(accept_stalled(e->ep, &e->s[6], t));
    assert_int_equal(e->ep->accept_window, 6);
    /* One in the queue is gone (its client left): five in it, room for
     * one. Within the same stall period the window stays... */
    accept_forget(e->ep, &e->s[0]);
    assert_true(accept_stalled(e->ep, &e->s[7], t + 1));
    assert_int_equal(e->ep->accept_window, 6);
    /* ...a period later it follows the queue. */
    accept_stalled(e->ep, &e->s[8], t + ACCEPT_STALL_MS);
    assert_int_equal(e->ep->accept_window, 5);
}

static void test_the_window_never_shrinks_below_its_floor(void **state)
{
    struct env *e = *state;
    e->ep->fast_handshake_ms = 1000; /* the path is known fast */
    burst(e, 8, 0, 1000);           /* and none of these got in */
    assert_true(accept_stalled(e->ep, &e->s[0], 1000 + ACCEPT_STALL_MS));
    assert_int_equal(e->ep->accept_window, ACCEPT_WINDOW_MIN);
}

static void test_it_grows_only_while_it_holds_requests_back(void **state)
{
    struct env *e = *state;
    e->ep->accept_window = 6;
    for (int i = 0; i < 3; i++) {
        accept_opened(e->ep, &e->s[i], true, 1000); /* connected at once */
    }
    assert_int_equal(e->s[2].seq, 3);
    assert_ptr_equal(list_first(&e->ep->accepting), &e->s[0].node);
    /* Not full: an answer frees a place but opens nothing new. */
    assert_false(accept_vouched(e->ep, &e->s[0], e->s[0].seq));
    assert_int_equal(e->ep->accept_window, 6);
    for (int i = 3; i < 7; i++) {
        accept_opened(e->ep, &e->s[i], true, 1000);
    }
    /* Full (six unconfirmed): the next answer grows it and opens room. */
    assert_true(accept_vouched(e->ep, &e->s[1], e->s[1].seq));
    assert_int_equal(e->ep->accept_window, 7);
}

static void test_an_accept_check_while_connects_are_stalled(void **state)
{
    struct env *e = *state;
    burst(e, ACCEPT_WINDOW_START, 6, 1000);
    assert_false(accept_wants_check(e->ep)); /* connects under way, none stalled yet */
    accept_stalled(e->ep, &e->s[6], 1000 + ACCEPT_STALL_MS);
    /* Full with 58 connects that will not complete until there is room:
     * a check tells whether the six got in the replica's hands. */
    assert_true(accept_wants_check(e->ep));
    /* Behind a load balancer a check vouches for nothing: none is sent. */
    e->ep->one_queue = false;
    assert_false(accept_wants_check(e->ep));
}

static void test_a_configured_address_takes_a_handshake_as_the_acceptance(void **state)
{
    struct env *e = *state;
    e->ep->one_queue = false; /* maybe a load balancer: no order to infer from */
    for (int i = 0; i < ACCEPT_WINDOW_START; i++) {
        accept_opened(e->ep, &e->s[i], false, 1000);
    }
    assert_int_equal(e->ep->unconfirmed, ACCEPT_WINDOW_START); /* full: requests wait */
    /* A completed handshake leaves the window, whether or not an answer
     * ever comes: the window was full and has room now. */
    assert_true(accept_connected(e->ep, &e->s[0], true, 1001));
    assert_false(e->s[0].unconfirmed);
    assert_false(accept_connected(e->ep, &e->s[1], true, 1001)); /* it was not full */
    assert_int_equal(e->ep->unconfirmed, ACCEPT_WINDOW_START - 2);
    assert_true(list_empty(&e->ep->accepting));
    assert_false(accept_wants_check(e->ep));
    /* One connected at once is not counted at all. */
    accept_opened(e->ep, &e->s[ACCEPT_WINDOW_START], true, 1002);
    assert_false(e->s[ACCEPT_WINDOW_START].unconfirmed);
    assert_int_equal(e->ep->unconfirmed, ACCEPT_WINDOW_START - 2);
    /* A queue overflows all the same: nothing is known in it, so the window
     * shrinks to its floor, and as many connects go again at once. */
    uint64_t t = 1000 + ACCEPT_STALL_MS;
    assert_true(accept_stalled(e->ep, &e->s[2], t));
    assert_int_equal(e->ep->accept_window, ACCEPT_WINDOW_MIN);
    accept_remade(e->ep, &e->s[2], t);
    assert_true(accept_stalled(e->ep, &e->s[3], t));
    accept_remade(e->ep, &e->s[3], t);
    assert_false(accept_stalled(e->ep, &e->s[4], t));
    /* One gets in. A queue overflowed lately: it counts until it answers
     * (the server may be slow to accept), as on a replica's own address. */
    assert_false(accept_connected(e->ep, &e->s[2], true, t + 1));
    assert_true(e->s[2].unconfirmed);
    assert_null(accept_next_remake(e->ep));
    /* Its answer: the window grows, and one more may go again. */
    accept_vouched(e->ep, &e->s[2], e->s[2].seq);
    assert_int_equal(e->ep->accept_window, ACCEPT_WINDOW_MIN + 1);
    assert_ptr_equal(accept_next_remake(e->ep), &e->s[4]);
    /* Long after the stall a handshake is the acceptance again. */
    accept_connected(e->ep, &e->s[3], true, t + ACCEPT_CAUTION_MS);
    assert_false(e->s[3].unconfirmed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_an_answer_vouches_for_the_connections_established_before_it, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_full_queue_shrinks_the_window_to_what_got_in,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_slow_path_never_stalls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_accept_check_waits_for_the_connects_under_way,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_connects_that_stalled_together_shrink_it_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_window_never_shrinks_below_its_floor, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_it_grows_only_while_it_holds_requests_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_an_accept_check_while_connects_are_stalled, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_a_configured_address_takes_a_handshake_as_the_acceptance, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

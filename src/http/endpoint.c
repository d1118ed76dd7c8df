#include "thaw/endpoint.h"
#include "thaw/log.h"
#include "thaw/netaddr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct endpoint *endpoint_new(const char *id, const char *addr)
{
    struct endpoint *ep = calloc(1, sizeof *ep);
    if (!ep) {
        return NULL;
    }
    if (netaddr_parse(addr, &ep->addr, &ep->addrlen)) {
        free(ep);
        errno = EINVAL;
        return NULL;
    }
    ep->id = strdup(id);
    if (!ep->id) {
        free(ep);
        errno = ENOMEM;
        return NULL;
    }
    snprintf(ep->addr_text, sizeof ep->addr_text, "%s", addr);
    snprintf(ep->check_path, sizeof ep->check_path, "/health");
    list_init(&ep->idle);
    list_init(&ep->accepting);
    list_init(&ep->stalled);
    ep->accept_window = ACCEPT_WINDOW_START;
    ep->refs = 1;
    return ep;
}

void endpoint_ref(struct endpoint *ep)
{
    ep->refs++;
}

void endpoint_unref(struct endpoint *ep)
{
    if (--ep->refs == 0) {
        if (ep->check_ctx) {
            control_cancel(&ep->check);
            event_del(&ep->check_retry);
        }
        free(ep->id);
        free(ep);
    }
}

static void unlink_slot(struct accept_slot *s)
{
    if (list_linked(&s->node)) {
        list_remove(&s->node);
    }
}

/* s's connect completed or was given up. */
static void connect_over(struct endpoint *ep, struct accept_slot *s)
{
    s->connecting = false;
    ep->connecting--;
    if (s->remade) {
        s->remade = false;
        ep->remade--;
    }
    unlink_slot(s); /* ep->stalled */
}

/* s no longer counts as a connection the replica may not have accepted. */
static void settle(struct endpoint *ep, struct accept_slot *s)
{
    s->unconfirmed = false;
    ep->unconfirmed--;
    unlink_slot(s);
}

static void established(struct endpoint *ep, struct accept_slot *s)
{
    s->seq = ++ep->established;
    list_push_back(&ep->accepting, &s->node);
}

void accept_opened(struct endpoint *ep, struct accept_slot *s, bool connected, uint64_t now)
{
    if (connected && !ep->one_queue) {
        return; /* in a listen queue already: all such an address tells */
    }
    s->unconfirmed = true;
    ep->unconfirmed++;
    if (connected) {
        established(ep, s);
    } else {
        s->connecting = true;
        ep->connecting++;
        s->started_ms = now;
    }
}

bool accept_connected(struct endpoint *ep, struct accept_slot *s, bool fast, uint64_t now)
{
    if (fast) {
        ep->fast_handshake_ms = now;
    }
    if (s->connecting) {
        connect_over(ep, s);
    }
    if (!s->unconfirmed) {
        return false;
    }
    if (ep->one_queue || (ep->stalled_ms && now - ep->stalled_ms < ACCEPT_CAUTION_MS)) {
        established(ep, s);
        return false;
    }
    /* An address that may be a load balancer's: which queue the connection
     * is in, and what the replica behind it has accepted, cannot be
     * inferred. A listener sends its SYN-ACK only while its queue has room,
     * so the handshake is taken as the acceptance: the window bounds the
     * connects under way, and answers that take long hold nothing back.
     * Once a connect stalls (a queue overflowed: a server slow to accept),
     * established connections count again until they answer, for a while. */
    return accept_vouched(ep, s, 0);
}

void accept_forget(struct endpoint *ep, struct accept_slot *s)
{
    if (s->connecting) {
        connect_over(ep, s);
    }
    if (s->unconfirmed) {
        settle(ep, s);
    }
}

/* Room for one more connect made again: those in the queue and those made
 * again and still under way are what the window holds. */
static bool has_room(const struct endpoint *ep)
{
    return ep->unconfirmed - ep->connecting + ep->remade < ep->accept_window;
}

bool accept_vouched(struct endpoint *ep, struct accept_slot *s, uint64_t seq)
{
    bool was_full = ep->unconfirmed >= ep->accept_window;
    if (s && s->unconfirmed) {
        settle(ep, s);
    }
    while (ep->one_queue && !list_empty(&ep->accepting)) {
        struct accept_slot *x = container_of(list_first(&ep->accepting), struct accept_slot, node);
        if (x->seq > seq) {
            break;
        }
        settle(ep, x);
    }
    if (was_full && ep->accept_window < ACCEPT_WINDOW_START) {
        ep->accept_window++; /* grown only while it is what holds requests back */
    }
    return was_full && ep->unconfirmed < ep->accept_window;
}

bool accept_path_fast(const struct endpoint *ep, uint64_t now)
{
    return ep->fast_handshake_ms && now - ep->fast_handshake_ms < ACCEPT_FAST_PATH_KNOWN_MS;
}

void accept_wait(struct endpoint *ep, struct accept_slot *s)
{
    if (!list_linked(&s->node)) {
        list_push_back(&ep->stalled, &s->node);
    }
}

bool accept_stalled(struct endpoint *ep, struct accept_slot *s, uint64_t now)
{
    uint32_t in_queue = ep->unconfirmed - ep->connecting;
    ep->stalled_ms = now;
    if (s->remade) {
        s->remade = false; /* made again and lost again: no longer under way */
        ep->remade--;
    }
    if (now - ep->window_shrunk_ms >= ACCEPT_STALL_MS) {
        /* The connects that stalled together shrink it once. */
        uint32_t w = in_queue > ACCEPT_WINDOW_MIN ? in_queue : ACCEPT_WINDOW_MIN;
        if (w < ep->accept_window) {
            LOGD("replica's accept queue full: fewer new connections at once",
                 "model=%s endpoint=%s window=%u", ep->model_name[0] ? ep->model_name : "-",
                 ep->addr_text, w);
            ep->accept_window = w;
            ep->window_shrunk_ms = now;
        }
    }
    if (has_room(ep)) {
        return true;
    }
    accept_wait(ep, s);
    return false;
}

struct accept_slot *accept_next_remake(const struct endpoint *ep)
{
    if (list_empty(&ep->stalled) || !has_room(ep)) {
        return NULL;
    }
    return container_of(list_first(&ep->stalled), struct accept_slot, node);
}

void accept_remade(struct endpoint *ep, struct accept_slot *s, uint64_t now)
{
    unlink_slot(s);
    if (!s->remade) {
        s->remade = true;
        ep->remade++;
    }
    s->started_ms = now;
}

bool accept_wants_check(const struct endpoint *ep)
{
    /* Once the connects under way have completed (a check opened before
     * them would vouch for few), or while some are stalled. */
    return ep->one_queue && ep->unconfirmed >= ep->accept_window &&
           !list_empty(&ep->accepting) && (ep->connecting == 0 || !list_empty(&ep->stalled));
}

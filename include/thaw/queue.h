/* A model's request queue: three tiers (critical, standard, batch), each
 * holding one FIFO per flow (a tenant; everything is flow 0 when no tenants
 * are configured).
 *
 * Service order across tiers ages: a tier's rank is the enqueue time of its
 * oldest waiting item + tier * aging_ms, and the smallest rank goes first, so
 * a batch request waiting longer than 2 * aging_ms beats a fresh critical one
 * and batch work never starves. Inside a tier the flows with waiting items
 * take turns (round robin, `weight` items per turn), so one flow's burst
 * cannot starve another's requests behind it; with one flow this is plain
 * FIFO. A flow may cap its items running at once (max_running, counted by the
 * caller with queue_flow_started/_finished): its items are skipped by
 * queue_peek/_pop while it is at the cap. Bounds: per queue, a shared global
 * total, and per flow (max_queued). A critical request arriving at a full
 * queue displaces the newest batch item of the longest batch FIFO (the caller
 * answers that one 503); at the global total, of the queue sharing it with
 * the most batch items. Deadlines: every item carries one;
 * queue_pop_expired returns those past it. Items are intrusive; the queue
 * owns none of them (it owns the flows it allocates: queue_dispose).
 * Pure: time comes in as arguments (milliseconds, any monotonic origin). */
#ifndef THAW_QUEUE_H
#define THAW_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/tier.h"
#include "thaw/list.h"

struct queue_item {
    struct list_node node;
    uint64_t enqueued_ms;
    uint64_t deadline_ms;
    enum tier tier;
    uint32_t flow; /* set by queue_push_flow (queue_push: 0) */
};

/* Shared by every queue: the global bound, and the queues that share it (a
 * critical item at the global bound may displace another queue's batch item).
 * A zeroed one with max_total set is ready to use. */
struct queue_global {
    size_t total;
    size_t max_total;
    struct list_node queues; /* struct queue.global_link */
};

struct queue_flow;

/* One flow's FIFO in one tier. */
struct queue_lane {
    struct list_node items;
    struct list_node link; /* in the tier's rotation while it has items */
    size_t len;
    uint32_t credit; /* items it may still give in its current turn */
    struct queue_flow *flow;
};

/* QUEUE_NO_CAP: no bound on a flow. */
#define QUEUE_NO_CAP UINT64_MAX

struct queue_flow {
    struct queue_lane lanes[TIER_COUNT];
    size_t queued;        /* items waiting, all tiers */
    uint64_t running;     /* items at a replica (the caller counts them) */
    uint32_t weight;      /* items per turn, >= 1 */
    uint64_t max_running; /* QUEUE_NO_CAP or a cap */
    uint64_t max_queued;  /* QUEUE_NO_CAP or a cap */
};

struct queue {
    /* Lanes with waiting items, per tier, in the order they take turns. */
    struct list_node rotation[TIER_COUNT];
    size_t len[TIER_COUNT];
    size_t count;
    size_t max;
    uint64_t aging_ms;
    struct queue_global *global;
    struct list_node global_link; /* in global->queues */
    struct queue_flow flow0;   /* the default flow, always there */
    struct queue_flow **flows; /* flows[i] for i >= 1, allocated on first use */
    uint32_t n_flows;          /* slots in flows (flows[0] unused) */
};

void queue_init(struct queue *q, size_t max, uint64_t aging_ms, struct queue_global *global);
/* Frees the flows queue_flow_set allocated and leaves the global bound's
 * queues; the queue must be empty. */
void queue_dispose(struct queue *q);
/* Gives an item its tier, enqueue time and deadline without queueing it: a
 * request sent straight to a replica carries them in case it comes back
 * (queue_push_front after a failed connect keeps them). */
void queue_item_stamp(struct queue_item *it, enum tier tier, uint64_t now_ms, uint64_t deadline_ms);
/* Creates flow id (if new) and sets its weight (0 counts as 1) and caps.
 * 0 or -ENOMEM. */
int queue_flow_set(struct queue *q, uint32_t id, uint32_t weight, uint64_t max_running,
                   uint64_t max_queued);
/* The flow with this id; NULL when it was never set (0 always exists). */
struct queue_flow *queue_flow(const struct queue *q, uint32_t id);
/* Waiting items that could start if replica slots were free: per flow, at
 * most the room below its max_running. Items of a flow at its cap are left
 * out: more replicas would not start them (what the autoscaler counts). */
size_t queue_runnable(const struct queue *q);
/* Whether an item of flow id may start now (below its max_running). */
bool queue_flow_may_run(const struct queue *q, uint32_t id);
/* The caller started (or finished) an item of flow id at a replica. */
void queue_flow_started(struct queue *q, uint32_t id);
void queue_flow_finished(struct queue *q, uint32_t id);
/* Adds it at the back of its tier in flow 0. Returns 0, or -ENOSPC when
 * full. When a critical item displaced a batch one to fit, *displaced is set
 * to that item (already removed; at the global bound it may be another
 * queue's), else NULL. */
int queue_push(struct queue *q, struct queue_item *it, enum tier tier, uint64_t now_ms,
               uint64_t deadline_ms, struct queue_item **displaced);
/* The same in flow `flow` (set before with queue_flow_set, else flow 0).
 * -EDQUOT when the flow holds max_queued items already (nothing displaced). */
int queue_push_flow(struct queue *q, struct queue_item *it, uint32_t flow, enum tier tier,
                    uint64_t now_ms, uint64_t deadline_ms, struct queue_item **displaced);
/* Puts a popped item back at the front of its flow in its tier (after a
 * failed connect), keeping its enqueue time and deadline; bounds are not
 * re-checked. */
void queue_push_front(struct queue *q, struct queue_item *it);
/* A shorter queue timeout applies to what waits too: each deadline becomes
 * at most enqueued + timeout_ms (never before now_ms), which keeps every
 * lane's deadlines in order. True when one moved. */
bool queue_cap_deadlines(struct queue *q, uint64_t timeout_ms, uint64_t now_ms);
/* The next item to serve, removed; NULL when nothing may run. */
struct queue_item *queue_pop(struct queue *q);
/* The item queue_pop would return, left in place. */
struct queue_item *queue_peek(const struct queue *q);
/* Any waiting item, caps ignored, removed; NULL when empty (to answer all). */
struct queue_item *queue_pop_any(struct queue *q);
void queue_remove(struct queue *q, struct queue_item *it);
/* One item whose deadline is <= now, removed; NULL when none. */
struct queue_item *queue_pop_expired(struct queue *q, uint64_t now_ms);
/* Earliest deadline of any item; UINT64_MAX when empty. */
uint64_t queue_next_deadline(const struct queue *q);
/* Age of the oldest item, 0 when empty. */
uint64_t queue_oldest_age(const struct queue *q, uint64_t now_ms);
/* Calls fn on every waiting item (fn must not change the queue). */
void queue_visit(const struct queue *q, void (*fn)(struct queue_item *it, void *ud), void *ud);

#endif

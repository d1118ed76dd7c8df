/* A model's request queue: three FIFO tiers (critical, standard, batch).
 *
 * Service order ages: an item's rank is enqueue_time + tier * aging_ms, and
 * the smallest rank goes first, so a batch request waiting longer than
 * 2 * aging_ms beats a fresh critical one and batch work never starves.
 * Bounds: per queue and a shared global total. A critical request arriving
 * at a full queue displaces the newest batch request (the caller answers that
 * one 503). Deadlines: every item carries one; queue_pop_expired returns
 * those past it. Items are intrusive; the queue owns none of them.
 * Pure: time comes in as arguments (milliseconds, any monotonic origin). */
#ifndef THAW_QUEUE_H
#define THAW_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "thaw/tier.h"
#include "thaw/list.h"

struct queue_item {
    struct list_node node;
    uint64_t enqueued_ms;
    uint64_t deadline_ms;
    enum tier tier;
};

/* Shared by every queue: the global bound. */
struct queue_global {
    size_t total;
    size_t max_total;
};

struct queue {
    struct list_node tiers[TIER_COUNT];
    size_t len[TIER_COUNT];
    size_t count;
    size_t max;
    uint64_t aging_ms;
    struct queue_global *global;
};

void queue_init(struct queue *q, size_t max, uint64_t aging_ms, struct queue_global *global);
/* Gives an item its tier, enqueue time and deadline without queueing it: a
 * request sent straight to a replica carries them in case it comes back
 * (queue_push_front after a failed connect keeps them). */
void queue_item_stamp(struct queue_item *it, enum tier tier, uint64_t now_ms,
                      uint64_t deadline_ms);
/* Adds it at the back of its tier. Returns 0, or -ENOSPC when full. When a
 * critical item displaced a batch one to fit, *displaced is set to that item
 * (already removed), else NULL. */
int queue_push(struct queue *q, struct queue_item *it, enum tier tier, uint64_t now_ms,
               uint64_t deadline_ms, struct queue_item **displaced);
/* Puts a popped item back at the front of its tier (after a failed connect),
 * keeping its enqueue time and deadline; bounds are not re-checked. */
void queue_push_front(struct queue *q, struct queue_item *it);
/* The next item to serve, removed; NULL when empty. */
struct queue_item *queue_pop(struct queue *q);
/* The item queue_pop would return, left in place. */
struct queue_item *queue_peek(const struct queue *q);
void queue_remove(struct queue *q, struct queue_item *it);
/* One item whose deadline is <= now, removed; NULL when none. */
struct queue_item *queue_pop_expired(struct queue *q, uint64_t now_ms);
/* Earliest deadline of any item; UINT64_MAX when empty. */
uint64_t queue_next_deadline(const struct queue *q);
/* Age of the oldest item, 0 when empty. */
uint64_t queue_oldest_age(const struct queue *q, uint64_t now_ms);

#endif

#include "thaw/queue.h"

#include <assert.h>
#include <errno.h>

void queue_init(struct queue *q, size_t max, uint64_t aging_ms, struct queue_global *global)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        list_init(&q->tiers[t]);
        q->len[t] = 0;
    }
    q->count = 0;
    q->max = max;
    q->aging_ms = aging_ms;
    q->global = global;
}

void queue_item_stamp(struct queue_item *it, enum tier tier, uint64_t now_ms,
                      uint64_t deadline_ms)
{
    it->tier = tier;
    it->enqueued_ms = now_ms;
    it->deadline_ms = deadline_ms;
}

static void link_item(struct queue *q, struct queue_item *it, bool front)
{
    if (front) {
        list_push_front(&q->tiers[it->tier], &it->node);
    } else {
        list_push_back(&q->tiers[it->tier], &it->node);
    }
    q->len[it->tier]++;
    q->count++;
    if (q->global) {
        q->global->total++;
    }
}

void queue_remove(struct queue *q, struct queue_item *it)
{
    assert(list_linked(&it->node));
    list_remove(&it->node);
    q->len[it->tier]--;
    q->count--;
    if (q->global) {
        q->global->total--;
    }
}

int queue_push(struct queue *q, struct queue_item *it, enum tier tier, uint64_t now_ms,
               uint64_t deadline_ms, struct queue_item **displaced)
{
    *displaced = NULL;
    bool full = q->count >= q->max || (q->global && q->global->total >= q->global->max_total);
    if (full) {
        if (tier != TIER_CRITICAL || q->len[TIER_BATCH] == 0) {
            return -ENOSPC;
        }
        struct queue_item *victim =
            container_of(list_last(&q->tiers[TIER_BATCH]), struct queue_item, node);
        queue_remove(q, victim);
        *displaced = victim;
    }
    queue_item_stamp(it, tier, now_ms, deadline_ms);
    link_item(q, it, false);
    return 0;
}

void queue_push_front(struct queue *q, struct queue_item *it)
{
    link_item(q, it, true);
}

struct queue_item *queue_peek(const struct queue *q)
{
    struct queue_item *best = NULL;
    uint64_t best_rank = UINT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *n = list_first(&q->tiers[t]);
        if (!n) {
            continue;
        }
        struct queue_item *it = container_of(n, struct queue_item, node);
        uint64_t rank = it->enqueued_ms + (uint64_t)t * q->aging_ms;
        if (rank < best_rank) {
            best = it;
            best_rank = rank;
        }
    }
    return best;
}

struct queue_item *queue_pop(struct queue *q)
{
    struct queue_item *it = queue_peek(q);
    if (it) {
        queue_remove(q, it);
    }
    return it;
}

/* Within a tier deadlines follow enqueue order (one timeout per model; items
 * put back at the front are older), so only the heads need looking at. */
struct queue_item *queue_pop_expired(struct queue *q, uint64_t now_ms)
{
    struct queue_item *best = NULL;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *n = list_first(&q->tiers[t]);
        if (!n) {
            continue;
        }
        struct queue_item *it = container_of(n, struct queue_item, node);
        if (it->deadline_ms <= now_ms && (!best || it->deadline_ms < best->deadline_ms)) {
            best = it;
        }
    }
    if (best) {
        queue_remove(q, best);
    }
    return best;
}

uint64_t queue_next_deadline(const struct queue *q)
{
    uint64_t best = UINT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *n = list_first(&q->tiers[t]);
        if (n) {
            struct queue_item *it = container_of(n, struct queue_item, node);
            if (it->deadline_ms < best) {
                best = it->deadline_ms;
            }
        }
    }
    return best;
}

uint64_t queue_oldest_age(const struct queue *q, uint64_t now_ms)
{
    uint64_t oldest = UINT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *n = list_first(&q->tiers[t]);
        if (n) {
            struct queue_item *it = container_of(n, struct queue_item, node);
            if (it->enqueued_ms < oldest) {
                oldest = it->enqueued_ms;
            }
        }
    }
    return oldest == UINT64_MAX || oldest > now_ms ? 0 : now_ms - oldest;
}

#include "thaw/queue.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

static void flow_init(struct queue_flow *f)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct queue_lane *l = &f->lanes[t];
        list_init(&l->items);
        list_node_init(&l->link);
        l->len = 0;
        l->credit = 1;
        l->flow = f;
    }
    f->queued = 0;
    f->running = 0;
    f->weight = 1;
    f->max_running = QUEUE_NO_CAP;
    f->max_queued = QUEUE_NO_CAP;
}

void queue_init(struct queue *q, size_t max, uint64_t aging_ms, struct queue_global *global)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        list_init(&q->rotation[t]);
        q->len[t] = 0;
    }
    q->count = 0;
    q->max = max;
    q->aging_ms = aging_ms;
    q->global = global;
    list_node_init(&q->global_link);
    if (global) {
        if (!global->queues.next) {
            list_init(&global->queues);
        }
        list_push_back(&global->queues, &q->global_link);
    }
    flow_init(&q->flow0);
    q->flows = NULL;
    q->n_flows = 0;
}

void queue_dispose(struct queue *q)
{
    if (list_linked(&q->global_link)) {
        list_remove(&q->global_link);
    }
    for (uint32_t i = 1; i < q->n_flows; i++) {
        free(q->flows[i]);
    }
    free(q->flows);
    q->flows = NULL;
    q->n_flows = 0;
}

struct queue_flow *queue_flow(const struct queue *q, uint32_t id)
{
    if (id == 0) {
        return (struct queue_flow *)&q->flow0;
    }
    return id < q->n_flows ? q->flows[id] : NULL;
}

/* Flow id, created if new. NULL when out of memory. */
static struct queue_flow *flow_get(struct queue *q, uint32_t id)
{
    struct queue_flow *f = queue_flow(q, id);
    if (f) {
        return f;
    }
    if (id >= q->n_flows) {
        uint32_t n = q->n_flows ? q->n_flows : 4;
        while (n <= id) {
            n *= 2;
        }
        struct queue_flow **nf = realloc(q->flows, n * sizeof *nf);
        if (!nf) {
            return NULL;
        }
        for (uint32_t i = q->n_flows; i < n; i++) {
            nf[i] = NULL;
        }
        q->flows = nf;
        q->n_flows = n;
    }
    f = malloc(sizeof *f);
    if (f) {
        flow_init(f);
        q->flows[id] = f;
    }
    return f;
}

int queue_flow_set(struct queue *q, uint32_t id, uint32_t weight, uint64_t max_running,
                   uint64_t max_queued)
{
    struct queue_flow *f = flow_get(q, id);
    if (!f) {
        return -ENOMEM;
    }
    uint32_t w = weight ? weight : 1;
    if (w != f->weight) {
        /* A new weight counts from this turn on: what waits gets it too. */
        for (int t = 0; t < TIER_COUNT; t++) {
            f->lanes[t].credit = w;
        }
    }
    f->weight = w;
    f->max_running = max_running;
    f->max_queued = max_queued;
    return 0;
}

static bool flow_may_run(const struct queue_flow *f)
{
    return f->max_running == QUEUE_NO_CAP || f->running < f->max_running;
}

static size_t flow_runnable(const struct queue_flow *f)
{
    if (f->max_running == QUEUE_NO_CAP) {
        return f->queued;
    }
    uint64_t room = f->running < f->max_running ? f->max_running - f->running : 0;
    return f->queued < room ? f->queued : (size_t)room;
}

size_t queue_runnable(const struct queue *q)
{
    size_t n = flow_runnable(&q->flow0);
    for (uint32_t id = 1; id < q->n_flows; id++) {
        if (q->flows[id]) {
            n += flow_runnable(q->flows[id]);
        }
    }
    return n;
}

bool queue_flow_may_run(const struct queue *q, uint32_t id)
{
    const struct queue_flow *f = queue_flow(q, id);
    return !f || flow_may_run(f);
}

void queue_flow_started(struct queue *q, uint32_t id)
{
    struct queue_flow *f = queue_flow(q, id);
    if (f) {
        f->running++;
    }
}

void queue_flow_finished(struct queue *q, uint32_t id)
{
    struct queue_flow *f = queue_flow(q, id);
    if (f && f->running > 0) {
        f->running--;
    }
}

void queue_item_stamp(struct queue_item *it, enum tier tier, uint64_t now_ms, uint64_t deadline_ms)
{
    it->tier = tier;
    it->enqueued_ms = now_ms;
    it->deadline_ms = deadline_ms;
}

static struct queue_lane *lane_of(const struct queue *q, const struct queue_item *it)
{
    struct queue_flow *f = queue_flow(q, it->flow);
    assert(f);
    return &f->lanes[it->tier];
}

static struct queue_item *lane_head(const struct queue_lane *l)
{
    struct list_node *n = list_first(&l->items);
    return n ? container_of(n, struct queue_item, node) : NULL;
}

#define for_each_lane(l, q, t)                                                                     \
    for (struct list_node *l##_n = (q)->rotation[t].next;                                          \
         l##_n != &(q)->rotation[t] && ((l) = container_of(l##_n, struct queue_lane, link), 1);    \
         l##_n = l##_n->next)

static void link_item(struct queue *q, struct queue_item *it, bool front)
{
    struct queue_lane *l = lane_of(q, it);
    if (front) {
        list_push_front(&l->items, &it->node);
    } else {
        list_push_back(&l->items, &it->node);
    }
    if (front) {
        /* Put back after a failed connect: it was being served, so its
         * lane goes next. */
        if (l->len > 0) {
            list_remove(&l->link);
        } else {
            l->credit = l->flow->weight;
        }
        list_push_front(&q->rotation[it->tier], &l->link);
    } else if (l->len == 0) {
        /* A lane joins the rotation at the back. */
        l->credit = l->flow->weight;
        list_push_back(&q->rotation[it->tier], &l->link);
    }
    l->len++;
    l->flow->queued++;
    q->len[it->tier]++;
    q->count++;
    if (q->global) {
        q->global->total++;
    }
}

void queue_remove(struct queue *q, struct queue_item *it)
{
    assert(list_linked(&it->node));
    struct queue_lane *l = lane_of(q, it);
    list_remove(&it->node);
    if (--l->len == 0) {
        list_remove(&l->link);
    }
    l->flow->queued--;
    q->len[it->tier]--;
    q->count--;
    if (q->global) {
        q->global->total--;
    }
}

/* The batch item a critical one displaces: the newest of the longest batch
 * lane (the flow with the biggest backlog pays). */
static struct queue_item *displacement_victim(const struct queue *q)
{
    struct queue_lane *l, *longest = NULL;
    for_each_lane(l, q, TIER_BATCH)
    {
        if (!longest || l->len > longest->len) {
            longest = l;
        }
    }
    return longest ? container_of(list_last(&longest->items), struct queue_item, node) : NULL;
}

/* Of the queues sharing q's global bound, the one with the most batch items
 * (q on a tie). */
static struct queue *most_batch(struct queue *q)
{
    struct queue *best = q;
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &q->global->queues)
    {
        struct queue *o = container_of(pos, struct queue, global_link);
        if (o->len[TIER_BATCH] > best->len[TIER_BATCH]) {
            best = o;
        }
    }
    return best;
}

int queue_push_flow(struct queue *q, struct queue_item *it, uint32_t flow, enum tier tier,
                    uint64_t now_ms, uint64_t deadline_ms, struct queue_item **displaced)
{
    *displaced = NULL;
    struct queue_flow *f = queue_flow(q, flow);
    if (!f) {
        flow = 0;
        f = &q->flow0;
    }
    if (f->max_queued != QUEUE_NO_CAP && f->queued >= f->max_queued) {
        return -EDQUOT;
    }
    /* At its own bound only this queue's items make room; at the global one
     * any queue's do, and the one with the biggest batch backlog pays. */
    struct queue *from = NULL;
    if (q->count >= q->max) {
        from = q;
    } else if (q->global && q->global->total >= q->global->max_total) {
        from = most_batch(q);
    }
    if (from) {
        struct queue_item *victim = tier == TIER_CRITICAL ? displacement_victim(from) : NULL;
        if (!victim) {
            return -ENOSPC;
        }
        queue_remove(from, victim);
        *displaced = victim;
    }
    queue_item_stamp(it, tier, now_ms, deadline_ms);
    it->flow = flow;
    link_item(q, it, false);
    return 0;
}

int queue_push(struct queue *q, struct queue_item *it, enum tier tier, uint64_t now_ms,
               uint64_t deadline_ms, struct queue_item **displaced)
{
    return queue_push_flow(q, it, 0, tier, now_ms, deadline_ms, displaced);
}

void queue_push_front(struct queue *q, struct queue_item *it)
{
    if (!queue_flow(q, it->flow)) {
        it->flow = 0;
    }
    link_item(q, it, true);
}

/* The lane a tier serves next: the first in its rotation whose flow may
 * run. *oldest gets the enqueue time of the tier's oldest item that may run
 * (its aging rank). NULL when none may run. */
static struct queue_lane *tier_next(const struct queue *q, int t, uint64_t *oldest)
{
    struct queue_lane *l, *next = NULL;
    *oldest = UINT64_MAX;
    for_each_lane(l, q, t)
    {
        if (!flow_may_run(l->flow)) {
            continue;
        }
        if (!next) {
            next = l;
        }
        /* Within a lane, enqueue order (items put back at the front are
         * older): the head is its oldest. */
        uint64_t e = lane_head(l)->enqueued_ms;
        if (e < *oldest) {
            *oldest = e;
        }
    }
    return next;
}

static struct queue_lane *next_lane(const struct queue *q)
{
    struct queue_lane *best = NULL;
    uint64_t best_rank = UINT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        uint64_t oldest;
        struct queue_lane *l = tier_next(q, t, &oldest);
        if (!l) {
            continue;
        }
        uint64_t rank = oldest + (uint64_t)t * q->aging_ms;
        if (!best || rank < best_rank) {
            best = l;
            best_rank = rank;
        }
    }
    return best;
}

struct queue_item *queue_peek(const struct queue *q)
{
    struct queue_lane *l = next_lane(q);
    return l ? lane_head(l) : NULL;
}

struct queue_item *queue_pop(struct queue *q)
{
    struct queue_lane *l = next_lane(q);
    if (!l) {
        return NULL;
    }
    struct queue_item *it = lane_head(l);
    bool last = l->len == 1;
    queue_remove(q, it);
    /* Its turn ends after `weight` items: to the back of the rotation. */
    if (!last && --l->credit == 0) {
        l->credit = l->flow->weight;
        list_remove(&l->link);
        list_push_back(&q->rotation[it->tier], &l->link);
    }
    return it;
}

struct queue_item *queue_pop_any(struct queue *q)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct list_node *n = list_first(&q->rotation[t]);
        if (n) {
            struct queue_item *it = lane_head(container_of(n, struct queue_lane, link));
            queue_remove(q, it);
            return it;
        }
    }
    return NULL;
}

/* Within a lane deadlines follow enqueue order (one timeout per model; items
 * put back at the front are older), so only the heads need looking at. */
static struct queue_item *earliest_deadline(const struct queue *q)
{
    struct queue_item *best = NULL;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct queue_lane *l;
        for_each_lane(l, q, t)
        {
            struct queue_item *it = lane_head(l);
            if (!best || it->deadline_ms < best->deadline_ms) {
                best = it;
            }
        }
    }
    return best;
}

struct queue_item *queue_pop_expired(struct queue *q, uint64_t now_ms)
{
    struct queue_item *it = earliest_deadline(q);
    if (!it || it->deadline_ms > now_ms) {
        return NULL;
    }
    queue_remove(q, it);
    return it;
}

bool queue_cap_deadlines(struct queue *q, uint64_t timeout_ms, uint64_t now_ms)
{
    bool moved = false;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct queue_lane *l;
        for_each_lane(l, q, t)
        {
            struct list_node *pos, *tmp;
            list_for_each_safe(pos, tmp, &l->items)
            {
                struct queue_item *it = container_of(pos, struct queue_item, node);
                uint64_t d = it->enqueued_ms + timeout_ms;
                d = d > now_ms ? d : now_ms;
                if (d < it->deadline_ms) {
                    it->deadline_ms = d;
                    moved = true;
                }
            }
        }
    }
    return moved;
}

uint64_t queue_next_deadline(const struct queue *q)
{
    struct queue_item *it = earliest_deadline(q);
    return it ? it->deadline_ms : UINT64_MAX;
}

uint64_t queue_oldest_age(const struct queue *q, uint64_t now_ms)
{
    uint64_t oldest = UINT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        struct queue_lane *l;
        for_each_lane(l, q, t)
        {
            uint64_t e = lane_head(l)->enqueued_ms;
            if (e < oldest) {
                oldest = e;
            }
        }
    }
    return oldest == UINT64_MAX || oldest > now_ms ? 0 : now_ms - oldest;
}

void queue_visit(const struct queue *q, void (*fn)(struct queue_item *it, void *ud), void *ud)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct queue_lane *l;
        for_each_lane(l, q, t)
        {
            struct list_node *pos, *tmp;
            list_for_each_safe(pos, tmp, &l->items)
            {
                fn(container_of(pos, struct queue_item, node), ud);
            }
        }
    }
}

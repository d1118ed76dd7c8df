#include "thaw/warmpool.h"

#include <stdlib.h>
#include <string.h>

static const char *const action_names[WP_ACTIONS] = {"keep_warm", "to_zero", "admit",  "deny",
                                                     "evict",     "preempt", "prewarm"};

const char *wp_action_name(enum wp_action a)
{
    return action_names[a];
}

static void record(struct wp_plan *p, size_t model, enum wp_action a, unsigned replicas, size_t by,
                   size_t node)
{
    if (p->n < sizeof p->d / sizeof p->d[0]) {
        p->d[p->n++] = (struct wp_decision){model, a, replicas, by, node};
    } else {
        p->dropped++;
    }
}

/* Service order: higher priority (lower tier index) first, then higher value. */
struct sort_key {
    size_t idx;
    enum tier tier;
    double value;
};

static int cmp(const void *a, const void *b)
{
    const struct sort_key *x = a, *y = b;
    if (x->tier != y->tier) {
        return x->tier < y->tier ? -1 : 1;
    }
    if (x->value != y->value) {
        return x->value > y->value ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx; /* stable: input order breaks ties */
}

/* idx gets model indexes in service order (see before()). */
static int order(const struct wp_model *m, size_t n, size_t *idx)
{
    struct sort_key *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        k[i] = (struct sort_key){i, m[i].tier, m[i].value};
    }
    qsort(k, n, sizeof *k, cmp);
    for (size_t i = 0; i < n; i++) {
        idx[i] = k[i].idx;
    }
    free(k);
    return 0;
}

/* ---- the state of one planning step ----------------------------------- */

struct step {
    struct wp_model *m;
    size_t n;
    size_t *idx;       /* service order */
    unsigned *pending; /* per model: replicas in target not placed on a node */
    unsigned *gone;    /* per model: replicas a room plan releases on its node */
    unsigned *skipped; /* per model: scratch of memory_room (held entries released) */
    struct wp_cluster *c;
    struct wp_plan *out;
    unsigned used_slices, warm_used;
    /* models x nodes: replicas placed when the plan began (a sleep-mode
     * model's beyond those are pods this plan starts, whose memory no sleep
     * frees); NULL: none placed anywhere */
    unsigned *base;
    bool free_only; /* prewarm: an idle sleep-mode pod's memory is not free */
};

static bool unlimited(const struct step *s)
{
    return s->c->n_nodes == 0 && s->c->cap_slices == 0;
}

static bool needs_nothing(const struct step *s, const struct wp_model *x)
{
    if (x->slices) {
        return false;
    }
    for (size_t r = 0; r < s->c->n_res; r++) {
        if (x->req[r]) {
            return false;
        }
    }
    return true;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

/* One replica of model i in (sign 1) or out of (-1) node k. */
static void move(struct step *s, size_t i, size_t k, int sign)
{
    struct wp_model *x = &s->m[i];
    struct wp_node *nd = &s->c->nodes[k];
    for (size_t r = 0; r < s->c->n_res; r++) {
        nd->used[r] = sign > 0 ? sat_add(nd->used[r], x->req[r])
                               : (nd->used[r] > x->req[r] ? nd->used[r] - x->req[r] : 0);
    }
    x->on_node[k] = sign > 0 ? x->on_node[k] + 1 : x->on_node[k] - 1;
}

/* A replica going away: from the node holding most of the model's replicas
 * (as a ReplicaSet picks, all else equal). */
static void release_one(struct step *s, size_t i)
{
    struct wp_model *x = &s->m[i];
    size_t best = WP_NO_NODE;
    for (size_t k = 0; k < s->c->n_nodes; k++) {
        if (x->on_node[k] && (best == WP_NO_NODE || x->on_node[k] > x->on_node[best])) {
            best = k;
        }
    }
    if (best != WP_NO_NODE) {
        move(s, i, best, -1);
    }
}

/* Replicas leave: unplaced ones first (a ReplicaSet deletes pending pods
 * first), then placed ones. */
static void drop_replicas(struct step *s, size_t i, unsigned count)
{
    unsigned p = count < s->pending[i] ? count : s->pending[i];
    s->pending[i] -= p;
    for (unsigned j = p; j < count; j++) {
        release_one(s, i);
    }
}

/* What a room plan releases on one node: resources, slices against the
 * cap, and (in step->gone) which replicas, for the memory packing. */
struct freed {
    uint64_t res[WP_MAX_RES];
    unsigned slices;
    bool any_gone; /* step->gone holds this plan's replicas */
};

/* What x still lacks of resource r on node k once `freed` is released there. */
static uint64_t short_of(const struct step *s, const struct wp_model *x, size_t k, size_t r,
                         const struct freed *freed)
{
    const struct wp_node *nd = &s->c->nodes[k];
    uint64_t have = sat_add(nd->alloc[r], freed ? freed->res[r] : 0);
    uint64_t avail = have > nd->used[r] ? have - nd->used[r] : 0;
    return x->req[r] > avail ? x->req[r] - avail : 0;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

bool wp_memory_packs(uint64_t *items, size_t n, unsigned gpus, uint64_t per_gpu)
{
    if (!per_gpu) {
        return true;
    }
    gpus = gpus == 0 ? 1 : gpus > WP_MAX_GPUS ? WP_MAX_GPUS : gpus;
    uint64_t left[WP_MAX_GPUS];
    for (unsigned g = 0; g < gpus; g++) {
        left[g] = per_gpu;
    }
    qsort(items, n, sizeof *items, cmp_desc);
    for (size_t i = 0; i < n && items[i]; i++) {
        unsigned g = 0;
        while (g < gpus && left[g] < items[i]) {
            g++;
        }
        if (g == gpus) {
            return false;
        }
        left[g] -= items[i];
    }
    return true;
}

/* Whether a sleep-mode replica's memory stays held for x: it cannot be put
 * to sleep now, or not for x (only a tier's own or a higher tier's demand
 * puts a replica to sleep, and a prewarm takes only free room). */
static bool held_for(const struct step *s, const struct wp_held *h, const struct wp_model *x)
{
    return s->free_only || !h->sleepable || h->tier < x->tier;
}

static bool counts_memory(const struct wp_model *m)
{
    return m->gpu_memory && !m->memory_sleeps;
}

/* The model whose replica holds held entry h of node nd, if said. */
static size_t held_model(const struct wp_node *nd, size_t h)
{
    return nd->held_model ? nd->held_model[h] : WP_NO_MODEL;
}

/* Whether held entry h, which counts against x, goes with the replicas a
 * room plan releases: the first gone[model] such entries of its model on
 * the node (skipped counts them; a preempted busy sleep-mode replica frees
 * its memory when it stops). */
static bool released(const struct step *s, const struct wp_node *nd, size_t h,
                     const struct freed *freed)
{
    size_t i = held_model(nd, h);
    if (i >= s->n || !freed || !freed->any_gone || s->skipped[i] >= s->gone[i]) {
        return false;
    }
    s->skipped[i]++;
    return true;
}

/* Whether v (model vi) holds memory on node k that counts against x and
 * that the room plan has not released yet. */
static bool holds_for(const struct step *s, size_t vi, size_t k, const struct wp_model *x)
{
    const struct wp_node *nd = &s->c->nodes[k];
    unsigned n = 0;
    for (size_t h = 0; h < nd->n_held; h++) {
        n += held_model(nd, h) == vi && held_for(s, &nd->held[h], x);
    }
    return n > s->gone[vi];
}

/* Replicas of model i on node k whose memory counts there: a model's that
 * sleep mode does not free, less those a room plan releases (gone); of a
 * sleep-mode model, those this plan places (its pods are the node's held). */
static unsigned memory_replicas(const struct step *s, size_t i, size_t k, unsigned gone)
{
    const struct wp_model *m = &s->m[i];
    if (!m->gpu_memory || !m->on_node) {
        return 0;
    }
    unsigned now = m->on_node[k];
    if (!m->memory_sleeps) {
        return now > gone ? now - gone : 0;
    }
    unsigned before = s->base ? s->base[i * s->c->n_nodes + k] : 0;
    return now > before ? now - before : 0;
}

/* Whether one more replica of x packs into node k's GPU memory with the
 * replicas there (less those `freed` releases) and what sleep-mode replicas
 * hold there for x. Only models that declare memory take part; a node that
 * does not know its memory does not limit. */
static bool memory_room(const struct step *s, const struct wp_model *x, size_t k,
                        const struct freed *freed)
{
    const struct wp_node *nd = &s->c->nodes[k];
    if (!x->gpu_memory || !nd->gpu_memory) {
        return true;
    }
    if (x->gpu_memory > nd->gpu_memory) {
        return false;
    }
    size_t total = 1 + nd->n_held;
    for (size_t i = 0; i < s->n; i++) {
        total += memory_replicas(s, i, k, freed && freed->any_gone ? s->gone[i] : 0);
    }
    uint64_t small[128];
    uint64_t *items = total <= 128 ? small : malloc(total * sizeof *items);
    if (!items) {
        return false; /* out of memory: admit nothing rather than overcommit */
    }
    size_t n = 0;
    items[n++] = x->gpu_memory;
    for (size_t i = 0; i < s->n; i++) {
        unsigned c = memory_replicas(s, i, k, freed && freed->any_gone ? s->gone[i] : 0);
        for (unsigned j = 0; j < c; j++) {
            items[n++] = s->m[i].gpu_memory;
        }
    }
    if (freed && freed->any_gone) {
        memset(s->skipped, 0, s->n * sizeof *s->skipped);
    }
    for (size_t h = 0; h < nd->n_held; h++) {
        if (held_for(s, &nd->held[h], x) && !released(s, nd, h, freed)) {
            items[n++] = nd->held[h].memory;
        }
    }
    bool fits = wp_memory_packs(items, n, nd->gpus, nd->gpu_memory);
    if (items != small) {
        free(items);
    }
    return fits;
}

static bool node_room(const struct step *s, const struct wp_model *x, size_t k,
                      const struct freed *freed)
{
    for (size_t r = 0; r < s->c->n_res; r++) {
        if (x->req[r] && short_of(s, x, k, r, freed)) {
            return false;
        }
    }
    return memory_room(s, x, k, freed);
}

static bool cap_room(const struct step *s, const struct wp_model *x, bool is_new,
                     unsigned freed_slices)
{
    if (!is_new || !s->c->cap_slices) {
        return true;
    }
    unsigned used = s->used_slices > freed_slices ? s->used_slices - freed_slices : 0;
    return used + x->slices <= s->c->cap_slices;
}

static bool eligible(const struct wp_model *x, size_t k)
{
    return !x->eligible || x->eligible[k];
}

/* The eligible node with room whose room is smallest (packing leaves big
 * nodes for big replicas); WP_NO_NODE when none has room. */
static size_t best_fit(const struct step *s, const struct wp_model *x, bool is_new)
{
    if (!cap_room(s, x, is_new, 0)) {
        return WP_NO_NODE;
    }
    size_t best = WP_NO_NODE;
    uint64_t best_left = 0;
    for (size_t k = 0; k < s->c->n_nodes; k++) {
        if (!eligible(x, k) || !node_room(s, x, k, NULL)) {
            continue;
        }
        uint64_t left = 0;
        for (size_t r = 0; r < s->c->n_res; r++) {
            const struct wp_node *nd = &s->c->nodes[k];
            if (x->req[r]) {
                left = sat_add(left, nd->alloc[r] - nd->used[r] - x->req[r]);
            }
        }
        if (best == WP_NO_NODE || left < best_left) {
            best = k;
            best_left = left;
        }
    }
    return best;
}

/* ---- making room on one node ------------------------------------------- */

struct victim {
    size_t model;
    enum wp_action action;
    unsigned on_node; /* replicas it gives up on the node */
    unsigned drop;    /* its target goes down by this (unplaced replicas go first) */
};

struct room {
    struct victim *v; /* at most 2 per model */
    size_t nv;
    unsigned preempted, evicted, worst_rank;
};

/* How long live demand waits behind an idle warm replica of its own tier
 * worth more than it (a model with little history is worth little): past
 * this it takes the room anyway. Not at once: two models taking a GPU from
 * each other at every request would cold-start at every turn. */
static uint64_t same_tier_patience_ms(enum tier t)
{
    return t == TIER_CRITICAL ? 1000 : t == TIER_STANDARD ? 10000 : 900000;
}

/* x's demand may take v's idle warm replica: v of lower priority; or of the
 * same, and worth less, or x waited past its patience. Which goes first is
 * the victims' order (lowest priority, then lowest value). */
static bool may_evict(const struct wp_model *v, const struct wp_model *x)
{
    return v->tier > x->tier ||
           (v->tier == x->tier &&
            (v->value < x->value || x->waited_ms >= same_tier_patience_ms(x->tier)));
}

/* v's release gives x something it lacks on node k. */
static bool helps(const struct step *s, const struct wp_model *v, const struct wp_model *x,
                  size_t k, const struct freed *freed, bool cap_short)
{
    if (cap_short && v->slices) {
        return true;
    }
    for (size_t r = 0; r < s->c->n_res; r++) {
        if (v->req[r] && x->req[r] && short_of(s, x, k, r, freed)) {
            return true;
        }
    }
    bool holds = counts_memory(v) || holds_for(s, (size_t)(v - s->m), k, x);
    return holds && !memory_room(s, x, k, freed);
}

/* v's replicas (on_node of them on the node, drop off its target) are
 * released (sign 1) or kept after all (-1). */
static void take(struct step *s, size_t vi, struct freed *freed, unsigned on_node, unsigned drop,
                 int sign)
{
    const struct wp_model *v = &s->m[vi];
    for (size_t r = 0; r < s->c->n_res; r++) {
        freed->res[r] = sign > 0 ? sat_add(freed->res[r], v->req[r] * on_node)
                                 : freed->res[r] - v->req[r] * on_node;
    }
    freed->slices = sign > 0 ? freed->slices + v->slices * drop : freed->slices - v->slices * drop;
    s->gone[vi] = sign > 0 ? s->gone[vi] + on_node : s->gone[vi] - on_node;
    freed->any_gone = true;
}

static bool fits_with(const struct step *s, const struct wp_model *x, size_t k, bool is_new,
                      const struct freed *freed)
{
    return node_room(s, x, k, freed) && cap_room(s, x, is_new, freed->slices);
}

/* Evictions a later, larger one made needless are taken back (an idle
 * replica goes only when its release is part of what makes x fit). */
static void keep_needless_evictions(struct step *s, size_t xi, size_t k, bool is_new,
                                    struct room *room, struct freed *freed)
{
    size_t kept = 0;
    for (size_t i = 0; i < room->nv; i++) {
        struct victim *vic = &room->v[i];
        if (vic->action == WP_EVICT) {
            take(s, vic->model, freed, vic->on_node, vic->drop, -1);
            if (fits_with(s, &s->m[xi], k, is_new, freed)) {
                room->evicted--;
                continue;
            }
            take(s, vic->model, freed, vic->on_node, vic->drop, 1);
        }
        room->v[kept++] = *vic;
    }
    room->nv = kept;
}

/* Which replicas on node k x would take, in the order of today's victims:
 * idle warm replicas (lowest priority, then lowest value, first), then
 * running ones of strictly lower priority toward their min. True when
 * their release makes x fit there; room says at what cost. */
static bool plan_room(struct step *s, size_t xi, size_t k, bool is_new, struct room *room)
{
    const struct wp_model *x = &s->m[xi];
    struct freed fr = {{0}, 0, false}, *freed = &fr;
    memset(s->gone, 0, s->n * sizeof *s->gone);
    room->nv = 0;
    room->preempted = room->evicted = room->worst_rank = 0;
    for (size_t j = s->n; j-- > 0;) {
        if (fits_with(s, x, k, is_new, freed)) {
            keep_needless_evictions(s, xi, k, is_new, room, freed);
            return true;
        }
        struct wp_model *v = &s->m[s->idx[j]];
        if (v == x || !v->warm || v->on_node[k] <= s->gone[s->idx[j]] || !may_evict(v, x) ||
            !helps(s, v, x, k, freed, !cap_room(s, x, is_new, freed->slices))) {
            continue;
        }
        take(s, s->idx[j], freed, 1, 1, 1);
        room->v[room->nv++] = (struct victim){s->idx[j], WP_EVICT, 1, 1};
        room->evicted++;
        room->worst_rank = (unsigned)(s->n - 1 - j);
    }
    for (size_t j = s->n; j-- > 0;) {
        struct wp_model *v = &s->m[s->idx[j]];
        if (v == x || v->tier <= x->tier || v->warm || !v->on_node[k]) {
            continue;
        }
        struct victim vic = {s->idx[j], WP_PREEMPT, 0, 0};
        unsigned pending = s->pending[s->idx[j]];
        while (!fits_with(s, x, k, is_new, freed) && vic.on_node < v->on_node[k] &&
               v->target >= vic.drop + pending + 1 + v->min_replicas &&
               helps(s, v, x, k, freed, !cap_room(s, x, is_new, freed->slices))) {
            take(s, s->idx[j], freed, 1, pending + 1, 1);
            vic.on_node++;
            vic.drop += pending + 1;
            pending = 0;
        }
        if (vic.on_node) {
            room->v[room->nv++] = vic;
            room->preempted += vic.drop;
            room->worst_rank = (unsigned)(2 * s->n - 1 - j);
        }
    }
    return fits_with(s, x, k, is_new, freed);
}

static bool cheaper(const struct room *a, const struct room *b)
{
    if (a->preempted != b->preempted) {
        return a->preempted < b->preempted;
    }
    if (a->evicted != b->evicted) {
        return a->evicted < b->evicted;
    }
    return a->worst_rank < b->worst_rank;
}

static void commit_room(struct step *s, size_t xi, size_t k, const struct room *room)
{
    for (size_t i = 0; i < room->nv; i++) {
        const struct victim *vic = &room->v[i];
        struct wp_model *v = &s->m[vic->model];
        unsigned unplaced = vic->drop - vic->on_node;
        s->pending[vic->model] -=
            unplaced < s->pending[vic->model] ? unplaced : s->pending[vic->model];
        for (unsigned j = 0; j < vic->on_node; j++) {
            move(s, vic->model, k, -1);
        }
        v->target -= vic->drop;
        s->used_slices -= v->slices * vic->drop;
        if (vic->action == WP_EVICT) {
            v->warm--;
            s->warm_used -= v->slices;
        }
        record(s->out, vic->model, vic->action, vic->drop, xi, k);
    }
}

/* The node where taking the fewest (and least valuable) replicas makes x
 * fit; WP_NO_NODE, taking nothing, when no single node can. */
static size_t make_room(struct step *s, size_t xi, bool is_new)
{
    struct room try = {calloc(2 * s->n + 1, sizeof(struct victim)), 0, 0, 0, 0};
    struct room best = {calloc(2 * s->n + 1, sizeof(struct victim)), 0, 0, 0, 0};
    size_t where = WP_NO_NODE;
    if (try.v && best.v) {
        for (size_t k = 0; k < s->c->n_nodes; k++) {
            if (!eligible(&s->m[xi], k) || !plan_room(s, xi, k, is_new, &try)) {
                continue;
            }
            if (where == WP_NO_NODE || cheaper(&try, &best)) {
                struct victim *keep = best.v;
                best = try;
                try.v = keep;
                where = k;
            }
        }
        if (where != WP_NO_NODE) {
            commit_room(s, xi, where, &best);
        }
    }
    free(try.v);
    free(best.v);
    return where;
}

/* ---- the planning step -------------------------------------------------- */

/* Placed replicas beyond what the model holds are on their way out. */
static void settle_placement(struct step *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct wp_model *x = &s->m[i];
        unsigned placed = 0;
        for (size_t k = 0; k < s->c->n_nodes; k++) {
            placed += x->on_node[k];
        }
        while (placed > x->current) {
            release_one(s, i);
            placed--;
        }
        s->pending[i] = s->c->n_nodes ? x->current - placed : 0;
    }
}

/* An idle model the autoscaler would take to zero keeps one replica while
 * the warm budget has room. */
static void keep_warm_or_zero(struct step *s, size_t xi, unsigned warm_budget)
{
    struct wp_model *x = &s->m[xi];
    if (!x->quiet && s->warm_used + x->slices <= warm_budget) {
        s->warm_used += x->slices;
        x->target = 1;
        x->warm = 1;
        record(s->out, xi, x->prewarm ? WP_PREWARM : WP_KEEP_WARM, 1, xi, WP_NO_NODE);
    } else {
        record(s->out, xi, WP_TO_ZERO, x->current, xi, WP_NO_NODE);
    }
}

static void scale_down(struct step *s, size_t xi, unsigned warm_budget)
{
    struct wp_model *x = &s->m[xi];
    x->warm = 0;
    unsigned want = x->desired > x->min_replicas ? x->desired : x->min_replicas;
    if (want >= x->current) {
        x->target = x->current; /* scale-ups are decided below */
        return;
    }
    x->target = want;
    if (x->idle && want == 0 && x->current > 0 && x->slices > 0) {
        keep_warm_or_zero(s, xi, warm_budget);
    }
    if (s->c->n_nodes) {
        drop_replicas(s, xi, x->current - x->target);
    }
}

/* 1. Scale-downs and the warm pool, best models first (service order: by
 * tier, then value); inside a tier, models whose demand is forecast take
 * the warm budget before the others. */
static void scale_downs(struct step *s, unsigned warm_budget)
{
    for (size_t from = 0, to; from < s->n; from = to) {
        enum tier t = s->m[s->idx[from]].tier;
        for (to = from; to < s->n && s->m[s->idx[to]].tier == t; to++) {
        }
        for (int forecast_pass = 1; forecast_pass >= 0; forecast_pass--) {
            for (size_t k = from; k < to; k++) {
                if (s->m[s->idx[k]].prewarm == (forecast_pass == 1)) {
                    scale_down(s, s->idx[k], warm_budget);
                }
            }
        }
    }
}

/* A replica of x onto a node, making room if it must. */
static size_t place_one(struct step *s, size_t xi, bool is_new)
{
    size_t k = best_fit(s, &s->m[xi], is_new);
    if (k == WP_NO_NODE) {
        k = make_room(s, xi, is_new);
    }
    if (k != WP_NO_NODE) {
        move(s, xi, k, 1);
    }
    return k;
}

/* 2. Scale-ups in priority order, making room from below: first the
 * model's replicas waiting for a node, then its new ones. */
static void scale_up(struct step *s, size_t xi)
{
    struct wp_model *x = &s->m[xi];
    unsigned want = x->desired > x->min_replicas ? x->desired : x->min_replicas;
    unsigned more = want > x->target ? want - x->target : 0;
    unsigned waiting = s->pending[xi];
    if (more == 0 && waiting == 0) {
        return;
    }
    if (unlimited(s) || needs_nothing(s, x)) {
        if (more) {
            x->target = want;
            s->used_slices += more * x->slices;
            record(s->out, xi, WP_ADMIT, more, xi, WP_NO_NODE);
        }
        return;
    }
    unsigned admitted = 0, unplaced = 0;
    size_t node = WP_NO_NODE;
    for (unsigned r = 0; r < waiting + more; r++) {
        bool is_new = r >= waiting;
        size_t k = place_one(s, xi, is_new);
        if (k == WP_NO_NODE) {
            unplaced = is_new ? 0 : waiting - r;
            break;
        }
        if (!is_new) {
            s->pending[xi]--;
            continue;
        }
        x->target++;
        s->used_slices += x->slices;
        node = admitted == 0 || node == k ? k : WP_NO_NODE;
        admitted++;
    }
    if (admitted) {
        record(s->out, xi, WP_ADMIT, admitted, xi, node);
    }
    if (admitted < more || unplaced) {
        record(s->out, xi, WP_DENY, more - admitted + unplaced, xi, WP_NO_NODE);
    }
}

/* 3. Models at zero whose demand is forecast, once live demand is served:
 * one replica each from the warm budget, where it fits without taking
 * anything from anyone. */
static void prewarm_from_zero(struct step *s, size_t xi, unsigned warm_budget)
{
    struct wp_model *x = &s->m[xi];
    if (!x->prewarm || x->target > 0 || s->warm_used + x->slices > warm_budget) {
        return;
    }
    size_t k = WP_NO_NODE;
    if (!unlimited(s) && !needs_nothing(s, x)) {
        s->free_only = true;
        k = best_fit(s, x, true);
        s->free_only = false;
        if (k == WP_NO_NODE) {
            return;
        }
        move(s, xi, k, 1);
    }
    x->target = 1;
    x->warm = 1;
    s->used_slices += x->slices;
    s->warm_used += x->slices;
    record(s->out, xi, WP_PREWARM, 1, xi, k);
}

static void step_free(struct step *s)
{
    free(s->idx);
    free(s->pending);
    free(s->gone);
    free(s->skipped);
    free(s->base);
}

static void plan(struct wp_model *m, size_t n, struct wp_cluster *c, unsigned warm_budget,
                 struct wp_plan *out)
{
    struct step s = {m,
                     n,
                     malloc((n ? n : 1) * sizeof(size_t)),
                     calloc(n ? n : 1, sizeof(unsigned)),
                     calloc(n ? n : 1, sizeof(unsigned)),
                     calloc(n ? n : 1, sizeof(unsigned)),
                     c,
                     out,
                     0,
                     0,
                     c->n_nodes ? calloc(n * c->n_nodes + 1, sizeof(unsigned)) : NULL,
                     false};
    if (!s.idx || !s.pending || !s.gone || !s.skipped || (c->n_nodes && !s.base) ||
        order(m, n, s.idx)) {
        for (size_t i = 0; i < n; i++) {
            m[i].target = m[i].current; /* no plan: change nothing */
        }
        step_free(&s);
        return;
    }
    for (size_t i = 0; i < n && s.base; i++) {
        for (size_t k = 0; m[i].on_node && k < c->n_nodes; k++) {
            s.base[i * c->n_nodes + k] = m[i].on_node[k];
        }
    }
    for (size_t k = 0; k < c->n_nodes; k++) {
        memset(c->nodes[k].used, 0, sizeof c->nodes[k].used);
        for (size_t i = 0; i < n; i++) {
            for (size_t r = 0; r < c->n_res; r++) {
                c->nodes[k].used[r] = sat_add(c->nodes[k].used[r], m[i].req[r] * m[i].on_node[k]);
            }
        }
    }
    settle_placement(&s);
    scale_downs(&s, warm_budget);
    for (size_t i = 0; i < n; i++) {
        s.used_slices += m[i].target * m[i].slices;
    }
    for (size_t k = 0; k < n; k++) {
        scale_up(&s, s.idx[k]);
    }
    for (size_t k = 0; k < n; k++) {
        prewarm_from_zero(&s, s.idx[k], warm_budget);
    }
    out->used_slices = s.used_slices;
    out->warm_slices = s.warm_used;
    step_free(&s);
}

static void plan_init(struct wp_plan *out, unsigned warm_budget)
{
    memset(out, 0, sizeof *out);
    out->warm_budget = warm_budget;
}

/* One capacity of slices: one node holding every replica. */
void warmpool_plan(struct wp_model *m, size_t n, unsigned capacity, unsigned warm_budget,
                   struct wp_plan *out)
{
    plan_init(out, warm_budget);
    out->capacity = capacity;
    struct wp_cluster unbounded = {0};
    if (capacity == 0) {
        plan(m, n, &unbounded, warm_budget, out);
        return;
    }
    struct wp_model *one = calloc(n ? n : 1, sizeof *one);
    unsigned *on = calloc(n ? n : 1, sizeof *on);
    if (!one || !on) {
        free(one);
        free(on);
        for (size_t i = 0; i < n; i++) {
            m[i].target = m[i].current;
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        one[i] = m[i];
        memset(one[i].req, 0, sizeof one[i].req);
        one[i].req[0] = m[i].slices;
        one[i].eligible = NULL;
        on[i] = m[i].current;
        one[i].on_node = &on[i];
    }
    struct wp_node node = {.name = "all", .alloc = {capacity}};
    struct wp_cluster c = {.n_res = 1, .res = {"slices"}, .nodes = &node, .n_nodes = 1};
    plan(one, n, &c, warm_budget, out);
    for (size_t i = 0; i < n; i++) {
        m[i].target = one[i].target;
        m[i].warm = one[i].warm;
    }
    free(one);
    free(on);
}

void warmpool_plan_cluster(struct wp_model *m, size_t n, struct wp_cluster *c, unsigned warm_budget,
                           struct wp_plan *out)
{
    if (c->n_nodes == 0) {
        warmpool_plan(m, n, c->cap_slices, warm_budget, out);
        return;
    }
    plan_init(out, warm_budget);
    out->per_node = true;
    uint64_t total = 0;
    for (size_t k = 0; k < c->n_nodes; k++) {
        for (size_t r = 0; r < c->n_res; r++) {
            total = sat_add(total, c->nodes[k].alloc[r]);
        }
    }
    out->capacity = c->cap_slices && c->cap_slices < total ? c->cap_slices
                    : total > UINT32_MAX                   ? UINT32_MAX
                                                           : (unsigned)total;
    plan(m, n, c, warm_budget, out);
}

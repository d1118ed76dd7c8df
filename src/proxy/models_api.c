#include "thaw/models_api.h"
#include "thaw/revisions.h"
#include "thaw/clock.h"
#include "thaw/tier.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct named {
    const char *id;
    const struct model *model;
};

struct names {
    const struct router *router;
    struct named *items;
    size_t n, cap;
    bool failed;
};

/* "namespace/name" is how a model's name is qualified: listed only when the
 * bare name is several namespaces' (then each lists its qualified name). */
static bool is_redundant_qualified(const struct router *r, const char *key,
                                   const struct model *m)
{
    size_t nl = m->namespace_ ? strlen(m->namespace_) : 0;
    if (!nl || strncmp(key, m->namespace_, nl) != 0 || key[nl] != '/' ||
        strcmp(key + nl + 1, m->name) != 0) {
        return false;
    }
    return router_lookup_name(r, m->name, strlen(m->name)) == m;
}

static void collect(void *ud, const char *key, void *value)
{
    struct names *ns = ud;
    /* A bare name several namespaces have maps to a marker, not a model. */
    if (ns->failed || router_lookup_name(ns->router, key, strlen(key)) != value) {
        return;
    }
    const struct model *m = value;
    if (m->removed || is_redundant_qualified(ns->router, key, m)) {
        return;
    }
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 64;
        struct named *items = realloc(ns->items, cap * sizeof *items);
        if (!items) {
            ns->failed = true;
            return;
        }
        ns->items = items;
        ns->cap = cap;
    }
    ns->items[ns->n++] = (struct named){key, m};
}

static int by_id(const void *a, const void *b)
{
    return strcmp(((const struct named *)a)->id, ((const struct named *)b)->id);
}

static const char *model_state(const struct model *m, uint64_t now);

/* A model with revisions: the most awake of its revisions. */
static const char *revisions_state(const struct model *m, uint64_t now)
{
    static const char *const order[] = {"ready", "starting", "scaled_to_zero", "unavailable"};
    size_t best = 3;
    for (size_t i = 0; i < m->revs->n; i++) {
        const struct model *r = m->revs->rev[i];
        const char *s = r ? model_state(r, now) : "unavailable";
        for (size_t k = 0; k < best; k++) {
            if (strcmp(order[k], s) == 0) {
                best = k;
            }
        }
    }
    return order[best];
}

/* Replicas serving now (not ejected after a failure) and held requests of
 * a model, or of all its revisions. */
static void model_counts(const struct model *m, uint64_t now, size_t *replicas, size_t *queued)
{
    *replicas = model_serving_endpoints(m, now);
    *queued = m->queue.count;
    for (size_t i = 0; m->revs && i < m->revs->n; i++) {
        if (m->revs->rev[i]) {
            *replicas += model_serving_endpoints(m->revs->rev[i], now);
            *queued += m->revs->rev[i]->queue.count;
        }
    }
}

/* What a UI shows of a model without asking it anything. */
static const char *model_state(const struct model *m, uint64_t now)
{
    if (m->revs) {
        return revisions_state(m, now);
    }
    if (model_serving_endpoints(m, now) > 0) {
        return "ready";
    }
    if (m->fixed_replicas) {
        return "unavailable"; /* static endpoints: none left, or all failing */
    }
    if (m->replicas_asleep > 0 && m->queue.count == 0) {
        return "sleeping"; /* the next request wakes one in seconds */
    }
    if (m->replicas_desired > 0 || m->queue.count > 0) {
        return "starting";
    }
    return "scaled_to_zero";
}

/* When thaw started, in Unix seconds: the same "created" on every listing. */
static long long started_unix(const struct runtime *rt)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long wall_ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    long long up_ms = (long long)(clock_now_ms() - rt->started_ms);
    return (wall_ms - up_ms + 500) / 1000;
}

static void append_entry(struct buf *out, const char *id, const struct model *m, long long created)
{
    const char *owner = m->namespace_ ? m->namespace_ : "thaw";
    buf_append_str(out, "{\"id\":\"");
    buf_append_json_escaped(out, id, strlen(id));
    buf_printf(out, "\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"", created);
    buf_append_json_escaped(out, owner, strlen(owner));
    buf_append_str(out, "\",\"root\":\"");
    buf_append_json_escaped(out, m->name, strlen(m->name));
    uint64_t now = clock_now_ms();
    size_t replicas, queued;
    model_counts(m, now, &replicas, &queued);
    buf_printf(out, "\",\"state\":\"%s\",\"tier\":\"%s\",\"replicas\":%zu,\"queued\":%zu}",
               model_state(m, now), tier_name(m->set.priority), replicas, queued);
}

void models_api_list(const struct runtime *rt, struct buf *out)
{
    struct names ns = {.router = &rt->fleet.router};
    strmap_each(&rt->fleet.router.by_name, collect, &ns);
    if (ns.n > 1) {
        qsort(ns.items, ns.n, sizeof *ns.items, by_id);
    }
    long long created = started_unix(rt);
    buf_append_str(out, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < ns.n; i++) {
        if (i) {
            buf_append(out, ",", 1);
        }
        append_entry(out, ns.items[i].id, ns.items[i].model, created);
    }
    buf_append_str(out, "]}\n");
    free(ns.items);
}

bool models_api_one(const struct runtime *rt, const char *id, size_t len, struct buf *out)
{
    const struct model *m = router_lookup_name(&rt->fleet.router, id, len);
    if (!m || m->removed || memchr(id, '\0', len)) {
        return false;
    }
    append_entry(out, id, m, started_unix(rt));
    buf_append(out, "\n", 1);
    return true;
}

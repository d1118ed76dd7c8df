#include "thaw/k8s/peers.h"
#include "thaw/clock.h"
#include "thaw/k8s/objects.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct k8s_peer {
    struct k8s_peers *set;
    char addr[96];
    bool self;
    bool seen;     /* in the latest slice */
    bool draining; /* terminating (a rollout of thaw): keeps its place until it leaves */
    uint64_t last_ok_ms;
    uint64_t polls, failures;
    struct strmap demand; /* model key -> (uintptr_t) demand + 1 */
    struct strmap queued; /* model key -> (uintptr_t) queued + 1, models with some queued */
    struct strmap idle;   /* model key -> (uintptr_t) ms since its last request + 1 */
    struct strmap unrouted; /* "ns/pod" -> (void *)1: pods it keeps out of routing (asleep) */
    uint64_t asked_ms;      /* when the poll under way (or the last) was sent */
    uint64_t answer_asked_ms; /* when the poll of the latest answer was sent */
    struct k8s_call *call;
    char identity[254];
};

static void free_peer(struct k8s_peer *pe)
{
    k8s_call_cancel(pe->call);
    strmap_dispose(&pe->demand);
    strmap_dispose(&pe->queued);
    strmap_dispose(&pe->idle);
    strmap_dispose(&pe->unrouted);
    free(pe);
}

static void mark_unseen(void *ud, const char *key, void *value)
{
    ((struct k8s_peer *)value)->seen = false;
}

struct slice_pass {
    struct k8s_peers *p;
    bool changed;
};

static void add_endpoint(void *ud, const struct k8s_slice_endpoint *e)
{
    struct slice_pass *sp = ud;
    struct k8s_peers *p = sp->p;
    char addr[96];
    snprintf(addr, sizeof addr, strchr(e->address, ':') ? "[%s]:%u" : "%s:%u", e->address,
             p->port);
    struct k8s_peer *pe = strmap_get(&p->peers, addr, strlen(addr));
    if (!pe) {
        pe = calloc(1, sizeof *pe);
        if (!pe) {
            return;
        }
        pe->set = p;
        snprintf(pe->addr, sizeof pe->addr, "%s", addr);
        pe->self = strcmp(e->address, p->self_ip) == 0;
        strmap_init(&pe->demand);
        strmap_init(&pe->queued);
        strmap_init(&pe->idle);
        strmap_init(&pe->unrouted);
        strmap_put(&p->peers, addr, strlen(addr), pe);
        LOGI("peer activator found", "peer=%s self=%d", addr, pe->self);
        sp->changed = true;
    }
    pe->seen = true;
    if (pe->draining != e->terminating) {
        /* The deal does not change: kube-proxy still sends it requests for
         * a while, and it drains what it holds, so it keeps its share (and
         * its demand counts) until it leaves the Service. */
        pe->draining = e->terminating;
        LOGI(e->terminating ? "peer activator terminating: it keeps its share until it leaves"
                            : "peer activator no longer terminating",
             "peer=%s self=%d", addr, pe->self);
    }
}

struct gone {
    char *keys[256];
    size_t n;
};

static void collect_unseen(void *ud, const char *key, void *value)
{
    struct gone *g = ud;
    if (!((struct k8s_peer *)value)->seen && g->n < 256) {
        g->keys[g->n++] = strdup(key);
    }
}

static void slice_upsert(void *ud, const cJSON *obj)
{
    struct k8s_peers *p = ud;
    strmap_each(&p->peers, mark_unseen, NULL);
    struct slice_pass sp = {p, false};
    k8s_slice_each(obj, add_endpoint, &sp);
    struct gone g = {.n = 0};
    strmap_each(&p->peers, collect_unseen, &g);
    for (size_t i = 0; i < g.n; i++) {
        struct k8s_peer *pe = strmap_del(&p->peers, g.keys[i], strlen(g.keys[i]));
        if (pe) {
            LOGI("peer activator gone", "peer=%s", pe->addr);
            free_peer(pe);
            sp.changed = true;
        }
        free(g.keys[i]);
    }
    if (sp.changed && p->on_change) {
        p->on_change(p->on_change_ud);
    }
}

static void on_slices_synced(void *ud)
{
    struct k8s_peers *p = ud;
    if (p->on_change) {
        p->on_change(p->on_change_ud);
    }
}

static void slice_remove(void *ud, const cJSON *obj)
{
}

static void on_demand(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_peer *pe = ud;
    pe->call = NULL;
    if (status != 200) {
        pe->failures++;
        return;
    }
    if (k8s_peer_report_parse(body, len, &pe->demand, &pe->queued, &pe->idle, &pe->unrouted,
                              pe->identity, sizeof pe->identity)) {
        pe->failures++;
        return;
    }
    pe->last_ok_ms = clock_now_ms();
    pe->answer_asked_ms = pe->asked_ms;
}

/* Stored plus one (a NULL value reads as absent): capped below the top. */
static void *count_value(uint64_t n)
{
    uint64_t cap = (uint64_t)UINTPTR_MAX - 1;
    return (void *)(uintptr_t)((n > cap ? cap : n) + 1);
}

int k8s_peer_demand_parse(const char *body, size_t len, struct strmap *demand,
                          struct strmap *idle, struct strmap *unrouted, char *identity,
                          size_t idlen)
{
    return k8s_peer_report_parse(body, len, demand, NULL, idle, unrouted, identity, idlen);
}

int k8s_peer_report_parse(const char *body, size_t len, struct strmap *demand,
                          struct strmap *queued, struct strmap *idle, struct strmap *unrouted,
                          char *identity, size_t idlen)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(root, "models");
    if (!cJSON_IsObject(models)) {
        cJSON_Delete(root);
        return -1;
    }
    strmap_dispose(demand);
    strmap_init(demand);
    if (queued) {
        strmap_dispose(queued);
        strmap_init(queued);
    }
    if (idle) {
        strmap_dispose(idle);
        strmap_init(idle);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, models)
    {
        uint64_t in = k8s_json_count(cJSON_GetArrayItem(m, 0));
        uint64_t q = k8s_json_count(cJSON_GetArrayItem(m, 1));
        uint64_t d = q > UINT64_MAX - in ? UINT64_MAX : in + q;
        strmap_put(demand, m->string, strlen(m->string), count_value(d));
        if (queued && q) {
            strmap_put(queued, m->string, strlen(m->string), count_value(q));
        }
        /* Optional third: ms since the model's last request at that peer. */
        const cJSON *age = cJSON_GetArrayItem(m, 2);
        if (idle && cJSON_IsNumber(age) && age->valuedouble >= 0) {
            strmap_put(idle, m->string, strlen(m->string), count_value(k8s_json_count(age)));
        }
    }
    if (unrouted) {
        strmap_dispose(unrouted);
        strmap_init(unrouted);
        const cJSON *pod;
        cJSON_ArrayForEach(pod, cJSON_GetObjectItemCaseSensitive(root, "unrouted"))
        {
            if (cJSON_IsString(pod) && pod->valuestring[0]) {
                strmap_put(unrouted, pod->valuestring, strlen(pod->valuestring), (void *)1);
            }
        }
    }
    const char *id = k8s_get_string(root, "identity");
    snprintf(identity, idlen, "%s", id ? id : "");
    cJSON_Delete(root);
    return 0;
}

static void poll_one(void *ud, const char *key, void *value)
{
    struct k8s_peer *pe = value;
    struct k8s_peers *p = ud;
    if (pe->self || pe->call) {
        return;
    }
    char url[160];
    snprintf(url, sizeof url, "http://%s/demand", pe->addr);
    pe->polls++;
    pe->asked_ms = clock_now_ms();
    pe->call = k8s_request(p->client, "GET", url, NULL, NULL, 0, (long)p->timeout_ms, on_demand,
                           pe);
}

static void on_poll(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_peers *p = arg;
    if (p->polling) {
        strmap_each(&p->peers, poll_one, p);
    }
    struct timeval tv = clock_timeval(p->poll_ms);
    event_add(&p->timer, &tv);
}

static bool fresh(const struct k8s_peers *p, const struct k8s_peer *pe)
{
    return !pe->self && pe->last_ok_ms && clock_now_ms() - pe->last_ok_ms < p->timeout_ms;
}

struct sum {
    struct k8s_peers *p;
    const char *key;
    uint64_t total;
    unsigned count;
    bool fresh_only;
};

static void add_demand(void *ud, const char *k, void *value)
{
    struct sum *s = ud;
    struct k8s_peer *pe = value;
    if (!fresh(s->p, pe)) {
        return;
    }
    void *d = strmap_get(&pe->demand, s->key, strlen(s->key));
    if (d) {
        s->total += (uintptr_t)d - 1;
    }
}

uint64_t k8s_peers_demand(struct k8s_peers *p, const char *key)
{
    struct sum s = {p, key, 0, 0, true};
    strmap_each(&p->peers, add_demand, &s);
    return s.total;
}

struct newest {
    struct k8s_peers *p;
    const char *key;
    uint64_t now_ms, idle_ms;
};

static void newest_request(void *ud, const char *k, void *value)
{
    struct newest *n = ud;
    struct k8s_peer *pe = value;
    void *v = fresh(n->p, pe) ? strmap_get(&pe->idle, n->key, strlen(n->key)) : NULL;
    if (v) {
        /* As old as it was when the peer answered, plus the time since. */
        uint64_t idle = (uint64_t)(uintptr_t)v - 1;
        uint64_t since = n->now_ms - pe->last_ok_ms;
        idle = idle > UINT64_MAX - since ? UINT64_MAX : idle + since;
        if (idle < n->idle_ms) {
            n->idle_ms = idle;
        }
    }
}

uint64_t k8s_peers_idle_ms(struct k8s_peers *p, const char *key)
{
    struct newest n = {p, key, clock_now_ms(), UINT64_MAX};
    strmap_each(&p->peers, newest_request, &n);
    return n.idle_ms;
}

struct let_go {
    struct k8s_peers *p;
    const char *model_key, *pod_key;
    uint64_t since_ms;
    bool all;
};

static void check_let_go(void *ud, const char *k, void *value)
{
    struct let_go *g = ud;
    struct k8s_peer *pe = value;
    if (pe->self) {
        return;
    }
    if (pe->answer_asked_ms < g->since_ms || !fresh(g->p, pe)) {
        g->all = false; /* not heard from since, or not lately */
        return;
    }
    if (!g->pod_key) {
        return;
    }
    uintptr_t d = (uintptr_t)strmap_get(&pe->demand, g->model_key, strlen(g->model_key));
    if (d > 1 || !strmap_get(&pe->unrouted, g->pod_key, strlen(g->pod_key))) {
        g->all = false;
    }
}

bool k8s_peers_heard_all(struct k8s_peers *p, uint64_t since_ms)
{
    struct let_go g = {p, NULL, NULL, since_ms, true};
    strmap_each(&p->peers, check_let_go, &g);
    return g.all;
}

bool k8s_peers_let_go(struct k8s_peers *p, const char *model_key, const char *pod_key,
                      uint64_t since_ms)
{
    struct let_go g = {p, model_key, pod_key, since_ms, true};
    strmap_each(&p->peers, check_let_go, &g);
    return g.all;
}

static void count_peer(void *ud, const char *k, void *value)
{
    struct sum *s = ud;
    struct k8s_peer *pe = value;
    if (!pe->self && (!s->fresh_only || fresh(s->p, pe))) {
        s->count++;
    }
}

unsigned k8s_peers_count(struct k8s_peers *p, bool fresh_only)
{
    struct sum s = {p, NULL, 0, 0, fresh_only};
    strmap_each(&p->peers, count_peer, &s);
    return s.count;
}

static void describe_peer(void *ud, const char *k, void *value)
{
    struct k8s_peer *pe = value;
    struct k8s_peers *p = pe->set;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "address", pe->addr);
    cJSON_AddBoolToObject(j, "self", pe->self);
    cJSON_AddBoolToObject(j, "draining", pe->draining);
    if (!pe->self) {
        cJSON_AddStringToObject(j, "identity", pe->identity);
        cJSON_AddBoolToObject(j, "fresh", fresh(p, pe));
        cJSON_AddNumberToObject(j, "last_answer_ms_ago",
                                pe->last_ok_ms ? (double)(clock_now_ms() - pe->last_ok_ms) : -1);
        cJSON_AddNumberToObject(j, "polls", (double)pe->polls);
        cJSON_AddNumberToObject(j, "failures", (double)pe->failures);
    }
    cJSON_AddItemToArray(ud, j);
}

struct place {
    const char *self;
    unsigned before, n;
    bool found;
};

static void place_peer(void *ud, const char *k, void *value)
{
    struct place *pl = ud;
    const struct k8s_peer *pe = value;
    pl->n++;
    if (pe->self) {
        pl->found = true;
        pl->self = pe->addr;
    }
}

static void count_before(void *ud, const char *k, void *value)
{
    struct place *pl = ud;
    const struct k8s_peer *pe = value;
    if (strcmp(pe->addr, pl->self) < 0) {
        pl->before++;
    }
}

bool k8s_pod_in_deal(bool terminating, bool unschedulable, bool ready, uint64_t age_ms,
                     uint64_t startup_ms)
{
    if (terminating || unschedulable) {
        return false;
    }
    return ready || age_ms < startup_ms;
}

uint32_t k8s_share_settle(struct k8s_share_hold *h, uint32_t dealt, uint64_t now_ms,
                          uint64_t settle_ms)
{
    if (!h->known) {
        *h = (struct k8s_share_hold){true, dealt, dealt, now_ms};
        return dealt;
    }
    bool holding = now_ms - h->moved_ms < settle_ms;
    if (dealt != h->dealt) {
        uint32_t before = holding ? h->floor : h->dealt;
        h->floor = dealt < before ? dealt : before;
        h->dealt = dealt;
        h->moved_ms = now_ms;
        holding = true;
    }
    return holding && h->floor < dealt ? h->floor : dealt;
}

bool k8s_peers_place(const struct k8s_peers *p, unsigned *rank, unsigned *n)
{
    struct place pl = {NULL, 0, 0, false};
    strmap_each(&p->peers, place_peer, &pl);
    *rank = 0;
    *n = pl.n;
    if (pl.n == 0) {
        *n = 1;
        return p->slices.synced;
    }
    if (!pl.found) {
        return false;
    }
    strmap_each(&p->peers, count_before, &pl);
    *rank = pl.before;
    return p->slices.synced;
}

uint32_t k8s_activator_share(uint32_t concurrency, unsigned n, unsigned rank, size_t pod_index)
{
    if (n <= 1) {
        return concurrency;
    }
    /* Slot k (counted over all pods, pod by pod) goes to activator k mod n;
     * this pod's slots start at k = pod_index * concurrency. */
    unsigned first = (unsigned)(((uint64_t)pod_index * concurrency) % n);
    unsigned offset = (rank % n + n - first) % n;
    return concurrency / n + (offset < concurrency % n ? 1 : 0);
}

unsigned k8s_pods_to_reach(uint32_t concurrency, unsigned rank)
{
    /* Rank k's first slot is slot k of the deal: on pod k / concurrency. */
    return rank / (concurrency ? concurrency : 1) + 1;
}

struct waiting {
    struct k8s_peers *p;
    const char *key;
    const char *last; /* address of the last peer with requests waiting */
    unsigned upto;    /* activators ordered up to it */
};

static void find_last_waiting(void *ud, const char *k, void *value)
{
    struct waiting *w = ud;
    const struct k8s_peer *pe = value;
    /* Queued there, or running there: the slot a request got from the floor
     * stays needed until it ends (else the pod it runs on is scaled away). */
    uintptr_t d = (uintptr_t)strmap_get(&pe->demand, w->key, strlen(w->key));
    bool busy = strmap_get(&pe->queued, w->key, strlen(w->key)) || d > 1;
    if (fresh(w->p, pe) && busy && (!w->last || strcmp(pe->addr, w->last) > 0)) {
        w->last = pe->addr;
    }
}

static void count_upto(void *ud, const char *k, void *value)
{
    struct waiting *w = ud;
    if (strcmp(((const struct k8s_peer *)value)->addr, w->last) <= 0) {
        w->upto++;
    }
}

unsigned k8s_peers_waiting_span(struct k8s_peers *p, const char *key)
{
    struct waiting w = {p, key, NULL, 0};
    strmap_each(&p->peers, find_last_waiting, &w);
    if (w.last) {
        strmap_each(&p->peers, count_upto, &w);
    }
    return w.upto;
}

void k8s_peers_describe(struct k8s_peers *p, cJSON *out)
{
    cJSON *arr = cJSON_AddArrayToObject(out, "peers");
    strmap_each(&p->peers, describe_peer, arr);
}

static const struct k8s_informer_ops slice_ops = {slice_upsert, slice_remove, on_slices_synced};

void k8s_peers_init(struct k8s_peers *p, struct k8s_client *c, struct event_base *base,
                    const char *namespace_, const char *service, unsigned port, const char *self_ip,
                    uint64_t poll_ms, uint64_t timeout_ms)
{
    memset(p, 0, sizeof *p);
    p->client = c;
    p->port = port;
    p->poll_ms = poll_ms;
    p->timeout_ms = timeout_ms;
    snprintf(p->self_ip, sizeof p->self_ip, "%s", self_ip ? self_ip : "");
    strmap_init(&p->peers);
    char path[600], sel[400];
    snprintf(path, sizeof path, "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices",
             namespace_);
    snprintf(sel, sizeof sel, "kubernetes.io/service-name=%s", service);
    k8s_informer_init(&p->slices, c, base, "peer endpointslices", path, sel, &slice_ops, p);
    event_assign(&p->timer, base, -1, 0, on_poll, p);
}

void k8s_peers_start(struct k8s_peers *p)
{
    k8s_informer_start(&p->slices);
    struct timeval tv = {0, 0};
    event_add(&p->timer, &tv);
}

void k8s_peers_set_polling(struct k8s_peers *p, bool on)
{
    p->polling = on;
    if (on) {
        event_active(&p->timer, EV_TIMEOUT, 0); /* a new leader hears from them at once */
    }
}

static void free_peer_cb(void *ud, const char *key, void *value)
{
    free_peer(value);
}

void k8s_peers_dispose(struct k8s_peers *p)
{
    event_del(&p->timer);
    k8s_informer_dispose(&p->slices);
    strmap_each(&p->peers, free_peer_cb, NULL);
    strmap_dispose(&p->peers);
}

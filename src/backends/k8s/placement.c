/* Kubernetes backend, placement: what the warm pool needs to decide per
 * node. Nodes with a counted extended resource (K8S_RESOURCE_PREFIX) are
 * the warm pool's nodes, each a set of (resource -> allocatable); a model's
 * replica is its pod template's set of (resource -> request), eligible on a
 * node when the scheduler's checks other than resources pass (cordon,
 * taints against tolerations, nodeSelector, required node affinity); its
 * replicas per node are its pods that are scheduled and not terminating
 * (a terminating pod's resources count as free: they are on their way, and
 * counting them would take a second victim for the same room; the scheduler
 * holds a new pod back until they are, but not for GPU memory, which it does
 * not see: a scale-up of a model that declares memory waits while a
 * terminating pod still holds some on a node it may use,
 * kube_memory_leaving_for). Only thaw's
 * model pods are watched, so resources held by other workloads are not
 * seen.
 * GPU memory: a node's shared GPUs (nvidia.com/gpu, nvidia.com/gpu.shared)
 * are `gpus` bins of nvidia.com/gpu.memory (or kubernetes.gpu_memory_bytes)
 * each; a replica of a model with thaw.dev/gpu-memory that asks for a shared
 * GPU takes that much of one bin (warmpool.h). MIG instances are not bins:
 * their profile carries their memory. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void kube_model_template(struct kmodel *km, const cJSON *deployment)
{
    struct k8s_pod_template t;
    if (k8s_pod_template_decode(k8s_get(deployment, "spec.template.spec"), &t)) {
        k8s_pod_template_dispose(&t);
        LOGW("cannot read a model's pod template (out of memory); placement keeps the old one",
             "deployment=%s", km->key);
        return;
    }
    k8s_pod_template_dispose(&km->tpl);
    km->tpl = t;
    uint64_t slices = k8s_resources_total(&t.requests);
    km->sc.slices = slices > UINT32_MAX ? UINT32_MAX : (unsigned)slices;
}

/* A resource whose GPUs share their memory among the replicas on them. */
static bool memory_shared(const char *resource)
{
    return strcmp(resource, "nvidia.com/gpu") == 0 ||
           strcmp(resource, "nvidia.com/gpu.shared") == 0;
}

uint64_t kube_shared_gpus(const struct k8s_node_info *ni)
{
    uint64_t units = 0;
    for (size_t i = 0; i < ni->allocatable.n; i++) {
        if (memory_shared(ni->allocatable.r[i].name)) {
            units += ni->allocatable.r[i].amount;
        }
    }
    uint64_t per_gpu = ni->gpu_replicas ? ni->gpu_replicas : 1;
    uint64_t whole = (units + per_gpu - 1) / per_gpu;
    /* gpu.count also counts GPUs split into MIG instances (mixed strategy) */
    return ni->gpu_count && ni->gpu_count < whole ? ni->gpu_count : whole;
}

uint64_t kube_gpu_memory(const struct kube_backend *kb, const struct k8s_node_info *ni,
                         const char **source)
{
    if (ni->gpu_memory) {
        *source = "label";
        return ni->gpu_memory;
    }
    *source = kb->cfg->kubernetes.gpu_memory_bytes ? "config" : "unknown";
    return kb->cfg->kubernetes.gpu_memory_bytes;
}

uint64_t kube_replica_memory(const struct kmodel *km)
{
    for (size_t i = 0; i < km->tpl.requests.n; i++) {
        if (km->tpl.requests.r[i].amount && memory_shared(km->tpl.requests.r[i].name)) {
            return km->spec.gpu_memory_bytes;
        }
    }
    return 0;
}

static void any_memory(void *ud, const char *key, void *value)
{
    const struct k8s_node_info *ni = value;
    if (ni->gpu_memory && kube_gpu_node(ni)) {
        *(bool *)ud = true;
    }
}

bool kube_memory_bound(const struct kmodel *km)
{
    if (!kube_replica_memory(km)) {
        return false;
    }
    bool any = km->kb->cfg->kubernetes.gpu_memory_bytes > 0;
    if (!any) {
        strmap_each(&km->kb->nodes_gpu, any_memory, &any);
    }
    return any;
}

bool kube_plan_wakes(const struct kmodel *km)
{
    return kube_memory_bound(km) || (km->kb->cfg->warm_pool.capacity_slices && km->sc.slices);
}

bool kube_gpu_node(const struct k8s_node_info *ni)
{
    for (size_t i = 0; i < ni->allocatable.n; i++) {
        if (ni->allocatable.r[i].amount) {
            return true;
        }
    }
    return false;
}

/* ---- usage per node ----------------------------------------------------- */

static void pod_usage(void *ud, const char *key, void *value)
{
    struct strmap *out = ud;
    const struct kpod *p = value;
    if (!p->node[0] || p->terminating) {
        return;
    }
    struct k8s_resources *u = strmap_get(out, p->node, strlen(p->node));
    if (!u) {
        u = calloc(1, sizeof *u);
        if (!u || strmap_put(out, p->node, strlen(p->node), u)) {
            free(u);
            return;
        }
    }
    for (size_t i = 0; i < p->requests.n; i++) {
        (void)k8s_resources_add(u, p->requests.r[i].name, p->requests.r[i].amount);
    }
}

static void model_usage(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, pod_usage, ud);
}

void kube_node_usage(struct kube_backend *kb, struct strmap *out)
{
    strmap_init(out);
    strmap_each(&kb->models, model_usage, out);
}

static void free_value(void *ud, const char *key, void *value)
{
    free(value);
}

void kube_node_usage_free(struct strmap *usage)
{
    strmap_each(usage, free_value, NULL);
    strmap_dispose(usage);
}

/* ---- GPU memory per node ------------------------------------------------ */

struct memory_ctx {
    const char *node;
    struct kube_node_memory *out;
    size_t cap;
    bool oom;
    bool awake;   /* leave out pods falling asleep */
    bool leaving; /* count pods on their way out that still hold theirs */
    bool staying; /* leave out pods on their way out */
    unsigned n_leaving;
};

bool kube_pod_holds_memory(const struct kpod *p)
{
    /* A retired pod, or one whose wake failed, still runs until the kubelet
     * stops it (terminating): its memory is not free yet. */
    return p->node[0] && !p->terminating && kube_replica_memory(p->km) &&
           !(p->sleep == KS_ASLEEP && !p->wake_asked_ms);
}

/* How long after thaw scaled a model down its pods beyond the new count
 * are taken as on their way out: the ReplicaSet marks the ones it picks
 * within moments. Bounded, so that a rollout's surge pods (more pods than
 * replicas for as long as it lasts) hold nothing back. */
#define SHRINK_WINDOW_MS 15000

static void count_staying(void *ud, const char *key, void *value)
{
    const struct kpod *p = value;
    *(int64_t *)ud += p->node[0] && !p->terminating;
}

/* Scaled down by thaw a moment ago and still running more pods than that. */
static bool model_shrinking(const struct kmodel *km)
{
    if (!km->scaled_down_ms || clock_now_ms() - km->scaled_down_ms > SHRINK_WINDOW_MS) {
        return false;
    }
    int64_t want = km->scale_want >= 0 ? km->scale_want : km->spec.replicas;
    int64_t pods = 0;
    strmap_each((struct strmap *)&km->pods, count_staying, &pods);
    return pods > want;
}

bool kube_pod_on_way_out(const struct kpod *p)
{
    if (!p->node[0] || !kube_replica_memory(p->km) || (p->sleep == KS_ASLEEP && !p->wake_asked_ms)) {
        return false; /* holds none (asleep pods hold none) */
    }
    if (p->terminating) {
        return p->memory_until_ms > (int64_t)clock_wall_ms();
    }
    return model_shrinking(p->km);
}

static void memory_pod(void *ud, const char *key, void *value)
{
    struct memory_ctx *c = ud;
    const struct kpod *p = value;
    if (strcmp(p->node, c->node) != 0) {
        return;
    }
    bool leaving = (c->leaving || c->staying) && kube_pod_on_way_out(p);
    if ((leaving && c->staying) || (!leaving && !kube_pod_holds_memory(p)) ||
        (c->awake && p->sleep == KS_DOZING)) {
        return;
    }
    c->n_leaving += leaving;
    uint64_t mem = kube_replica_memory(p->km);
    struct kube_node_memory *o = c->out;
    if (o->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        uint64_t *items = realloc(o->items, (cap + 1) * sizeof *items);
        if (!items) {
            c->oom = true;
            return;
        }
        o->items = items;
        c->cap = cap;
    }
    o->items[o->n++] = mem;
    o->used = o->used + mem < o->used ? UINT64_MAX : o->used + mem;
}

static void memory_model(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, memory_pod, ud);
}

/* What the pods on ni hold (c's flags say which); c->n_leaving: how many
 * of them are on their way out. */
static int node_memory(struct kube_backend *kb, const struct k8s_node_info *ni,
                       struct kube_node_memory *out, struct memory_ctx *c)
{
    memset(out, 0, sizeof *out);
    out->per_gpu = kube_gpu_memory(kb, ni, &out->source);
    uint64_t gpus = kube_shared_gpus(ni);
    out->gpus = gpus > WP_MAX_GPUS ? WP_MAX_GPUS : (unsigned)gpus;
    c->node = ni->name;
    c->out = out;
    strmap_each(&kb->models, memory_model, c);
    if (c->oom) {
        kube_node_memory_dispose(out);
        return -1;
    }
    return 0;
}

int kube_node_memory(struct kube_backend *kb, const struct k8s_node_info *ni,
                     struct kube_node_memory *out)
{
    struct memory_ctx c = {0};
    return node_memory(kb, ni, out, &c);
}

struct leaving_ctx {
    const struct kmodel *km;
    bool wait;
};

/* A node km may use where pods on their way out still hold GPU memory that
 * one more replica of km would not fit beside, and would once they are
 * gone (where it would not fit either way, waiting gains nothing). */
static void leaving_node(void *ud, const char *key, void *value)
{
    struct leaving_ctx *l = ud;
    const struct k8s_node_info *ni = value;
    if (l->wait || k8s_node_admits(ni, &l->km->tpl) != K8S_FITS) {
        return;
    }
    uint64_t need = kube_replica_memory(l->km);
    struct kube_node_memory with, without;
    struct memory_ctx c = {.leaving = true}, s = {.staying = true};
    if (node_memory(l->km->kb, ni, &with, &c)) {
        return;
    }
    if (c.n_leaving && !kube_node_memory_fits(&with, need) &&
        node_memory(l->km->kb, ni, &without, &s) == 0) {
        l->wait = kube_node_memory_fits(&without, need);
        kube_node_memory_dispose(&without);
    }
    kube_node_memory_dispose(&with);
}

bool kube_memory_leaving_for(const struct kmodel *km)
{
    struct leaving_ctx l = {km, false};
    if (kube_replica_memory(km)) {
        strmap_each(&km->kb->nodes_gpu, leaving_node, &l);
    }
    return l.wait;
}

bool kube_node_awake_packs(struct kube_backend *kb, const struct k8s_node_info *ni)
{
    struct kube_node_memory nm;
    struct memory_ctx c = {.awake = true};
    if (node_memory(kb, ni, &nm, &c)) {
        return true; /* out of memory: the sums alone decide */
    }
    bool packs = kube_node_memory_fits(&nm, 0);
    kube_node_memory_dispose(&nm);
    return packs;
}

bool kube_node_memory_fits(struct kube_node_memory *nm, uint64_t extra)
{
    if (!nm->per_gpu) {
        return true;
    }
    if (extra > nm->per_gpu) {
        return false;
    }
    uint64_t none[1];
    uint64_t *items = nm->items ? nm->items : none; /* room for one more: see memory_pod */
    items[nm->n] = extra;
    return wp_memory_packs(items, nm->n + 1, nm->gpus, nm->per_gpu);
}

void kube_node_memory_dispose(struct kube_node_memory *nm)
{
    free(nm->items);
    memset(nm, 0, sizeof *nm);
}

/* ---- the scaling driver's nodes hook ------------------------------------ */

/* The index of resource name, added when new; -1 when the table is full. */
static int res_index(struct kube_placement *pl, const char *name)
{
    for (size_t r = 0; r < pl->n_res; r++) {
        if (strcmp(pl->res[r], name) == 0) {
            return (int)r;
        }
    }
    if (pl->n_res == WP_MAX_RES) {
        return -1;
    }
    snprintf(pl->res[pl->n_res], sizeof pl->res[0], "%s", name);
    return (int)pl->n_res++;
}

static void add_node(void *ud, const char *key, void *value)
{
    struct kube_placement *pl = ud;
    const struct k8s_node_info *ni = value;
    if (!kube_gpu_node(ni) || pl->n_nodes == pl->cap_nodes) {
        return;
    }
    size_t k = pl->n_nodes++;
    struct wp_node *nd = &pl->nodes[k];
    memset(nd, 0, sizeof *nd);
    nd->name = ni->name;
    const char *source;
    nd->gpu_memory = kube_gpu_memory(pl->kb, ni, &source);
    uint64_t gpus = kube_shared_gpus(ni);
    nd->gpus = gpus > WP_MAX_GPUS ? WP_MAX_GPUS : (unsigned)gpus;
    pl->info[k] = ni;
    for (size_t i = 0; i < ni->allocatable.n; i++) {
        int r = res_index(pl, ni->allocatable.r[i].name);
        if (r >= 0) {
            nd->alloc[r] = ni->allocatable.r[i].amount;
        }
    }
}

static size_t node_index(const struct kube_placement *pl, const char *name)
{
    for (size_t k = 0; k < pl->n_nodes; k++) {
        if (strcmp(pl->nodes[k].name, name) == 0) {
            return k;
        }
    }
    return WP_NO_NODE;
}

struct count_ctx {
    const struct kube_placement *pl;
    unsigned *on_node;
};

static void count_pod(void *ud, const char *key, void *value)
{
    struct count_ctx *c = ud;
    const struct kpod *p = value;
    if (!p->node[0] || p->terminating) {
        return;
    }
    size_t k = node_index(c->pl, p->node);
    if (k != WP_NO_NODE) {
        c->on_node[k]++;
    }
}

/* One model's request, eligibility and pods per node. */
static void model_row(struct kube_placement *pl, struct kmodel *km, bool *eligible,
                      unsigned *on_node)
{
    struct scaler_model *sm = &km->sc;
    memset(sm->req, 0, sizeof sm->req);
    sm->gpu_memory = kube_replica_memory(km);
    sm->memory_sleeps = km->spec.sleep_level != 0;
    bool all_known = !km->tpl.requests.truncated;
    for (size_t i = 0; i < km->tpl.requests.n; i++) {
        int r = res_index(pl, km->tpl.requests.r[i].name);
        if (r < 0) {
            all_known = false; /* a resource past the table: place it nowhere */
        } else {
            sm->req[r] = km->tpl.requests.r[i].amount;
        }
    }
    for (size_t k = 0; k < pl->n_nodes; k++) {
        eligible[k] = all_known && k8s_node_admits(pl->info[k], &km->tpl) == K8S_FITS;
        on_node[k] = 0;
    }
    struct count_ctx c = {pl, on_node};
    strmap_each(&km->pods, count_pod, &c);
    sm->eligible = eligible;
    sm->on_node = on_node;
}

/* What the awake pods of sleep-mode models hold per node (struct wp_node's
 * held), and whose it is (held_model: a preemption of that model there
 * releases it, so a busy pod of a lower tier gives way as any other would):
 * counted in a first pass (pl->held NULL), written in a second. A pod
 * falling asleep is not counted: its memory is on its way. */
static void held_pod(void *ud, const char *key, void *value)
{
    struct kube_placement *pl = ud;
    const struct kpod *p = value;
    if (!kube_pod_holds_memory(p) || p->sleep == KS_DOZING) {
        return;
    }
    size_t k = node_index(pl, p->node);
    if (k == WP_NO_NODE) {
        return;
    }
    struct wp_node *nd = &pl->nodes[k];
    if (pl->held) {
        size_t at = (size_t)(nd->held - pl->held) + nd->n_held;
        pl->held[at] = (struct wp_held){kube_replica_memory(p->km), p->km->m->set.priority,
                                        kube_pod_sleepable(p)};
        pl->held_model[at] = p->km->plan_index;
    }
    nd->n_held++;
}

static void held_model(void *ud, const char *key, void *value)
{
    const struct kmodel *km = value;
    if (km->spec.sleep_level && kube_replica_memory(km)) {
        strmap_each(&km->pods, held_pod, ud);
    }
}

/* Out of memory, no node lists what sleep-mode pods hold: the plan admits
 * as if none were awake. */
static void collect_held(struct kube_placement *pl)
{
    struct wp_held *keep = pl->held;
    pl->held = NULL;
    strmap_each(&pl->kb->models, held_model, pl);
    size_t total = 0;
    for (size_t k = 0; k < pl->n_nodes; k++) {
        total += pl->nodes[k].n_held;
    }
    pl->held = keep;
    if (total > pl->cap_held) {
        struct wp_held *more = realloc(pl->held, total * sizeof *more);
        if (more) {
            pl->held = more;
        }
        size_t *whose = realloc(pl->held_model, total * sizeof *whose);
        if (whose) {
            pl->held_model = whose;
        }
        if (!more || !whose) {
            for (size_t k = 0; k < pl->n_nodes; k++) {
                pl->nodes[k].n_held = 0;
            }
            return;
        }
        pl->cap_held = total;
    }
    size_t at = 0;
    for (size_t k = 0; k < pl->n_nodes; k++) {
        pl->nodes[k].held = pl->held ? pl->held + at : NULL;
        pl->nodes[k].held_model = pl->held_model ? pl->held_model + at : NULL;
        at += pl->nodes[k].n_held;
        pl->nodes[k].n_held = 0;
    }
    if (total) {
        strmap_each(&pl->kb->models, held_model, pl);
    }
}

/* Room for want nodes and want_cells model x node cells. */
static int reserve(struct kube_placement *pl, size_t want, size_t want_cells)
{
    if (want > pl->cap_nodes) {
        struct wp_node *nodes = realloc(pl->nodes, want * sizeof *nodes);
        if (nodes) {
            pl->nodes = nodes;
        }
        const struct k8s_node_info **info = realloc(pl->info, want * sizeof *info);
        if (info) {
            pl->info = info;
        }
        if (!nodes || !info) {
            return -1;
        }
        pl->cap_nodes = want;
    }
    if (want_cells > pl->cap_cells) {
        bool *el = realloc(pl->eligible, want_cells * sizeof *el);
        if (el) {
            pl->eligible = el;
        }
        unsigned *on = realloc(pl->on_node, want_cells * sizeof *on);
        if (on) {
            pl->on_node = on;
        }
        if (!el || !on) {
            return -1;
        }
        pl->cap_cells = want_cells;
    }
    return 0;
}

static void unplanned(void *ud, const char *key, void *value)
{
    ((struct kmodel *)value)->plan_index = WP_NO_MODEL;
}

static bool no_nodes(struct scaler_model **sms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memset(sms[i]->req, 0, sizeof sms[i]->req);
        sms[i]->gpu_memory = 0;
        sms[i]->eligible = NULL;
        sms[i]->on_node = NULL;
    }
    return false;
}

bool kube_plan_nodes(void *ud, struct scaler_model **sms, size_t n, struct wp_cluster *c)
{
    struct kube_backend *kb = ud;
    struct kube_placement *pl = &kb->placement;
    size_t nodes = kb->nodes_gpu.count;
    if (nodes == 0 || reserve(pl, nodes, (n ? n : 1) * nodes)) {
        return no_nodes(sms, n);
    }
    pl->n_nodes = 0;
    pl->n_res = 0;
    pl->kb = kb;
    strmap_each(&kb->nodes_gpu, add_node, pl);
    if (pl->n_nodes == 0) {
        return no_nodes(sms, n);
    }
    strmap_each(&kb->models, unplanned, NULL);
    for (size_t i = 0; i < n; i++) {
        container_of(sms[i], struct kmodel, sc)->plan_index = i;
    }
    collect_held(pl);
    for (size_t i = 0; i < n; i++) {
        struct kmodel *km = container_of(sms[i], struct kmodel, sc);
        model_row(pl, km, pl->eligible + i * pl->n_nodes, pl->on_node + i * pl->n_nodes);
    }
    c->n_res = pl->n_res;
    for (size_t r = 0; r < pl->n_res; r++) {
        c->res[r] = pl->res[r];
    }
    c->nodes = pl->nodes;
    c->n_nodes = pl->n_nodes;
    return true;
}

void kube_placement_dispose(struct kube_placement *pl)
{
    free(pl->nodes);
    free(pl->info);
    free(pl->eligible);
    free(pl->on_node);
    free(pl->held);
    free(pl->held_model);
    memset(pl, 0, sizeof *pl);
}

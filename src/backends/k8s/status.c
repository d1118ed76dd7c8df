/* Kubernetes backend, status: a model's describe (spec, scaling, demand,
 * pods, placement, state), the capacity view (API client, Events,
 * informers, nodes with what thaw's replicas hold on each, leadership) and
 * the backend's metrics. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct describe_ctx {
    cJSON *arr;
    const struct model *m;
    unsigned unschedulable;
};

/* The slots this activator may use on a ready pod; -1 when not routed. */
static double pod_slots(const struct model *m, const char *pod)
{
    for (size_t i = 0; i < m->n_endpoints; i++) {
        const struct endpoint *ep = m->endpoints[i];
        if (strcmp(ep->id, pod) == 0) {
            return ep->share < m->set.max_concurrency ? ep->share : m->set.max_concurrency;
        }
    }
    return -1;
}

static void describe_pod(void *ud, const char *key, void *value)
{
    struct describe_ctx *d = ud;
    struct kpod *p = value;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", p->name);
    cJSON_AddStringToObject(j, "ip", p->ip);
    cJSON_AddStringToObject(j, "phase", p->phase);
    cJSON_AddBoolToObject(j, "ready", p->reported);
    cJSON_AddBoolToObject(j, "probe_ok", p->probe_ok);
    cJSON_AddBoolToObject(j, "endpoint_ready", p->slice_ready);
    cJSON_AddBoolToObject(j, "terminating", p->terminating);
    if (p->sleep != KS_AWAKE) {
        cJSON_AddStringToObject(j, "sleep", kube_pod_sleep_name(p->sleep));
    }
    cJSON_AddStringToObject(j, "node", p->node);
    cJSON_AddNumberToObject(j, "slots", pod_slots(d->m, p->name));
    if (p->unschedulable) {
        cJSON_AddBoolToObject(j, "unschedulable", true);
        d->unschedulable++;
    }
    if (p->phases.begun_ms) {
        /* A pod of a cold start in progress: where it is, and the time so far in each phase. */
        uint64_t now = clock_now_ms();
        cJSON *cs = cJSON_AddObjectToObject(j, "cold_start");
        cJSON_AddStringToObject(cs, "phase", cs_phase_name(p->phases.phase));
        cJSON_AddNumberToObject(cs, "phase_elapsed_ms",
                                (double)cs_timeline_phase_ms(&p->phases, p->phases.phase, now));
        cJSON *ph = cJSON_AddObjectToObject(cs, "phases_ms");
        for (int i = 0; i < CS_PHASES; i++) {
            if (cs_timeline_entered(&p->phases, (enum cs_phase)i)) {
                cJSON_AddNumberToObject(ph, cs_phase_name((enum cs_phase)i),
                                        (double)cs_timeline_phase_ms(&p->phases, (enum cs_phase)i,
                                                                     now));
            }
        }
    }
    cJSON_AddItemToArray(d->arr, j);
}

/* The effective settings (annotations over defaults), as thaw uses them. */
static void describe_settings(const struct kmodel *km, cJSON *out)
{
    const struct model_settings *set = &km->m->set;
    const struct as_config *asc = &km->sc.asc;
    cJSON *s = cJSON_AddObjectToObject(out, "settings");
    cJSON_AddNumberToObject(s, "max_queue", (double)set->max_queue);
    cJSON_AddNumberToObject(s, "queue_timeout_ms", (double)set->queue_timeout_ms);
    cJSON_AddNumberToObject(s, "connect_timeout_ms", (double)set->connect_timeout_ms);
    cJSON_AddNumberToObject(s, "first_byte_timeout_ms", (double)set->first_byte_timeout_ms);
    cJSON_AddNumberToObject(s, "upstream_idle_timeout_ms",
                            (double)set->upstream_idle_timeout_ms);
    cJSON_AddNumberToObject(s, "loading_heartbeat_ms", (double)set->loading_heartbeat_ms);
    cJSON_AddNumberToObject(s, "startup_timeout_ms", (double)km->spec.startup_timeout_ms);
    cJSON_AddNumberToObject(s, "idle_timeout_ms", (double)km->spec.idle_timeout_ms);
    cJSON_AddNumberToObject(s, "min_scale", (double)asc->min_scale);
    cJSON_AddNumberToObject(s, "max_scale", (double)asc->max_scale);
    cJSON_AddNumberToObject(s, "initial_scale",
                            km->spec.initial_scale_set ? (double)km->spec.initial_scale : 0);
    cJSON_AddNumberToObject(s, "activation_scale", (double)asc->activation_scale);
    cJSON_AddNumberToObject(s, "target", asc->target);
    cJSON_AddNumberToObject(s, "stable_window_ms", (double)asc->stable_window_ms);
    cJSON_AddNumberToObject(s, "panic_window_pct", asc->panic_window_pct);
    cJSON_AddNumberToObject(s, "panic_threshold_pct", asc->panic_threshold * 100.0);
    cJSON_AddNumberToObject(s, "scale_down_delay_ms", (double)asc->scale_down_delay_ms);
    cJSON_AddStringToObject(s, "metric", "concurrency");
}

static cJSON *resources_json(const struct k8s_resources *rs)
{
    cJSON *j = cJSON_CreateObject();
    for (size_t i = 0; i < rs->n; i++) {
        cJSON_AddNumberToObject(j, rs->r[i].name, (double)rs->r[i].amount);
    }
    return j;
}

struct fit_ctx {
    struct kmodel *km;
    const struct strmap *usage;
    cJSON *arr;
};

/* The scheduler's verdict, then thaw's: "gpu_memory" when one more replica
 * would not pack into the node's GPU memory. */
static const char *fit_name(struct kmodel *km, const struct k8s_node_info *ni,
                            const struct k8s_resources *used)
{
    enum k8s_fit fit = k8s_node_fits(ni, &km->tpl, used);
    uint64_t mem = kube_replica_memory(km);
    if (fit != K8S_FITS || !mem) {
        return k8s_fit_name(fit);
    }
    struct kube_node_memory nm;
    bool fits = kube_node_memory(km->kb, ni, &nm) == 0 && kube_node_memory_fits(&nm, mem);
    kube_node_memory_dispose(&nm);
    return fits ? k8s_fit_name(fit) : "gpu_memory";
}

static void node_fit(void *ud, const char *key, void *value)
{
    struct fit_ctx *f = ud;
    const struct k8s_node_info *ni = value;
    if (!kube_gpu_node(ni)) {
        return;
    }
    const struct k8s_resources *used = strmap_get(f->usage, ni->name, strlen(ni->name));
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", ni->name);
    cJSON_AddStringToObject(j, "fit", fit_name(f->km, ni, used));
    cJSON_AddItemToArray(f->arr, j);
}

/* Its request per replica and, per GPU node, whether one more replica
 * would fit there now or what stops it. */
static void describe_placement(struct kmodel *km, cJSON *out)
{
    cJSON *pl = cJSON_AddObjectToObject(out, "placement");
    cJSON_AddItemToObject(pl, "requests", resources_json(&km->tpl.requests));
    struct strmap usage;
    kube_node_usage(km->kb, &usage);
    struct fit_ctx f = {km, &usage, cJSON_AddArrayToObject(pl, "nodes")};
    strmap_each(&km->kb->nodes_gpu, node_fit, &f);
    kube_node_usage_free(&usage);
}

/* How long the model has been idle, as the scale-to-zero decision sees it,
 * and the last request recorded on its Deployment. */
static void describe_idle_clock(const struct kmodel *km, cJSON *out)
{
    cJSON *ic = cJSON_AddObjectToObject(out, "idle_clock");
    uint64_t idle = as_idle_ms(&km->sc.ass, clock_now_ms());
    if (idle == UINT64_MAX) {
        cJSON_AddNullToObject(ic, "idle_ms");
    } else {
        cJSON_AddNumberToObject(ic, "idle_ms", (double)idle);
    }
    if (km->annotated_ms > 0) {
        char when[40];
        k8s_time_format_ms(km->annotated_ms, when, sizeof when);
        cJSON_AddStringToObject(ic, "last_request_at", when);
    } else {
        cJSON_AddNullToObject(ic, "last_request_at");
    }
}

void kube_describe(struct backend *b, struct model *m, cJSON *out)
{
    if (m->revs) {
        kube_describe_group(m->backend_data, out);
        return;
    }
    struct kmodel *km = m->backend_data;
    cJSON_AddStringToObject(out, "backend", "kubernetes");
    cJSON_AddStringToObject(out, "deployment", km->key);
    cJSON_AddStringToObject(out, "service", km->spec.service);
    cJSON_AddNumberToObject(out, "port", km->spec.port);
    cJSON_AddNumberToObject(out, "replicas_desired", (double)km->spec.replicas);
    cJSON_AddNumberToObject(out, "replicas_ready_in_cluster", (double)km->spec.ready_replicas);
    cJSON_AddNumberToObject(out, "gpu_slices", (double)km->spec.gpu_slices);
    cJSON_AddNumberToObject(out, "gpu_memory_bytes", (double)km->spec.gpu_memory_bytes);
    cJSON_AddNumberToObject(out, "min_scale", (double)km->spec.min_scale);
    cJSON_AddNumberToObject(out, "max_scale", (double)km->spec.max_scale);
    cJSON_AddNumberToObject(out, "idle_timeout_ms", (double)km->spec.idle_timeout_ms);
    describe_settings(km, out);
    cJSON_AddNumberToObject(out, "scale_ups", (double)km->scale_ups);
    cJSON_AddNumberToObject(out, "scale_downs", (double)km->scale_downs);
    if (km->spec.errors[0]) {
        cJSON_AddStringToObject(out, "annotation_errors", km->spec.errors);
    }
    if (km->last_scale_error[0]) {
        cJSON_AddStringToObject(out, "last_scale_error", km->last_scale_error);
    }
    scaler_describe(&km->sc, out);
    describe_idle_clock(km, out);
    cJSON *dm = cJSON_AddObjectToObject(out, "demand");
    cJSON_AddNumberToObject(dm, "local", model_demand(m));
    if (km->kb->have_peers) {
        cJSON_AddNumberToObject(dm, "peers", (double)k8s_peers_demand(&km->kb->peers, km->key));
    }
    unsigned rank = 0, n = 1;
    bool placed = !km->kb->have_peers || k8s_peers_place(&km->kb->peers, &rank, &n);
    cJSON *sl = cJSON_AddObjectToObject(out, "slots");
    cJSON_AddNumberToObject(sl, "activators", n);
    cJSON_AddNumberToObject(sl, "rank", rank);
    cJSON_AddBoolToObject(sl, "placed", placed);
    cJSON_AddNumberToObject(sl, "here", model_capacity(m));
    struct describe_ctx d = {cJSON_AddArrayToObject(out, "pods"), m, 0};
    strmap_each(&km->pods, describe_pod, &d);
    describe_placement(km, out);
    unsigned waking = 0, dozing = 0;
    unsigned asleep = kube_pods_asleep(km, &waking, &dozing);
    if (km->spec.sleep_level) {
        cJSON *sm = cJSON_AddObjectToObject(out, "sleep");
        cJSON_AddNumberToObject(sm, "level", (double)km->spec.sleep_level);
        cJSON_AddNumberToObject(sm, "idle_before_sleep_ms", (double)km->spec.idle_before_sleep_ms);
        cJSON_AddNumberToObject(sm, "last_wake_ms", (double)km->last_wake_ms);
        cJSON_AddNumberToObject(sm, "sleeps", (double)m->stats.sleeps);
        cJSON_AddNumberToObject(sm, "wakes", (double)m->stats.wakes);
    }
    cJSON_AddNumberToObject(out, "replicas_sleeping", asleep + dozing);
    cJSON_AddNumberToObject(out, "replicas_waking", waking);
    const char *state = m->n_endpoints       ? "ready"
                        : waking             ? "waking"
                        : asleep             ? "sleeping"
                        : dozing             ? "falling_asleep"
                        : d.unschedulable    ? "waiting_for_capacity"
                        : km->spec.replicas  ? "starting"
                        /* held requests, and the plan denied the wake (GPU memory) */
                        : m->queue.count > 0 && strcmp(km->sc.last_action, "deny") == 0
                            ? "waiting_for_capacity"
                        /* a wake on its way, or failed and retried while requests wait */
                        : km->scale_inflight || (km->zero_failures && m->queue.count > 0)
                            ? "scaling_up"
                            : "scaled_to_zero";
    cJSON_AddStringToObject(out, "state", state);
}

/* Every informer this backend runs (its namespace, or NULL when cluster-wide
 * or the default), for /status and /metrics alike. */
static void each_informer(const struct kube_backend *kb,
                          void (*fn)(void *ud, const struct k8s_informer *inf, const char *ns),
                          void *ud)
{
    for (size_t i = 0; i < kb->n_ns; i++) {
        const char *ns = kb->cfg->kubernetes.n_namespaces ? kb->cfg->kubernetes.namespaces[i]
                                                          : NULL;
        fn(ud, &kb->ns[i].deployments, ns);
        fn(ud, &kb->ns[i].slices, ns);
        fn(ud, &kb->ns[i].pods, ns);
        if (kb->cfg->kubernetes.pull_events) {
            fn(ud, &kb->ns[i].pulling, ns);
            fn(ud, &kb->ns[i].pulled, ns);
        }
    }
    fn(ud, &kb->nodes, NULL);
    if (kb->tenants.on) {
        fn(ud, &kb->tenants.inf, kb->tenants.ns);
    }
}

static void add_informer(void *ud, const struct k8s_informer *inf, const char *ns)
{
    cJSON *arr = ud;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "resource", inf->name);
    cJSON_AddStringToObject(j, "namespace", ns ? ns : "");
    cJSON_AddBoolToObject(j, "synced", inf->synced);
    cJSON_AddStringToObject(j, "resource_version", inf->rv);
    cJSON_AddNumberToObject(j, "lists", (double)inf->relists);
    cJSON_AddNumberToObject(j, "list_pages", (double)inf->list_pages);
    cJSON_AddNumberToObject(j, "watch_restarts", (double)inf->watch_restarts);
    cJSON_AddNumberToObject(j, "errors", (double)inf->errors);
    cJSON_AddNumberToObject(j, "events", (double)inf->events);
    if (inf->last_error[0]) {
        cJSON_AddStringToObject(j, "last_error", inf->last_error);
    }
    cJSON_AddItemToArray(arr, j);
}

struct nodes_ctx {
    struct kube_backend *kb;
    const struct strmap *usage;
    struct strmap by_name; /* node name -> its JSON object */
    cJSON *arr;
};

static void add_label(cJSON *j, const struct k8s_node_info *ni, const char *label,
                      const char *field)
{
    const char *v = k8s_node_label(ni, label);
    if (v) {
        cJSON_AddStringToObject(j, field, v);
    }
}

/* Per resource kind: what the node offers, what thaw's replicas hold, and
 * which (holders filled by add_replica). */
static void add_resources(cJSON *j, const struct k8s_node_info *ni,
                          const struct k8s_resources *used)
{
    cJSON *rs = cJSON_AddObjectToObject(j, "resources");
    for (size_t i = 0; i < ni->allocatable.n; i++) {
        const char *name = ni->allocatable.r[i].name;
        cJSON *r = cJSON_AddObjectToObject(rs, name);
        cJSON_AddNumberToObject(r, "capacity", (double)ni->allocatable.r[i].amount);
        cJSON_AddNumberToObject(r, "used", used ? (double)k8s_resources_get(used, name) : 0);
        cJSON_AddArrayToObject(r, "holders");
    }
}

/* The node's shared GPUs' memory: per GPU, in all, what thaw's replicas
 * hold, and whether they still pack (false: placed before a declaration
 * changed, or by someone else). */
static void add_gpu_memory(cJSON *j, struct kube_backend *kb, const struct k8s_node_info *ni)
{
    struct kube_node_memory nm;
    if (kube_node_memory(kb, ni, &nm)) {
        return;
    }
    cJSON *m = cJSON_AddObjectToObject(j, "gpu_memory");
    cJSON_AddStringToObject(m, "source", nm.source);
    cJSON_AddNumberToObject(m, "gpus", nm.gpus);
    if (nm.per_gpu) {
        cJSON_AddNumberToObject(m, "per_gpu_bytes", (double)nm.per_gpu);
        cJSON_AddNumberToObject(m, "total_bytes", (double)nm.per_gpu * nm.gpus);
    } else {
        cJSON_AddNullToObject(m, "per_gpu_bytes");
        cJSON_AddNullToObject(m, "total_bytes");
    }
    cJSON_AddNumberToObject(m, "used_bytes", (double)nm.used);
    cJSON_AddNumberToObject(m, "replicas", (double)nm.n);
    cJSON_AddBoolToObject(m, "packs", kube_node_memory_fits(&nm, 0));
    if (ni->gpu_memory_bad) {
        cJSON_AddStringToObject(m, "label_error",
                                "nvidia.com/gpu.memory is not a count of MiB; ignored");
    }
    kube_node_memory_dispose(&nm);
}

static const char *effect_name(enum k8s_taint_effect e)
{
    static const char *const names[] = {"", "NoSchedule", "PreferNoSchedule", "NoExecute", "other"};
    return names[e];
}

static void add_node(void *ud, const char *key, void *value)
{
    struct nodes_ctx *c = ud;
    const struct k8s_node_info *ni = value;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", key);
    cJSON_AddNumberToObject(j, "gpu_slices", (double)ni->gpu_allocatable);
    cJSON_AddNumberToObject(j, "gpus", (double)ni->gpu_count);
    cJSON_AddNumberToObject(j, "replicas_per_gpu", (double)ni->gpu_replicas);
    if (ni->gpu_product[0]) {
        cJSON_AddStringToObject(j, "product", ni->gpu_product);
    }
    add_label(j, ni, "nvidia.com/gpu.sharing-strategy", "sharing_strategy");
    add_label(j, ni, "nvidia.com/mig.strategy", "mig_strategy");
    cJSON_AddBoolToObject(j, "cordoned", ni->unschedulable);
    cJSON *taints = cJSON_AddArrayToObject(j, "taints");
    for (size_t i = 0; i < ni->n_taints; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "key", ni->taints[i].key);
        if (ni->taints[i].value[0]) {
            cJSON_AddStringToObject(t, "value", ni->taints[i].value);
        }
        cJSON_AddStringToObject(t, "effect", effect_name(ni->taints[i].effect));
        cJSON_AddItemToArray(taints, t);
    }
    cJSON_AddItemToObject(j, "allocatable", resources_json(&ni->allocatable));
    const struct k8s_resources *used = strmap_get(c->usage, ni->name, strlen(ni->name));
    struct k8s_resources none = {0};
    cJSON_AddItemToObject(j, "used", resources_json(used ? used : &none));
    add_resources(j, ni, used);
    if (kube_gpu_node(ni)) {
        add_gpu_memory(j, c->kb, ni);
    }
    cJSON_AddArrayToObject(j, "replicas");
    strmap_put(&c->by_name, ni->name, strlen(ni->name), j);
    cJSON_AddItemToArray(c->arr, j);
}

struct replica_ctx {
    struct nodes_ctx *nodes;
    const struct kmodel *km;
};

static void add_replica(void *ud, const char *key, void *value)
{
    struct replica_ctx *r = ud;
    const struct kpod *p = value;
    cJSON *node = p->node[0] && !p->terminating
                      ? strmap_get(&r->nodes->by_name, p->node, strlen(p->node))
                      : NULL;
    if (!node) {
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", r->km->m->name);
    cJSON_AddStringToObject(j, "pod", p->name);
    cJSON_AddItemToObject(j, "requests", resources_json(&p->requests));
    uint64_t mem = kube_replica_memory(r->km);
    if (mem) {
        cJSON_AddNumberToObject(j, "gpu_memory_bytes", (double)mem);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(node, "replicas"), j);
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(node, "resources");
    for (size_t i = 0; i < p->requests.n; i++) {
        cJSON *holders = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(rs, p->requests.r[i].name), "holders");
        if (holders) {
            cJSON *h = cJSON_CreateObject();
            cJSON_AddStringToObject(h, "model", r->km->m->name);
            cJSON_AddStringToObject(h, "pod", p->name);
            cJSON_AddNumberToObject(h, "amount", (double)p->requests.r[i].amount);
            cJSON_AddItemToArray(holders, h);
        }
    }
}

static void add_model_replicas(void *ud, const char *key, void *value)
{
    struct replica_ctx r = {ud, value};
    strmap_each(&r.km->pods, add_replica, &r);
}

/* Every node: its GPUs, whether thaw may place there, what it offers of the
 * counted resources, what thaw's replicas hold and which replicas. */
static void describe_nodes(struct kube_backend *kb, cJSON *k)
{
    struct strmap usage;
    kube_node_usage(kb, &usage);
    struct nodes_ctx c = {kb, &usage, {0}, cJSON_AddArrayToObject(k, "nodes")};
    strmap_init(&c.by_name);
    strmap_each(&kb->nodes_gpu, add_node, &c);
    strmap_each(&kb->models, add_model_replicas, &c);
    strmap_dispose(&c.by_name);
    kube_node_usage_free(&usage);
}

void kube_describe_capacity(struct backend *b, cJSON *out)
{
    struct kube_backend *kb = KB(b);
    cJSON *k = cJSON_AddObjectToObject(out, "kubernetes");
    cJSON_AddStringToObject(k, "server", k8s_client_auth(kb->client)->server);
    cJSON_AddBoolToObject(k, "synced", kube_synced(b));
    const struct k8s_client_stats *st = k8s_client_stats(kb->client);
    cJSON_AddNumberToObject(k, "api_requests", (double)st->requests);
    cJSON_AddNumberToObject(k, "api_errors", (double)st->errors);
    cJSON *evs = cJSON_AddObjectToObject(k, "events");
    cJSON_AddNumberToObject(evs, "created", (double)kb->events.stats.created);
    cJSON_AddNumberToObject(evs, "aggregated", (double)kb->events.stats.aggregated);
    cJSON_AddNumberToObject(evs, "unaggregated", (double)kb->events.stats.unaggregated);
    cJSON_AddNumberToObject(evs, "errors", (double)kb->events.stats.errors);
    each_informer(kb, add_informer, cJSON_AddArrayToObject(k, "informers"));
    kube_tenants_source_describe(&kb->tenants, k);
    describe_nodes(kb, k);
    kube_ha_describe(kb, k);
}

struct node_metrics_ctx {
    const struct strmap *usage;
    struct buf *o;
    bool used; /* the pass: allocatable, then used */
};

/* A node name as the API validates it (DNS subdomain): safe in a label. */
static bool plain_name(const char *s)
{
    return s[strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-.")] == '\0';
}

static void node_metric(void *ud, const char *key, void *value)
{
    struct node_metrics_ctx *c = ud;
    const struct k8s_node_info *ni = value;
    if (!kube_gpu_node(ni) || !plain_name(ni->name)) {
        return;
    }
    const struct k8s_resources *used = strmap_get(c->usage, ni->name, strlen(ni->name));
    for (size_t i = 0; i < ni->allocatable.n; i++) {
        const char *res = ni->allocatable.r[i].name;
        uint64_t v =
            c->used ? (used ? k8s_resources_get(used, res) : 0) : ni->allocatable.r[i].amount;
        buf_printf(c->o, "%s{node=\"%s\",resource=\"%s\"} %llu\n",
                   c->used ? "thaw_node_used" : "thaw_node_allocatable", ni->name, res,
                   (unsigned long long)v);
    }
}

struct memory_metrics_ctx {
    struct kube_backend *kb;
    struct buf *o;
    bool used; /* the pass: per GPU, then used */
};

static void node_memory_metric(void *ud, const char *key, void *value)
{
    struct memory_metrics_ctx *c = ud;
    const struct k8s_node_info *ni = value;
    struct kube_node_memory nm;
    if (!kube_gpu_node(ni) || !plain_name(ni->name) || kube_node_memory(c->kb, ni, &nm)) {
        return;
    }
    if (nm.per_gpu) {
        buf_printf(c->o, "%s{node=\"%s\"} %llu\n",
                   c->used ? "thaw_node_gpu_memory_used_bytes" : "thaw_node_gpu_memory_bytes",
                   ni->name, (unsigned long long)(c->used ? nm.used : nm.per_gpu * nm.gpus));
    }
    kube_node_memory_dispose(&nm);
}

static void node_schedulable(void *ud, const char *key, void *value)
{
    const struct k8s_node_info *ni = value;
    if (kube_gpu_node(ni) && plain_name(ni->name)) {
        buf_printf(ud, "thaw_node_cordoned{node=\"%s\"} %d\n", ni->name, ni->unschedulable);
    }
}

/* Per GPU node: what it offers of each counted resource, what thaw's model
 * pods hold of it, and whether it is cordoned. Node and resource names are
 * DNS-1123 names and qualified names: nothing in them needs escaping. */
static void render_node_metrics(struct kube_backend *kb, struct buf *o)
{
    struct strmap usage;
    kube_node_usage(kb, &usage);
    struct node_metrics_ctx c = {&usage, o, false};
    metrics_help_type(o, "thaw_node_allocatable", "gauge",
                      "What a GPU node offers of each counted extended resource.");
    strmap_each(&kb->nodes_gpu, node_metric, &c);
    c.used = true;
    metrics_help_type(o, "thaw_node_used", "gauge",
                      "What thaw's model pods (not terminating) hold of it on the node.");
    strmap_each(&kb->nodes_gpu, node_metric, &c);
    struct memory_metrics_ctx mc = {kb, o, false};
    metrics_help_type(o, "thaw_node_gpu_memory_bytes", "gauge",
                      "Memory of a node's shared GPUs in all (nodes whose GPU memory is known).");
    strmap_each(&kb->nodes_gpu, node_memory_metric, &mc);
    mc.used = true;
    metrics_help_type(o, "thaw_node_gpu_memory_used_bytes", "gauge",
                      "What thaw's model pods declare (thaw.dev/gpu-memory) on the node.");
    strmap_each(&kb->nodes_gpu, node_memory_metric, &mc);
    metrics_help_type(o, "thaw_node_cordoned", "gauge", "1 while a GPU node is cordoned.");
    strmap_each(&kb->nodes_gpu, node_schedulable, o);
    kube_node_usage_free(&usage);
}

struct informer_totals {
    uint64_t restarts, relists;
};

static void add_to_totals(void *ud, const struct k8s_informer *inf, const char *ns)
{
    struct informer_totals *t = ud;
    t->restarts += inf->watch_restarts;
    t->relists += inf->relists;
}

/* API client and informer counters, leadership and peers, sync. */
void kube_render_metrics(struct backend *b, struct buf *o)
{
    struct kube_backend *kb = KB(b);
    uint64_t api_errors = k8s_client_stats(kb->client)->errors;
    struct informer_totals tot = {0, 0};
    each_informer(kb, add_to_totals, &tot);
    uint64_t restarts = tot.restarts, relists = tot.relists;
    metrics_single(o, "thaw_kubernetes_api_errors_total", "counter",
                   "Kubernetes API requests that failed (transport or HTTP >= 400).", api_errors);
    metrics_single(o, "thaw_kubernetes_watch_restarts_total", "counter",
                   "Kubernetes watches that ended and were resumed.", restarts);
    metrics_single(o, "thaw_kubernetes_lists_total", "counter",
                   "Kubernetes lists (the first, and relists after 410 Gone or errors).", relists);
    /* Only the leader polls its peers: a follower has none to call stale (an
     * alert on stale peers would fire on every follower). */
    bool polls = kb->have_peers && kb->leading;
    unsigned fresh = polls ? k8s_peers_count(&kb->peers, true) : 0;
    unsigned all = polls ? k8s_peers_count(&kb->peers, false) : 0;
    metrics_single(o, "thaw_leader", "gauge", "1 while this activator is the leader.",
                   kb->leading ? 1 : 0);
    metrics_help_type(o, "thaw_peers", "gauge",
                      "Other activators, by whether their counts are fresh or stale.");
    buf_printf(o, "thaw_peers{state=\"fresh\"} %u\nthaw_peers{state=\"stale\"} %u\n", fresh,
               all - fresh);
    metrics_single(o, "thaw_kubernetes_last_request_writes_total", "counter",
                   "Writes of a model's last request time to its Deployment "
                   "(thaw.dev/last-request-at).",
                   kb->idle_writes);
    metrics_single(o, "thaw_kubernetes_last_request_write_errors_total", "counter",
                   "Writes of thaw.dev/last-request-at that failed.", kb->idle_write_errors);
    metrics_single(o, "thaw_kubernetes_rollout_writes_total", "counter",
                   "Writes of a rollout's state to its revisions' Deployments.",
                   kb->rollout_writes);
    metrics_single(o, "thaw_kubernetes_rollout_write_errors_total", "counter",
                   "Writes of a rollout's state that failed.", kb->rollout_write_errors);
    kube_tenants_source_metrics(&kb->tenants, o);
    metrics_single(o, "thaw_kubernetes_synced", "gauge", "1 once every informer has listed.",
                   kube_synced(b) ? 1 : 0);
    render_node_metrics(kb, o);
}

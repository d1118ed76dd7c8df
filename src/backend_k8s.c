/* Kubernetes backend: models are Deployments labelled thaw.dev/model.
 *
 * Four informers feed it: Deployments (the models and their settings),
 * EndpointSlices (replica readiness as the cluster sees it), Pods (IPs to
 * probe directly, ahead of the kubelet; Pending/Unschedulable pods) and
 * Nodes (GPU capacity). A replica is a pod: it is reported ready the first
 * time either its EndpointSlice endpoint is ready or thaw's own probe of
 * podIP:port answers, and gone when it terminates, is deleted, or its
 * endpoint stops being ready. Scaling goes through the Deployment's scale
 * subresource (merge patch); one PATCH at a time per model, retried with
 * backoff while requests wait. After idle_timeout with nothing in flight or
 * queued, thaw scales the model down to its min-scale. */
#include "thaw/backend.h"
#include "thaw/clock.h"
#include "thaw/k8s/client.h"
#include "thaw/k8s/events.h"
#include "thaw/k8s/informer.h"
#include "thaw/k8s/lease.h"
#include "thaw/k8s/peers.h"
#include "thaw/k8s/model_spec.h"
#include "thaw/k8s/objects.h"
#include "thaw/log.h"
#include "thaw/probe.h"
#include "thaw/scale_driver.h"
#include "thaw/scaler.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/event_struct.h>


#define TICK_MS 500
#define MAX_NAMESPACES 64

struct kube_backend;
struct kmodel;

struct kpod {
    struct kmodel *km;
    char name[254];
    char ip[64];
    bool reported;      /* told the fleet it is ready */
    bool slice_ready;   /* its EndpointSlice endpoint is ready */
    bool probe_ok;
    bool probing;
    bool terminating;
    bool retired; /* thaw scaled to zero: not routed until scaled up again */
    bool unschedulable;
    char phase[16];
    struct probe probe;
};

struct kmodel {
    struct kube_backend *kb;
    struct model *m;
    struct k8s_model_spec spec;
    char key[600]; /* "ns/deployment" */
    struct strmap pods; /* pod name -> kpod */
    /* scaling */
    bool scale_inflight;
    int64_t scale_want; /* -1: nothing wanted */
    unsigned scale_failures;
    struct event scale_retry;
    struct k8s_call *scale_call;
    uint64_t idle_since_ms;
    uint64_t waiting_since_ms; /* requests wait and no pod is ready */
    uint64_t scale_ups, scale_downs;
    char last_scale_error[200];
    struct scaler_model sc;
    uint64_t woken_ms; /* when a scale from zero landed; 0: not waking */
};

struct informer_set {
    struct k8s_informer deployments, slices, pods;
};

struct kube_backend {
    struct backend base;
    struct event_base *evbase;
    struct k8s_client *client;
    const struct config *cfg;
    struct informer_set ns[MAX_NAMESPACES];
    size_t n_ns;
    struct k8s_informer nodes;
    unsigned synced_count, informer_count;
    size_t deployments_synced;
    struct strmap models;   /* "ns/deployment" -> kmodel */
    struct strmap by_label; /* "ns/model name" -> kmodel (pods) */
    struct strmap by_svc;   /* "ns/service" -> kmodel (slices) */
    struct strmap nodes_gpu; /* node name -> struct k8s_node_info */
    struct event tick;
    struct scale_driver driver;
    /* several activators */
    bool elect;
    bool leading;
    uint64_t leader_since_ms;
    struct k8s_lease lease;
    bool have_peers;
    struct k8s_peers peers;
    char identity[254];
    uint64_t conditional_scales, conditional_conflicts;
    struct k8s_events events;
    uint64_t scale_errors;
};

static struct kube_backend *KB(struct backend *b)
{
    return container_of(b, struct kube_backend, base);
}

/* ---- events -------------------------------------------------------------- */

static void post_event(struct kmodel *km, const char *type, const char *reason,
                       const char *message)
{
    struct kube_backend *kb = km->kb;
    if (!kb->cfg->kubernetes.events) {
        return;
    }
    struct k8s_event_ref obj = {km->spec.namespace_, "apps/v1", "Deployment",
                                km->spec.deployment};
    k8s_events_record(&kb->events, &obj, type, reason, message, clock_now_ms());
}

/* ---- scaling ------------------------------------------------------------- */

static void send_scale(struct kmodel *km);

static void on_scale_retry(evutil_socket_t fd, short what, void *arg)
{
    send_scale(arg);
}

static void pod_gone(struct kpod *p, const char *why);

/* Scaled to zero: route nothing more to the pods, even before the watch
 * reports them terminating. Not final: if the model is scaled up again
 * before they go, the cluster may keep them (see unretire_pod). */
static void retire_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    p->retired = true;
    pod_gone(p, "scaled to zero");
}

static void pod_ready(struct kpod *p, const char *via);

static void unretire_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->retired) {
        p->retired = false;
        if (!p->terminating && (p->probe_ok || p->slice_ready)) {
            pod_ready(p, "kept by the cluster");
        }
    }
}

static void on_scaled(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct kmodel *km = ud;
    km->scale_call = NULL;
    km->scale_inflight = false;
    int64_t want = km->scale_want;
    if (status == 200) {
        int64_t from = km->spec.replicas;
        km->spec.replicas = want;
        km->scale_failures = 0;
        km->last_scale_error[0] = '\0';
        if (km->scale_want == want) {
            km->scale_want = -1;
        } else if (km->scale_want >= 0) {
            send_scale(km); /* the wish changed while this PATCH was out */
        }
        char msg[400];
        snprintf(msg, sizeof msg, "thaw scaled %s from %lld to %lld replicas", km->spec.deployment,
                 (long long)from, (long long)want);
        LOGI("scaled deployment", "model=%s deployment=%s/%s from=%lld to=%lld", km->m->name,
             km->spec.namespace_, km->spec.deployment, (long long)from, (long long)want);
        if (from == 0 && want > 0) {
            km->scale_ups++;
            km->woken_ms = clock_now_ms();
            strmap_each(&km->pods, unretire_pod, NULL);
            post_event(km, "Normal", "ScaledFromZero", msg);
        } else if (want == 0) {
            km->scale_downs++;
            post_event(km, "Normal", "ScaledToZero", msg);
            /* Every pod goes now: send them nothing more, even before the
             * watch reports them terminating. */
            strmap_each(&km->pods, retire_pod, NULL);
        }
        return;
    }
    km->kb->scale_errors++;
    km->scale_failures++;
    snprintf(km->last_scale_error, sizeof km->last_scale_error, "HTTP %ld%s%s", status,
             err ? ": " : "", err ? err : "");
    uint64_t ms = k8s_backoff_ms(km->scale_failures, (double)rand() / ((double)RAND_MAX + 1));
    LOGW("scaling deployment failed", "model=%s deployment=%s/%s status=%ld error=\"%s\" "
         "retry_in_ms=%llu", km->m->name, km->spec.namespace_, km->spec.deployment, status,
         err ? err : "", (unsigned long long)ms);
    if (km->scale_failures == 1 || km->scale_failures % 10 == 0) {
        post_event(km, "Warning", "ScaleFailed", km->last_scale_error);
    }
    struct timeval tv = clock_timeval(ms);
    event_add(&km->scale_retry, &tv);
}

static void send_scale(struct kmodel *km)
{
    if (km->scale_inflight || km->scale_want < 0) {
        return;
    }
    if (km->scale_want == km->spec.replicas) {
        km->scale_want = -1;
        return;
    }
    /* Scaling up is only worth it while requests wait or are in flight. */
    char body[64];
    snprintf(body, sizeof body, "{\"spec\":{\"replicas\":%lld}}", (long long)km->scale_want);
    char path[700];
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s/scale",
             km->spec.namespace_, km->spec.deployment);
    km->scale_inflight = true;
    km->scale_call = k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json",
                                 body, strlen(body), 15000, on_scaled, km);
    if (!km->scale_call) {
        km->scale_inflight = false;
    }
}

static void on_scaled_from_zero(void *ud, long status, const char *body, size_t len,
                                const char *err)
{
    struct kmodel *km = ud;
    km->scale_call = NULL;
    km->scale_inflight = false;
    if (status == 200) {
        int64_t to = (int64_t)km->kb->cfg->autoscaler.activation_scale;
        km->spec.replicas = to;
        km->woken_ms = clock_now_ms();
        strmap_each(&km->pods, unretire_pod, NULL);
        km->scale_ups++;
        km->kb->conditional_scales++;
        char msg[700];
        snprintf(msg, sizeof msg, "%s scaled %s from 0 to %lld replicas", km->kb->identity,
                 km->spec.deployment, (long long)to);
        LOGI("scaled deployment from zero", "model=%s deployment=%s/%s to=%lld", km->m->name,
             km->spec.namespace_, km->spec.deployment, (long long)to);
        post_event(km, "Normal", "ScaledFromZero", msg);
    } else if (status == 409) {
        /* Another activator got there first: the informer will say so. */
        km->kb->conditional_conflicts++;
        LOGD("scale from zero: someone else was first", "model=%s", km->m->name);
    } else {
        km->kb->scale_errors++;
        snprintf(km->last_scale_error, sizeof km->last_scale_error, "HTTP %ld%s%s", status,
                 err ? ": " : "", err ? err : "");
        LOGW("scale from zero failed", "model=%s status=%ld error=\"%s\"", km->m->name, status,
             err ? err : "");
    }
}

/* 0 -> activation scale, only if still 0: the PATCH carries the
 * resourceVersion thaw saw, so of activators poking at once one wins and
 * the others get 409. Any activator may do this; the rest is the leader's. */
static void scale_from_zero(struct kmodel *km)
{
    if (km->spec.replicas != 0 || km->scale_inflight || !km->spec.resource_version[0]) {
        return;
    }
    char body[200];
    snprintf(body, sizeof body,
             "{\"metadata\":{\"resourceVersion\":\"%s\"},\"spec\":{\"replicas\":%llu}}",
             km->spec.resource_version,
             (unsigned long long)km->kb->cfg->autoscaler.activation_scale);
    char path[700];
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s/scale",
             km->spec.namespace_, km->spec.deployment);
    km->scale_inflight = true;
    km->scale_call = k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json",
                                 body, strlen(body), 15000, on_scaled_from_zero, km);
    if (!km->scale_call) {
        km->scale_inflight = false;
    }
}

static void want_replicas(struct kmodel *km, int64_t n)
{
    if (n > (int64_t)km->spec.max_scale) {
        n = (int64_t)km->spec.max_scale;
    }
    if (n == km->spec.replicas && !km->scale_inflight) {
        km->scale_want = -1;
        return;
    }
    km->scale_want = n;
    if (!event_pending(&km->scale_retry, EV_TIMEOUT, NULL)) {
        send_scale(km);
    }
}

/* ---- replicas -------------------------------------------------------------- */

static void pod_addr(struct kpod *p, char *out, size_t len)
{
    snprintf(out, len, strchr(p->ip, ':') ? "[%s]:%d" : "%s:%d", p->ip, p->km->spec.port);
}

static void pod_ready(struct kpod *p, const char *via)
{
    if (p->reported || p->terminating || p->retired || !p->ip[0]) {
        return;
    }
    char addr[96];
    pod_addr(p, addr, sizeof addr);
    p->reported = true;
    LOGI("pod ready", "model=%s pod=%s addr=%s via=%s", p->km->m->name, p->name, addr, via);
    struct kmodel *km = p->km;
    if (km->woken_ms && km->m->n_endpoints == 0) {
        /* The cold start as clients see it: scale-up landed -> first pod ready. */
        uint64_t ms = clock_now_ms() - km->woken_ms;
        km->m->cold_start_ms = ms;
        histogram_observe(&km->m->stats.cold_start, (double)ms / 1000.0);
        km->woken_ms = 0;
    }
    fleet_replica_ready(p->km->m->fleet, p->km->m, p->name, addr);
}

static void pod_gone(struct kpod *p, const char *why)
{
    if (p->probing) {
        probe_stop(&p->probe);
        p->probing = false;
    }
    if (p->reported) {
        p->reported = false;
        fleet_replica_gone(p->km->m->fleet, p->km->m, p->name, why);
    }
}

static void on_pod_probe(struct probe *pr, void *ud)
{
    struct kpod *p = ud;
    p->probing = false;
    p->probe_ok = true;
    pod_ready(p, "probe");
}

static struct kpod *pod_get(struct kmodel *km, const char *name, bool create)
{
    struct kpod *p = strmap_get(&km->pods, name, strlen(name));
    if (p || !create) {
        return p;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        return NULL;
    }
    p->km = km;
    snprintf(p->name, sizeof p->name, "%s", name);
    strmap_put(&km->pods, name, strlen(name), p);
    return p;
}

static void pod_free(struct kmodel *km, struct kpod *p, const char *why)
{
    pod_gone(p, why);
    strmap_del(&km->pods, p->name, strlen(p->name));
    free(p);
}

/* ---- models ---------------------------------------------------------------- */

static void split_list(char *s, char **out, size_t *n, size_t max)
{
    *n = 0;
    for (char *tok = strtok(s, ", "); tok && *n < max; tok = strtok(NULL, ", ")) {
        out[(*n)++] = tok;
    }
}

/* A config_model view of a spec (strings point into spec and bufs). */
static void to_config_model(const struct k8s_model_spec *sp, const struct config_limits *lim,
                            struct config_model *cm, char *hosts_buf, char *aliases_buf,
                            char **hosts, char **aliases)
{
    config_model_defaults(cm, lim);
    cm->name = (char *)sp->name;
    cm->namespace_ = (char *)sp->namespace_;
    strcpy(hosts_buf, sp->hosts);
    strcpy(aliases_buf, sp->aliases);
    split_list(hosts_buf, hosts, &cm->n_hosts, 32);
    split_list(aliases_buf, aliases, &cm->n_aliases, 32);
    cm->hosts = hosts;
    cm->aliases = aliases;
    cm->max_concurrency = sp->max_concurrency;
    cm->priority = sp->priority;
}

static void index_model(struct kube_backend *kb, struct kmodel *km, bool add)
{
    char k[600];
    snprintf(k, sizeof k, "%s/%s", km->spec.namespace_, km->spec.name);
    if (add) {
        strmap_put(&kb->by_label, k, strlen(k), km);
    } else if (strmap_get(&kb->by_label, k, strlen(k)) == km) {
        strmap_del(&kb->by_label, k, strlen(k));
    }
    snprintf(k, sizeof k, "%s/%s", km->spec.namespace_, km->spec.service);
    if (add) {
        strmap_put(&kb->by_svc, k, strlen(k), km);
    } else if (strmap_get(&kb->by_svc, k, strlen(k)) == km) {
        strmap_del(&kb->by_svc, k, strlen(k));
    }
}

static void free_pod_cb(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->probing) {
        probe_stop(&p->probe);
    }
    free(p);
}

static void kmodel_free(struct kmodel *km)
{
    event_del(&km->scale_retry);
    k8s_call_cancel(km->scale_call);
    strmap_each(&km->pods, free_pod_cb, NULL);
    strmap_dispose(&km->pods);
    free(km);
}

static void deployment_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct k8s_model_spec defaults = {0};
    struct config_model dm;
    config_model_defaults(&dm, &kb->cfg->limits);
    defaults.max_concurrency = dm.max_concurrency;
    defaults.priority = dm.priority;
    defaults.min_scale = 0;
    defaults.max_scale = 1000;
    defaults.idle_timeout_ms = dm.idle_timeout_ms;
    defaults.startup_timeout_ms = dm.startup_timeout_ms;
    defaults.target = 0;
    defaults.port = (int)kb->cfg->kubernetes.default_port;
    snprintf(defaults.health_path, sizeof defaults.health_path, "/health");
    struct k8s_model_spec sp;
    if (k8s_model_spec_parse(obj, &defaults, &sp)) {
        return;
    }
    char key[600];
    snprintf(key, sizeof key, "%s/%s", sp.namespace_, sp.deployment);
    struct kmodel *km = strmap_get(&kb->models, key, strlen(key));
    char hosts_buf[1024], aliases_buf[1024];
    char *hosts[32], *aliases[32];
    struct config_model cm;
    to_config_model(&sp, &kb->cfg->limits, &cm, hosts_buf, aliases_buf, hosts, aliases);
    if (sp.errors[0] && (!km || strcmp(km->spec.errors, sp.errors) != 0)) {
        LOGW("bad annotations on a model Deployment (defaults used)",
             "deployment=%s errors=\"%s\"", key, sp.errors);
    }
    if (!km) {
        km = calloc(1, sizeof *km);
        if (!km) {
            return;
        }
        km->kb = kb;
        km->spec = sp;
        km->scale_want = -1;
        snprintf(km->key, sizeof km->key, "%s", key);
        strmap_init(&km->pods);
        event_assign(&km->scale_retry, kb->evbase, -1, 0, on_scale_retry, km);
        size_t conflicts = 0;
        km->m = fleet_add_model(kb->base.fleet, &cm, &conflicts);
        if (!km->m) {
            kmodel_free(km);
            return;
        }
        if (conflicts) {
            LOGW("model names already taken by another model are ignored",
                 "model=%s deployment=%s conflicts=%zu", sp.name, key, conflicts);
        }
        km->m->backend = &kb->base;
        km->m->backend_data = km;
        scaler_model_init(&km->sc, km->m, kb->cfg, sp.target, sp.window_ms,
                          (unsigned)sp.min_scale, (unsigned)sp.max_scale, sp.idle_timeout_ms,
                          (unsigned)sp.gpu_slices);
        strmap_put(&kb->models, key, strlen(key), km);
        index_model(kb, km, true);
        LOGI("model discovered", "model=%s deployment=%s replicas=%lld gpu_slices=%llu",
             sp.name, key, (long long)sp.replicas, (unsigned long long)sp.gpu_slices);
        return;
    }
    index_model(kb, km, false);
    bool names_changed = strcmp(km->spec.hosts, sp.hosts) || strcmp(km->spec.aliases, sp.aliases);
    /* Keep thaw's own view of replicas while a PATCH is on its way. */
    if (km->scale_inflight) {
        sp.replicas = km->spec.replicas;
    }
    km->spec = sp;
    index_model(kb, km, true);
    model_apply_settings(km->m, &cm);
    /* New annotations take effect; the autoscaler keeps its samples. */
    km->sc.asc.min_scale = km->sc.min_replicas = (unsigned)sp.min_scale;
    km->sc.asc.max_scale = (unsigned)sp.max_scale;
    km->sc.asc.scale_to_zero_grace_ms = sp.idle_timeout_ms;
    km->sc.slices = (unsigned)sp.gpu_slices;
    if (sp.target) {
        km->sc.asc.target = (double)sp.target;
    }
    if (names_changed) {
        fleet_reroute_model(kb->base.fleet, km->m, &cm, NULL);
    }
}

static void deployment_remove(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    char key[600];
    k8s_object_key(obj, key, sizeof key);
    struct kmodel *km = strmap_get(&kb->models, key, strlen(key));
    if (!km) {
        return;
    }
    strmap_del(&kb->models, key, strlen(key));
    index_model(kb, km, false);
    char why[700];
    snprintf(why, sizeof why, "the model's Deployment %s was deleted", key);
    struct model *m = km->m;
    /* Pods go first (their endpoints leave the model), then the model,
     * whose held requests are answered 503 naming the reason. */
    strmap_each(&km->pods, free_pod_cb, NULL);
    strmap_dispose(&km->pods);
    strmap_init(&km->pods);
    fleet_remove_model(kb->base.fleet, m, why);
    kmodel_free(km);
}

/* ---- pods ------------------------------------------------------------------ */

static struct kmodel *model_of_pod(struct kube_backend *kb, const struct k8s_pod_info *pi)
{
    if (!pi->model[0]) {
        return NULL;
    }
    char k[600];
    snprintf(k, sizeof k, "%s/%s", pi->namespace_, pi->model);
    return strmap_get(&kb->by_label, k, strlen(k));
}

static void pod_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct k8s_pod_info pi;
    if (k8s_pod_decode(obj, &pi)) {
        return;
    }
    struct kmodel *km = model_of_pod(kb, &pi);
    struct kpod *p = km ? pod_get(km, pi.name, true) : NULL;
    if (!p) {
        return;
    }
    snprintf(p->phase, sizeof p->phase, "%s", pi.phase);
    p->unschedulable = pi.unschedulable;
    if (pi.terminating) {
        p->terminating = true;
        pod_gone(p, "pod terminating");
        return;
    }
    if (pi.ip[0] && strcmp(pi.ip, p->ip) != 0) {
        if (p->probing) {
            probe_stop(&p->probe);
            p->probing = false;
        }
        snprintf(p->ip, sizeof p->ip, "%s", pi.ip);
    }
    /* Probe as soon as the pod has an IP, not when the kubelet says so. */
    if (kb->cfg->kubernetes.probe_pods && p->ip[0] && !p->reported && !p->probing &&
        pi.running) {
        char addr[96];
        pod_addr(p, addr, sizeof addr);
        if (probe_init(&p->probe, kb->evbase, addr, km->spec.health_path, on_pod_probe, p) == 0) {
            p->probing = true;
            probe_start(&p->probe);
        }
    }
}

static void pod_remove(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    const char *name = k8s_get_string(obj, "metadata.name");
    const char *ns = k8s_get_string(obj, "metadata.namespace");
    if (!name || !ns) {
        return;
    }
    /* After a relist the removed object may carry only its name and namespace
     * (see informer.c): look in every model of ns. */
    struct k8s_pod_info pi;
    struct kmodel *km = k8s_pod_decode(obj, &pi) == 0 ? model_of_pod(kb, &pi) : NULL;
    if (km) {
        struct kpod *p = pod_get(km, name, false);
        if (p) {
            pod_free(km, p, "pod deleted");
        }
        return;
    }
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &kb->base.fleet->models)
    {
        struct model *m = container_of(pos, struct model, node);
        if (m->backend != &kb->base) {
            continue;
        }
        struct kmodel *k = m->backend_data;
        struct kpod *p = pod_get(k, name, false);
        if (p && strcmp(k->spec.namespace_, ns) == 0) {
            pod_free(k, p, "pod deleted");
        }
    }
}

/* ---- endpointslices ---------------------------------------------------------- */

static void slice_endpoint(void *ud, const struct k8s_slice_endpoint *e)
{
    struct kmodel *km = ud;
    struct kpod *p = pod_get(km, e->pod, true);
    if (!p) {
        return;
    }
    if (!p->ip[0]) {
        snprintf(p->ip, sizeof p->ip, "%s", e->address);
    }
    if (e->terminating) {
        p->terminating = true;
        pod_gone(p, "endpoint terminating");
    } else if (e->ready) {
        p->slice_ready = true;
        pod_ready(p, "endpointslice");
    } else if (p->slice_ready) {
        /* Was ready, is not any more: the kubelet saw it fail. */
        p->slice_ready = false;
        pod_gone(p, "endpoint not ready");
    }
}

static void slice_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    const char *ns = k8s_get_string(obj, "metadata.namespace");
    const char *svc = k8s_slice_service(obj);
    if (!ns || !svc) {
        return;
    }
    char k[600];
    snprintf(k, sizeof k, "%s/%s", ns, svc);
    struct kmodel *km = strmap_get(&kb->by_svc, k, strlen(k));
    if (km) {
        k8s_slice_each(obj, slice_endpoint, km);
    }
}

static void slice_remove(void *ud, const cJSON *obj)
{
    /* Pods of a removed slice are handled through the Pods informer. */
}

/* ---- nodes ----------------------------------------------------------------- */

static void node_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct k8s_node_info ni;
    if (k8s_node_decode(obj, &ni)) {
        return;
    }
    struct k8s_node_info *cur = strmap_get(&kb->nodes_gpu, ni.name, strlen(ni.name));
    if (!cur) {
        cur = malloc(sizeof *cur);
        if (!cur) {
            return;
        }
        strmap_put(&kb->nodes_gpu, ni.name, strlen(ni.name), cur);
    }
    *cur = ni;
}

static void node_remove(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    const char *name = k8s_get_string(obj, "metadata.name");
    if (name) {
        free(strmap_del(&kb->nodes_gpu, name, strlen(name)));
    }
}

/* ---- sync and idle ------------------------------------------------------------ */

static void on_synced(void *ud)
{
    struct kube_backend *kb = ud;
    kb->synced_count++;
    if (kb->synced_count == kb->informer_count) {
        LOGI("kubernetes informers synced", "models=%zu", kb->models.count);
    }
}

/* Pods and slices start once every Deployment list is in, so they find the
 * models they belong to. */
static void on_deployments_synced(void *ud)
{
    struct kube_backend *kb = ud;
    on_synced(kb);
    if (++kb->deployments_synced < kb->n_ns) {
        return;
    }
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_start(&kb->ns[i].pods);
        k8s_informer_start(&kb->ns[i].slices);
    }
    k8s_informer_start(&kb->nodes);
}

static void any_unschedulable(void *ud, const char *key, void *value)
{
    const struct kpod *p = value;
    if (p->unschedulable && !p->terminating) {
        *(bool *)ud = true;
    }
}

static bool model_has_unschedulable(struct kmodel *km)
{
    bool any = false;
    strmap_each(&km->pods, any_unschedulable, &any);
    return any;
}

/* Per model, every tick: a concurrency sample, a retried scale-up, and the
 * startup timeout for pods that never get ready. */
static void model_tick(void *ud, const char *key, void *value)
{
    struct kmodel *km = value;
    struct model *m = km->m;
    bool busy = m->inflight > 0 || m->queue.count > 0;
    if (!busy && km->spec.replicas == 0 && km->sc.last.desired == 0 &&
        !(km->kb->have_peers && km->kb->leading)) {
        km->waiting_since_ms = 0; /* scaled to zero and quiet: the common, cheap case */
        return;
    }
    uint64_t now = clock_now_ms();
    uint64_t peer = km->kb->have_peers && km->kb->leading ? k8s_peers_demand(&km->kb->peers, km->key)
                                                           : 0;
    as_record(&km->sc.ass, now, (double)m->inflight + (double)m->queue.count + (double)peer);
    if (busy && m->n_endpoints == 0 && km->spec.replicas == 0) {
        scale_from_zero(km); /* retried until the Deployment says otherwise */
    }
    if (!busy || m->n_endpoints > 0 || m->queue.count == 0) {
        km->waiting_since_ms = 0;
        return;
    }
    if (!km->waiting_since_ms) {
        km->waiting_since_ms = now;
    } else if (now - km->waiting_since_ms >= km->spec.startup_timeout_ms &&
               !model_has_unschedulable(km)) {
        /* Pods that run but never answer (crash loops, bad images): do not
         * hold clients forever. Pods waiting for a GPU are not failures. */
        char why[160];
        snprintf(why, sizeof why, "no pod became ready within startup-timeout (%llu ms)",
                 (unsigned long long)km->spec.startup_timeout_ms);
        LOGW("model did not become ready", "model=%s deployment=%s", m->name, km->key);
        post_event(km, "Warning", "StartupTimeout", why);
        km->waiting_since_ms = now;
        fleet_model_unavailable(m->fleet, m, why, 0);
    }
}

/* ---- scaling driver hooks: the autoscaler and the warm pool over every
 * model, against the GPU slices the Nodes offer (or the configured cap);
 * each change is one scale PATCH. */

struct collect {
    struct scaler_model **sms;
    size_t n, cap;
};

static size_t count_models(void *ud)
{
    return ((struct kube_backend *)ud)->models.count;
}

static void collect_model(void *ud, const char *key, void *value)
{
    struct collect *c = ud;
    struct kmodel *km = value;
    if (c->n == c->cap) {
        return;
    }
    km->sc.current = (unsigned)(km->scale_want >= 0 ? km->scale_want : km->spec.replicas);
    km->sc.ready = (unsigned)km->m->n_endpoints;
    km->sc.hold_starts = false;
    c->sms[c->n++] = &km->sc;
}

static size_t collect_models(void *ud, uint64_t now_ms, struct scaler_model **sms, size_t max)
{
    struct collect c = {sms, 0, max};
    strmap_each(&((struct kube_backend *)ud)->models, collect_model, &c);
    return c.n;
}

static void sum_gpus(void *ud, const char *key, void *value)
{
    *(unsigned *)ud += (unsigned)((const struct k8s_node_info *)value)->gpu_allocatable;
}

static unsigned gpu_slices(void *ud)
{
    unsigned capacity = 0;
    strmap_each(&((struct kube_backend *)ud)->nodes_gpu, sum_gpus, &capacity);
    return capacity;
}

static void apply_targets(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms)
{
    struct kube_backend *kb = ud;
    /* A new leader starts from the cluster's replicas and the peers' counts,
     * not from zero: for one stable window it does not scale anything down. */
    bool hold_down = now_ms - kb->leader_since_ms < kb->cfg->autoscaler.stable_window_ms;
    for (size_t i = 0; i < n; i++) {
        struct kmodel *km = container_of(sms[i], struct kmodel, sc);
        if (hold_down && km->sc.target < km->sc.current) {
            km->sc.target = km->sc.current;
        }
        if (km->sc.current == 0 && km->sc.target > 0) {
            scale_from_zero(km); /* conditional, as every activator does it */
        } else if ((int64_t)km->sc.target != km->sc.current) {
            want_replicas(km, km->sc.target);
        }
    }
}

static const struct scale_driver_ops kube_scale_ops = {
    .count = count_models,
    .collect = collect_models,
    .gpu_slices = gpu_slices,
    .apply = apply_targets,
};

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct kube_backend *kb = arg;
    strmap_each(&kb->models, model_tick, kb);
    if (kb->leading && scale_driver_due(&kb->driver, clock_now_ms())) {
        scale_driver_plan(&kb->driver, kb->cfg);
    }
}

static void on_leadership(void *ud, bool leading)
{
    struct kube_backend *kb = ud;
    kb->leading = leading;
    kb->leader_since_ms = clock_now_ms();
    if (kb->have_peers) {
        k8s_peers_set_polling(&kb->peers, leading);
    }
}

/* ---- backend ops --------------------------------------------------------------- */

static int kube_attach(struct backend *b, struct model *m, const struct config_model *cm)
{
    return -ENOTSUP; /* models come from the cluster, not the config */
}

/* Demand for a model with no ready pod: scale it from zero now (any
 * activator, conditionally), not at the next tick. */
static int kube_scale(struct backend *b, struct model *m, unsigned replicas)
{
    struct kmodel *km = m->backend_data;
    uint64_t now = clock_now_ms();
    as_record(&km->sc.ass, now, (double)m->inflight + (double)m->queue.count + 1);
    if (km->spec.replicas == 0) {
        scale_from_zero(km);
    }
    return 0;
}

static uint64_t kube_retry_after_ms(struct backend *b, struct model *m)
{
    return m->cold_start_ms ? m->cold_start_ms : 5000;
}

static bool kube_synced(struct backend *b)
{
    struct kube_backend *kb = KB(b);
    return kb->synced_count >= kb->informer_count;
}

struct describe_ctx {
    cJSON *arr;
    unsigned unschedulable;
};

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
    if (p->unschedulable) {
        cJSON_AddBoolToObject(j, "unschedulable", true);
        d->unschedulable++;
    }
    cJSON_AddItemToArray(d->arr, j);
}

static void kube_describe(struct backend *b, struct model *m, cJSON *out)
{
    struct kmodel *km = m->backend_data;
    cJSON_AddStringToObject(out, "backend", "kubernetes");
    cJSON_AddStringToObject(out, "deployment", km->key);
    cJSON_AddStringToObject(out, "service", km->spec.service);
    cJSON_AddNumberToObject(out, "port", km->spec.port);
    cJSON_AddNumberToObject(out, "replicas_desired", (double)km->spec.replicas);
    cJSON_AddNumberToObject(out, "replicas_ready_in_cluster", (double)km->spec.ready_replicas);
    cJSON_AddNumberToObject(out, "gpu_slices", (double)km->spec.gpu_slices);
    cJSON_AddNumberToObject(out, "min_scale", (double)km->spec.min_scale);
    cJSON_AddNumberToObject(out, "max_scale", (double)km->spec.max_scale);
    cJSON_AddNumberToObject(out, "idle_timeout_ms", (double)km->spec.idle_timeout_ms);
    cJSON_AddNumberToObject(out, "scale_ups", (double)km->scale_ups);
    cJSON_AddNumberToObject(out, "scale_downs", (double)km->scale_downs);
    if (km->spec.errors[0]) {
        cJSON_AddStringToObject(out, "annotation_errors", km->spec.errors);
    }
    if (km->last_scale_error[0]) {
        cJSON_AddStringToObject(out, "last_scale_error", km->last_scale_error);
    }
    scaler_describe(&km->sc, out);
    cJSON *dm = cJSON_AddObjectToObject(out, "demand");
    cJSON_AddNumberToObject(dm, "local", (double)m->inflight + (double)m->queue.count);
    if (km->kb->have_peers) {
        cJSON_AddNumberToObject(dm, "peers", (double)k8s_peers_demand(&km->kb->peers, km->key));
    }
    struct describe_ctx d = {cJSON_AddArrayToObject(out, "pods"), 0};
    strmap_each(&km->pods, describe_pod, &d);
    const char *state = m->n_endpoints       ? "ready"
                        : d.unschedulable    ? "waiting_for_capacity"
                        : km->spec.replicas  ? "starting"
                        : km->scale_inflight ? "scaling_up"
                                             : "scaled_to_zero";
    cJSON_AddStringToObject(out, "state", state);
}

static void add_informer(cJSON *arr, const struct k8s_informer *inf, const char *ns)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "resource", inf->name);
    cJSON_AddStringToObject(j, "namespace", ns ? ns : "");
    cJSON_AddBoolToObject(j, "synced", inf->synced);
    cJSON_AddStringToObject(j, "resource_version", inf->rv);
    cJSON_AddNumberToObject(j, "lists", (double)inf->relists);
    cJSON_AddNumberToObject(j, "watch_restarts", (double)inf->watch_restarts);
    cJSON_AddNumberToObject(j, "errors", (double)inf->errors);
    cJSON_AddNumberToObject(j, "events", (double)inf->events);
    if (inf->last_error[0]) {
        cJSON_AddStringToObject(j, "last_error", inf->last_error);
    }
    cJSON_AddItemToArray(arr, j);
}

static void add_node(void *ud, const char *key, void *value)
{
    const struct k8s_node_info *ni = value;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", key);
    cJSON_AddNumberToObject(j, "gpu_slices", (double)ni->gpu_allocatable);
    cJSON_AddNumberToObject(j, "gpus", (double)ni->gpu_count);
    cJSON_AddNumberToObject(j, "replicas_per_gpu", (double)ni->gpu_replicas);
    if (ni->gpu_product[0]) {
        cJSON_AddStringToObject(j, "product", ni->gpu_product);
    }
    cJSON_AddItemToArray(ud, j);
}

static void free_node(void *ud, const char *key, void *value)
{
    free(value);
}

static void kube_describe_capacity(struct backend *b, cJSON *out)
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
    cJSON *infs = cJSON_AddArrayToObject(k, "informers");
    for (size_t i = 0; i < kb->n_ns; i++) {
        const char *ns = kb->cfg->kubernetes.n_namespaces ? kb->cfg->kubernetes.namespaces[i]
                                                          : NULL;
        add_informer(infs, &kb->ns[i].deployments, ns);
        add_informer(infs, &kb->ns[i].slices, ns);
        add_informer(infs, &kb->ns[i].pods, ns);
    }
    add_informer(infs, &kb->nodes, NULL);
    cJSON *nodes = cJSON_AddArrayToObject(k, "nodes");
    strmap_each(&kb->nodes_gpu, add_node, nodes);
    cJSON *le = cJSON_AddObjectToObject(k, "leader_election");
    cJSON_AddBoolToObject(le, "enabled", kb->elect);
    cJSON_AddStringToObject(le, "identity", kb->identity);
    cJSON_AddBoolToObject(le, "leading", kb->leading);
    if (kb->elect) {
        cJSON_AddStringToObject(le, "lease", kb->lease.name);
        cJSON_AddStringToObject(le, "holder", kb->lease.holder);
        cJSON_AddNumberToObject(le, "lease_transitions", (double)kb->lease.transitions);
    }
    cJSON_AddNumberToObject(le, "conditional_scales", (double)kb->conditional_scales);
    cJSON_AddNumberToObject(le, "conditional_conflicts", (double)kb->conditional_conflicts);
    if (kb->have_peers) {
        k8s_peers_describe(&kb->peers, k);
    }
}

/* GET /demand: this activator's own counts per model, for the leader. */

static void add_demand_cb(void *ud, const char *key, void *value)
{
    struct kmodel *km = value;
    if (km->m->inflight || km->m->queue.count) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(km->m->inflight));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)km->m->queue.count));
        cJSON_AddItemToObject(ud, key, pair);
    }
}

static void kube_demand(struct backend *b, cJSON *out)
{
    struct kube_backend *kb = KB(b);
    cJSON_AddStringToObject(out, "identity", kb->identity);
    cJSON_AddBoolToObject(out, "leader", kb->leading);
    cJSON *models = cJSON_AddObjectToObject(out, "models");
    strmap_each(&kb->models, add_demand_cb, models);
}

/* API client and informer counters, leadership and peers, sync. */
static void kube_render_metrics(struct backend *b, struct buf *o)
{
    struct kube_backend *kb = KB(b);
    uint64_t api_errors = k8s_client_stats(kb->client)->errors, restarts = 0, relists = 0;
    for (size_t i = 0; i < kb->n_ns; i++) {
        const struct k8s_informer *all[] = {&kb->ns[i].deployments, &kb->ns[i].slices,
                                            &kb->ns[i].pods};
        for (size_t j = 0; j < 3; j++) {
            restarts += all[j]->watch_restarts;
            relists += all[j]->relists;
        }
    }
    restarts += kb->nodes.watch_restarts;
    relists += kb->nodes.relists;
    metrics_help_type(o, "thaw_kubernetes_api_errors_total", "counter",
                      "Kubernetes API requests that failed (transport or HTTP >= 400).");
    buf_printf(o, "thaw_kubernetes_api_errors_total %llu\n", (unsigned long long)api_errors);
    metrics_help_type(o, "thaw_kubernetes_watch_restarts_total", "counter",
                      "Kubernetes watches that ended and were resumed.");
    buf_printf(o, "thaw_kubernetes_watch_restarts_total %llu\n", (unsigned long long)restarts);
    metrics_help_type(o, "thaw_kubernetes_lists_total", "counter",
                      "Kubernetes lists (the first, and relists after 410 Gone or errors).");
    buf_printf(o, "thaw_kubernetes_lists_total %llu\n", (unsigned long long)relists);
    unsigned fresh = kb->have_peers ? k8s_peers_count(&kb->peers, true) : 0;
    unsigned all = kb->have_peers ? k8s_peers_count(&kb->peers, false) : 0;
    metrics_help_type(o, "thaw_leader", "gauge", "1 while this activator is the leader.");
    buf_printf(o, "thaw_leader %d\n", kb->leading ? 1 : 0);
    metrics_help_type(o, "thaw_peers", "gauge",
                      "Other activators, by whether their counts are fresh or stale.");
    buf_printf(o, "thaw_peers{state=\"fresh\"} %u\nthaw_peers{state=\"stale\"} %u\n", fresh,
               all - fresh);
    metrics_help_type(o, "thaw_kubernetes_synced", "gauge", "1 once every informer has listed.");
    buf_printf(o, "thaw_kubernetes_synced %d\n", kube_synced(b) ? 1 : 0);
}

static void kube_stop(struct backend *b)
{
}

static void free_model_cb(void *ud, const char *key, void *value)
{
    kmodel_free(value);
}

static void kube_free(struct backend *b)
{
    struct kube_backend *kb = KB(b);
    event_del(&kb->tick);
    if (kb->elect) {
        k8s_lease_dispose(&kb->lease);
    }
    if (kb->have_peers) {
        k8s_peers_dispose(&kb->peers);
    }
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_dispose(&kb->ns[i].deployments);
        k8s_informer_dispose(&kb->ns[i].slices);
        k8s_informer_dispose(&kb->ns[i].pods);
    }
    k8s_informer_dispose(&kb->nodes);
    strmap_each(&kb->models, free_model_cb, NULL);
    strmap_dispose(&kb->models);
    strmap_dispose(&kb->by_label);
    strmap_dispose(&kb->by_svc);
    strmap_each(&kb->nodes_gpu, free_node, NULL);
    strmap_dispose(&kb->nodes_gpu);
    k8s_events_dispose(&kb->events);
    k8s_client_free(kb->client);
    free(kb);
}

static void kube_set_config(struct backend *b, const struct config *cfg)
{
    KB(b)->cfg = cfg;
}

static const struct backend_ops kube_ops = {
    .name = "kubernetes",
    .attach = kube_attach,
    .scale = kube_scale,
    .retry_after_ms = kube_retry_after_ms,
    .describe = kube_describe,
    .describe_capacity = kube_describe_capacity,
    .synced = kube_synced,
    .set_config = kube_set_config,
    .render_metrics = kube_render_metrics,
    .demand = kube_demand,
    .stop = kube_stop,
    .free = kube_free,
};

static const struct k8s_informer_ops deployment_ops = {deployment_upsert, deployment_remove,
                                                       on_deployments_synced};
static const struct k8s_informer_ops pod_ops = {pod_upsert, pod_remove, on_synced};
static const struct k8s_informer_ops slice_ops = {slice_upsert, slice_remove, on_synced};
static const struct k8s_informer_ops node_ops = {node_upsert, node_remove, on_synced};

struct backend *backend_k8s_new(struct fleet *fleet, struct event_base *base,
                                const struct config *cfg, struct k8s_auth *auth, char *err,
                                size_t errlen)
{
    struct kube_backend *kb = calloc(1, sizeof *kb);
    if (!kb) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kb->base.ops = &kube_ops;
    kb->base.fleet = fleet;
    kb->evbase = base;
    kb->cfg = cfg;
    scale_driver_init(&kb->driver, &kube_scale_ops, kb);
    strmap_init(&kb->models);
    strmap_init(&kb->by_label);
    strmap_init(&kb->by_svc);
    strmap_init(&kb->nodes_gpu);
    kb->client = k8s_client_new(base, auth, err, errlen);
    if (!kb->client) {
        free(kb);
        return NULL;
    }
    /* An hour: the API server's default Event TTL. 4096: client-go's cache size. */
    k8s_events_init(&kb->events, kb->client, "thaw", 60 * 60 * 1000, 4096);
    const struct config_kubernetes *k = &cfg->kubernetes;
    const char *sel = k->label_selector ? k->label_selector : "thaw.dev/model";
    kb->n_ns = k->n_namespaces ? k->n_namespaces : 1;
    if (kb->n_ns > MAX_NAMESPACES) {
        kb->n_ns = MAX_NAMESPACES;
    }
    for (size_t i = 0; i < kb->n_ns; i++) {
        char dp[512], sp[512], pp[512];
        if (k->n_namespaces) {
            const char *ns = k->namespaces[i];
            snprintf(dp, sizeof dp, "/apis/apps/v1/namespaces/%s/deployments", ns);
            snprintf(sp, sizeof sp, "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices", ns);
            snprintf(pp, sizeof pp, "/api/v1/namespaces/%s/pods", ns);
        } else {
            snprintf(dp, sizeof dp, "/apis/apps/v1/deployments");
            snprintf(sp, sizeof sp, "/apis/discovery.k8s.io/v1/endpointslices");
            snprintf(pp, sizeof pp, "/api/v1/pods");
        }
        k8s_informer_init(&kb->ns[i].deployments, kb->client, base, "deployments", dp, sel,
                          &deployment_ops, kb);
        k8s_informer_init(&kb->ns[i].slices, kb->client, base, "endpointslices", sp,
                          "kubernetes.io/service-name", &slice_ops, kb);
        k8s_informer_init(&kb->ns[i].pods, kb->client, base, "pods", pp, "thaw.dev/model",
                          &pod_ops, kb);
    }
    k8s_informer_init(&kb->nodes, kb->client, base, "nodes", "/api/v1/nodes", NULL, &node_ops, kb);
    kb->informer_count = (unsigned)kb->n_ns * 3 + 1;
    /* Deployments first: pods and slices find their models by them. */
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_start(&kb->ns[i].deployments);
    }
    kb->leading = true; /* alone, this activator decides */
    const char *pod = getenv("POD_NAME");
    if (k->identity) {
        snprintf(kb->identity, sizeof kb->identity, "%s", k->identity);
    } else if (pod && *pod) {
        snprintf(kb->identity, sizeof kb->identity, "%s", pod);
    } else {
        char host[200] = "thaw";
        gethostname(host, sizeof host - 1);
        snprintf(kb->identity, sizeof kb->identity, "%s-%d", host, (int)getpid());
    }
    const struct k8s_auth *au = k8s_client_auth(kb->client);
    const char *lease_ns = k->lease_namespace ? k->lease_namespace
                           : au->namespace_   ? au->namespace_
                                              : "default";
    if (k->leader_election) {
        kb->elect = true;
        kb->leading = false;
        k8s_lease_init(&kb->lease, kb->client, base, k->lease_name ? k->lease_name : "thaw-leader",
                       lease_ns, kb->identity, k->lease_duration_ms, k->renew_interval_ms,
                       k->renew_deadline_ms, on_leadership, kb);
        k8s_lease_start(&kb->lease);
    }
    if (k->peers_service) {
        const char *self_ip = getenv("POD_IP");
        char listen_ip[128] = "";
        if (!self_ip || !*self_ip) {
            snprintf(listen_ip, sizeof listen_ip, "%s", cfg->admin_listen);
            char *colon = strrchr(listen_ip, ':');
            if (colon) {
                *colon = '\0';
            }
            self_ip = listen_ip;
        }
        kb->have_peers = true;
        k8s_peers_init(&kb->peers, kb->client, base,
                       k->peers_namespace ? k->peers_namespace : lease_ns, k->peers_service,
                       (unsigned)k->peers_port, self_ip, k->peers_poll_ms, k->peers_timeout_ms);
        k8s_peers_set_polling(&kb->peers, kb->leading);
        k8s_peers_start(&kb->peers);
    }
    event_assign(&kb->tick, base, -1, EV_PERSIST, on_tick, kb);
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(&kb->tick, &tv);
    LOGI("kubernetes backend", "server=%s auth=\"%s\" namespaces=%zu",
         k8s_client_auth(kb->client)->server, k8s_client_auth(kb->client)->source,
         k->n_namespaces);
    return &kb->base;
}


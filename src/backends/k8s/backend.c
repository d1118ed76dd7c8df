/* Kubernetes backend: models are Deployments labelled K8S_MODEL_LABEL (objects.h).
 *
 * Four informers feed it: Deployments (the models and their settings),
 * EndpointSlices (replica readiness as the cluster sees it), Pods (those a
 * model Deployment's spec.selector selects: IPs to probe directly, ahead of
 * the kubelet; Pending/Unschedulable pods) and
 * Nodes (GPU capacity). A replica is a pod: it is reported ready the first
 * time either its EndpointSlice endpoint is ready or thaw's own probe of
 * podIP:port answers, and gone when it terminates, is deleted, or its
 * endpoint stops being ready. Scaling goes through the Deployment's scale
 * subresource (merge patch); one PATCH at a time per model, retried with
 * backoff while requests wait. After idle_timeout with nothing in flight or
 * queued, thaw scales the model down to its min-scale. The parts are listed
 * in backend_k8s_int.h; this file holds the backend ops and the wiring. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- backend ops --------------------------------------------------------------- */

static int kube_attach(struct backend *b, struct model *m, const struct config_model *cm)
{
    return -ENOTSUP; /* models come from the cluster, not the config */
}

/* Demand for a model with no ready pod: scale it from zero now (any
 * activator, conditionally), not at the next tick; a model whose GPU
 * memory is bound waits for the leader's plan (at most one tick). */
static int kube_scale(struct backend *b, struct model *m, unsigned replicas)
{
    if (m->revs) {
        return -ENOTSUP; /* a routing entry: its revisions scale */
    }
    struct kmodel *km = m->backend_data;
    uint64_t now = clock_now_ms();
    as_record(&km->sc.ass, now, model_demand(m) + 1);
    /* Clients wait from now: the cold start they see begins (its phases
     * come from the pods, kube_cold_refresh). */
    if (kube_wake_for_demand(km)) {
        return 0; /* a pod is asleep or waking: it serves in seconds */
    }
    kube_cold_begin(km, now);
    if (km->spec.replicas == 0 && !kube_plan_wakes(km)) {
        kube_scale_from_zero(km);
    } else if (km->spec.replicas == 0 && km->kb->leading) {
        km->kb->driver.next_plan_ms = now; /* memory or the cap: the next tick's plan decides */
    }
    return 0;
}

static uint64_t kube_retry_after_ms(struct backend *b, struct model *m)
{
    struct kmodel *km = m->backend_data;
    unsigned waking = 0, dozing = 0;
    if (km->last_wake_ms && kube_pods_asleep(km, &waking, &dozing) + waking + dozing > 0) {
        return km->last_wake_ms;
    }
    uint64_t remaining;
    if (coldstart_remaining_ms(&m->cold, clock_now_ms(), &remaining)) {
        return remaining;
    }
    return m->cold_start_ms ? m->cold_start_ms : 5000;
}

bool kube_synced(struct backend *b)
{
    struct kube_backend *kb = KB(b);
    return kb->synced_count >= kb->informer_count;
}

static void free_node(void *ud, const char *key, void *value)
{
    kube_node_free(value);
}

static void kube_stop(struct backend *b)
{
}

static void free_model_cb(void *ud, const char *key, void *value)
{
    kube_kmodel_free(value);
}

static void kube_free(struct backend *b)
{
    struct kube_backend *kb = KB(b);
    event_del(&kb->tick);
    kube_ha_dispose(kb);
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_dispose(&kb->ns[i].deployments);
        k8s_informer_dispose(&kb->ns[i].slices);
        k8s_informer_dispose(&kb->ns[i].pods);
        k8s_informer_dispose(&kb->ns[i].pulling);
        k8s_informer_dispose(&kb->ns[i].pulled);
    }
    k8s_informer_dispose(&kb->nodes);
    kube_tenants_source_dispose(&kb->tenants);
    strmap_each(&kb->models, free_model_cb, NULL);
    strmap_dispose(&kb->models);
    kube_groups_free(kb);
    strmap_dispose(&kb->by_svc);
    strmap_each(&kb->nodes_gpu, free_node, NULL);
    strmap_dispose(&kb->nodes_gpu);
    kube_placement_dispose(&kb->placement);
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
    .rollout_decided = kube_rollout_decided,
    .rollout_leads = kube_rollout_leads,
    .stop = kube_stop,
    .free = kube_free,
};

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
    kb->ready_gate = kube_pod_check_sleep;
    kb->base.fleet = fleet;
    kb->evbase = base;
    kb->cfg = cfg;
    strmap_init(&kb->models);
    strmap_init(&kb->groups);
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
    const char *sel = k->label_selector ? k->label_selector : K8S_MODEL_LABEL;
    kb->n_ns = k->n_namespaces ? k->n_namespaces : 1;
    if (kb->n_ns > MAX_NAMESPACES) {
        kb->n_ns = MAX_NAMESPACES;
    }
    for (size_t i = 0; i < kb->n_ns; i++) {
        char dp[512], sp[512], pp[512], ep[512];
        if (k->n_namespaces) {
            const char *ns = k->namespaces[i];
            snprintf(dp, sizeof dp, "/apis/apps/v1/namespaces/%s/deployments", ns);
            snprintf(sp, sizeof sp, "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices", ns);
            snprintf(pp, sizeof pp, "/api/v1/namespaces/%s/pods", ns);
            snprintf(ep, sizeof ep, "/api/v1/namespaces/%s/events", ns);
        } else {
            snprintf(dp, sizeof dp, "/apis/apps/v1/deployments");
            snprintf(sp, sizeof sp, "/apis/discovery.k8s.io/v1/endpointslices");
            snprintf(pp, sizeof pp, "/api/v1/pods");
            snprintf(ep, sizeof ep, "/api/v1/events");
        }
        k8s_informer_init(&kb->ns[i].deployments, kb->client, base, "deployments", dp, sel,
                          &kube_deployment_ops, kb);
        k8s_informer_init(&kb->ns[i].slices, kb->client, base, "endpointslices", sp,
                          "kubernetes.io/service-name", &kube_slice_ops, kb);
        /* Every pod: a model's are those its Deployment's selector picks,
         * which no single label selector can ask for (replicas.c). */
        k8s_informer_init(&kb->ns[i].pods, kb->client, base, "pods", pp, NULL, &kube_pod_ops, kb);
        /* Only the two reasons, server-side: a namespace's other Events
         * (probe failures, scheduling, other workloads') never reach thaw. */
        k8s_informer_init(&kb->ns[i].pulling, kb->client, base, "events:Pulling", ep, NULL,
                          &kube_pull_event_ops, kb);
        k8s_informer_set_field_selector(&kb->ns[i].pulling, "involvedObject.kind=Pod,reason=Pulling");
        k8s_informer_init(&kb->ns[i].pulled, kb->client, base, "events:Pulled", ep, NULL,
                          &kube_pull_event_ops, kb);
        k8s_informer_set_field_selector(&kb->ns[i].pulled, "involvedObject.kind=Pod,reason=Pulled");
    }
    k8s_informer_init(&kb->nodes, kb->client, base, "nodes", "/api/v1/nodes", NULL, &kube_node_ops,
                      kb);
    kb->informer_count = (unsigned)kb->n_ns * 3 + 1;
    /* Deployments first: pods and slices find their models by them. */
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_start(&kb->ns[i].deployments);
    }
    kube_ha_start(kb);
    kube_scaling_start(kb);
    LOGI("kubernetes backend", "server=%s auth=\"%s\" namespaces=%zu",
         k8s_client_auth(kb->client)->server, k8s_client_auth(kb->client)->source,
         k->n_namespaces);
    return &kb->base;
}

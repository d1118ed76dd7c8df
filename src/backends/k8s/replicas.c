/* Kubernetes backend, replicas: Deployments labelled with K8S_MODEL_LABEL are
 * models (their annotations the settings); a replica is a pod the
 * Deployment's spec.selector selects (or its Service's EndpointSlice lists),
 * reported ready the first time either its EndpointSlice endpoint is ready or
 * thaw's own probe of podIP:port answers, and gone when it terminates, is
 * deleted, stops matching the selector, or its endpoint stops being ready.
 * What happens to a replica once known (ready, gone, its share of the
 * slots, its cold-start phases) is pods.c's. Nodes give the GPU capacity
 * per node (placement.c). */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/k8s/json.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct kpod *pod_get(struct kmodel *km, const char *name, bool create);

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
    kube_pod_gone(p, why);
    kube_pod_sleep_dispose(p);
    strmap_del(&km->pods, p->name, strlen(p->name));
    free(p);
    kube_shares_update(km); /* the pods after it move up in the deal */
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
    cm->max_queue = sp->max_queue;
    cm->queue_timeout_ms = sp->queue_timeout_ms;
    cm->connect_timeout_ms = sp->connect_timeout_ms;
    cm->first_byte_timeout_ms = sp->first_byte_timeout_ms;
    cm->upstream_idle_timeout_ms = sp->upstream_idle_timeout_ms;
    cm->loading_heartbeat_ms = sp->loading_heartbeat_ms;
    cm->health_path = (char *)sp->health_path;
}

/* What a cluster model gets without annotations: the config models'
 * defaults, except a startup timeout as long as the thaw-model chart's
 * startup probe allows (15 minutes) and loading heartbeats on. */
static void spec_defaults(const struct kube_backend *kb, struct k8s_model_spec *d)
{
    struct config_model dm;
    config_model_defaults(&dm, &kb->cfg->limits);
    memset(d, 0, sizeof *d);
    d->max_concurrency = dm.max_concurrency;
    d->priority = dm.priority;
    d->max_queue = dm.max_queue;
    d->connect_timeout_ms = dm.connect_timeout_ms;
    d->first_byte_timeout_ms = dm.first_byte_timeout_ms;
    d->upstream_idle_timeout_ms = dm.upstream_idle_timeout_ms;
    d->loading_heartbeat_ms = K8S_DEFAULT_LOADING_HEARTBEAT_MS;
    d->min_scale = 0;
    d->max_scale = 1000;
    d->idle_timeout_ms = dm.idle_timeout_ms;
    d->startup_timeout_ms = K8S_DEFAULT_STARTUP_TIMEOUT_MS;
    d->target = 0;
    d->port = (int)kb->cfg->kubernetes.default_port;
    d->idle_before_sleep_ms = K8S_DEFAULT_IDLE_BEFORE_SLEEP_MS;
    d->sleep_timeout_ms = K8S_DEFAULT_SLEEP_TIMEOUT_MS;
    snprintf(d->health_path, sizeof d->health_path, "/health");
    /* A rollout's defaults: a config model's. */
    d->rollout_step_percent = dm.rollout.step_percent;
    d->rollout_step_interval_ms = dm.rollout.step_interval_ms;
    d->rollout_min_requests = dm.rollout.min_requests;
    d->rollout_max_error_rate_increase_pct = dm.rollout.max_error_rate_increase_pct;
    d->rollout_max_ttfb_p99_ratio_pct = dm.rollout.max_ttfb_p99_ratio_pct;
    d->rollout_ttfb_p99_tolerance_ms = dm.rollout.ttfb_p99_tolerance_ms;
}

/* The annotations' autoscaler settings over the global ones. */
static void apply_scaling(struct kmodel *km, const struct config *cfg)
{
    const struct k8s_model_spec *sp = &km->spec;
    struct as_config *asc = &km->sc.asc;
    asc->min_scale = km->sc.min_replicas = (unsigned)sp->min_scale;
    asc->max_scale = (unsigned)sp->max_scale;
    asc->scale_to_zero_grace_ms = sp->idle_timeout_ms;
    /* Knative: the target is aimed at target-utilization-percentage of it. */
    double target = sp->target ? (double)sp->target : (double)sp->max_concurrency;
    if (sp->target_utilization_pct) {
        target = target * (double)sp->target_utilization_pct / 100.0;
    } else if (!sp->target) {
        target = target * (double)cfg->autoscaler.target_utilization_pct / 100.0;
    }
    asc->target = target < 1 ? 1 : target;
    asc->stable_window_ms = sp->window_ms >= 6000 ? sp->window_ms
                                                   : cfg->autoscaler.stable_window_ms;
    asc->panic_window_pct = (double)(sp->panic_window_pct ? sp->panic_window_pct
                                                          : cfg->autoscaler.panic_window_pct);
    asc->panic_threshold = (double)(sp->panic_threshold_pct ? sp->panic_threshold_pct
                                                            : cfg->autoscaler.panic_threshold_pct) /
                           100.0;
    asc->scale_down_delay_ms = sp->scale_down_delay_set ? sp->scale_down_delay_ms
                                                        : cfg->autoscaler.scale_down_delay_ms;
    asc->activation_scale = (unsigned)(sp->activation_scale ? sp->activation_scale
                                                            : cfg->autoscaler.activation_scale);
    km->sc.prewarm = sp->prewarm;
}

/* Bad or unknown annotations: a warning naming the Deployment and each
 * annotation with its value, and a Warning Event on the Deployment, each
 * time the set of problems changes. */
static void report_annotation_errors(struct kmodel *km, const char *before)
{
    const struct k8s_model_spec *sp = &km->spec;
    if (!sp->errors[0] || strcmp(before, sp->errors) == 0) {
        return;
    }
    LOGW("bad annotations on a model Deployment (defaults used)",
         "deployment=%s/%s errors=%s", sp->namespace_, sp->deployment, LOG_Q(sp->errors));
    kube_post_event(km, "Warning", "InvalidAnnotations", sp->errors);
}

/* initial-scale: right after the Deployment is created (its spec never
 * changed since: generation 1), scale it to that, as Knative does a new
 * revision, and hold it there for idle-timeout; then the autoscaler
 * decides (with no requests, back to min-scale). */
static void apply_initial_scale(struct kmodel *km)
{
    const struct k8s_model_spec *sp = &km->spec;
    if (!sp->initial_scale_set || sp->generation > 1 ||
        sp->replicas >= (int64_t)sp->initial_scale) {
        return;
    }
    km->initial_hold_until_ms = clock_now_ms() + sp->idle_timeout_ms;
    LOGI("initial scale", "model=%s deployment=%s replicas=%llu", km->m->name, km->key,
         (unsigned long long)sp->initial_scale);
    kube_want_replicas(km, (int64_t)sp->initial_scale);
}

static void index_model(struct kube_backend *kb, struct kmodel *km, bool add)
{
    char k[600];
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
    kube_pod_sleep_dispose(p);
    free(p);
}

void kube_kmodel_free(struct kmodel *km)
{
    event_del(&km->scale_retry);
    k8s_call_cancel(km->scale_call);
    k8s_call_cancel(km->idle_call);
    k8s_call_cancel(km->rollout_call);
    strmap_each(&km->pods, free_pod_cb, NULL);
    strmap_dispose(&km->pods);
    k8s_pod_template_dispose(&km->tpl);
    cJSON_Delete(km->selector);
    scaler_model_dispose(&km->sc);
    if (km->renamed_from) {
        model_unref(km->renamed_from);
    }
    free(km);
}

static struct kmodel *kmodel_new(struct kube_backend *kb, const struct k8s_model_spec *sp,
                                 const char *key, const struct config_model *cm)
{
    struct kmodel *km = calloc(1, sizeof *km);
    if (!km) {
        return NULL;
    }
    km->kb = kb;
    km->spec = *sp;
    km->seen_replicas = sp->replicas;
    km->scale_want = -1;
    snprintf(km->key, sizeof km->key, "%s", key);
    strmap_init(&km->pods);
    event_assign(&km->scale_retry, kb->evbase, -1, 0, kube_scale_retry, km);
    km->m = fleet_add_model(kb->base.fleet, cm);
    if (!km->m) {
        kube_kmodel_free(km);
        return NULL;
    }
    km->m->backend = &kb->base;
    km->m->backend_data = km;
    km->m->namespaced = true;
    scaler_model_init(&km->sc, km->m, kb->cfg, sp->target, sp->window_ms,
                      (unsigned)sp->min_scale, (unsigned)sp->max_scale, sp->idle_timeout_ms,
                      (unsigned)sp->gpu_slices);
    apply_scaling(km, kb->cfg);
    return km;
}

/* Keeps the Deployment's spec.selector (immutable in apps/v1, but read anew). */
static void set_selector(struct kmodel *km, const cJSON *deployment)
{
    cJSON *sel = cJSON_Duplicate(k8s_get(deployment, "spec.selector"), true);
    cJSON_Delete(km->selector);
    km->selector = sel;
}

static void deployment_remove(void *ud, const cJSON *obj);
static void remove_kmodel(struct kube_backend *kb, struct kmodel *km, const char *why);
static void relist_pods(struct kube_backend *kb, const char *ns);

static void deployment_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct k8s_model_spec defaults;
    spec_defaults(kb, &defaults);
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
    char rev_name[600], rev_hosts_buf[4096];
    char *rev_hosts[36];
    if (sp.revision[0]) {
        /* One revision of a model: a model of its own, reached by tag. */
        char group_buf[4096];
        char *group_hosts[32];
        size_t n = kube_group_hosts(kb, &sp, group_buf, sizeof group_buf, group_hosts, 32);
        kube_revision_names(&sp, group_hosts, n, &cm, rev_name, sizeof rev_name, rev_hosts_buf,
                            sizeof rev_hosts_buf, rev_hosts, 36);
    }
    bool other_model = km && (strcmp(km->spec.revision, sp.revision) != 0 ||
                              strcmp(km->spec.name, sp.name) != 0);
    struct model *served = NULL; /* the model it served, when it renames it */
    if (other_model) {
        /* A Deployment that became (or stopped being) a revision, or changed
         * its revision or model name: its model is a different one now. Its
         * held requests are told so; its pods come back to the new model
         * through a list of them (the informers keep no objects). */
        char why[900];
        snprintf(why, sizeof why, "the model's Deployment %s now serves model %s%s%s", key,
                 sp.name, sp.revision[0] ? " revision " : "", sp.revision);
        served = km->m;
        model_ref(served);
        remove_kmodel(kb, km, why);
        km = NULL;
    }
    if (!km) {
        km = kmodel_new(kb, &sp, key, &cm);
        if (served && km && served->inflight_leaving) {
            km->renamed_from = served; /* its requests on the pods run on */
        } else if (served) {
            model_unref(served);
        }
        if (!km) {
            return;
        }
        if (other_model) {
            relist_pods(kb, sp.namespace_);
        }
        set_selector(km, obj);
        kube_model_template(km, obj);
        strmap_put(&kb->models, key, strlen(key), km);
        index_model(kb, km, true);
        kube_idle_observe(km, obj, true);
        LOGI("model discovered", "model=%s deployment=%s replicas=%lld gpu_slices=%llu",
             sp.name, key, (long long)sp.replicas, (unsigned long long)sp.gpu_slices);
        report_annotation_errors(km, "");
        apply_initial_scale(km);
        if (sp.revision[0]) {
            kube_revisions_sync(kb, sp.namespace_, sp.name);
        }
        return;
    }
    index_model(kb, km, false);
    bool names_changed = strcmp(km->spec.hosts, sp.hosts) || strcmp(km->spec.aliases, sp.aliases);
    /* Keep thaw's own view of replicas while a PATCH is on its way. */
    km->seen_replicas = sp.replicas;
    if (km->scale_inflight) {
        sp.replicas = km->spec.replicas;
    }
    char before[sizeof sp.errors];
    memcpy(before, km->spec.errors, sizeof before);
    km->spec = sp;
    set_selector(km, obj);
    index_model(kb, km, true);
    report_annotation_errors(km, before);
    model_apply_settings(km->m, &cm);
    kube_shares_update(km); /* max_concurrency may have changed */
    /* New annotations take effect; the autoscaler keeps its samples. */
    apply_scaling(km, kb->cfg);
    kube_model_template(km, obj); /* after: it sets the slices a replica takes */
    if (names_changed) {
        fleet_reroute_model(kb->base.fleet, km->m, &cm);
    }
    kube_idle_observe(km, obj, false);
    if (sp.revision[0]) {
        kube_revisions_sync(kb, sp.namespace_, sp.name);
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
    /* A watch by label reports a Deployment that lost its label as deleted
     * too; with the default selector the object says which it was (one
     * known by key only, gone while the watch was down, cannot). */
    char why[700];
    const cJSON *labels = k8s_get(obj, "metadata.labels");
    const char *sel = kb->cfg->kubernetes.label_selector;
    if ((sel && strcmp(sel, K8S_MODEL_LABEL) != 0) || !k8s_get(obj, "metadata.uid")) {
        snprintf(why, sizeof why,
                 "the model's Deployment %s was deleted or no longer matches the label selector",
                 key);
    } else if (!cJSON_GetObjectItemCaseSensitive(labels, K8S_MODEL_LABEL)) {
        snprintf(why, sizeof why,
                 "the model's Deployment %s no longer carries the " K8S_MODEL_LABEL " label", key);
    } else {
        snprintf(why, sizeof why, "the model's Deployment %s was deleted", key);
    }
    remove_kmodel(kb, km, why);
}

/* km leaves: its pods, then its model, whose held requests are answered 503
 * with why. */
static void remove_kmodel(struct kube_backend *kb, struct kmodel *km, const char *why)
{
    strmap_del(&kb->models, km->key, strlen(km->key));
    index_model(kb, km, false);
    struct model *m = km->m;
    /* Pods go first (their endpoints leave the model), then the model,
     * whose held requests are answered 503 naming the reason. */
    strmap_each(&km->pods, free_pod_cb, NULL);
    strmap_dispose(&km->pods);
    strmap_init(&km->pods);
    fleet_remove_model(kb->base.fleet, m, why);
    bool revision = km->spec.revision[0] != '\0';
    char ns[254], name[254];
    snprintf(ns, sizeof ns, "%s", km->spec.namespace_);
    snprintf(name, sizeof name, "%s", km->spec.name);
    kube_kmodel_free(km);
    if (revision) {
        kube_revisions_sync(kb, ns, name);
    }
}

/* ---- pods ------------------------------------------------------------------ */

/* The pods and EndpointSlices of namespace ns listed again. */
static void relist_pods(struct kube_backend *kb, const char *ns)
{
    for (size_t i = 0; i < kb->n_ns; i++) {
        if (!kb->cfg->kubernetes.n_namespaces ||
            strcmp(kb->cfg->kubernetes.namespaces[i], ns) == 0) {
            k8s_informer_relist(&kb->ns[i].pods);
            k8s_informer_relist(&kb->ns[i].slices);
        }
    }
}

struct pod_match {
    const struct k8s_pod_info *pi;
    const cJSON *labels;
    struct kmodel *found;
};

/* Whether the pod's controller, its ReplicaSet, is km's Deployment's: the
 * Deployment controller names it "<deployment>-<pod-template-hash>" and
 * labels the pods with that hash. */
static bool owned_by(const struct kmodel *km, const struct pod_match *pm)
{
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(pm->labels, "pod-template-hash");
    const char *owner = pm->pi->owner;
    size_t n = strlen(km->spec.deployment);
    if (strncmp(owner, km->spec.deployment, n) != 0 || owner[n] != '-') {
        return false;
    }
    return !cJSON_IsString(hash) || strcmp(owner + n + 1, hash->valuestring) == 0;
}

static void match_model(void *ud, const char *key, void *value)
{
    struct pod_match *pm = ud;
    struct kmodel *km = value;
    if (strcmp(km->spec.namespace_, pm->pi->namespace_) != 0 ||
        !k8s_selector_matches(km->selector, pm->labels)) {
        return;
    }
    /* Overlapping selectors (the API warns against them): the Deployment
     * that owns the pod, else the first by key, so the choice is stable. */
    struct kmodel *cur = pm->found;
    bool mine = owned_by(km, pm);
    bool theirs = cur && owned_by(cur, pm);
    bool better = !cur || (mine && !theirs) || (mine == theirs && strcmp(km->key, cur->key) < 0);
    if (better) {
        pm->found = km;
    }
}

/* The model whose Deployment's selector selects the pod, as the Deployment
 * controller and kubectl count its pods; NULL when none does. */
static struct kmodel *model_of_pod(struct kube_backend *kb, const cJSON *obj,
                                   const struct k8s_pod_info *pi)
{
    struct pod_match pm = {pi, k8s_get(obj, "metadata.labels"), NULL};
    strmap_each(&kb->models, match_model, &pm);
    return pm.found;
}

struct unselect {
    const struct k8s_pod_info *pi;
    const struct kmodel *keep;
};

static void drop_if_unselected(void *ud, const char *key, void *value)
{
    struct unselect *u = ud;
    struct kmodel *km = value;
    if (km == u->keep || strcmp(km->spec.namespace_, u->pi->namespace_) != 0) {
        return;
    }
    /* Also one an EndpointSlice brought before the pod was seen: a Service
     * may select another Deployment's pods (overlapping selectors). */
    struct kpod *p = pod_get(km, u->pi->name, false);
    if (p) {
        pod_free(km, p, "pod no longer matches the Deployment's selector");
    }
}

static void pod_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct k8s_pod_info pi;
    if (k8s_pod_decode(obj, &pi)) {
        return;
    }
    struct kmodel *km = model_of_pod(kb, obj, &pi);
    /* Relabelled out of a Deployment (its ReplicaSet lets go of it too). */
    struct unselect u = {&pi, km};
    strmap_each(&kb->models, drop_if_unselected, &u);
    struct kpod *p = km ? pod_get(km, pi.name, true) : NULL;
    if (!p) {
        return;
    }
    bool placed_before = kube_pod_in_deal(p, (int64_t)clock_wall_ms());
    p->selected = true;
    snprintf(p->phase, sizeof p->phase, "%s", pi.phase);
    bool moved = strcmp(p->created, pi.created) != 0;
    if (moved) {
        snprintf(p->created, sizeof p->created, "%s", pi.created);
        int64_t ms = 0;
        p->created_ms = k8s_time_parse_ms(pi.created, &ms) == 0 && ms > 0 ? ms : 0;
    }
    p->unschedulable = pi.unschedulable;
    p->pod_ready = pi.ready;
    if (!pi.running) {
        p->sleep_known = true; /* seen before its server ran: it starts awake */
    }
    p->terminating = p->terminating || pi.terminating;
    if (moved || placed_before != kube_pod_in_deal(p, (int64_t)clock_wall_ms())) {
        kube_shares_update(km); /* the pods in the deal, or their order, changed */
    }
    snprintf(p->node, sizeof p->node, "%s", pi.node_name);
    p->requests = pi.requests;
    /* A kill that lags the deletionTimestamp: the kubelet's own delay. */
    const int64_t kill_slack_ms = 10000, default_grace_ms = 30000;
    if (pi.stopping && !p->memory_until_ms) {
        p->memory_until_ms = (pi.kill_ms ? pi.kill_ms : (int64_t)clock_wall_ms() + default_grace_ms) +
                             kill_slack_ms;
    } else if (!pi.stopping) {
        p->memory_until_ms = 0; /* exited (Failed, Succeeded), or not deleted */
    }
    if (pi.terminating) {
        p->terminating = true;
        kube_pod_gone(p, "pod terminating");
        return;
    }
    if (!p->reported) {
        kube_pod_observe_phase(p, &pi, clock_now_ms());
    }
    if (pi.ip[0] && strcmp(pi.ip, p->ip) != 0) {
        if (p->probing) {
            probe_stop(&p->probe);
            p->probing = false;
        }
        snprintf(p->ip, sizeof p->ip, "%s", pi.ip);
    }
    kube_pod_sleep_marks(p, &pi);
    /* Probe as soon as the pod has an IP, not when the kubelet says so. */
    if (pi.running) {
        kube_pod_probe(p);
    }
}


struct pod_gone {
    const char *name, *ns;
};

static void free_pod_named(void *ud, const char *key, void *value)
{
    const struct pod_gone *g = ud;
    struct kmodel *km = value;
    struct kpod *p = strcmp(km->spec.namespace_, g->ns) == 0 ? pod_get(km, g->name, false) : NULL;
    if (p) {
        pod_free(km, p, "pod deleted");
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
    struct kmodel *km = k8s_pod_decode(obj, &pi) == 0 ? model_of_pod(kb, obj, &pi) : NULL;
    if (km) {
        struct kpod *p = pod_get(km, name, false);
        if (p) {
            pod_free(km, p, "pod deleted");
        }
        return;
    }
    /* Every Deployment's model (kb->models: not the fleet's list, where a
     * model with revisions is a routing entry, not a kmodel). */
    struct pod_gone g = {name, ns};
    strmap_each(&kb->models, free_pod_named, &g);
}

/* ---- endpointslices ---------------------------------------------------------- */

struct pod_claim {
    const struct kmodel *km;
    const char *pod;
    bool other;
};

static void claimed_elsewhere(void *ud, const char *key, void *value)
{
    struct pod_claim *c = ud;
    const struct kmodel *km = value;
    if (km != c->km && !c->other && strcmp(km->spec.namespace_, c->km->spec.namespace_) == 0) {
        const struct kpod *p = strmap_get(&km->pods, c->pod, strlen(c->pod));
        c->other = p && p->selected;
    }
}

static void slice_endpoint(void *ud, const struct k8s_slice_endpoint *e)
{
    struct kmodel *km = ud;
    if (!e->pod) {
        return; /* a replica is a pod: an address alone is not one thaw knows */
    }
    /* The Service's selector may overlap another model's: a pod the pods
     * informer gave to another Deployment (its ReplicaSet's) is not ours. */
    struct pod_claim claim = {km, e->pod, false};
    if (!pod_get(km, e->pod, false)) {
        strmap_each(&km->kb->models, claimed_elsewhere, &claim);
    }
    struct kpod *p = claim.other ? NULL : pod_get(km, e->pod, true);
    if (!p) {
        return;
    }
    if (!p->ip[0]) {
        snprintf(p->ip, sizeof p->ip, "%s", e->address);
    }
    if (e->terminating) {
        p->terminating = true;
        kube_pod_gone(p, "endpoint terminating");
    } else if (e->ready) {
        p->slice_ready = true;
        if (kube_pod_slice_ready_trusted(p)) {
            kube_pod_ready(p, "endpointslice");
        }
    } else if (p->slice_ready) {
        /* Was ready, is not any more: the kubelet saw it fail. */
        p->slice_ready = false;
        kube_pod_gone(p, "endpoint not ready");
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
        k8s_node_info_dispose(&ni);
        return;
    }
    struct k8s_node_info *cur = strmap_get(&kb->nodes_gpu, ni.name, strlen(ni.name));
    bool known = cur != NULL;
    if (!cur) {
        cur = calloc(1, sizeof *cur);
        if (!cur || strmap_put(&kb->nodes_gpu, ni.name, strlen(ni.name), cur)) {
            free(cur);
            k8s_node_info_dispose(&ni);
            return;
        }
    }
    if (ni.gpu_memory_bad && (!known || !cur->gpu_memory_bad)) {
        LOGW("node label nvidia.com/gpu.memory is not a count of MiB; the node's GPU memory "
             "is kubernetes.gpu_memory_bytes (0: not limited)",
             "node=%s", ni.name);
    }
    if (known && (ni.unschedulable != cur->unschedulable || ni.n_taints != cur->n_taints)) {
        LOGI("node scheduling changed", "node=%s cordoned=%d taints=%zu", ni.name, ni.unschedulable,
             ni.n_taints);
    }
    k8s_node_info_dispose(cur);
    *cur = ni;
}

void kube_node_free(struct k8s_node_info *ni)
{
    if (ni) {
        k8s_node_info_dispose(ni);
        free(ni);
    }
}

static void node_remove(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    const char *name = k8s_get_string(obj, "metadata.name");
    if (name) {
        kube_node_free(strmap_del(&kb->nodes_gpu, name, strlen(name)));
    }
}

/* ---- sync ------------------------------------------------------------------- */

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
    kube_revisions_listed(kb);
    for (size_t i = 0; i < kb->n_ns; i++) {
        k8s_informer_start(&kb->ns[i].pods);
        k8s_informer_start(&kb->ns[i].slices);
    }
    k8s_informer_start(&kb->nodes);
    if (kb->cfg->kubernetes.pull_events) {
        for (size_t i = 0; i < kb->n_ns; i++) {
            k8s_informer_start(&kb->ns[i].pulling);
            k8s_informer_start(&kb->ns[i].pulled);
        }
    }
}

const struct k8s_informer_ops kube_deployment_ops = {deployment_upsert, deployment_remove,
                                                     on_deployments_synced};
const struct k8s_informer_ops kube_pod_ops = {pod_upsert, pod_remove, on_synced};
const struct k8s_informer_ops kube_slice_ops = {slice_upsert, slice_remove, on_synced};
const struct k8s_informer_ops kube_node_ops = {node_upsert, node_remove, on_synced};

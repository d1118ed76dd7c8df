/* Kubernetes backend, scaling: every tick a concurrency sample per model
 * (plus the peers' counts while leading), a retried scale from zero and the
 * startup timeout; every autoscaler.tick_ms, while leading, one step of the
 * shared scaling driver (scale_driver.h) whose targets become scale PATCHes
 * on the Deployment's scale subresource: one at a time per model, retried
 * with backoff; from zero conditionally on the resourceVersion. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Held requests wait on a wake: its retries back off, but never so far
 * that a recovered API server leaves them waiting long. */
#define ZERO_RETRY_MAX_MS 4000

/* ---- scaling ------------------------------------------------------------- */

static void send_scale(struct kmodel *km);

/* Sends a merge PATCH of the Deployment's scale subresource; at most one is
 * in flight per model. */
static void patch_scale(struct kmodel *km, const char *body, k8s_done_cb done)
{
    char path[700];
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s/scale",
             km->spec.namespace_, km->spec.deployment);
    km->scale_inflight = true;
    km->scale_call = k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json",
                                 body, strlen(body), 15000, done, km);
    if (!km->scale_call) {
        km->scale_inflight = false;
    }
}

void kube_scale_retry(evutil_socket_t fd, short what, void *arg)
{
    send_scale(arg);
}

/* Scaled to zero: route nothing more to the pods, even before the watch
 * reports them terminating. Not final: if the model is scaled up again
 * before they go, the cluster may keep them (see unretire_pod). */
static void retire_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    p->retired = true;
    kube_pod_gone(p, "scaled to zero");
}

static void unretire_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->retired) {
        p->retired = false;
        if (!p->terminating && (p->probe_ok || p->slice_ready)) {
            kube_pod_ready(p, "kept by the cluster");
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
            kube_cold_begin(km, km->woken_ms); /* also when no request asked (warm pool) */
            strmap_each(&km->pods, unretire_pod, NULL);
            kube_post_event(km, "Normal", "ScaledFromZero", msg);
        } else if (want == 0) {
            km->scale_downs++;
            kube_post_event(km, "Normal", "ScaledToZero", msg);
            coldstart_cancel(&km->m->cold);
            /* Every pod goes now: send them nothing more, even before the
             * watch reports them terminating. */
            strmap_each(&km->pods, retire_pod, NULL);
        }
        return;
    }
    km->spec.replicas = km->seen_replicas; /* what the watch said meanwhile */
    km->kb->scale_errors++;
    km->scale_failures++;
    snprintf(km->last_scale_error, sizeof km->last_scale_error, "HTTP %ld%s%s", status,
             err ? ": " : "", err ? err : "");
    uint64_t ms = k8s_backoff_ms(km->scale_failures, (double)rand() / ((double)RAND_MAX + 1));
    LOGW("scaling deployment failed", "model=%s deployment=%s/%s status=%ld error=%s "
         "retry_in_ms=%llu", km->m->name, km->spec.namespace_, km->spec.deployment, status,
         LOG_Q(err ? err : ""), (unsigned long long)ms);
    if (km->scale_failures == 1 || km->scale_failures % 10 == 0) {
        kube_post_event(km, "Warning", "ScaleFailed", km->last_scale_error);
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
    patch_scale(km, body, on_scaled);
}

static void on_scaled_from_zero(void *ud, long status, const char *body, size_t len,
                                const char *err)
{
    struct kmodel *km = ud;
    km->scale_call = NULL;
    km->scale_inflight = false;
    if (status == 200 || status == 409) {
        km->zero_failures = 0;
        km->zero_retry_at_ms = 0;
    }
    if (status == 200) {
        int64_t to = (int64_t)km->sc.asc.activation_scale;
        km->spec.replicas = to;
        km->woken_ms = clock_now_ms();
        as_note_scaled(&km->sc.ass, &km->sc.asc, km->woken_ms, (unsigned)to);
        kube_cold_begin(km, km->woken_ms);
        strmap_each(&km->pods, unretire_pod, NULL);
        km->scale_ups++;
        km->kb->conditional_scales++;
        char msg[700];
        snprintf(msg, sizeof msg, "%s scaled %s from 0 to %lld replicas", km->kb->identity,
                 km->spec.deployment, (long long)to);
        LOGI("scaled deployment from zero", "model=%s deployment=%s/%s to=%lld", km->m->name,
             km->spec.namespace_, km->spec.deployment, (long long)to);
        kube_post_event(km, "Normal", "ScaledFromZero", msg);
        return;
    }
    /* The Deployment as the watch reported it while this PATCH was out:
     * its resourceVersion is in spec already, so its replicas must be too,
     * or a 409 would leave a view of zero replicas at a version where they
     * are not, and the next try would succeed on it. */
    km->spec.replicas = km->seen_replicas;
    if (status == 409) {
        /* Another activator got there first: the informer will say so. */
        km->kb->conditional_conflicts++;
        LOGD("scale from zero: someone else was first", "model=%s", km->m->name);
    } else {
        km->kb->scale_errors++;
        snprintf(km->last_scale_error, sizeof km->last_scale_error, "HTTP %ld%s%s", status,
                 err ? ": " : "", err ? err : "");
        uint64_t ms = k8s_backoff_ms(++km->zero_failures, (double)rand() / ((double)RAND_MAX + 1));
        if (ms > ZERO_RETRY_MAX_MS) {
            ms = ZERO_RETRY_MAX_MS;
        }
        km->zero_retry_at_ms = clock_now_ms() + ms;
        LOGW("scale from zero failed", "model=%s status=%ld error=%s retry_in_ms=%llu",
             km->m->name, status, LOG_Q(err ? err : ""), (unsigned long long)ms);
    }
}

/* 0 -> activation scale, only if still 0: the PATCH carries the
 * resourceVersion thaw saw, so of activators poking at once one wins and
 * the others get 409. Any activator may do this; the rest is the leader's. */
void kube_scale_from_zero(struct kmodel *km)
{
    if (km->spec.replicas != 0 || km->scale_inflight || !km->spec.resource_version[0] ||
        clock_now_ms() < km->zero_retry_at_ms) {
        return;
    }
    char body[200];
    snprintf(body, sizeof body,
             "{\"metadata\":{\"resourceVersion\":\"%s\"},\"spec\":{\"replicas\":%llu}}",
             km->spec.resource_version, (unsigned long long)km->sc.asc.activation_scale);
    patch_scale(km, body, on_scaled_from_zero);
}

void kube_want_replicas(struct kmodel *km, int64_t n)
{
    if (n > (int64_t)km->spec.max_scale) {
        n = (int64_t)km->spec.max_scale;
    }
    if (n == km->spec.replicas && !km->scale_inflight) {
        km->scale_want = -1;
        return;
    }
    if (n < km->spec.replicas) {
        km->scaled_down_ms = clock_now_ms();
    }
    km->scale_want = n;
    if (!event_pending(&km->scale_retry, EV_TIMEOUT, NULL)) {
        send_scale(km);
    }
}

/* ---- the tick and the scaling driver ------------------------------------- */

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
    uint64_t renamed = km->renamed_from ? km->renamed_from->inflight_leaving : 0;
    if (km->renamed_from && !renamed) {
        model_unref(km->renamed_from); /* the last request from before the rename ended */
        km->renamed_from = NULL;
    }
    kube_idle_tick(km, clock_now_ms());
    kube_sleep_tick(km, clock_now_ms());
    if (km->kb->have_peers) {
        kube_shares_update(km); /* shares held back settle, pods age out of the deal */
    }
    bool busy = m->inflight > 0 || m->queue.count > 0 || renamed > 0;
    if (!busy && km->spec.replicas == 0 && km->sc.last.desired == 0 &&
        !(km->kb->have_peers && km->kb->leading)) {
        km->waiting_since_ms = 0; /* scaled to zero and quiet: the common, cheap case */
        coldstart_cancel(&m->cold); /* nobody waits any more */
        return;
    }
    uint64_t now = clock_now_ms();
    uint64_t peer = km->kb->have_peers && km->kb->leading ? k8s_peers_demand(&km->kb->peers, km->key)
                                                           : 0;
    as_record(&km->sc.ass, now, model_demand(m) + (double)(peer + renamed));
    bool plan_bound = m->n_endpoints == 0 && km->spec.replicas == 0 && kube_plan_wakes(km);
    if (busy && m->n_endpoints == 0 && km->spec.replicas == 0 && !plan_bound) {
        kube_scale_from_zero(km); /* retried until the Deployment says otherwise */
    } else if (plan_bound && (busy || peer) && km->kb->leading) {
        /* The scheduler sees neither GPU memory nor thaw's slice cap: only
         * the plan may wake this one (or refuse, or make room); it runs
         * this tick. */
        km->kb->driver.next_plan_ms = now;
    }
    if (!busy || m->n_endpoints > 0 || m->queue.count == 0) {
        km->waiting_since_ms = 0;
        return;
    }
    if (!km->waiting_since_ms) {
        km->waiting_since_ms = now;
    } else if (now - km->waiting_since_ms >= km->spec.startup_timeout_ms &&
               !model_has_unschedulable(km) &&
               !(plan_bound && strcmp(km->sc.last_action, "deny") == 0)) {
        /* Pods that run but never answer (crash loops, bad images): do not
         * hold clients forever. Pods waiting for a GPU (its slices, or a
         * wake the plan denies for GPU memory) are not failures: those
         * requests end at their queue timeout. */
        char why[160];
        snprintf(why, sizeof why, "no pod became ready within startup-timeout (%llu ms)",
                 (unsigned long long)km->spec.startup_timeout_ms);
        LOGW("model did not become ready", "model=%s deployment=%s", m->name, km->key);
        kube_post_event(km, "Warning", "StartupTimeout", why);
        km->waiting_since_ms = now;
        fleet_model_unavailable(m->fleet, m, why, 0);
    }
}

/* ---- scaling driver hooks: the autoscaler and the warm pool over every
 * model, against the GPU Nodes one by one (placement.c; the configured cap
 * on top), or the configured cap alone without GPU Nodes; each change is
 * one scale PATCH. */

struct collect {
    struct scaler_model **sms;
    size_t n, cap;
};

static size_t count_models(void *ud)
{
    return ((struct kube_backend *)ud)->models.count;
}

/* With several activators a pod's slots are dealt among them, so requests
 * held at an activator whose share is 0 wait for pods the total demand may
 * not need: the model keeps enough pods that the last activator (in the
 * deal's order) holding runnable requests, or running some, gets a slot,
 * within max-scale. Running ones count so that the pod a request got this
 * way is not scaled away under it. */
static unsigned share_floor(struct kmodel *km)
{
    struct kube_backend *kb = km->kb;
    if (!kb->have_peers) {
        return 0;
    }
    unsigned span = k8s_peers_waiting_span(&kb->peers, km->key);
    unsigned rank, n;
    bool busy_here = queue_runnable(&km->m->queue) || km->m->inflight > 0;
    if (busy_here && k8s_peers_place(&kb->peers, &rank, &n) && rank + 1 > span) {
        span = rank + 1;
    }
    if (!span) {
        return 0;
    }
    unsigned pods = k8s_pods_to_reach(km->m->set.max_concurrency, span - 1);
    return pods < km->spec.max_scale ? pods : (unsigned)km->spec.max_scale;
}

static void collect_model(void *ud, const char *key, void *value)
{
    struct collect *c = ud;
    struct kmodel *km = value;
    if (c->n == c->cap) {
        return;
    }
    /* The plan keeps (and admits) at least min_replicas: the share floor
     * joins min-scale there, so it takes its place in GPU admission. */
    unsigned least = share_floor(km);
    km->sc.min_replicas = least > km->spec.min_scale ? least : (unsigned)km->spec.min_scale;
    km->sc.current = (unsigned)(km->scale_want >= 0 ? km->scale_want : km->spec.replicas);
    /* Asleep pods are replicas the autoscaler keeps (the idle timeout, not
     * the stable window, takes them): they serve again after a wake. */
    unsigned waking = 0, dozing = 0;
    unsigned asleep = kube_pods_asleep(km, &waking, &dozing);
    km->sc.ready = (unsigned)km->m->n_endpoints + asleep + waking + dozing;
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

static unsigned cluster_gpu_slices(void *ud)
{
    unsigned capacity = 0;
    strmap_each(&((struct kube_backend *)ud)->nodes_gpu, sum_gpus, &capacity);
    return capacity;
}

/* Whether km's scale-up must wait for GPU memory: pods on their way out
 * (scaled down, by this plan too, or terminating) still hold it. The
 * scheduler counts their GPU slices until they are gone, not their memory,
 * so a pod placed meanwhile could share a GPU with them over its memory. */
static bool memory_not_free_yet(struct kmodel *km)
{
    if (!kube_memory_bound(km) || !kube_memory_leaving_for(km)) {
        km->memory_wait_said = false;
        return false;
    }
    if (!km->memory_wait_said) {
        LOGI("scale-up waits for GPU memory that stopping pods still hold",
             "model=%s deployment=%s", km->m->name, km->key);
        km->memory_wait_said = true;
    }
    return true;
}

static void apply_targets(void *ud, struct scaler_model **sms, size_t n, uint64_t now_ms)
{
    struct kube_backend *kb = ud;
    /* A new leader starts from the cluster's replicas and the peers' counts,
     * not from zero: for one stable window (the model's, thaw.dev/window) it
     * does not scale a model down. */
    for (size_t i = 0; i < n; i++) {
        struct kmodel *km = container_of(sms[i], struct kmodel, sc);
        bool hold_down = now_ms - kb->leader_since_ms < km->sc.asc.stable_window_ms;
        if (hold_down && km->sc.target < km->sc.current) {
            km->sc.target = km->sc.current;
        }
        if (now_ms < km->initial_hold_until_ms && km->sc.target < km->spec.initial_scale) {
            km->sc.target = (unsigned)km->spec.initial_scale;
        }
        if ((int64_t)km->sc.target < km->sc.current) {
            kube_want_replicas(km, km->sc.target);
        }
    }
    /* Then the scale-ups, which the memory freed by those may be for. */
    for (size_t i = 0; i < n; i++) {
        struct kmodel *km = container_of(sms[i], struct kmodel, sc);
        if ((int64_t)km->sc.target <= km->sc.current) {
            continue;
        }
        if (memory_not_free_yet(km)) {
            km->sc.target = (unsigned)km->sc.current; /* the plan runs again next tick */
        } else if (km->sc.current == 0) {
            kube_scale_from_zero(km); /* conditional, as every activator does it */
        } else {
            kube_want_replicas(km, km->sc.target);
        }
    }
}

static const struct scale_driver_ops kube_scale_ops = {
    .count = count_models,
    .collect = collect_models,
    .gpu_slices = cluster_gpu_slices,
    .apply = apply_targets,
    .nodes = kube_plan_nodes,
};

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct kube_backend *kb = arg;
    strmap_each(&kb->models, model_tick, kb);
    kube_rollout_writes_tick(kb);
    kube_sleep_for_memory(kb);
    if (kb->leading && scale_driver_due(&kb->driver, clock_now_ms())) {
        scale_driver_plan(&kb->driver, kb->cfg);
    }
}

void kube_scaling_start(struct kube_backend *kb)
{
    scale_driver_init(&kb->driver, &kube_scale_ops, kb);
    event_assign(&kb->tick, kb->evbase, -1, EV_PERSIST, on_tick, kb);
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(&kb->tick, &tv);
}

/* Kubernetes backend, pods: a replica once known (replicas.c finds the
 * pods): reported ready (by thaw's own probe of podIP:port, whose open
 * connection carries the first request, or by its EndpointSlice) and gone;
 * this activator's share of its slots when several activators serve it;
 * and the phases of its cold start, from the pod and the kubelet's
 * Pulling/Pulled Events. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/k8s/json.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void pod_cold_start_done(struct kpod *p, uint64_t now, bool tell);

/* ---- replicas -------------------------------------------------------------- */

/* How long until a pod of km should be ready, from its last cold start and
 * how long ago this one began; 0 when unknown. */
static uint64_t expected_ready_ms(const struct kmodel *km)
{
    uint64_t last = km->m->cold_start_ms;
    if (!last || !km->woken_ms) {
        return 0;
    }
    uint64_t elapsed = clock_now_ms() - km->woken_ms;
    return last > elapsed ? last - elapsed : 0;
}

void kube_pod_addr(const struct kpod *p, char *out, size_t len)
{
    snprintf(out, len, strchr(p->ip, ':') ? "[%s]:%d" : "%s:%d", p->ip, p->km->spec.port);
}

void kube_pod_ready(struct kpod *p, const char *via)
{
    kube_pod_ready_conn(p, via, -1);
}

void kube_pod_ready_conn(struct kpod *p, const char *via, int conn_fd)
{
    /* Asleep (or on its way there or back): sleep.c reports it when woken. */
    struct kube_backend *kb = p->km->kb;
    if (p->reported || p->terminating || p->retired || !p->ip[0] || p->sleep != KS_AWAKE ||
        (kb->ready_gate && kb->ready_gate(p))) {
        if (conn_fd >= 0) {
            close(conn_fd);
        }
        return;
    }
    char addr[96];
    kube_pod_addr(p, addr, sizeof addr);
    p->reported = true;
    LOGI("pod ready", "model=%s pod=%s addr=%s via=%s", p->km->m->name, p->name, addr, via);
    struct kmodel *km = p->km;
    /* With several activators, the one whose scale from zero landed tells
     * the cold start's Event; the others only count it. */
    bool tell = km->woken_ms || !km->kb->elect;
    km->busy_at_ms = clock_now_ms(); /* idle-before-sleep counts from here */
    if (km->woken_ms && km->m->n_endpoints == 0) {
        /* The cold start as clients see it: scale-up landed -> first pod ready. */
        uint64_t ms = clock_now_ms() - km->woken_ms;
        km->m->cold_start_ms = ms;
        histogram_observe_in(&km->m->stats.cold_start, cs_hist_bounds, (double)ms / 1000.0);
        km->woken_ms = 0;
    }
    pod_cold_start_done(p, clock_now_ms(), tell);
    /* No slot until the shares are dealt with this pod counted in: another
     * activator may already hold all of it. The probe's connection waits in
     * the pool meanwhile. */
    fleet_replica_ready_with(km->m->fleet, km->m, p->name, addr, 0, conn_fd);
    kube_shares_update(km);
}

void kube_pod_gone(struct kpod *p, const char *why)
{
    if (p->probing) {
        probe_stop(&p->probe);
        p->probing = false;
    }
    if (p->reported) {
        p->reported = false;
        fleet_replica_gone(p->km->m->fleet, p->km->m, p->name, why);
        kube_shares_update(p->km);
    }
}

/* ---- cold-start phases ------------------------------------------------------ */

/* Phases move forward, except that a pod being set up (container_start)
 * goes into its image pull and back: sandbox, pull, create, start. */
static bool phase_may_enter(enum cs_phase cur, enum cs_phase next)
{
    return next > cur || (next == CS_IMAGE_PULL && cur == CS_CONTAINER_START);
}

static void pod_phase(struct kpod *p, enum cs_phase ph, uint64_t at_ms)
{
    if (!p->phases.begun_ms || !phase_may_enter(p->phases.phase, ph)) {
        return;
    }
    cs_timeline_enter(&p->phases, ph, at_ms);
    kube_cold_refresh(p->km);
}

struct most_advanced {
    enum cs_phase phase;
    uint64_t since;
    bool any;
};

static void most_advanced_cb(void *ud, const char *key, void *value)
{
    struct most_advanced *ma = ud;
    const struct kpod *p = value;
    if (!p->phases.begun_ms || p->terminating || p->retired) {
        return;
    }
    if (!ma->any || p->phases.phase > ma->phase) {
        ma->phase = p->phases.phase;
        ma->since = p->phases.phase_since_ms;
        ma->any = true;
    }
}

void kube_cold_refresh(struct kmodel *km)
{
    struct most_advanced ma = {CS_SCALE, 0, false};
    strmap_each(&km->pods, most_advanced_cb, &ma);
    if (ma.any) {
        coldstart_phase(&km->m->cold, ma.phase, ma.since);
    }
}

/* A pod that is not ready while its model is cold is part of the cold
 * start: its phases are counted from the start (the scale write), and it
 * has been waiting for its node since it was first seen. */
static void pod_track(struct kpod *p, uint64_t now)
{
    const struct coldstart *c = &p->km->m->cold;
    if (p->phases.begun_ms || p->reported || !c->started_ms) {
        return;
    }
    cs_timeline_begin(&p->phases, CS_SCALE, c->started_ms);
    cs_timeline_enter(&p->phases, CS_SCHEDULE, now);
    kube_cold_refresh(p->km);
}

/* A cold start began with pods already there (the Deployment was scaled up
 * by another activator, or its pods wait for a node): their phases go on
 * from what thaw knows of them. */
static void track_existing_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    uint64_t now = *(const uint64_t *)ud;
    p->phases.begun_ms = 0; /* what it has is an earlier cold start's, cancelled */
    if (p->terminating || p->retired || p->reported) {
        return;
    }
    pod_track(p, now);
    if (p->unschedulable) {
        pod_phase(p, CS_CAPACITY, now);
    }
    if (p->node[0]) {
        pod_phase(p, CS_CONTAINER_START, now);
    }
    if (strcmp(p->phase, "Running") == 0) {
        pod_phase(p, CS_LOAD, now);
    }
    if (p->probing && p->probe.listening_ms) {
        pod_phase(p, CS_HEALTH, now);
    }
}

void kube_cold_begin(struct kmodel *km, uint64_t now)
{
    if (km->m->n_endpoints > 0 || km->m->cold.started_ms) {
        return;
    }
    coldstart_begin(&km->m->cold, CS_SCALE, now);
    strmap_each(&km->pods, track_existing_pod, &now);
}

/* The pod's state as the Pods watch shows it. */
void kube_pod_observe_phase(struct kpod *p, const struct k8s_pod_info *pi, uint64_t now)
{
    pod_track(p, now);
    if (pi->unschedulable) {
        pod_phase(p, CS_CAPACITY, now);
    }
    /* Bound to a node: the kubelet sets it up. The Pulling Event may have
     * come first (another watch): then only Pulled ends the pull. */
    if (pi->node_name[0] && p->phases.phase < CS_IMAGE_PULL) {
        pod_phase(p, CS_CONTAINER_START, now);
    }
    if (pi->container_started || pi->running) {
        pod_phase(p, CS_LOAD, now);
    }
}

static void on_pod_listening(struct probe *pr, void *ud)
{
    struct kpod *p = ud;
    pod_phase(p, CS_HEALTH, pr->listening_ms);
    if (p->slice_ready) {
        kube_pod_ready(p, "endpointslice"); /* held back until it listened */
    }
}

bool kube_pod_slice_ready_trusted(const struct kpod *p)
{
    return p->km->spec.readiness_probe || !p->km->kb->cfg->kubernetes.probe_pods ||
           p->probe_ok || p->probe.listening_ms;
}

/* The pod is ready: its phases are observed, and when it ends its model's
 * cold start, an Event on the Deployment names the slowest phase (tell:
 * this activator records it). */
static void pod_cold_start_done(struct kpod *p, uint64_t now, bool tell)
{
    struct kmodel *km = p->km;
    struct model *m = km->m;
    uint64_t total = m->cold.started_ms && now > m->cold.started_ms ? now - m->cold.started_ms : 0;
    const struct cs_timeline *t = p->phases.begun_ms ? &p->phases : NULL;
    bool ended = coldstart_replica_ready(&m->cold, t, now, m->stats.cold_phase);
    if (ended && t) {
        enum cs_phase slow = cs_timeline_slowest(t, now);
        char phases[400], msg[600];
        cs_timeline_summary(t, now, phases, sizeof phases);
        snprintf(msg, sizeof msg, "cold start took %.1fs; slowest phase: %s (%.1fs); %s",
                 (double)total / 1000.0, cs_phase_name(slow),
                 (double)cs_timeline_phase_ms(t, slow, now) / 1000.0, phases);
        LOGI("cold start completed", "model=%s pod=%s total_ms=%llu slowest=%s phases=\"%s\"",
             m->name, p->name, (unsigned long long)total, cs_phase_name(slow), phases);
        if (tell) {
            kube_post_event(km, "Normal", "ColdStartCompleted", msg);
        }
    }
    p->phases.begun_ms = 0;
}

/* A Pulling or Pulled Event of one of the pods in a cold start. */
struct pull_seen {
    const char *ns, *pod, *reason, *message;
    uint64_t now;
};

static void pull_event_model(void *ud, const char *key, void *value)
{
    struct pull_seen *ps = ud;
    struct kmodel *km = value;
    if (strcmp(km->spec.namespace_, ps->ns) != 0) {
        return;
    }
    struct kpod *p = strmap_get(&km->pods, ps->pod, strlen(ps->pod));
    if (!p || !p->phases.begun_ms) {
        return;
    }
    if (strcmp(ps->reason, "Pulling") == 0) {
        pod_phase(p, CS_IMAGE_PULL, ps->now);
        return;
    }
    if (p->phases.phase == CS_IMAGE_PULL) {
        pod_phase(p, CS_CONTAINER_START, ps->now);
    }
    /* The kubelet's own figure is the pull's length: the Events and the
     * pod's updates come on different watches, so what thaw saw of the
     * pull may hold some of starting the container, or none of the pull. */
    uint64_t ms;
    if (k8s_pulled_duration_ms(ps->message, &ms) == 0) {
        uint64_t seen = cs_timeline_phase_ms(&p->phases, CS_IMAGE_PULL, ps->now);
        if (seen > ms) {
            cs_timeline_move(&p->phases, CS_IMAGE_PULL, CS_CONTAINER_START, seen - ms, ps->now);
        } else {
            cs_timeline_move(&p->phases, CS_CONTAINER_START, CS_IMAGE_PULL, ms - seen, ps->now);
        }
    }
}

static void pull_event_upsert(void *ud, const cJSON *obj)
{
    struct kube_backend *kb = ud;
    struct pull_seen ps = {k8s_get_string(obj, "involvedObject.namespace"),
                           k8s_get_string(obj, "involvedObject.name"),
                           k8s_get_string(obj, "reason"), k8s_get_string(obj, "message"),
                           clock_now_ms()};
    if (!ps.ns || !ps.pod || !ps.reason) {
        return;
    }
    strmap_each(&kb->models, pull_event_model, &ps);
}

static void pull_event_remove(void *ud, const cJSON *obj)
{
    /* Events expire (an hour by default): nothing to undo. */
}

/* ---- this activator's share of the slots ------------------------------------ */

bool kube_pod_in_deal(const struct kpod *p, int64_t wall_now)
{
    /* Only pod objects place a pod: one known from its Service's slice
     * alone is not seen alike by every activator. */
    if (!p->selected || !p->created_ms) {
        return false;
    }
    uint64_t age = wall_now > p->created_ms ? (uint64_t)(wall_now - p->created_ms) : 0;
    return k8s_pod_in_deal(p->terminating, p->unschedulable, p->pod_ready, age,
                           p->km->spec.startup_timeout_ms);
}

struct deal_pass {
    struct kpod **order;
    size_t n, cap;
    int64_t wall_now;
    uint32_t outside; /* what a pod outside the deal gets */
};

static void collect_dealt(void *ud, const char *key, void *value)
{
    struct deal_pass *d = ud;
    struct kpod *p = value;
    p->dealt = d->outside;
    if (d->n < d->cap && kube_pod_in_deal(p, d->wall_now)) {
        d->order[d->n++] = p;
    }
}

static int by_creation(const void *a, const void *b)
{
    const struct kpod *x = *(struct kpod *const *)a, *y = *(struct kpod *const *)b;
    int c = strcmp(x->created, y->created);
    return c ? c : strcmp(x->name, y->name);
}

static void settle_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    p->share = k8s_share_settle(&p->hold, p->dealt, *(uint64_t *)ud, SHARE_SETTLE_MS);
}

/* Deals every pod in the deal its slots (p->dealt), in the same order on
 * every activator: oldest first, then by name. A scale-up's new pods come
 * last and a scale-down takes the newest, so the pods already serving keep
 * their shares. Returns -1 when out of memory. */
static int deal_pods(struct kmodel *km, bool placed, unsigned rank, unsigned n)
{
    /* Alone, this activator may use every pod whole. */
    uint32_t alone = placed && n <= 1 ? UINT32_MAX : 0;
    struct deal_pass d = {NULL, 0, km->pods.count, (int64_t)clock_wall_ms(), alone};
    d.order = d.cap ? malloc(d.cap * sizeof *d.order) : NULL;
    if (d.cap && !d.order) {
        return -1;
    }
    strmap_each(&km->pods, collect_dealt, &d);
    if (d.n > 1) {
        qsort(d.order, d.n, sizeof *d.order, by_creation);
    }
    for (size_t i = 0; i < d.n; i++) {
        d.order[i]->dealt = !placed  ? 0
                            : n <= 1 ? UINT32_MAX
                                     : k8s_activator_share(km->m->set.max_concurrency, n, rank, i);
    }
    free(d.order);
    return 0;
}

void kube_shares_update(struct kmodel *km)
{
    struct model *m = km->m;
    struct kube_backend *kb = km->kb;
    unsigned rank = 0, n = 1;
    /* Before the activators are known, or while this one is not among
     * them, it takes nothing: the others may be using every slot. */
    bool placed = !kb->have_peers || k8s_peers_place(&kb->peers, &rank, &n);
    if (deal_pods(km, placed, rank, n)) {
        return;
    }
    uint64_t now = clock_now_ms();
    strmap_each(&km->pods, settle_pod, &now);
    bool grew = false;
    for (size_t i = 0; i < m->n_endpoints; i++) {
        struct endpoint *ep = m->endpoints[i];
        const struct kpod *p = strmap_get(&km->pods, ep->id, strlen(ep->id));
        uint32_t share = !kb->have_peers ? UINT32_MAX : p ? p->share : 0;
        grew = grew || share > ep->share;
        ep->share = share;
    }
    if (grew && m->fleet->on_capacity) {
        m->fleet->on_capacity(m->fleet->cb_ud, m);
    }
}

static void shares_update_cb(void *ud, const char *key, void *value)
{
    kube_shares_update(value);
}

void kube_peers_changed(void *kb)
{
    struct kube_backend *b = kb;
    unsigned rank = 0, n = 1;
    if (k8s_peers_place(&b->peers, &rank, &n)) {
        LOGI("activators changed: the models' slots are split anew", "activators=%u rank=%u", n,
             rank);
    } else if (b->peers.slices.synced) {
        LOGW("this activator is not among its Service's endpoints: it holds its requests and "
             "takes no share of the pods' slots until it is",
             "activators=%u self=%s", n, b->peers.self_ip);
    }
    strmap_each(&b->models, shares_update_cb, NULL);
}

static void on_pod_probe(struct probe *pr, void *ud)
{
    struct kpod *p = ud;
    p->probing = false;
    p->probe_ok = true;
    /* The probe's connection carries the first request. */
    kube_pod_ready_conn(p, "probe", probe_take_conn(pr));
}

void kube_pod_probe(struct kpod *p)
{
    struct kmodel *km = p->km;
    struct kube_backend *kb = km->kb;
    if (!kb->cfg->kubernetes.probe_pods || !p->ip[0] || p->reported || p->probing ||
        p->sleep != KS_AWAKE) {
        return;
    }
    char addr[96];
    kube_pod_addr(p, addr, sizeof addr);
    if (probe_init(&p->probe, kb->evbase, addr, km->spec.health_path, on_pod_probe, p) == 0) {
        p->probe.listening = on_pod_listening;
        p->probe.replica = p->name;
        p->probing = true;
        probe_start(&p->probe, expected_ready_ms(km));
    }
}

const struct k8s_informer_ops kube_pull_event_ops = {pull_event_upsert, pull_event_remove, NULL};

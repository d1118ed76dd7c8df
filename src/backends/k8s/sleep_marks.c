/* Kubernetes backend, sleep mode with several activators: the marks on a
 * pod (K8S_SLEEP_STATE_ANNOTATION, K8S_WAKE_REQUEST_ANNOTATION) and what an
 * activator holds while sleep keeps a pod out of its routing. Writing a mark
 * (the leader's: one PATCH at a time per pod, the newest wish last, backing
 * off after failures), reading one (every activator's pod watch), a
 * follower's state taken from the mark, a new leader's adoption of the mark
 * it finds, a follower's wake request, and the endpoints held until the
 * requests on them end. The decisions that use them are sleep.c's. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/endpoint.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes p out of routing for sleep. Requests still running on it no longer
 * hold the model's slots but stay its load (inflight_leaving, model.c): its
 * endpoint is held to see them end. */
void kube_pod_unroute(struct kpod *p)
{
    struct model *m = p->km->m;
    for (size_t i = 0; i < m->n_endpoints && p->reported; i++) {
        struct endpoint *ep = m->endpoints[i];
        if (strcmp(ep->id, p->name) != 0) {
            continue;
        }
        if (p->n_held == KPOD_HELD_MAX) {
            endpoint_unref(p->held[0]); /* the oldest: a pod routed and unrouted 8 times over */
            memmove(p->held, p->held + 1, (KPOD_HELD_MAX - 1) * sizeof p->held[0]);
            p->n_held--;
        }
        endpoint_ref(ep);
        p->held[p->n_held++] = ep;
        break;
    }
    kube_pod_gone(p, "asleep");
}

/* Lets go of the held endpoints nothing runs on any more (all: the pod is
 * gone). Whether requests still run on the others. */
bool kube_pod_still_serving(struct kpod *p, bool all)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < p->n_held; i++) {
        if (all || p->held[i]->inflight == 0) {
            endpoint_unref(p->held[i]);
        } else {
            p->held[kept++] = p->held[i];
        }
    }
    p->n_held = kept;
    return kept > 0;
}

static void add_held(void *ud, const char *key, void *value)
{
    const struct kpod *p = value;
    for (unsigned i = 0; i < p->n_held; i++) {
        *(uint64_t *)ud += p->held[i]->inflight;
    }
}

uint64_t kube_sleep_held_inflight(const struct kmodel *km)
{
    uint64_t n = 0;
    strmap_each((struct strmap *)&km->pods, add_held, &n);
    return n;
}

bool kube_model_idle(const struct kmodel *km)
{
    struct kube_backend *kb = km->kb;
    if (km->m->inflight || km->m->queue.count || kube_sleep_held_inflight(km)) {
        return false;
    }
    return !(kb->have_peers && kb->leading) || k8s_peers_demand(&kb->peers, km->key) == 0;
}

bool kube_pod_sleepable(const struct kpod *p)
{
    return p->km->spec.sleep_level && p->reported && p->sleep == KS_AWAKE && !p->terminating &&
           kube_model_idle(p->km) && clock_now_ms() >= p->no_sleep_until_ms;
}

#define MARK_RETRY_MAX_MS 30000

void kube_pod_key(const struct kpod *p, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", p->km->spec.namespace_, p->name);
}

/* A merge patch of p's metadata.annotations (body: the whole patch). */
static struct k8s_call *patch_pod(struct kpod *p, const char *body, k8s_done_cb done)
{
    struct kmodel *km = p->km;
    char path[700];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", km->spec.namespace_, p->name);
    return k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json", body,
                       strlen(body), 15000, done, p);
}

static void on_marked(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct kpod *p = ud;
    enum kpod_mark sent = p->mark_sent;
    uint64_t now = clock_now_ms();
    p->mark_call = NULL;
    if (status < 200 || status > 299) {
        /* Written again by the tick, backing off. */
        unsigned n = ++p->mark_failures;
        if (sent == MARK_FALLING) {
            p->falling_refused++;
        }
        uint64_t wait = n < 6 ? 500ull << n : MARK_RETRY_MAX_MS; /* 1, 2, 4... 30 s */
        p->mark_retry_ms = now + (wait < MARK_RETRY_MAX_MS ? wait : MARK_RETRY_MAX_MS);
        if ((n & (n - 1)) == 0) {
            LOGW("writing a pod's sleep mark failed (RBAC: patch on pods?)",
                 "model=%s pod=%s status=%ld failures=%u error=%s", p->km->m->name, p->name,
                 status, n, LOG_Q(err ? err : ""));
        }
        return;
    }
    p->mark_failures = 0;
    p->falling_refused = 0;
    p->mark_done = sent;
    p->mark_done_ms = now;
    if (sent == MARK_FALLING && p->mark_want == MARK_FALLING && p->sleep == KS_DOZING) {
        p->marked_ms = now; /* the others' polls from now on tell */
    }
    if (p->mark_want != p->mark_done) {
        kube_pod_mark_send(p);
    }
}

/* One PATCH at a time per pod, the newest wish last, so that two never land
 * out of order; only from the activator that decides. */
void kube_pod_mark_send(struct kpod *p)
{
    struct kmodel *km = p->km;
    if (p->mark_call || !kube_sleep_deciding(km) || p->mark_want == MARK_NONE ||
        p->mark_want == p->mark_done || clock_now_ms() < p->mark_retry_ms) {
        return;
    }
    const char *v = p->mark_want == MARK_FALLING ? "\"falling-asleep\""
                    : p->mark_want == MARK_ASLEEP ? "\"asleep\""
                                                  : "null";
    char body[256];
    /* A mark written or removed answers any wake request made before it. */
    snprintf(body, sizeof body, "{\"metadata\":{\"annotations\":{\"%s\":%s,\"%s\":null}}}",
             K8S_SLEEP_STATE_ANNOTATION, v, K8S_WAKE_REQUEST_ANNOTATION);
    p->mark_sent = p->mark_want;
    p->mark_call = patch_pod(p, body, on_marked);
}

void kube_pod_mark(struct kpod *p, enum kpod_mark want)
{
    if (!kube_sleep_shared(p->km) || !kube_sleep_deciding(p->km)) {
        return;
    }
    p->mark_want = want;
    kube_pod_mark_send(p);
}

/* What the pod object says matches what the leader wrote (a clear: no mark). */
static bool mark_agrees(enum kpod_mark want, enum kpod_mark seen)
{
    return want == seen || (want == MARK_CLEAR && seen == MARK_NONE);
}

/* Not deciding: the pod's state is the mark's. A control request this one
 * still has out (it lost the lease meanwhile) follows it when it ends. */
void kube_pod_follow_mark(struct kpod *p)
{
    if (p->sleep == KS_FAILED || p->terminating || (p->ctl_init && control_running(&p->ctl))) {
        return;
    }
    if (p->mark_seen != MARK_NONE) {
        if (p->sleep == KS_AWAKE) {
            kube_pod_unroute(p);
        }
        p->sleep = p->mark_seen == MARK_ASLEEP ? KS_ASLEEP : KS_DOZING;
    } else if (p->sleep != KS_AWAKE) {
        p->sleep = KS_AWAKE;
        p->sleep_maybe_sent = false; /* the leader removes the mark once it is awake */
        p->wake_request_ms = 0;
        (void)kube_pod_still_serving(p, false);
        kube_pod_ready(p, "woken");
    }
}

/* The leader with no wish of its own for p yet (it just took the lease, or
 * started): the mark it finds is its own. A pod falling asleep is let go of
 * again before its /sleep (sent or not: it is sent again), and demand
 * meanwhile wakes it (the /sleep may have reached it); an asleep one wakes
 * on demand (a wake of an awake server is harmless). */
void kube_pod_adopt_mark(struct kpod *p)
{
    if (p->mark_want != MARK_NONE || p->mark_seen == MARK_NONE || p->sleep == KS_FAILED ||
        p->terminating || (p->ctl_init && control_running(&p->ctl))) {
        return;
    }
    if (p->sleep == KS_AWAKE) {
        kube_pod_unroute(p);
    }
    p->mark_want = p->mark_done = p->mark_seen;
    p->sleep_sent = false;
    if (p->mark_seen == MARK_FALLING) {
        p->sleep = KS_DOZING;
        p->sleep_maybe_sent = true; /* by whoever wrote the mark */
        p->marked_ms = clock_now_ms();
    } else {
        p->sleep = KS_ASLEEP;
        p->marked_ms = 0;
    }
}

static void on_wake_requested(void *ud, long status, const char *body, size_t len,
                              const char *err)
{
    struct kpod *p = ud;
    p->wake_call = NULL;
    if (status < 200 || status > 299) {
        p->wake_request_ms = 0; /* asked again at the next tick */
        LOGW("asking the leader to wake a pod failed", "model=%s pod=%s status=%ld",
             p->km->m->name, p->name, status);
    }
}

#define WAKE_REQUEST_AGAIN_MS 2000

/* A follower with requests and only asleep pods: asks the leader to wake
 * p, at most once per WAKE_REQUEST_AGAIN_MS. */
void kube_pod_request_wake(struct kpod *p)
{
    struct kmodel *km = p->km;
    uint64_t now = clock_now_ms();
    if (p->wake_call || (p->wake_request_ms && now - p->wake_request_ms < WAKE_REQUEST_AGAIN_MS)) {
        return;
    }
    char body[400];
    snprintf(body, sizeof body, "{\"metadata\":{\"annotations\":{\"%s\":\"%s\"}}}",
             K8S_WAKE_REQUEST_ANNOTATION, km->kb->identity);
    p->wake_request_ms = now;
    p->wake_call = patch_pod(p, body, on_wake_requested);
    LOGI("asking the leader to wake a pod", "model=%s pod=%s", km->m->name, p->name);
}

void kube_pod_marks_tend(struct kpod *p)
{
    uint64_t now = clock_now_ms();
    if (!p->mark_call && p->mark_want != MARK_NONE && p->mark_done == p->mark_want &&
        now - p->mark_done_ms > 1000 &&
        (!mark_agrees(p->mark_want, p->mark_seen) ||
         (p->wake_requested && p->sleep == KS_AWAKE))) {
        p->mark_done = MARK_NONE; /* the watch has had a second to show it: write it again */
    }
    if (p->wake_requested && p->sleep == KS_AWAKE && p->mark_want == MARK_NONE) {
        p->mark_want = MARK_CLEAR; /* a request that came after the pod woke */
    }
    kube_pod_mark_send(p);
}

bool kube_pod_read_marks(struct kpod *p, const struct k8s_pod_info *pi)
{
    bool asked = pi->wake_requested && !p->wake_requested;
    p->wake_requested = pi->wake_requested;
    p->mark_seen = !pi->sleep_state[0]                           ? MARK_NONE
                   : strcmp(pi->sleep_state, "asleep") == 0 ? MARK_ASLEEP
                                                                : MARK_FALLING;
    return asked;
}

void kube_pod_marks_dispose(struct kpod *p)
{
    k8s_call_cancel(p->mark_call);
    p->mark_call = NULL;
    k8s_call_cancel(p->wake_call);
    p->wake_call = NULL;
    (void)kube_pod_still_serving(p, true);
}

static void unrouted_pod(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->mark_seen != MARK_NONE && !p->reported && !kube_pod_still_serving(p, false)) {
        char pod_key[600];
        kube_pod_key(p, pod_key, sizeof pod_key);
        cJSON_AddItemToArray(ud, cJSON_CreateString(pod_key));
    }
}

static void unrouted_model(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, unrouted_pod, ud);
}

void kube_sleep_unrouted(struct kube_backend *kb, cJSON *out)
{
    strmap_each(&kb->models, unrouted_model, cJSON_AddArrayToObject(out, "unrouted"));
}

/* Kubernetes backend, sleep mode (thaw.dev/sleep-mode): the same states as
 * the process backend's, through the pod's IP. A ready pod of a model that
 * has had nothing in flight or held for idle-before-sleep leaves routing and
 * is sent POST /sleep?level=N; asleep it keeps running (the Deployment keeps
 * its count, the pod its node's resources) with its GPU memory free. Demand
 * wakes it (POST /wake_up) before anything scales up; the idle timeout
 * scales the Deployment down as before, taking the asleep pods with it.
 * Failures: a /sleep answered with an error leaves the pod serving (not
 * asked again when idle); one that is not answered sends it back through
 * thaw's probe; a /wake_up that fails deletes the pod, so its ReplicaSet
 * starts a new one and the held requests get a cold start.
 *
 * GPU memory per node: a node's is GPU feature discovery's
 * nvidia.com/gpu.memory label (MiB per GPU) times its GPUs; a pod's is its
 * model's thaw.dev/gpu-memory. The scheduler counts neither, so a pod of one
 * model can land where idle pods of others hold the memory: when the pods
 * holding memory on a node (awake, starting, or asked to wake) need more than
 * it has, idle sleep-mode pods there of the same or lower priority are put to
 * sleep, lowest priority first. A wake waits for that; with nothing there to
 * put to sleep, the pod is deleted for a cold start.
 *
 * Several activators: only the leader puts pods to sleep and wakes them,
 * and only when the model is idle at every activator (the peers' /demand).
 * It marks the pod "falling-asleep" (K8S_SLEEP_STATE_ANNOTATION) first;
 * every activator seeing the mark takes the pod out of its routing and
 * lists it in its /demand answer; the leader sends POST /sleep once every
 * fresh peer has answered a poll sent after the mark with the pod listed and
 * nothing of the model in flight or queued (k8s_peers_let_go), so no
 * request can be on the pod when it sleeps. "asleep" once answered; the mark
 * is removed once the pod is awake again, and every activator routes to it
 * again. A follower with requests and only asleep pods asks the leader to
 * wake one (K8S_WAKE_REQUEST_ANNOTATION), which the leader sees on its pod
 * watch at once. Demand before /sleep was sent calls the sleep off; once
 * it may have been sent (by this leader, or under a falling-asleep mark a
 * leader before wrote), calling it off wakes the pod before it is routed
 * again. A leader that finds a mark it did not write (it just took the
 * lease, or restarted) takes it as its own: a wake of an awake server is
 * harmless. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/endpoint.h"
#include "thaw/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kube_pod_sleep_name(enum kpod_sleep s)
{
    switch (s) {
    case KS_AWAKE: return "awake";
    case KS_DOZING: return "falling_asleep";
    case KS_ASLEEP: return "sleeping";
    case KS_WAKING: return "waking";
    case KS_FAILED: return "wake_failed";
    case KS_CHECKING: return "checking";
    }
    return "unknown";
}

void kube_pod_sleep_dispose(struct kpod *p)
{
    if (p->ctl_init) {
        control_cancel(&p->ctl);
    }
    k8s_call_cancel(p->delete_call);
    p->delete_call = NULL;
    kube_pod_marks_dispose(p);
}

static int send_control_as(struct kpod *p, const char *method, const char *path,
                           uint64_t timeout_ms, control_done_cb done)
{
    struct kmodel *km = p->km;
    if (!p->ctl_init) {
        control_init(&p->ctl, km->kb->evbase);
        p->ctl_init = true;
    }
    char addr[96];
    kube_pod_addr(p, addr, sizeof addr);
    return control_send(&p->ctl, addr, method, path, timeout_ms, done, p);
}

static int send_control(struct kpod *p, const char *path, control_done_cb done)
{
    return send_control_as(p, "POST", path, p->km->spec.sleep_timeout_ms, done);
}

static void wake_wanted(struct kmodel *km);
static void pod_wake(struct kpod *p);

/* A falling-asleep mark refused this many times in a row calls the sleep
 * off, and the pod is not put to sleep again for MARK_GIVE_UP_MS. */
#define MARK_FAILURES_GIVE_UP 3
#define MARK_GIVE_UP_MS 600000

static void on_slept(struct control *c, int status, void *ud)
{
    struct kpod *p = ud;
    struct kmodel *km = p->km;
    p->sleep_sent = false;
    p->marked_ms = 0;
    bool slept = status >= 200 && status <= 299;
    if (!kube_sleep_deciding(km)) {
        /* It lost the lease meanwhile: the new leader's mark says. */
        if (slept) {
            km->m->stats.sleeps++;
        }
        kube_pod_follow_mark(p);
        return;
    }
    if (!slept && status <= 0) {
        /* No answer: taken as asleep (it may have gone to sleep late), so
         * nothing is routed to a sleeping server that answers requests with
         * errors; demand wakes it, which is harmless if it is awake, and a
         * pod that does not answer /wake_up either is replaced. */
        LOGW("pod did not answer /sleep: taken as asleep", "model=%s pod=%s error=%d",
             km->m->name, p->name, status);
        slept = true;
    }
    if (slept) {
        p->sleep = KS_ASLEEP;
        kube_pod_mark(p, MARK_ASLEEP);
        km->m->stats.sleeps++;
        LOGI("pod asleep", "model=%s pod=%s", km->m->name, p->name);
        wake_wanted(km); /* a request may have come meanwhile */
        return;
    }
    km->m->stats.sleep_failures++;
    p->sleep = KS_AWAKE;
    p->sleep_maybe_sent = false;
    p->no_idle_sleep = true;
    kube_pod_mark(p, MARK_CLEAR);
    /* It answered with an error: it is serving and stays in routing. */
    LOGW("pod refused to sleep: it stays awake", "model=%s pod=%s status=%d", km->m->name,
         p->name, status);
    (void)kube_pod_still_serving(p, false);
    kube_pod_ready(p, "sleep refused");
}

/* Sends POST /sleep to a pod out of routing. */
static void send_sleep(struct kpod *p)
{
    struct kmodel *km = p->km;
    char path[32];
    snprintf(path, sizeof path, "/sleep?level=%u", (unsigned)km->spec.sleep_level);
    if (send_control(p, path, on_slept) == 0) {
        p->sleep_sent = true;
        p->sleep_maybe_sent = true;
        LOGI("every activator let go of the pod: sending /sleep", "model=%s pod=%s level=%u",
             km->m->name, p->name, (unsigned)km->spec.sleep_level);
    }
}

/* Demand came while the others were letting go of p: it serves again. One
 * whose /sleep may have been sent (by this activator, or by a leader before
 * it that died or stalled before marking it asleep) may be asleep: it is
 * woken first (waking an awake server is harmless), and its mark stays
 * until it answers, so no activator routes to it before. */
static void sleep_called_off(struct kpod *p)
{
    p->marked_ms = 0;
    if (p->sleep_maybe_sent) {
        LOGI("sleep called off: waking the pod first, its /sleep may have been sent",
             "model=%s pod=%s", p->km->m->name, p->name);
        p->sleep = KS_ASLEEP;
        pod_wake(p);
        return;
    }
    p->sleep = KS_AWAKE;
    if (p->mark_done == MARK_NONE && !p->mark_call) {
        p->mark_want = MARK_NONE; /* no mark ever landed: none to remove */
    } else {
        kube_pod_mark(p, MARK_CLEAR);
    }
    LOGI("sleep called off: requests came", "model=%s pod=%s", p->km->m->name, p->name);
    (void)kube_pod_still_serving(p, false);
    kube_pod_ready(p, "sleep called off");
}

/* Takes a ready pod out of routing and asks it to sleep (with several
 * activators: marks it, and the tick sends /sleep once they let go). */
static void pod_sleep(struct kpod *p, const char *why)
{
    struct kmodel *km = p->km;
    if (kube_sleep_shared(km)) {
        kube_pod_unroute(p);
        p->sleep = KS_DOZING;
        p->sleep_sent = false;
        p->sleep_maybe_sent = false; /* routed until now: awake */
        p->marked_ms = 0;
        kube_pod_mark(p, MARK_FALLING);
        LOGI("putting pod to sleep once every activator lets go of it",
             "model=%s pod=%s level=%u reason=\"%s\"", km->m->name, p->name,
             (unsigned)km->spec.sleep_level, why);
        return;
    }
    char path[32];
    snprintf(path, sizeof path, "/sleep?level=%u", (unsigned)km->spec.sleep_level);
    if (send_control(p, path, on_slept)) {
        return;
    }
    kube_pod_unroute(p);
    p->sleep = KS_DOZING;
    LOGI("putting pod to sleep", "model=%s pod=%s level=%u reason=\"%s\"", km->m->name, p->name,
         (unsigned)km->spec.sleep_level, why);
}

static void on_deleted(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct kpod *p = ud;
    p->delete_call = NULL;
    if (status < 200 || status > 299) {
        LOGW("deleting a pod that did not wake failed", "model=%s pod=%s status=%ld",
             p->km->m->name, p->name, status);
    }
}

/* /wake_up failed: the pod goes, its ReplicaSet replaces it (a cold start)
 * and the held requests wait for that. */
static void wake_failed(struct kpod *p, int status)
{
    struct kmodel *km = p->km;
    km->m->stats.wake_failures++;
    p->sleep = KS_FAILED;
    /* status: the server's HTTP answer, or a negative errno (no answer, no
     * memory on its node) said in words */
    char how[96];
    if (status > 0) {
        snprintf(how, sizeof how, "HTTP %d", status);
    } else {
        snprintf(how, sizeof how, "%s", status == -ENOSPC ? "no GPU memory on its node"
                                        : status == -ETIMEDOUT ? "no answer in sleep-timeout"
                                                               : strerror(-status));
    }
    LOGW("pod did not wake: deleting it for a cold start", "model=%s pod=%s why=%s",
         km->m->name, p->name, LOG_Q(how));
    char path[700];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods/%s", km->spec.namespace_, p->name);
    p->delete_call = k8s_request(km->kb->client, "DELETE", path, NULL, NULL, 0, 15000,
                                 on_deleted, p);
    char msg[400];
    snprintf(msg, sizeof msg, "pod %s did not wake from sleep (%s); deleted for a cold start",
             p->name, how);
    kube_post_event(km, "Warning", "WakeFailed", msg);
    km->woken_ms = clock_now_ms(); /* the cold start as clients see it starts now */
}

static void on_woken(struct control *c, int status, void *ud)
{
    struct kpod *p = ud;
    struct kmodel *km = p->km;
    if (status < 200 || status > 299) {
        wake_failed(p, status);
        return;
    }
    uint64_t now = clock_now_ms();
    /* Awake; one that lost the lease meanwhile follows the marks below, from
     * "waking" so that no mark left routes it again. */
    p->sleep = kube_sleep_deciding(km) ? KS_AWAKE : KS_WAKING;
    p->sleep_maybe_sent = false;
    kube_pod_mark(p, MARK_CLEAR);
    km->m->stats.wakes++;
    km->last_wake_ms = now - p->wake_asked_ms;
    histogram_observe(&km->m->stats.wake, (double)km->last_wake_ms / 1000.0);
    LOGI("pod awake", "model=%s pod=%s wake_ms=%llu", km->m->name, p->name,
         (unsigned long long)km->last_wake_ms);
    p->wake_asked_ms = 0;
    if (!kube_sleep_deciding(km)) {
        kube_pod_follow_mark(p); /* it lost the lease meanwhile */
        return;
    }
    (void)kube_pod_still_serving(p, false);
    kube_pod_ready(p, "woken");
}

/* ---- GPU memory per node ---- */

/* The node's GPU memory that replicas share (time-sliced or MPS GPUs): its
 * per-GPU memory (label or config) times its shared GPUs; 0: unknown. */
static uint64_t node_shared_memory(const struct kube_backend *kb, const struct k8s_node_info *ni)
{
    const char *source;
    uint64_t per_gpu = kube_gpu_memory(kb, ni, &source);
    uint64_t gpus = kube_shared_gpus(ni);
    return per_gpu && gpus ? per_gpu * gpus : 0;
}

struct node_memory {
    const char *node;
    uint64_t held, coming; /* coming: held by pods falling asleep */
    bool need;             /* a pod there wants memory it is not yet using */
    enum tier need_tier;   /* the highest priority among them */
    unsigned put_to_sleep;
    uint64_t cap;          /* the node's shared GPU memory; 0: unknown */
};

static void tally_pod(void *ud, const char *key, void *value)
{
    struct node_memory *nm = ud;
    const struct kpod *p = value;
    const struct kmodel *km = p->km;
    if (strcmp(p->node, nm->node) != 0) {
        return;
    }
    if (kube_pod_on_way_out(p)) {
        /* on its way out: a wake waits for it, nothing is slept for it */
        nm->held += kube_replica_memory(km);
        nm->coming += kube_replica_memory(km);
        return;
    }
    if (!kube_pod_holds_memory(p)) {
        return;
    }
    nm->held += kube_replica_memory(km);
    if (p->sleep == KS_DOZING) {
        nm->coming += kube_replica_memory(km);
    }
    bool wants = (p->sleep == KS_AWAKE && !p->reported) || p->sleep == KS_ASLEEP ||
                 p->sleep == KS_WAKING || !kube_model_idle(km);
    if (wants && (!nm->need || km->m->set.priority < nm->need_tier)) {
        nm->need = true;
        nm->need_tier = km->m->set.priority;
    }
}

static void tally_model(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, tally_pod, ud);
}

static void node_tally(struct kube_backend *kb, struct node_memory *nm)
{
    const char *node = nm->node;
    memset(nm, 0, sizeof *nm);
    nm->node = node;
    strmap_each(&kb->models, tally_model, nm);
}

struct victims {
    struct node_memory *nm;
    const struct k8s_node_info *ni;
    int tier;
    bool fits;
};

/* What the pods there hold, less what is on its way, is within the node's
 * memory and packs into its GPUs one by one, as the plan admits. */
static bool node_fits(struct kube_backend *kb, const struct node_memory *nm,
                      const struct k8s_node_info *ni)
{
    return nm->held - nm->coming <= nm->cap && kube_node_awake_packs(kb, ni);
}

static void sleep_victim(void *ud, const char *key, void *value)
{
    struct victims *v = ud;
    struct kpod *p = value;
    struct kmodel *km = p->km;
    if (v->fits || strcmp(p->node, v->nm->node) != 0 || (int)km->m->set.priority != v->tier ||
        !kube_pod_sleepable(p)) {
        return;
    }
    char why[300];
    snprintf(why, sizeof why, "GPU memory needed on node %s", p->node);
    pod_sleep(p, why);
    if (p->sleep == KS_DOZING) {
        v->nm->coming += kube_replica_memory(km);
        v->nm->put_to_sleep++;
        v->fits = node_fits(km->kb, v->nm, v->ni);
    }
}

static void victims_in_model(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, sleep_victim, ud);
}

/* Puts idle pods on node to sleep, lowest priority first, until what the
 * pods there hold fits its GPU memory (node_fits): of the tier of the pods there that
 * want memory and below; of any tier when none wants it (the newcomer
 * loaded between two ticks, or the pods were awake together before thaw
 * started): an overcommitted GPU sheds all the same. The memory still held
 * after that (0 when it fits), with nm filled. */
static uint64_t make_room(struct kube_backend *kb, const char *node, struct node_memory *nm)
{
    nm->node = node;
    node_tally(kb, nm);
    const struct k8s_node_info *ni = strmap_get(&kb->nodes_gpu, node, strlen(node));
    uint64_t cap = ni ? node_shared_memory(kb, ni) : 0;
    nm->cap = cap;
    if (!cap || node_fits(kb, nm, ni)) {
        return 0;
    }
    struct victims v = {nm, ni, TIER_COUNT - 1, false};
    if (kb->leading || !kb->have_peers) {
        for (int upto = nm->need ? (int)nm->need_tier : 0; v.tier >= upto && !v.fits; v.tier--) {
            strmap_each(&kb->models, victims_in_model, &v);
        }
    }
    if (v.fits) {
        return 0;
    }
    /* over: the sum's excess, or a byte when only the packing fails */
    return nm->held - nm->coming > cap ? nm->held - nm->coming - cap : 1;
}

static void check_node(void *ud, const char *key, void *value)
{
    struct node_memory nm;
    make_room(ud, key, &nm);
}

void kube_sleep_for_memory(struct kube_backend *kb)
{
    strmap_each(&kb->nodes_gpu, check_node, kb);
}

/* ---- a pod found ready: asleep? ---- */

/* How long GET /is_sleeping may take; no answer by then: taken as awake. */
#define IS_SLEEPING_TIMEOUT_MS 2000

static void on_is_sleeping(struct control *c, int status, void *ud)
{
    struct kpod *p = ud;
    struct kmodel *km = p->km;
    if (p->sleep != KS_CHECKING) {
        return;
    }
    size_t len = 0;
    const char *body = control_body(c, &len);
    cJSON *j = status == 200 ? cJSON_ParseWithLength(body, len) : NULL;
    bool asleep = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "is_sleeping"));
    cJSON_Delete(j);
    if (status != 200) {
        LOGD("GET /is_sleeping not answered: pod taken as awake", "model=%s pod=%s status=%d",
             km->m->name, p->name, status);
    }
    if (p->mark_seen != MARK_NONE || !kube_sleep_deciding(km)) {
        /* A mark came meanwhile, or the lease went: the marks say. */
        p->sleep = asleep ? KS_ASLEEP : KS_AWAKE;
        if (kube_sleep_deciding(km)) {
            kube_pod_adopt_mark(p);
        } else {
            kube_pod_follow_mark(p);
        }
        kube_pod_ready(p, "is_sleeping"); /* if they leave it awake */
        return;
    }
    if (asleep) {
        p->sleep = KS_ASLEEP;
        kube_pod_mark(p, MARK_ASLEEP);
        LOGI("pod found asleep: routed once woken", "model=%s pod=%s", km->m->name, p->name);
        wake_wanted(km); /* requests may be waiting */
        return;
    }
    p->sleep = KS_AWAKE;
    kube_pod_ready(p, "is_sleeping");
}

/* vLLM answers /health while asleep, so a pod found ready may be asleep: an
 * activator before this one (restarted, or rolled out) may have put it to
 * sleep, even before the kubelet first took it for Ready. Only a pod this
 * activator saw before its container ran is known awake; of the others the
 * server is asked. With several activators the leader's mark says, and only
 * the leader (or an activator alone) asks. */
bool kube_pod_check_sleep(struct kpod *p)
{
    struct kmodel *km = p->km;
    if (p->sleep_known || !km->spec.sleep_level) {
        return false;
    }
    p->sleep_known = true;
    if (p->mark_seen != MARK_NONE || !kube_sleep_deciding(km) ||
        send_control_as(p, "GET", "/is_sleeping", IS_SLEEPING_TIMEOUT_MS, on_is_sleeping)) {
        return false;
    }
    p->sleep = KS_CHECKING;
    LOGI("pod found ready: asking whether it is asleep", "model=%s pod=%s", km->m->name,
         p->name);
    return true;
}

/* ---- waking ---- */

/* Wakes p once its node has the memory for it: idle pods there are put to
 * sleep first (it waits for them; the tick asks again); with none to put to
 * sleep, p is deleted for a cold start, which may land where there is room. */
static void pod_wake(struct kpod *p)
{
    struct kmodel *km = p->km;
    if (!p->wake_asked_ms) {
        p->wake_asked_ms = clock_now_ms();
    }
    struct node_memory nm;
    uint64_t over = p->node[0] ? make_room(km->kb, p->node, &nm) : 0;
    if (over > 0 && !nm.coming) {
        LOGW("no GPU memory on its node to wake into", "model=%s pod=%s node=%s", km->m->name,
             p->name, p->node);
        wake_failed(p, -ENOSPC);
        return;
    }
    if (over > 0 || (p->node[0] && nm.coming && nm.cap && nm.held > nm.cap)) {
        return; /* memory on its way: woken once the pods falling asleep free it */
    }
    int rc = send_control(p, "/wake_up", on_woken);
    if (rc == -EBUSY) {
        /* Its /sleep is still being answered (this activator sent it, lost
         * the lease and got it back meanwhile): that answer marks the pod
         * asleep, and the demand wakes it then. Not a failed wake. */
        LOGI("wake waits for the pod's /sleep to be answered", "model=%s pod=%s",
             km->m->name, p->name);
        return;
    }
    if (rc) {
        wake_failed(p, rc);
        return;
    }
    p->sleep = KS_WAKING;
    LOGI("waking pod", "model=%s pod=%s", km->m->name, p->name);
}

struct sleep_count {
    unsigned asleep, waking, dozing;
    unsigned to_wake; /* wake_some: how many more */
};

static void count_pod(void *ud, const char *key, void *value)
{
    struct sleep_count *c = ud;
    struct kpod *p = value;
    if (p->terminating || p->retired) {
        return;
    }
    if (p->sleep == KS_ASLEEP) {
        c->asleep++;
    } else if (p->sleep == KS_WAKING || p->sleep == KS_CHECKING) {
        c->waking++;
    } else if (p->sleep == KS_DOZING) {
        c->dozing++;
    }
}

unsigned kube_pods_asleep(const struct kmodel *km, unsigned *waking, unsigned *dozing)
{
    struct sleep_count c = {0};
    strmap_each((struct strmap *)&km->pods, count_pod, &c);
    *waking = c.waking;
    *dozing = c.dozing;
    return c.asleep;
}

/* With several activators a pod's slots are dealt among them (pods.c): an
 * awake pod may have none for this one, and of the asleep pods those dealt
 * to this one are the ones its requests can use. */
static void slot_on(void *ud, const char *key, void *value)
{
    const struct kpod *p = value;
    if (p->reported && p->share > 0) {
        *(bool *)ud = true;
    }
}

/* Whether a ready pod of km has slots for this activator. */
static bool slot_here(const struct kmodel *km)
{
    bool any = false;
    strmap_each((struct strmap *)&km->pods, slot_on, &any);
    return any;
}

struct waking {
    bool mine, any, dealt; /* a pod dealt here waking; any pod waking; any pod dealt here */
};

static void waking_on(void *ud, const char *key, void *value)
{
    struct waking *w = ud;
    const struct kpod *p = value;
    if (p->terminating) {
        return;
    }
    bool waking = p->sleep == KS_WAKING || p->sleep == KS_CHECKING;
    w->mine = w->mine || (waking && p->dealt > 0);
    w->any = w->any || waking;
    w->dealt = w->dealt || p->dealt > 0;
}

/* Whether a pod this activator's requests can use is on its way to
 * serving: one dealt to it; with none dealt to it (not yet placed among
 * the activators), any, so that one wake at a time goes out, not one per
 * request. */
static bool waking_here(const struct kmodel *km)
{
    struct waking w = {false, false, false};
    strmap_each((struct strmap *)&km->pods, waking_on, &w);
    return w.dealt ? w.mine : w.any;
}

/* Picks asleep pods for a wake, or a wake request: first those dealt to
 * this activator (mine), then the others. */
struct pick {
    bool mine;
    bool dozing_too; /* a pod falling asleep will do (a wake request calls it off) */
    unsigned left;
    void (*act)(struct kpod *p);
};

static void pick_one(void *ud, const char *key, void *value)
{
    struct pick *k = ud;
    struct kpod *p = value;
    if (k->left && (p->sleep == KS_ASLEEP || (k->dozing_too && p->sleep == KS_DOZING)) &&
        !p->terminating && !p->retired && (p->dealt > 0) == k->mine) {
        k->left--;
        k->act(p);
    }
}

static void pick(struct kmodel *km, struct pick *k)
{
    k->mine = true;
    strmap_each(&km->pods, pick_one, k);
    k->mine = false;
    strmap_each(&km->pods, pick_one, k);
}

/* Asks n asleep pods of km to wake (each once). */
static void wake_some(struct kmodel *km, unsigned n)
{
    struct pick k = {.left = n, .act = pod_wake};
    pick(km, &k);
}

static void any_wake_request(void *ud, const char *key, void *value)
{
    const struct kpod *p = value;
    if (p->wake_requested && !p->terminating) {
        *(bool *)ud = true;
    }
}

/* A follower asked for this pod: the one dealt to it. */
static void wake_if_requested(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->wake_requested && p->sleep == KS_ASLEEP && !p->terminating && !p->retired) {
        pod_wake(p);
    }
}

/* Pods a follower asked for wake; and with requests in flight or held, the
 * autoscaler's count (at least one) should be awake: asleep pods make up
 * the difference. */
static void wake_wanted(struct kmodel *km)
{
    struct model *m = km->m;
    bool asked = false;
    if (kube_sleep_shared(km)) {
        strmap_each(&km->pods, any_wake_request, &asked);
    }
    if (!kube_sleep_deciding(km) || (kube_model_idle(km) && !asked)) {
        return;
    }
    if (asked) {
        strmap_each(&km->pods, wake_if_requested, NULL);
    }
    unsigned want = km->sc.last.desired ? km->sc.last.desired : 1;
    struct sleep_count c = {0};
    strmap_each(&km->pods, count_pod, &c);
    if (c.asleep && m->n_endpoints + c.waking < want) {
        wake_some(km, want - (unsigned)m->n_endpoints - c.waking);
    }
}

/* A follower: asks the leader to wake one of km's asleep pods, one dealt to
 * it if there is one (the leader wakes the very pod asked for). */
static void ask_leader_to_wake(struct kmodel *km)
{
    struct pick k = {.left = 1, .dozing_too = true, .act = kube_pod_request_wake};
    pick(km, &k);
}

/* Requests here and no slot for them on a ready pod: an asleep pod dealt to
 * this activator is woken (asked for, on a follower). Whether a pod of km
 * is asleep or on its way back (the requests wait for it). */
bool kube_wake_for_demand(struct kmodel *km)
{
    struct sleep_count c = {0};
    strmap_each(&km->pods, count_pod, &c);
    if (!kube_sleep_deciding(km)) {
        if (c.asleep + c.dozing && !slot_here(km) && !waking_here(km)) {
            ask_leader_to_wake(km);
        }
    } else if (c.asleep && !slot_here(km) && !waking_here(km)) {
        wake_some(km, 1);
        return true;
    }
    return c.asleep + c.waking + c.dozing > 0;
}

static void sleep_if_awake(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    if (p->reported && p->sleep == KS_AWAKE && !p->no_idle_sleep && !p->terminating &&
        clock_now_ms() >= p->no_sleep_until_ms) {
        pod_sleep(p, "idle-before-sleep passed");
    }
}

/* Every tick, with several activators, on the leader: its marks kept
 * written (kube_pod_marks_tend); a pod falling asleep gets its /sleep once
 * the others let go of it, or serves again when requests came meanwhile or
 * its mark keeps being refused. */
static void tend_marks(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    struct kmodel *km = p->km;
    if (!kube_sleep_deciding(km) || p->terminating) {
        return;
    }
    kube_pod_marks_tend(p);
    if (p->sleep != KS_DOZING || p->sleep_sent) {
        return;
    }
    if (p->falling_refused >= MARK_FAILURES_GIVE_UP && p->mark_want == MARK_FALLING &&
        !p->mark_call) {
        /* Not put to sleep again for a while: the API keeps refusing the
         * mark (its removal is still written, should one have landed). */
        p->falling_refused = 0;
        p->no_sleep_until_ms = clock_now_ms() + MARK_GIVE_UP_MS;
        sleep_called_off(p);
        return;
    }
    if (!kube_model_idle(km) || p->wake_requested || kube_pod_still_serving(p, false) ||
        !k8s_peers_heard_all(&km->kb->peers, 0)) {
        sleep_called_off(p); /* requests came, or a peer went quiet: it cannot let go */
        return;
    }
    char pod_key[600];
    kube_pod_key(p, pod_key, sizeof pod_key);
    if (p->marked_ms && k8s_peers_let_go(&km->kb->peers, km->key, pod_key, p->marked_ms)) {
        send_sleep(p);
    }
}

void kube_sleep_tick(struct kmodel *km, uint64_t now)
{
    struct model *m = km->m;
    unsigned waking, dozing;
    m->replicas_asleep = kube_pods_asleep(km, &waking, &dozing) + dozing;
    if (kube_sleep_shared(km)) {
        strmap_each(&km->pods, tend_marks, NULL);
    }
    if (m->inflight > 0 || m->queue.count > 0) {
        km->busy_at_ms = now;
        if (!kube_sleep_deciding(km) && m->queue.count > 0 && !slot_here(km) &&
            !waking_here(km)) {
            ask_leader_to_wake(km); /* again, should the last ask be lost */
        }
        wake_wanted(km);
        return;
    }
    wake_wanted(km); /* a follower's wake request */
    if (!km->spec.sleep_level || m->n_endpoints == 0 || !kube_sleep_deciding(km) ||
        now - km->busy_at_ms < km->spec.idle_before_sleep_ms) {
        return;
    }
    struct kube_backend *kb = km->kb;
    uint64_t since = kb->leader_since_ms > km->busy_at_ms ? kb->leader_since_ms : km->busy_at_ms;
    if (kube_sleep_shared(km) && (!k8s_peers_heard_all(&kb->peers, since) ||
                       k8s_peers_demand(&kb->peers, km->key) ||
                       k8s_peers_idle_ms(&kb->peers, km->key) < km->spec.idle_before_sleep_ms)) {
        return; /* busy at another activator, or lately, or not heard from since the lease */
    }
    strmap_each(&km->pods, sleep_if_awake, NULL);
}

static void lead_or_follow(void *ud, const char *key, void *value)
{
    struct kpod *p = value;
    p->mark_want = MARK_NONE; /* a new leader's wishes start from the marks it finds */
    p->mark_done = p->mark_seen;
    p->mark_failures = p->falling_refused = 0;
    p->mark_retry_ms = 0;
    if (kube_sleep_deciding(p->km)) {
        kube_pod_adopt_mark(p);
    } else {
        kube_pod_follow_mark(p);
    }
}

void kube_pod_sleep_marks(struct kpod *p, const struct k8s_pod_info *pi)
{
    struct kmodel *km = p->km;
    if (!kube_sleep_shared(km)) {
        return;
    }
    bool asked = kube_pod_read_marks(p, pi);
    if (!kube_sleep_deciding(km)) {
        kube_pod_follow_mark(p);
        return;
    }
    kube_pod_adopt_mark(p);
    if (asked) {
        LOGI("a peer asked for a pod to wake", "model=%s pod=%s", km->m->name, p->name);
        km->busy_at_ms = clock_now_ms(); /* demand: idle-before-sleep counts from here */
        if (p->sleep == KS_DOZING && !p->sleep_sent) {
            sleep_called_off(p);
        } else {
            wake_wanted(km);
        }
    }
}

static void lead_or_follow_model(void *ud, const char *key, void *value)
{
    strmap_each(&((struct kmodel *)value)->pods, lead_or_follow, NULL);
}

void kube_sleep_leadership(struct kube_backend *kb)
{
    strmap_each(&kb->models, lead_or_follow_model, NULL);
}


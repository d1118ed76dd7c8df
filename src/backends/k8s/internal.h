/* Private to the Kubernetes backend (backend_k8s*.c): its state and what
 * its parts call of one another.
 *   backend_k8s.c          backend ops and wiring (informers, start, free)
 *   backend_k8s_replicas.c Deployments, Pods, EndpointSlices, Nodes -> models and replicas
 *   pods.c                 a replica once known: ready and gone, its share of the
 *                          slots, its cold-start phases
 *   backend_k8s_scale.c    the tick: samples, startup timeout, scaling driver hooks,
 *                          scale PATCHes (conditional from zero), Events
 *   backend_k8s_ha.c       identity, leader lease, peers, the /demand answer
 *   backend_k8s_status.c   describe, capacity, metrics
 *   placement.c            nodes and pod templates -> the warm pool's per-node view
 *   idle.c                 the idle clock kept on the Deployment across restarts
 *   sleep.c                sleep mode: idle pods sleep (POST /sleep), demand wakes them
 *   sleep_marks.c          sleep mode with several activators: the marks on a pod, and
 *                          the endpoints held while it is out of routing
 *   traffic.c              Deployments that are one model's revisions -> its routing
 *                          entry, split and rollout (kept in annotations)
 *   tenants_source.c       tenants.source: the watched Secret or ConfigMap of tenants */
#ifndef THAW_BACKEND_K8S_INT_H
#define THAW_BACKEND_K8S_INT_H

#include "thaw/backend.h"
#include "thaw/clock.h"
#include "thaw/k8s/client.h"
#include "thaw/k8s/events.h"
#include "thaw/k8s/informer.h"
#include "thaw/k8s/lease.h"
#include "thaw/k8s/model_spec.h"
#include "thaw/k8s/objects.h"
#include "thaw/k8s/peers.h"
#include "thaw/control.h"
#include "thaw/probe.h"
#include "thaw/scale_driver.h"
#include "thaw/scaler.h"

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#define TICK_MS 500
#define MAX_NAMESPACES 64
/* When a model's last request passed (RFC 3339), written by the leader. */
#define K8S_LAST_REQUEST_ANNOTATION "thaw.dev/last-request-at"
/* Writes of it, per model: at most one per max(idle-timeout / 4, this). */
#define IDLE_WRITE_MIN_MS 10000
/* How long a grown share of a pod's slots waits before it is used: longer
 * than the activators take to see the same change of pods or activators. */
#define SHARE_SETTLE_MS 1000

struct kube_backend;
struct kmodel;

/* Sleep mode, per pod: AWAKE -> DOZING (out of routing, /sleep sent) ->
 * ASLEEP (the pod runs and keeps its node's resources) -> WAKING (/wake_up
 * sent) -> AWAKE; FAILED: /wake_up failed, the pod is being deleted so its
 * ReplicaSet starts a new one (a cold start). */
enum kpod_sleep { KS_AWAKE, KS_DOZING, KS_ASLEEP, KS_WAKING, KS_FAILED, KS_CHECKING };
/* The sleep-state annotation an activator writes on a pod (several
 * activators): none wanted, "falling-asleep", "asleep", or removed. */
enum kpod_mark { MARK_NONE, MARK_FALLING, MARK_ASLEEP, MARK_CLEAR };
#define KPOD_HELD_MAX 8

struct kpod {
    struct kmodel *km;
    char name[254];
    char ip[64];
    bool reported;      /* told the fleet it is ready */
    bool slice_ready;   /* its EndpointSlice endpoint is ready */
    bool probe_ok;
    bool probing;
    bool terminating;
    /* Terminating with its server maybe still running: its GPU memory is
     * held until the pod is gone, or this wall time at the latest (the
     * kubelet kills it at its deletionTimestamp); 0: not so. */
    int64_t memory_until_ms;
    bool retired; /* thaw scaled to zero: not routed until scaled up again */
    bool selected; /* the Deployment's selector picked it (not only its Service) */
    bool unschedulable;
    char phase[16];
    char node[254];                /* spec.nodeName; "" while not scheduled */
    struct k8s_resources requests; /* its counted extended resources */
    char created[32]; /* creationTimestamp: the order slots are dealt in */
    struct cs_timeline phases; /* tracked when it starts while its model is cold */
    int64_t created_ms;         /* the same in wall ms; 0: unknown */
    bool pod_ready;             /* the pod object's Ready condition */
    uint32_t dealt;             /* this activator's slots on it in the latest deal */
    uint32_t share;             /* the slots it uses: dealt, once settled */
    struct k8s_share_hold hold; /* the share used while the deal settles */
    struct probe probe;
    /* sleep mode (sleep.c) */
    enum kpod_sleep sleep;
    struct control ctl;
    bool ctl_init;
    bool no_idle_sleep;     /* its server refused /sleep: not asked again when idle */
    /* Whether it is asleep is known: seen starting, or asked (KS_CHECKING:
     * GET /is_sleeping under way), or marked by the leader. */
    bool sleep_known;
    uint64_t wake_asked_ms; /* when demand first found it asleep */
    struct k8s_call *delete_call;
    /* sleep mode with several activators (sleep.c): the pod's sleep
     * annotations (K8S_SLEEP_STATE_ANNOTATION, K8S_WAKE_REQUEST_ANNOTATION) */
    enum kpod_mark mark_seen;  /* the mark on the pod object: NONE, FALLING or ASLEEP */
    enum kpod_mark mark_want;  /* leader: what it wants written; NONE: no wish yet */
    enum kpod_mark mark_sent;  /* what the PATCH under way writes */
    enum kpod_mark mark_done;  /* what it wrote last */
    uint64_t mark_done_ms;     /* when that landed */
    unsigned mark_failures;    /* PATCHes failed in a row */
    unsigned falling_refused;  /* falling-asleep marks refused in a row */
    uint64_t mark_retry_ms;    /* not written again before this */
    uint64_t no_sleep_until_ms; /* the API kept refusing its mark: not put to sleep before */
    struct k8s_call *mark_call;
    uint64_t marked_ms;        /* leader: when its falling-asleep mark landed; 0: not yet */
    bool sleep_sent;           /* leader: /sleep sent, the others having let go */
    /* leader: /sleep may have reached the server since it was last known
     * awake (sent, or the falling-asleep mark of a leader before): a sleep
     * called off wakes it rather than routing it again */
    bool sleep_maybe_sent;
    bool wake_requested;       /* it carries a wake request */
    /* Its endpoints (one per time it was routed) that requests still run
     * on after sleep took it out of routing: those requests are not the
     * model's any more (model.c), and the pod is not let go of before they
     * end. Each is held until nothing runs on it. */
    struct endpoint *held[KPOD_HELD_MAX];
    unsigned n_held;
    uint64_t wake_request_ms;  /* when this activator last asked for it to wake */
    struct k8s_call *wake_call;
};

struct kmodel {
    struct kube_backend *kb;
    struct model *m;
    /* The model its Deployment served before a rename (a reference), while
     * requests run on the pods it had: they are this model's load. */
    struct model *renamed_from;
    struct k8s_model_spec spec;
    cJSON *selector; /* the Deployment's spec.selector: which pods are its */
    char key[600]; /* "ns/deployment" */
    struct strmap pods; /* pod name -> kpod */
    /* scaling */
    bool scale_inflight;
    /* spec.replicas as the watch last reported it: while a PATCH is out,
     * spec.replicas keeps thaw's own view, and a PATCH that fails goes
     * back to this one (with the resourceVersion it came with). */
    int64_t seen_replicas;
    int64_t scale_want; /* -1: nothing wanted */
    unsigned scale_failures;
    /* Failed wakes (scale from zero) in a row, and when the next may go:
     * they back off (at most ZERO_RETRY_MAX_MS apart) while the API server
     * cannot be reached, not one every tick and request. */
    unsigned zero_failures;
    uint64_t zero_retry_at_ms;
    struct event scale_retry;
    struct k8s_call *scale_call;
    uint64_t idle_since_ms;
    uint64_t waiting_since_ms; /* requests wait and no pod is ready */
    bool memory_wait_said; /* "waits for a terminating pod's GPU memory" logged */
    uint64_t scaled_down_ms; /* when thaw last scaled it down; 0: never */
    uint64_t scale_ups, scale_downs;
    char last_scale_error[200];
    struct scaler_model sc;
    uint64_t woken_ms; /* when a scale from zero landed; 0: not waking */
    uint64_t initial_hold_until_ms; /* initial-scale holds the count until then */
    struct k8s_pod_template tpl; /* what the scheduler reads of its pods */
    /* the idle clock on the Deployment (idle.c) */
    uint64_t requests_seen;      /* proxied + rejected + aborted at the last tick */
    uint64_t traffic_ms;         /* last request here (or at a peer, when leading); 0: none */
    int64_t annotated_ms;        /* wall ms of the annotation; 0: absent, -1: unreadable */
    uint64_t written_traffic_ms; /* traffic_ms the annotation holds */
    uint64_t writing_traffic_ms; /* traffic_ms of the write in flight */
    uint64_t last_write_ms;      /* when the last write was sent */
    struct k8s_call *idle_call;
    /* sleep mode (sleep.c) */
    uint64_t busy_at_ms;   /* the last tick with requests in flight or held */
    uint64_t last_wake_ms; /* the last wake from sleep took this long; 0: none */
    struct k8s_call *rollout_call;
    size_t plan_index; /* its index in the scaling plan being made (placement.c) */
};

/* A model whose Deployments are its revisions: the routing entry that
 * splits its requests (its struct model has revs set, and this as its
 * backend_data). */
struct kgroup {
    struct kube_backend *kb;
    struct model *m;
    char key[600]; /* "ns/model" */
    char namespace_[254], name[254];
    char error[400]; /* why the split is not what the Deployments say; "" */
    /* error was logged and posted; not until every Deployment list is in:
     * a revision listed before its siblings is no invalid split */
    bool error_reported;
    char names[2048];  /* its hosts and aliases (the revisions'), as routed */
    /* The rollout state this activator last wrote to the canary, until the
     * canary's own annotations show it: events of the Deployment that
     * started before the write landed (status updates, other annotations)
     * still carry the step before, which must not undo the decision. */
    bool rollout_written;
    int written_stage;
    uint32_t written_percent;
    uint64_t written_ms;
    char written_canary[600]; /* the canary Deployment's key ("ns/name") */
};

/* The per-node view handed to the warm pool each planning step; arrays
 * reused from step to step. */
struct kube_placement {
    const struct kube_backend *kb;
    struct wp_node *nodes;
    const struct k8s_node_info **info; /* per node */
    size_t n_nodes, cap_nodes;
    bool *eligible; /* model-major: models x nodes */
    unsigned *on_node;
    size_t cap_cells;
    char res[WP_MAX_RES][96];
    size_t n_res;
    struct wp_held *held; /* the nodes' `held`, node by node */
    size_t *held_model;   /* per held entry: its model's index in the plan */
    size_t cap_held;
};

/* tenants.source: the watched Secret or ConfigMap (tenants_source.c). */
struct kube_tenants_source {
    bool on;
    struct kube_backend *kb;
    enum tenants_source_kind kind;
    char ns[254], name[254], key[254];
    struct k8s_informer inf;
    backend_tenants_apply_fn apply;
    void *apply_ud;
    bool present;     /* the object exists (as last listed or watched) */
    bool loaded;      /* a document was applied since start */
    char seen_rv[64]; /* the version last read (applied or not) */
    char uid[64];     /* its metadata.uid while present (its Events name it) */
    char applied_rv[64];
    int64_t applied_unix;
    uint64_t applied, rejected;
    char last_error[768]; /* "" while the latest version is in force */
};

struct informer_set {
    struct k8s_informer deployments, slices, pods;
    /* The kubelet's image pull Events of pods (Pulling, Pulled): the image
     * pull phase of cold starts. Not counted for readiness. */
    struct k8s_informer pulling, pulled;
};

struct kube_backend {
    /* Holds a pod back before it is routed, whether it did (sleep.c's
     * kube_pod_check_sleep: a pod found ready may be asleep); set by
     * backend.c, so that pods.c, below sleep.c, calls no higher module. */
    bool (*ready_gate)(struct kpod *p);
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
    struct strmap groups;   /* "ns/model" -> kgroup (models with revisions) */
    uint64_t rollout_writes, rollout_write_errors;
    struct strmap by_svc;   /* "ns/service" -> kmodel (slices) */
    struct strmap nodes_gpu; /* node name -> struct k8s_node_info (heap, owns its parts) */
    struct kube_placement placement;
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
    uint64_t idle_writes, idle_write_errors;
    struct kube_tenants_source tenants;
};

static inline struct kube_backend *KB(struct backend *b)
{
    return container_of(b, struct kube_backend, base);
}

/* backend_k8s.c */
bool kube_synced(struct backend *b);

/* backend_k8s_replicas.c */
extern const struct k8s_informer_ops kube_deployment_ops, kube_pod_ops, kube_slice_ops,
    kube_node_ops;
void kube_kmodel_free(struct kmodel *km);
void kube_node_free(struct k8s_node_info *ni);

/* pods.c */
extern const struct k8s_informer_ops kube_pull_event_ops;
/* "ip:port" (or "[ip6]:port") of the pod's model server. */
void kube_pod_addr(const struct kpod *p, char *out, size_t len);
/* The pod's cold-start phase from what its object says (scheduled,
 * container started, ...), when it is tracked. */
void kube_pod_observe_phase(struct kpod *p, const struct k8s_pod_info *pi, uint64_t now);
/* Does the pod take a place in the deal of slots among activators (from its
 * object alone, so every activator sees it alike: k8s_pod_in_deal)? */
bool kube_pod_in_deal(const struct kpod *p, int64_t wall_now);
/* The model's current cold-start phase from its pods' (the most advanced). */
void kube_cold_refresh(struct kmodel *km);
/* Clients wait for a model with no ready pod, or it is scaled from zero: its
 * cold start begins (nothing when one is in progress or a pod is ready);
 * pods already starting are tracked from what is known of them. */
void kube_cold_begin(struct kmodel *km, uint64_t now);
void kube_pod_ready(struct kpod *p, const char *via);
/* Whether p's EndpointSlice readiness routes it: with no readinessProbe
 * the kubelet takes a started container for ready, so where thaw probes
 * pods it waits until its probe finds the port accepting connections (a
 * server that binds once loaded refuses until then). */
bool kube_pod_slice_ready_trusted(const struct kpod *p);
/* The same, with the probe's open connection to the pod (-1: none). */
void kube_pod_ready_conn(struct kpod *p, const char *via, int conn_fd);
void kube_pod_gone(struct kpod *p, const char *why);
/* Starts thaw's own probe of the pod (when probe_pods is on and it runs). */
void kube_pod_probe(struct kpod *p);
/* This activator's share of each ready pod's slots, from the activators
 * (peers) and the Deployment's pods in the deal (k8s_pod_in_deal); a share
 * grows only once settled (k8s_share_settle). Waiting requests go when a
 * share grew. Also called every tick: pods age out of the deal, and shares
 * held back settle. */
void kube_shares_update(struct kmodel *km);
/* The set of activators changed: every model's shares move. */
void kube_peers_changed(void *kb);

/* backend_k8s_scale.c */
void kube_scale_retry(evutil_socket_t fd, short what, void *arg);
/* An Event on the model's Deployment (when kubernetes.events is on); every
 * part posts them, so it sits here rather than in one of them. */
static inline void kube_post_event(struct kmodel *km, const char *type, const char *reason,
                                   const char *message)
{
    struct kube_backend *kb = km->kb;
    if (kb->cfg->kubernetes.events) {
        struct k8s_event_ref obj = {km->spec.namespace_, "apps/v1", "Deployment",
                                    km->spec.deployment, km->spec.uid};
        k8s_events_record(&kb->events, &obj, type, reason, message, clock_now_ms());
    }
}
/* Asks for n replicas (capped at max-scale): one PATCH at a time. */
void kube_want_replicas(struct kmodel *km, int64_t n);
/* 0 -> activation scale, only if still 0 (any activator may). */
void kube_scale_from_zero(struct kmodel *km);
/* The model tick and the scaling driver, started last. */
void kube_scaling_start(struct kube_backend *kb);

/* backend_k8s_ha.c */
/* Identity, then the leader lease and peers when configured. */
void kube_ha_start(struct kube_backend *kb);
void kube_ha_dispose(struct kube_backend *kb);
void kube_ha_describe(struct kube_backend *kb, cJSON *k);
void kube_demand(struct backend *b, cJSON *out);

/* placement.c */
/* The model's pod template from its Deployment (keeps the old one when it
 * cannot be read); sets the slices the warm budget counts per replica. */
void kube_model_template(struct kmodel *km, const cJSON *deployment);
/* The scaling driver's nodes hook (scale_driver_ops.nodes). */
bool kube_plan_nodes(void *ud, struct scaler_model **sms, size_t n, struct wp_cluster *c);
void kube_placement_dispose(struct kube_placement *pl);
/* Counted resources held per node by thaw's model pods (not terminating):
 * node name -> struct k8s_resources (heap; kube_node_usage_free). */
void kube_node_usage(struct kube_backend *kb, struct strmap *out);
void kube_node_usage_free(struct strmap *usage);
/* A node that carries a counted resource (the warm pool's nodes). */
bool kube_gpu_node(const struct k8s_node_info *ni);
/* The node's physical GPUs that share memory among replicas (time-sliced
 * nvidia.com/gpu, MPS nvidia.com/gpu.shared): its shared units over
 * nvidia.com/gpu.replicas, at most nvidia.com/gpu.count. */
uint64_t kube_shared_gpus(const struct k8s_node_info *ni);
/* Memory per physical GPU: the nvidia.com/gpu.memory label, else
 * kubernetes.gpu_memory_bytes; 0: unknown. *source: "label", "config" or
 * "unknown". */
uint64_t kube_gpu_memory(const struct kube_backend *kb, const struct k8s_node_info *ni,
                         const char **source);
/* GPU memory one replica takes on a shared GPU: thaw.dev/gpu-memory when its
 * pod template asks for a shared GPU; 0 otherwise (MIG, or not declared). */
uint64_t kube_replica_memory(const struct kmodel *km);
/* Whether p holds its model's GPU memory on its node now: placed, not
 * terminating, and not asleep (sleep mode) unless asked to wake. What the
 * admission packs and what sleep mode frees count the same pods. */
bool kube_pod_holds_memory(const struct kpod *p);
/* Whether p holds GPU memory on its way out: terminating (until
 * memory_until_ms), or of a model thaw scaled below its pods a moment ago
 * (the ReplicaSet has yet to pick which go). */
bool kube_pod_on_way_out(const struct kpod *p);
/* Whether a new replica of km must wait: pods on their way out (terminating,
 * or of a model scaled below them) still hold GPU memory on a node km may
 * use, where it would not fit beside them (the scheduler does not count GPU
 * memory, so a pod placed there meanwhile would share the GPU with them). */
bool kube_memory_leaving_for(const struct kmodel *km);
/* Its replicas declare GPU memory and some GPU node knows its own: a wake
 * from zero must go through the plan (memory admission), not straight to a
 * scale PATCH. */
bool kube_memory_bound(const struct kmodel *km);
/* A wake from zero the plan decides: memory-bound, or a GPU model under
 * warm_pool.capacity_slices (the cap on all models' slices together). */
bool kube_plan_wakes(const struct kmodel *km);
/* What thaw's replicas on a node hold of its GPU memory. */
struct kube_node_memory {
    uint64_t per_gpu; /* 0: unknown */
    unsigned gpus;
    const char *source;
    uint64_t used;
    uint64_t *items; /* each replica's memory (n of them, room for one more) */
    size_t n;
};
/* 0, or -1 when memory ran out. Dispose either way. */
int kube_node_memory(struct kube_backend *kb, const struct k8s_node_info *ni,
                     struct kube_node_memory *out);
/* Do the replicas there and one more of `extra` bytes (0: none) pack into
 * the node's GPUs? Reorders items. */
bool kube_node_memory_fits(struct kube_node_memory *nm, uint64_t extra);
void kube_node_memory_dispose(struct kube_node_memory *nm);
/* Do the pods on the node that hold memory and are not falling asleep pack
 * into its GPUs (the bins the plan admits by)? */
bool kube_node_awake_packs(struct kube_backend *kb, const struct k8s_node_info *ni);

/* idle.c */
/* The annotation on a Deployment seen (discovered: first seen): it starts or
 * advances the model's idle clock; without one a new model's starts now. */
void kube_idle_observe(struct kmodel *km, const cJSON *deployment, bool discovered);
/* Leadership taken: models without the annotation start their clock now. */
void kube_idle_on_leadership(struct kube_backend *kb);
/* Every tick: notes requests, and on the leader writes the annotation. */
void kube_idle_tick(struct kmodel *km, uint64_t now);
/* ms since this activator's last request for the model, for /demand;
 * UINT64_MAX when none within its idle timeout. */
uint64_t kube_idle_demand_age(const struct kmodel *km, uint64_t now);

/* sleep.c */
/* Every tick: idle pods of a sleep-mode model doze after idle-before-sleep;
 * demand wakes asleep ones. */
void kube_sleep_tick(struct kmodel *km, uint64_t now);
/* Demand for a model with no ready pod: wakes an asleep one (with several
 * activators, a follower asks the leader to). True when one is asleep or
 * waking (no scale-up is needed for it). */
bool kube_wake_for_demand(struct kmodel *km);
/* A pod object seen (added or changed): its sleep annotations. */
void kube_pod_sleep_marks(struct kpod *p, const struct k8s_pod_info *pi);
/* This activator took or lost the lease: a new leader takes the marks it
 * finds as its own; one that lost it follows them. */
void kube_sleep_leadership(struct kube_backend *kb);

/* sleep_marks.c: sleep mode with several activators, the marks on a pod
 * and what an activator holds while sleep keeps a pod out of its routing */
/* Several activators share the model's pods: sleep goes through the marks. */
static inline bool kube_sleep_shared(const struct kmodel *km)
{
    return km->kb->have_peers;
}
/* This activator decides sleep and wake: the leader, or any activator
 * where there are no peers. */
static inline bool kube_sleep_deciding(const struct kmodel *km)
{
    return km->kb->leading || !km->kb->have_peers;
}
/* Takes p out of routing for sleep; its endpoint is held while requests
 * still run on it (no longer in the model's slots, still in its load:
 * inflight_leaving, model.c). */
void kube_pod_unroute(struct kpod *p);
/* Lets go of p's held endpoints nothing runs on (all of them: all); whether
 * requests still run on the others. */
bool kube_pod_still_serving(struct kpod *p, bool all);
/* Requests still running on km's pods that sleep took out of routing: in
 * flight all the same, for /demand and for the model's idleness. */
uint64_t kube_sleep_held_inflight(const struct kmodel *km);
/* Nothing in flight or waiting for the model: here (held requests on pods
 * sleep unrouted included), and on the leader at every fresh peer too. */
bool kube_model_idle(const struct kmodel *km);
/* Whether p could be put to sleep now for another pod's GPU memory: a
 * sleep-mode pod, awake and reported ready, its model idle everywhere. */
bool kube_pod_sleepable(const struct kpod *p);
/* The leader's wish for p's mark, written when it may be (one PATCH at a
 * time, the newest wish last, backing off after failures). */
void kube_pod_mark(struct kpod *p, enum kpod_mark want);
void kube_pod_mark_send(struct kpod *p);
/* Every tick, on the leader: the mark written again when the pod object
 * disagrees with it a second after it landed, or a wake request stayed on an
 * awake pod. */
void kube_pod_marks_tend(struct kpod *p);
/* A pod object seen: its mark and wake request stored. Whether a wake
 * request is new. */
bool kube_pod_read_marks(struct kpod *p, const struct k8s_pod_info *pi);
/* Not deciding: p's state is the mark's (routed again once it is gone). */
void kube_pod_follow_mark(struct kpod *p);
/* The leader with no wish for p yet: the mark it finds is its own. */
void kube_pod_adopt_mark(struct kpod *p);
/* A follower with requests and only asleep pods: asks the leader to wake
 * p (K8S_WAKE_REQUEST_ANNOTATION), at most once per 2 s. */
void kube_pod_request_wake(struct kpod *p);
/* GET /demand: the pods this activator keeps out of routing because they
 * are marked asleep and nothing of it runs on any more ("ns/pod"), for the
 * leader to know they were let go of. */
void kube_sleep_unrouted(struct kube_backend *kb, cJSON *out);
/* "ns/pod": how /demand names a pod. */
void kube_pod_key(const struct kpod *p, char *out, size_t len);
void kube_pod_marks_dispose(struct kpod *p);
/* A pod leaves: its control request and delete are dropped. */
void kube_pod_sleep_dispose(struct kpod *p);
/* Pods asleep; those waking and falling asleep in *waking and *dozing. */
unsigned kube_pods_asleep(const struct kmodel *km, unsigned *waking, unsigned *dozing);
const char *kube_pod_sleep_name(enum kpod_sleep s);
/* A ready pod of a sleep-mode model that this activator did not see start:
 * asks its server whether it is asleep before it is routed. Whether it did
 * (the pod is reported once the answer says awake). */
bool kube_pod_check_sleep(struct kpod *p);
/* Every tick: on each node whose GPU memory the pods there (awake, starting,
 * waking) need more of than it has, idle sleep-mode pods of the same or
 * lower priority are put to sleep. */
void kube_sleep_for_memory(struct kube_backend *kb);
/* traffic.c */
/* The revisions of model ns/name changed (a Deployment came, changed or
 * went): its routing entry, split and rollout follow. */
void kube_revisions_sync(struct kube_backend *kb, const char *ns, const char *name);
/* Every Deployment list is in: reports the split errors held back until now. */
void kube_revisions_listed(struct kube_backend *kb);
/* Each tick: a rollout state held against the cluster is let go once its
 * echo is overdue or this activator no longer leads. */
void kube_rollout_writes_tick(struct kube_backend *kb);
/* A config_model name and tag hosts for a revision's own model: the tags of
 * the model's name and of group_hosts, the hosts of all its revisions
 * (kube_group_hosts). */
void kube_revision_names(const struct k8s_model_spec *sp, char *const *group_hosts,
                         size_t n_group_hosts, struct config_model *cm, char *name,
                         size_t name_len, char *hosts_buf, size_t hosts_len, char **hosts,
                         size_t max_hosts);
/* The thaw.dev/hosts of every revision of sp's model, sp's as it is now
 * (its Deployment's object in kb may be older, or not there yet), each once,
 * into out (copied into buf). Their number. */
size_t kube_group_hosts(struct kube_backend *kb, const struct k8s_model_spec *sp, char *buf,
                        size_t buflen, char **out, size_t max);
void kube_rollout_decided(struct backend *b, struct model *parent,
                          const struct rollout_decision *d);
bool kube_rollout_leads(struct backend *b);
void kube_describe_group(struct kgroup *g, cJSON *out);
void kube_groups_free(struct kube_backend *kb);
/* tenants_source.c */
void kube_tenants_source_dispose(struct kube_tenants_source *ts);
void kube_tenants_source_describe(const struct kube_tenants_source *ts, cJSON *k);
void kube_tenants_source_metrics(const struct kube_tenants_source *ts, struct buf *o);

/* backend_k8s_status.c */
void kube_describe(struct backend *b, struct model *m, cJSON *out);
void kube_describe_capacity(struct backend *b, cJSON *out);
void kube_render_metrics(struct backend *b, struct buf *o);

#endif

/* The other activators and their demand. Peers are the endpoints of thaw's
 * own Service (its EndpointSlices); each serves its per-model in-flight and
 * queued counts, and how long ago its last request for the model was, on
 * GET /demand of its admin port, and the leader polls them.
 * Polling keeps this traffic off the API server (publishing counts there
 * would write to etcd every second from every activator). A peer that has
 * not answered for timeout_ms is stale: it drops out of the sum. */
#ifndef THAW_K8S_PEERS_H
#define THAW_K8S_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/k8s/client.h"
#include "thaw/k8s/informer.h"
#include "thaw/strmap.h"

struct k8s_peers {
    struct k8s_client *client;
    struct k8s_informer slices;
    struct strmap peers; /* "ip:port" -> struct k8s_peer */
    char self_ip[64];
    unsigned port;
    uint64_t poll_ms, timeout_ms;
    struct event timer;
    bool polling; /* only the leader polls */
    /* Called when the set of activators changed (one joined or left). */
    void (*on_change)(void *ud);
    void *on_change_ud;
};

void k8s_peers_init(struct k8s_peers *p, struct k8s_client *c, struct event_base *base,
                    const char *namespace_, const char *service, unsigned port, const char *self_ip,
                    uint64_t poll_ms, uint64_t timeout_ms);
void k8s_peers_start(struct k8s_peers *p);
void k8s_peers_set_polling(struct k8s_peers *p, bool on);
/* Sum of in-flight + queued for model key ("ns/deployment") over fresh peers
 * (terminating ones included: they keep their share while they drain). */
uint64_t k8s_peers_demand(struct k8s_peers *p, const char *key);
/* Of the fresh peers with requests of model key queued that more replicas
 * could start, the last in the deal's order (k8s_peers_place): its rank
 * plus one; 0 when none has any. */
unsigned k8s_peers_waiting_span(struct k8s_peers *p, const char *key);
unsigned k8s_peers_count(struct k8s_peers *p, bool fresh_only);
void k8s_peers_describe(struct k8s_peers *p, cJSON *out);
/* The fewest milliseconds since a request for model key at any fresh peer
 * (as reported, plus the time since the report); UINT64_MAX when none says. */
uint64_t k8s_peers_idle_ms(struct k8s_peers *p, const char *key);
/* Whether every peer (terminating ones included) has answered a poll sent at
 * or after since_ms, and is fresh. */
bool k8s_peers_heard_all(struct k8s_peers *p, uint64_t since_ms);
/* Whether every peer has let go of pod pod_key ("ns/name") of model
 * model_key: it is fresh, and its answer to a poll sent at or after since_ms
 * lists the pod as kept out of its routing, and has nothing of the model in
 * flight or queued. True when there is no peer. */
bool k8s_peers_let_go(struct k8s_peers *p, const char *model_key, const char *pod_key,
                      uint64_t since_ms);

/* Where this activator stands among all of them (itself included), ordered
 * by address so that every activator computes the same order without
 * talking: *n activators, this one at *rank. Terminating ones keep their
 * place until they leave the Service: requests still reach them for a
 * while, and they serve what they hold. Returns false when this one is
 * not (yet) among them while others are, or before the first list (then *n
 * is what is known and *rank is meaningless). No activator listed at all
 * reads as alone (*n = 1, *rank = 0). */
bool k8s_peers_place(const struct k8s_peers *p, unsigned *rank, unsigned *n);

/* The slots activator rank of n holds on the pod_index-th ready pod (pods in
 * a deterministic order), each pod taking concurrency requests at once. The
 * slots of all pods, pod by pod, are dealt to the activators round-robin
 * (Knative's activator splits the same total), so no pod gets more than
 * concurrency from all activators together, the activators' totals differ
 * by at most one, and the first ones hold the remainder (8 slots over 3
 * activators: 3, 3, 2). Pure. */
uint32_t k8s_activator_share(uint32_t concurrency, unsigned n, unsigned rank, size_t pod_index);

/* How many pods in the deal give activator rank a slot at all: it gets one
 * once pods x concurrency > rank, whatever the number of activators. Pure. */
unsigned k8s_pods_to_reach(uint32_t concurrency, unsigned rank);

/* Whether a pod takes a place (pod_index above) in its Deployment's deal.
 * The places come from the pod objects, which every activator reads alike,
 * not from when each activator saw a pod get ready (each probes on its own):
 * a pod counts from its creation while it may still be starting (younger
 * than startup_ms), after that only while its Ready condition holds (a pod
 * that never gets ready does not keep slots forever), and never once
 * terminating, failed or unschedulable. The places are ordered by
 * creationTimestamp, then name. Pure. */
bool k8s_pod_in_deal(bool terminating, bool unschedulable, bool ready, uint64_t age_ms,
                     uint64_t startup_ms);

/* One pod's share as dealt over time. Activators see a change of the deal
 * (a pod or an activator come or gone) at slightly different moments; a
 * share that shrinks does so at once, one that grows only once the deal
 * has held settle_ms, so that the others have shrunk theirs first: until
 * then the smallest share dealt since the last change is used. */
struct k8s_share_hold {
    bool known;
    uint32_t dealt;    /* the latest deal */
    uint32_t floor;    /* the smallest deal since moved_ms */
    uint64_t moved_ms; /* when the deal last changed */
};

/* Records dealt (at now_ms) and returns the share to use. The first deal
 * seen is used at once. Pure. */
uint32_t k8s_share_settle(struct k8s_share_hold *h, uint32_t dealt, uint64_t now_ms,
                          uint64_t settle_ms);
/* A peer's demand report ({"identity": ..., "models": {key: [inflight,
 * queued, idle_ms]}, "unrouted": ["ns/pod", ...]}, idle_ms optional: ms
 * since the model's last request there; unrouted optional: the pods it
 * keeps out of routing because they are marked asleep) into demand (key ->
 * (uintptr_t) demand + 1, replaced whole), idle (key -> (uintptr_t) idle_ms
 * + 1, replaced whole; may be NULL), unrouted (pod -> (void *)1, replaced
 * whole; may be NULL) and identity. 0, or -1 when it is not such a report
 * (nothing changed). */
int k8s_peer_demand_parse(const char *body, size_t len, struct strmap *demand,
                          struct strmap *idle, struct strmap *unrouted, char *identity,
                          size_t idlen);
/* The same, with queued (key -> (uintptr_t) queued + 1 for the models with
 * some queued, replaced whole; may be NULL): which activator holds the
 * requests waiting, not only how many there are. */
int k8s_peer_report_parse(const char *body, size_t len, struct strmap *demand,
                          struct strmap *queued, struct strmap *idle, struct strmap *unrouted,
                          char *identity, size_t idlen);
void k8s_peers_dispose(struct k8s_peers *p);

#endif

/* Decoding of the Kubernetes objects thaw watches besides Deployments (see
 * model_spec.h): Pods, EndpointSlices and Nodes, into plain structs. Pure. */
#ifndef THAW_K8S_OBJECTS_H
#define THAW_K8S_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* The label that makes a Deployment a model; its value is the model's name.
 * The default kubernetes.label_selector. A model's pods are the ones its
 * Deployment's spec.selector selects (k8s_selector_matches), whatever other
 * labels they carry. */
#define K8S_MODEL_LABEL "thaw.dev/model"

struct k8s_pod_info {
    char name[254];
    char namespace_[254];
    char model[254]; /* K8S_MODEL_LABEL label; "" when absent */
    char owner[254]; /* the controlling ownerReference's name (a ReplicaSet); "" when none */
    char created[32]; /* metadata.creationTimestamp (RFC 3339, sorts as text); "" when absent */
    char ip[64];     /* status.podIP; "" before it has one */
    char phase[16];
    bool running;       /* phase Running */
    bool terminating;   /* deletionTimestamp set, or Failed/Succeeded */
    bool unschedulable; /* PodScheduled=False, reason Unschedulable */
    char unschedulable_message[256];
};

/* 0, or -1 when obj has no name. */
int k8s_pod_decode(const cJSON *obj, struct k8s_pod_info *out);

/* Whether an object with these labels (metadata.labels; NULL: none) is
 * selected by a LabelSelector: every matchLabels pair, and every
 * matchExpressions requirement (In, NotIn, Exists, DoesNotExist), as the API
 * server and every controller read it: NotIn and DoesNotExist hold for an
 * object without the key. A null or empty selector, and one with an unknown
 * operator or a malformed requirement (In/NotIn without values,
 * Exists/DoesNotExist with some), select nothing: a Deployment's selector
 * may be neither, and claiming every pod of a namespace is the worse error. */
bool k8s_selector_matches(const cJSON *selector, const cJSON *labels);

struct k8s_slice_endpoint {
    const char *pod; /* targetRef.name */
    const char *address;
    bool ready;       /* conditions.ready (absent means ready, per the API) */
    bool terminating; /* conditions.terminating */
};

/* The service a slice belongs to (kubernetes.io/service-name), or NULL. */
const char *k8s_slice_service(const cJSON *slice);
/* Calls fn for each endpoint that names a pod and has an address; strings
 * point into slice. Returns how many. */
size_t k8s_slice_each(const cJSON *slice, void (*fn)(void *ud, const struct k8s_slice_endpoint *e),
                      void *ud);

struct k8s_node_info {
    char name[254];
    uint64_t gpu_allocatable; /* nvidia.com/gpu (time-slicing replicas counted) */
    uint64_t gpu_count;       /* label nvidia.com/gpu.count, 0 when absent */
    uint64_t gpu_replicas;    /* label nvidia.com/gpu.replicas, 0 when absent */
    char gpu_product[128];    /* label nvidia.com/gpu.product */
};

int k8s_node_decode(const cJSON *obj, struct k8s_node_info *out);

/* RFC 3339 ("2026-12-02T15:04:05Z"; an optional fraction, read to the
 * millisecond; Z or +hh:mm) as milliseconds since the epoch. 0, or -1. */
int k8s_time_parse_ms(const char *s, int64_t *out_ms);
/* ms since the epoch (not negative) as RFC 3339 UTC: "2026-12-02T15:04:05.123Z". */
void k8s_time_format_ms(int64_t ms, char *out, size_t len);

#endif

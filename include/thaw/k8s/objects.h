/* Decoding of the Kubernetes objects thaw watches besides Deployments (see
 * model_spec.h): Pods, EndpointSlices and Nodes, into plain structs, and what
 * the scheduler would say of a pod template on a node (taints, cordon,
 * nodeSelector, required node affinity, extended resources). Pure. */
#ifndef THAW_K8S_OBJECTS_H
#define THAW_K8S_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "thaw/k8s/json.h"

/* The label that makes a Deployment a model; its value is the model's name.
 * The default kubernetes.label_selector. A model's pods are the ones its
 * Deployment's spec.selector selects (k8s_selector_matches), whatever other
 * labels they carry. */
#define K8S_MODEL_LABEL "thaw.dev/model"

/* Sleep mode with several activators: the leader marks a pod it puts to
 * sleep with K8S_SLEEP_STATE_ANNOTATION ("falling-asleep" before it sends
 * POST /sleep, "asleep" once answered; removed once the pod is awake
 * again), and every activator keeps a pod so marked out of routing. An
 * activator with requests for a model whose pods are all asleep asks the
 * leader to wake one with K8S_WAKE_REQUEST_ANNOTATION (its identity). */
#define K8S_SLEEP_STATE_ANNOTATION "thaw.dev/sleep-state"
#define K8S_WAKE_REQUEST_ANNOTATION "thaw.dev/wake-requested"

/* Extended resources counted per node: every resource whose name starts with
 * this (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...). */
#define K8S_RESOURCE_PREFIX "nvidia.com/"
#define K8S_MAX_RESOURCES 16

struct k8s_resource {
    char name[96];
    uint64_t amount;
};

/* A set of (resource name -> amount); names unique. */
struct k8s_resources {
    size_t n;
    bool truncated; /* more names than K8S_MAX_RESOURCES; the rest were dropped */
    struct k8s_resource r[K8S_MAX_RESOURCES];
};

/* A resource quantity as the API writes one ("20Gi", "24000Mi", "16G",
 * "1.5Gi", "3e9", plain "1073741824") in whole units, rounded up as
 * resource.Quantity's Value() does. 0, or -1 when s is not a quantity, is
 * negative, has a milli ("m") suffix or exceeds UINT64_MAX. */
int k8s_parse_quantity(const char *s, uint64_t *out);

/* The amount of name; 0 when absent. */
uint64_t k8s_resources_get(const struct k8s_resources *rs, const char *name);
/* Adds amount to name (saturating); -1 when the set is full (truncated set). */
int k8s_resources_add(struct k8s_resources *rs, const char *name, uint64_t amount);
/* The sum over every resource (saturating). */
uint64_t k8s_resources_total(const struct k8s_resources *rs);

struct k8s_pod_info {
    char name[254];
    char namespace_[254];
    char model[254]; /* K8S_MODEL_LABEL label; "" when absent */
    char owner[254]; /* the controlling ownerReference's name (a ReplicaSet); "" when none */
    char created[32]; /* metadata.creationTimestamp (RFC 3339, sorts as text); "" when absent */
    char ip[64];     /* status.podIP; "" before it has one */
    char phase[16];
    bool running;       /* phase Running */
    bool container_started; /* its first container's state is running (startedAt set) */
    bool terminating;   /* deletionTimestamp set, or Failed/Succeeded */
    /* Its containers may still run: deleted (deletionTimestamp set) but
     * not Failed or Succeeded; until kill_ms (the deletionTimestamp, when
     * the kubelet kills what is left; wall ms, 0 unknown). */
    bool stopping;
    int64_t kill_ms;
    bool unschedulable; /* PodScheduled=False, reason Unschedulable */
    bool ready;         /* condition Ready=True (the kubelet's readiness) */
    char unschedulable_message[256];
    char node_name[254];           /* spec.nodeName; "" while not scheduled */
    struct k8s_resources requests; /* K8S_RESOURCE_PREFIX resources (see k8s_pod_template) */
    char sleep_state[16]; /* K8S_SLEEP_STATE_ANNOTATION; "" when absent */
    bool wake_requested;  /* K8S_WAKE_REQUEST_ANNOTATION is set */
};

/* 0, or -1 when obj has no name. */
int k8s_pod_decode(const cJSON *obj, struct k8s_pod_info *out);

/* The pull time the kubelet reports in a Pulled Event's message:
 * `Successfully pulled image "x" in 1.234s (1.234s including waiting). ...`
 * (a Go duration: 850ms, 1.5s, 2m3.1s, 1h0m0s). 0, or -1 when the message is
 * not of that shape (e.g. `Container image "x" already present on machine`). */
int k8s_pulled_duration_ms(const char *message, uint64_t *ms);

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
    const char *pod; /* targetRef.name; NULL without one (optional: a slice written by hand) */
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

enum k8s_taint_effect {
    K8S_EFFECT_ANY, /* a toleration with no effect: tolerates every effect */
    K8S_NO_SCHEDULE,
    K8S_PREFER_NO_SCHEDULE,
    K8S_NO_EXECUTE,
    K8S_EFFECT_OTHER,
};

struct k8s_taint {
    char *key, *value;
    enum k8s_taint_effect effect;
};

/* The taint a cordoned node carries; a pod tolerating it may still go there. */
#define K8S_UNSCHEDULABLE_TAINT "node.kubernetes.io/unschedulable"

/* A decoded Node; owns its labels and taints (k8s_node_info_dispose). */
struct k8s_node_info {
    char name[254];
    uint64_t gpu_allocatable; /* nvidia.com/gpu (time-slicing replicas counted) */
    uint64_t gpu_count;       /* label nvidia.com/gpu.count, 0 when absent */
    uint64_t gpu_replicas;    /* label nvidia.com/gpu.replicas, 0 when absent */
    char gpu_product[128];    /* label nvidia.com/gpu.product */
    uint64_t gpu_memory;      /* label nvidia.com/gpu.memory (MiB per GPU) in bytes; 0: absent */
    bool gpu_memory_bad;      /* the label is there but not a count of MiB */
    struct k8s_resources allocatable; /* status.allocatable, K8S_RESOURCE_PREFIX names */
    bool unschedulable;               /* spec.unschedulable: cordoned */
    char **labels;                    /* key, value, key, value ... */
    size_t n_labels;
    struct k8s_taint *taints;
    size_t n_taints;
};

/* 0, or -1 when obj has no name (or memory ran out). out must be disposed
 * either way. */
int k8s_node_decode(const cJSON *obj, struct k8s_node_info *out);
void k8s_node_info_dispose(struct k8s_node_info *ni);
/* The value of label key on the node, or NULL. */
const char *k8s_node_label(const struct k8s_node_info *ni, const char *key);

enum k8s_toleration_op { K8S_TOL_EQUAL, K8S_TOL_EXISTS };

struct k8s_toleration {
    char *key; /* "" with Exists: every key */
    enum k8s_toleration_op op;
    char *value;
    enum k8s_taint_effect effect; /* K8S_EFFECT_ANY when empty */
};

enum k8s_selector_op {
    K8S_SEL_IN,
    K8S_SEL_NOT_IN,
    K8S_SEL_EXISTS,
    K8S_SEL_DOES_NOT_EXIST,
    K8S_SEL_GT,
    K8S_SEL_LT,
    K8S_SEL_INVALID, /* matches nothing */
};

/* One matchExpressions (or matchFields, on metadata.name) requirement. */
struct k8s_node_requirement {
    char *key;
    bool field; /* matchFields: key is metadata.name */
    enum k8s_selector_op op;
    char **values;
    size_t n_values;
};

/* A nodeSelectorTerm: its requirements ANDed. */
struct k8s_node_term {
    struct k8s_node_requirement *reqs;
    size_t n_reqs;
};

/* What the scheduler reads of a pod (or a Deployment's pod template) to
 * place it; owns everything (k8s_pod_template_dispose). */
struct k8s_pod_template {
    /* Per replica: each container's requests (limits where a request is
     * absent), summed; an init container's if larger (it runs alone). */
    struct k8s_resources requests;
    char **node_selector; /* key, value, key, value ... */
    size_t n_node_selector;
    /* requiredDuringSchedulingIgnoredDuringExecution: terms ORed; none: any node */
    struct k8s_node_term *terms;
    size_t n_terms;
    struct k8s_toleration *tolerations;
    size_t n_tolerations;
};

/* Decodes a pod spec (a Pod's spec or a Deployment's spec.template.spec;
 * NULL gives an empty template). 0, or -1 when memory ran out. out must be
 * disposed either way. */
int k8s_pod_template_decode(const cJSON *pod_spec, struct k8s_pod_template *out);
void k8s_pod_template_dispose(struct k8s_pod_template *t);

/* Why a node would not take a pod, the scheduler's checks in its order. */
enum k8s_fit {
    K8S_FITS,
    K8S_FIT_CORDONED,      /* spec.unschedulable, not tolerated */
    K8S_FIT_TAINT,         /* a NoSchedule/NoExecute taint the pod does not tolerate */
    K8S_FIT_NODE_SELECTOR, /* nodeSelector */
    K8S_FIT_AFFINITY,      /* required node affinity */
    K8S_FIT_RESOURCES,     /* not enough of a requested resource left */
};

const char *k8s_fit_name(enum k8s_fit f);
/* Everything but resources: may the pod go to this node at all? */
enum k8s_fit k8s_node_admits(const struct k8s_node_info *node, const struct k8s_pod_template *t);
/* As k8s_node_admits, then: for every resource the template requests,
 * allocatable - used >= request. used may be NULL (nothing used). */
enum k8s_fit k8s_node_fits(const struct k8s_node_info *node, const struct k8s_pod_template *t,
                           const struct k8s_resources *used);
/* Does a toleration tolerate a taint (the scheduler's rule)? */
bool k8s_tolerates(const struct k8s_toleration *tol, const struct k8s_taint *taint);


#endif

/* Configuration: a JSON file parsed with cJSON into plain structs, driven
 * by one key table per section in config.c (type, offset, default, range,
 * check). Every limit has a default, a unit in its key and a range; unknown keys,
 * duplicate keys, wrong types and out-of-range values are errors that name
 * the file, line and key. The struct config owns all its strings. */
#ifndef THAW_CONFIG_H
#define THAW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/log.h"
#include "thaw/tier.h"


/* What the thaw-priority request header may do. */
enum priority_header_policy {
    PRIORITY_HEADER_ANY = 0,   /* any tier */
    PRIORITY_HEADER_LOWER_ONLY, /* only a tier below the model's (clients cannot jump ahead) */
    PRIORITY_HEADER_IGNORE,    /* the model's tier always */
};

struct config_limits {
    uint64_t max_connections;
    uint64_t max_header_bytes;
    uint64_t max_headers;
    uint64_t max_body_bytes;
    uint64_t header_timeout_ms;
    uint64_t body_timeout_ms;
    uint64_t keepalive_timeout_ms;
    uint64_t send_timeout_ms;
    uint64_t max_queue_per_model;
    uint64_t max_queue_total;
    uint64_t queue_aging_ms;
    uint64_t drain_timeout_ms;
    uint64_t max_buffered_body_bytes;
    enum priority_header_policy priority_header;
    uint64_t body_total_timeout_ms; /* whole request body, from the end of the head */
    bool trust_forwarded_headers;   /* keep and extend the client's X-Forwarded-* / Forwarded */
};

struct config_upstream {
    uint64_t keepalive_per_endpoint;
    uint64_t keepalive_timeout_ms;
    uint64_t eject_ms;
    uint64_t max_response_header_bytes;
};

/* Warming a model ahead of its forecast demand (forecast.h): off, on, or
 * shadow (log what it would do); a model's INHERIT takes the global one. */
enum prewarm_mode { PREWARM_INHERIT = 0, PREWARM_OFF, PREWARM_ON, PREWARM_SHADOW };

/* Sleep mode (vLLM's --enable-sleep-mode: POST /sleep?level=N, POST
 * /wake_up): a replica that keeps running but frees its GPU memory. */
struct config_sleep {
    bool enabled;
    uint64_t level;                /* 1: weights kept in host memory; 2: discarded */
    uint64_t idle_before_sleep_ms; /* asleep after this long idle; 0: only when memory is needed */
    uint64_t timeout_ms;           /* for /sleep and /wake_up to answer */
};

/* Progressive rollout of a model's second revision (the canary) against
 * its first (the stable one); see rollout.h. */
struct config_rollout {
    bool enabled;
    uint64_t step_percent;
    uint64_t step_interval_ms;
    uint64_t min_requests;
    uint64_t max_error_rate_increase_pct;
    uint64_t max_ttfb_p99_ratio_pct;
    uint64_t ttfb_p99_tolerance_ms;
};

/* One entry of a model's traffic split. */
struct config_revision {
    char *name;
    uint64_t percent;
};

#define CONFIG_MAX_REVISIONS 8

struct config_model {
    char *name;
    char *namespace_;
    char **hosts;
    size_t n_hosts;
    char **aliases;
    size_t n_aliases;
    char **endpoints; /* static backend: "host:port", as written */
    size_t n_endpoints;
    /* process backend (a model has `endpoints` or `command`, not both) */
    char **command; /* argv; "{port}" and "{gpu}" are substituted */
    size_t n_command;
    char **env; /* "NAME=value", substituted likewise */
    size_t n_env;
    char *health_path;
    uint64_t min_replicas;
    uint64_t max_replicas;
    uint64_t idle_timeout_ms;
    uint64_t startup_timeout_ms;
    uint64_t stop_grace_ms;
    uint64_t stop_drain_ms;
    uint64_t gpu_slices;
    char *mig_profile;          /* a replica takes one MIG instance of this profile; NULL: none */
    uint64_t gpu_memory_bytes;  /* GPU memory a replica needs (placement); 0: not declared */
    uint64_t loading_heartbeat_ms; /* 0: no SSE heartbeats while loading */
    uint64_t target;               /* autoscaler: concurrency per replica; 0: derived */
    uint64_t stable_window_ms;     /* autoscaler: 0: the global one */
    enum prewarm_mode prewarm;     /* PREWARM_INHERIT: autoscaler.prewarm */
    struct config_sleep sleep;
    uint64_t max_concurrency;
    enum tier priority;
    uint64_t max_queue;
    uint64_t queue_timeout_ms;
    uint64_t connect_timeout_ms;
    uint64_t first_byte_timeout_ms;
    uint64_t upstream_idle_timeout_ms;
    /* A model with revisions is a routing entry: each request goes to one of
     * its revisions, which are models of their own in this list, named
     * "<model>@<revision>", with parent and revision set and each with its
     * own command or endpoints, GPU needs and settings (the model's keys are
     * their defaults). */
    struct config_revision *revisions;
    size_t n_revisions;
    bool fallback_to_warm_revision; /* a cold pick goes to a warm revision while it wakes */
    char *sticky_header;            /* a client's revision follows this header's value */
    bool sticky_tenant;             /* ... or its tenant's name */
    struct config_rollout rollout;
    uint64_t percent;  /* a revision: its share (read inside "revisions" only) */
    char *parent;      /* a revision: the model it belongs to; NULL otherwise */
    char *revision;    /* a revision: its name */
    int line;
};

enum gpu_sharing { GPU_TIME_SLICING = 0, GPU_MPS = 1 };

/* A unit of GPU capacity for the process backend: a whole GPU (time-sliced
 * or MPS) or, with `mig`, one MIG instance of GPU `id`. */
struct config_gpu {
    uint64_t id;
    uint64_t slices;
    enum gpu_sharing sharing;
    char *mig;             /* "MIG-<uuid>": a MIG instance; NULL: a whole GPU */
    char *profile;         /* the MIG instance's profile ("1g.10gb") */
    uint64_t memory_bytes; /* framebuffer; 0: not declared */
};

/* Autoscaler defaults (Knative's where it has one); models may override
 * target and the windows. */
struct config_autoscaler {
    uint64_t tick_ms;
    uint64_t stable_window_ms;
    uint64_t panic_window_pct;
    uint64_t panic_threshold_pct;
    uint64_t max_scale_up_rate;
    uint64_t max_scale_down_rate;
    uint64_t scale_down_delay_ms;
    uint64_t activation_scale;
    uint64_t target_utilization_pct; /* target = max_concurrency x this, unless set */
    enum prewarm_mode prewarm;        /* never PREWARM_INHERIT */
    uint64_t prewarm_min_requests;    /* forecast within the horizon that warms a model */
    uint64_t prewarm_lead_ms;         /* horizon when the cold start is shorter or unknown */
    uint64_t prewarm_quiet_ms;        /* an idle model forecast quiet this long is let go */
};

struct config_warm_pool {
    uint64_t budget_slices;   /* slices idle replicas may hold; 0: no warm pool */
    uint64_t capacity_slices; /* cap on slices in use; 0: the GPUs' (or unlimited) */
};

/* Turned on by a "kubernetes" object in the config. */
struct config_kubernetes {
    bool enabled;
    char **namespaces; /* none: all */
    size_t n_namespaces;
    char *label_selector; /* model Deployments; default "thaw.dev/model" */
    char *kubeconfig;     /* below --kubeconfig and $KUBECONFIG */
    char *context;
    bool probe_pods;      /* probe pod IPs directly, ahead of EndpointSlices */
    bool events;          /* post Events on scale decisions */
    bool pull_events;     /* watch pods' Pulling/Pulled Events: the image pull phase */
    uint64_t default_port;
    /* Several activators: a Lease elects the one that scales; peers share demand. */
    bool leader_election;
    char *lease_name;      /* default "thaw-leader" */
    char *lease_namespace; /* default: the credentials' namespace, else "default" */
    char *identity;        /* default: $POD_NAME, else host name and pid */
    uint64_t lease_duration_ms;
    uint64_t renew_interval_ms;
    uint64_t renew_deadline_ms;
    char *peers_service;   /* thaw's own Service: its EndpointSlices list the peers */
    char *peers_namespace;
    uint64_t peers_port;   /* their admin port */
    uint64_t peers_poll_ms;
    uint64_t peers_timeout_ms; /* a peer silent this long drops out of the sum */
    /* Memory per physical GPU of a node without the nvidia.com/gpu.memory
     * label; 0: unknown (replicas' GPU memory not limited there). */
    uint64_t gpu_memory_bytes;
};

/* A tenant's caps on one model (UINT64_MAX: the tenant's own). */
struct config_tenant_model {
    char *model;
    uint64_t max_concurrency;
    uint64_t max_queue;
};

/* A client of thaw: known by API key (SHA-256, never the key itself) or by
 * the value of the trusted gateway header. Caps apply per model. */
struct config_tenant {
    char *name;
    char **api_keys; /* "sha256:<64 hex>" */
    size_t n_api_keys;
    enum tier tier;           /* the highest tier its requests run at */
    uint64_t max_concurrency; /* at one model's replicas; UINT64_MAX: no cap */
    uint64_t max_queue;       /* waiting at one model; UINT64_MAX: no cap */
    uint64_t weight;          /* turns in its tier's round robin */
    struct config_tenant_model *models;
    size_t n_models;
    int line;
};

/* "tenants.source": where the tenants document comes from in cluster mode:
 * a key of a Secret or ConfigMap, watched; NONE: the file's own tenants. */
enum tenants_source_kind { TENANTS_SOURCE_NONE, TENANTS_SOURCE_SECRET, TENANTS_SOURCE_CONFIGMAP };

struct config_tenants_source {
    enum tenants_source_kind kind;
    char *namespace_; /* NULL: thaw's own namespace */
    char *name;
    char *key; /* the data key holding the document */
};

/* "tenants": optional; without it every request is the default tenant's. */
struct config_tenants {
    /* With a source, the rest is the document's, once loaded; until then
     * only required is read from the file (true: 503 until loaded). */
    struct config_tenants_source source;
    bool required;                 /* unknown or missing key: 401 (else the default tenant) */
    char *header;                  /* a gateway's header naming the tenant; NULL: none */
    struct config_tenant default_; /* name "default", no keys */
    struct config_tenant *list;
    size_t n_list;
};

struct config {
    char *path;
    char *listen;
    char *admin_listen;
    enum log_level log_level;
    bool access_log;
    struct config_limits limits;
    struct config_upstream upstream;
    struct config_model *models;
    size_t n_models;
    struct config_gpu *gpus;
    size_t n_gpus;
    /* "gpus": "discover": the process backend lists the GPUs and MIG
     * instances with gpu_discovery_command at start-up. */
    bool gpu_discovery;
    char **gpu_discovery_command; /* default: nvidia-smi -L */
    size_t n_gpu_discovery_command;
    uint64_t gpu_discovery_slices; /* replicas a discovered whole GPU takes (time-slicing) */
    struct config_kubernetes kubernetes;
    struct config_autoscaler autoscaler;
    struct config_warm_pool warm_pool;
    struct config_tenants tenants;
};

struct config_error {
    char msg[768];
};

/* Reads and validates path. NULL on error, with err->msg set to
 * "FILE:LINE: KEY: problem". */
struct config *config_load(const char *path, struct config_error *err);
/* Same on an in-memory text; label names it in errors. */
struct config *config_parse(const char *text, size_t len, const char *label,
                            struct config_error *err);
/* Reads a tenants document (the "tenants" section's keys, without
 * "source") into out, which the caller disposes of (config_tenants_dispose)
 * whatever the result. 0, or -EINVAL with err->msg "LABEL:LINE: KEY:
 * problem" (naming keys, never quoting a value). */
int config_parse_tenants(const char *text, size_t len, const char *label,
                         struct config_tenants *out, struct config_error *err);
void config_tenants_dispose(struct config_tenants *ts);
/* Fills a model with every default but its strings, which stay NULL (for
 * models discovered at run time: the caller points them at its own). */
void config_model_defaults(struct config_model *m, const struct config_limits *lim);
/* queue_timeout_ms's default: 5 minutes, or startup_ms + 1 minute when
 * longer (0: the model is not started by thaw), and at least an hour for a
 * batch model (batch waits for capacity the interactive tiers leave idle
 * rather than being turned away). */
#define CONFIG_BATCH_QUEUE_TIMEOUT_MS 3600000ull
uint64_t config_default_queue_timeout_ms(enum tier priority, uint64_t startup_ms);
/* idle_timeout_ms's default (the scale-to-zero grace): 5 minutes, 30 s for
 * a batch model (a batch request waits out a cold start within its SLO, so
 * an idle batch replica is not worth its GPU; Knative's grace). */
#define CONFIG_IDLE_TIMEOUT_DEFAULT_MS 300000ull
#define CONFIG_BATCH_IDLE_TIMEOUT_MS 30000ull
uint64_t config_default_idle_timeout_ms(enum tier priority);
/* A configuration with every default and no models. */
struct config *config_new_default(void);
void config_free(struct config *cfg);
/* Where cfg->models[i] is in the file, as errors name it: "models[0]." or,
 * for a revision, "models[0].revisions[1].". */
void config_model_prefix(const struct config *cfg, size_t i, char *prefix, size_t n);
/* A health path goes into a request line as it is: it starts with '/' and
 * holds no space or control byte. */
bool config_health_path_ok(const char *path);
/* Would model m's GPU needs fit on a GPU unit while it holds nothing else?
 * unit_profile: a MIG instance's profile, NULL for a whole GPU;
 * unit_memory: its framebuffer, 0 when not declared (not limited). */
bool config_gpu_unit_takes(const struct config_model *m, const char *unit_profile,
                           uint64_t unit_slices, uint64_t unit_memory);
/* Replaces a string field. 0 or -ENOMEM. */
int config_set_string(char **field, const char *value);
/* Validates and sets a listen address given on the command line (flag
 * names it in errors). 0 or -EINVAL with err set. */
int config_set_listen(struct config *cfg, char **field, const char *value, const char *flag,
                      struct config_error *err);

#endif

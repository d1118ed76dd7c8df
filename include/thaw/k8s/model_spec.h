/* A model Deployment read into thaw's terms: its thaw.dev/ annotations
 * (with Knative's autoscaling.knative.dev/ ones read as aliases), on the
 * Deployment or on its pod template (the Deployment's win), the GPU slices
 * its pod template requests, the tier from its priorityClassName, and the
 * port and health path from its container. Pure: no I/O.
 * A bad annotation value is not fatal: the default is kept and the problem
 * is described in `errors` (the model is still served); so is an
 * annotation under thaw.dev/ or autoscaling.knative.dev/ that thaw does not
 * know or cannot honour. */
#ifndef THAW_K8S_MODEL_SPEC_H
#define THAW_K8S_MODEL_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "thaw/config.h"
#include "thaw/tier.h"

/* A cluster model's defaults where they differ from a config model's: the
 * thaw-model chart's startup probe allows a 15-minute load, and streaming
 * clients held through one get ": loading" heartbeats. */
#define K8S_DEFAULT_STARTUP_TIMEOUT_MS (15 * 60 * 1000)
#define K8S_DEFAULT_LOADING_HEARTBEAT_MS 15000
/* Sleep mode in a cluster: a pod sleeps after this long idle (no memory
 * accounting there decides it), and /sleep and /wake_up get this long. */
#define K8S_DEFAULT_IDLE_BEFORE_SLEEP_MS 60000
#define K8S_DEFAULT_SLEEP_TIMEOUT_MS 30000

struct k8s_model_spec {
    char name[254];       /* model name: K8S_MODEL_LABEL value, or the Deployment's */
    char label[254];      /* the K8S_MODEL_LABEL value as written */
    char deployment[254]; /* the Deployment's name */
    char namespace_[254];
    char service[254];
    int port;
    char health_path[128];
    /* The first container has a readinessProbe: its pods' Ready (and their
     * EndpointSlice's ready) means the server answers, not only that the
     * container started. */
    bool readiness_probe;
    enum tier priority;
    uint64_t max_concurrency;
    uint64_t max_queue;
    uint64_t min_scale, max_scale;
    uint64_t idle_timeout_ms, startup_timeout_ms;
    uint64_t queue_timeout_ms;  /* 0 in defaults: derived from startup_timeout_ms */
    bool queue_timeout_set;     /* given by an annotation */
    bool idle_timeout_set;      /* given by an annotation */
    uint64_t connect_timeout_ms, first_byte_timeout_ms, upstream_idle_timeout_ms;
    uint64_t loading_heartbeat_ms; /* 0: none */
    uint64_t target;    /* concurrency target per replica (autoscaler); 0: derived */
    uint64_t target_utilization_pct; /* 0: not given (the global one applies) */
    uint64_t window_ms; /* stable window (autoscaler) */
    uint64_t panic_window_pct, panic_threshold_pct; /* 0: the global ones */
    uint64_t scale_down_delay_ms;
    bool scale_down_delay_set;
    uint64_t activation_scale; /* 0: the global one */
    enum prewarm_mode prewarm; /* PREWARM_INHERIT: autoscaler.prewarm */
    uint64_t initial_scale;    /* replicas right after the Deployment is created */
    bool initial_scale_set;
    int64_t generation;        /* metadata.generation; 1: never changed since creation */
    char hosts[1024];   /* comma-separated, as written */
    char aliases[1024];
    uint64_t gpu_slices;
    uint64_t gpu_memory_bytes; /* thaw.dev/gpu-memory: per replica, on one GPU; 0: not declared */
    /* sleep mode (thaw.dev/sleep-mode, idle-before-sleep, sleep-timeout) */
    uint64_t sleep_level; /* 0: off; 1 or 2: POST /sleep?level=N */
    uint64_t idle_before_sleep_ms;
    uint64_t sleep_timeout_ms;
    /* Revisions: Deployments with the same model name and a revision name
     * (label or annotation thaw.dev/revision) are one model's revisions. */
    char revision[64];           /* "": not a revision */
    uint64_t traffic_percent;    /* thaw.dev/traffic-percent */
    bool traffic_percent_set;
    bool traffic_from_kserve;    /* given as serving.kserve.io/canaryTrafficPercent */
    /* Progressive rollout, on the canary's Deployment (rollout.h); stage and
     * step start are written by thaw so a restarted activator continues. */
    bool rollout;
    uint64_t rollout_step_percent, rollout_step_interval_ms, rollout_min_requests;
    uint64_t rollout_max_error_rate_increase_pct, rollout_max_ttfb_p99_ratio_pct;
    uint64_t rollout_ttfb_p99_tolerance_ms;
    int rollout_stage;            /* enum rollout_stage; -1: not written yet */
    int64_t rollout_step_started; /* wall ms; 0: not written yet */
    bool fallback_to_warm_revision;
    char sticky_header[64];
    int64_t replicas;       /* spec.replicas; missing means 0 */
    int64_t ready_replicas; /* status.readyReplicas */
    char resource_version[64];
    char uid[64]; /* the Deployment's metadata.uid (its Events name it) */
    char errors[1200];
};

/* Defaults come from d (max_concurrency, timeouts, port, ...). 0, or -1
 * when the object is not a usable Deployment (no name). */
int k8s_model_spec_parse(const cJSON *deployment, const struct k8s_model_spec *defaults,
                         struct k8s_model_spec *out);
/* "30s", "5m", "1h30m", "250ms", or plain seconds. 0 or -1. */
int k8s_parse_duration_ms(const char *s, uint64_t *out);
/* Does a K8S_MODEL_LABEL value only mark the Deployment as a model ("",
 * "true") rather than name it? */
bool k8s_model_label_is_marker(const char *value);
/* The queue timeout a cluster model gets when none is given: long enough
 * for a start that takes the whole startup timeout; an hour at least for a
 * batch model. */
uint64_t k8s_default_queue_timeout_ms(uint64_t startup_timeout_ms, enum tier priority);

#endif

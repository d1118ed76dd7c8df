/* A model Deployment read into thaw's terms: its thaw.dev/ annotations
 * (with Knative's autoscaling.knative.dev/ ones read as aliases), the GPU slices
 * its pod template requests, the tier from its priorityClassName, and the
 * port and health path from its container. Pure: no I/O.
 * A bad annotation value is not fatal: the default is kept and the problem
 * is described in `errors` (the model is still served). */
#ifndef THAW_K8S_MODEL_SPEC_H
#define THAW_K8S_MODEL_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "thaw/tier.h"

struct k8s_model_spec {
    char name[254];       /* model name: K8S_MODEL_LABEL value (objects.h), else the Deployment's */
    char deployment[254]; /* the Deployment's name */
    char namespace_[254];
    char service[254];
    int port;
    char health_path[128];
    enum tier priority;
    uint64_t max_concurrency;
    uint64_t min_scale, max_scale;
    uint64_t idle_timeout_ms, startup_timeout_ms;
    uint64_t target;    /* concurrency target per replica (autoscaler) */
    uint64_t window_ms; /* stable window (autoscaler) */
    char hosts[1024];   /* comma-separated, as written */
    char aliases[1024];
    uint64_t gpu_slices;
    int64_t replicas;       /* spec.replicas; missing means 0 */
    int64_t ready_replicas; /* status.readyReplicas */
    char resource_version[64];
    char errors[600];
};

/* Defaults come from d (max_concurrency, idle/startup timeouts, port). 0, or
 * -1 when the object is not a usable Deployment (no name). */
int k8s_model_spec_parse(const cJSON *deployment, const struct k8s_model_spec *defaults,
                         struct k8s_model_spec *out);
/* "30s", "5m", "1h30m", "250ms", or plain seconds. 0 or -1. */
int k8s_parse_duration_ms(const char *s, uint64_t *out);

#endif

#include "thaw/k8s/model_spec.h"
#include "thaw/k8s/informer.h"
#include "thaw/k8s/objects.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int k8s_parse_duration_ms(const char *s, uint64_t *out)
{
    if (!s || !*s) {
        return -1;
    }
    char *end;
    /* Plain number: seconds (as Knative's integer annotations). */
    unsigned long long plain = strtoull(s, &end, 10);
    if (*end == '\0' && isdigit((unsigned char)s[0])) {
        if (plain > UINT64_MAX / 1000) {
            return -1;
        }
        *out = plain * 1000;
        return 0;
    }
    uint64_t total = 0;
    const char *p = s;
    while (*p) {
        if (!isdigit((unsigned char)*p)) {
            return -1;
        }
        double v = strtod(p, &end);
        if (end == p) {
            return -1;
        }
        p = end;
        uint64_t mult;
        if (strncmp(p, "ms", 2) == 0) {
            mult = 1;
            p += 2;
        } else if (*p == 's') {
            mult = 1000;
            p++;
        } else if (*p == 'm') {
            mult = 60000;
            p++;
        } else if (*p == 'h') {
            mult = 3600000;
            p++;
        } else {
            return -1;
        }
        /* Past about 584 million years a duration is nonsense (and its
         * conversion to an integer undefined). */
        double part = v * (double)mult;
        if (!(part < 1e19) || (uint64_t)part > UINT64_MAX - total) {
            return -1;
        }
        total += (uint64_t)part;
    }
    *out = total;
    return 0;
}

static void add_error(struct k8s_model_spec *o, const char *key, const char *value,
                      const char *what)
{
    size_t n = strlen(o->errors);
    snprintf(o->errors + n, sizeof o->errors - n, "%s%s: \"%.60s\" %s", n ? "; " : "", key, value,
             what);
}

static const char *annotation(const cJSON *anns, const char *key, const char *alias,
                              const char **used)
{
    const cJSON *item = cJSON_IsObject(anns) ? cJSON_GetObjectItemCaseSensitive(anns, key) : NULL;
    const char *v = cJSON_IsString(item) ? item->valuestring : NULL;
    *used = key;
    if (!v && alias) {
        item = cJSON_IsObject(anns) ? cJSON_GetObjectItemCaseSensitive(anns, alias) : NULL;
        v = cJSON_IsString(item) ? item->valuestring : NULL;
        *used = alias;
    }
    return v;
}

static void read_uint(const cJSON *anns, const char *key, const char *alias, uint64_t min,
                      uint64_t max, uint64_t *field, struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, key, alias, &used);
    if (!v) {
        return;
    }
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end || !*v || v[0] == '-') {
        add_error(o, used, v, "is not a whole number; using the default");
        return;
    }
    if (n < min || n > max) {
        char what[96];
        snprintf(what, sizeof what, "is out of range %llu..%llu; using the default",
                 (unsigned long long)min, (unsigned long long)max);
        add_error(o, used, v, what);
        return;
    }
    *field = n;
}

static void read_duration(const cJSON *anns, const char *key, const char *alias, uint64_t *field,
                          struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, key, alias, &used);
    if (!v) {
        return;
    }
    uint64_t ms;
    if (k8s_parse_duration_ms(v, &ms)) {
        add_error(o, used, v, "is not a duration (like 30s, 5m, 1h); using the default");
        return;
    }
    *field = ms;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

/* A replica count; never negative, at most INT64_MAX. */
static int64_t replica_count(const cJSON *v)
{
    uint64_t n = k8s_json_count(v);
    return n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
}

/* nvidia.com/gpu of all containers (requests, else limits). */
static uint64_t gpu_slices(const cJSON *pod_spec)
{
    uint64_t total = 0;
    const cJSON *containers = cJSON_GetObjectItemCaseSensitive(pod_spec, "containers");
    const cJSON *c;
    cJSON_ArrayForEach(c, containers)
    {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(c, "resources");
        const cJSON *req = k8s_get(res, "requests");
        const cJSON *lim = k8s_get(res, "limits");
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(req, "nvidia.com/gpu");
        if (!g) {
            g = cJSON_GetObjectItemCaseSensitive(lim, "nvidia.com/gpu");
        }
        uint64_t n = cJSON_IsString(g) ? strtoull(g->valuestring, NULL, 10) : k8s_json_count(g);
        total = n > UINT64_MAX - total ? UINT64_MAX : total + n;
    }
    return total;
}

int k8s_model_spec_parse(const cJSON *dep, const struct k8s_model_spec *d,
                         struct k8s_model_spec *o)
{
    *o = *d;
    o->errors[0] = '\0';
    const char *name = k8s_get_string(dep, "metadata.name");
    if (!name) {
        return -1;
    }
    copy_str(o->deployment, sizeof o->deployment, name);
    copy_str(o->namespace_, sizeof o->namespace_, k8s_get_string(dep, "metadata.namespace"));
    copy_str(o->resource_version, sizeof o->resource_version,
             k8s_get_string(dep, "metadata.resourceVersion"));
    const cJSON *labels = k8s_get(dep, "metadata.labels");
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(labels, K8S_MODEL_LABEL);
    copy_str(o->name, sizeof o->name,
             cJSON_IsString(ml) && ml->valuestring[0] ? ml->valuestring : name);
    copy_str(o->service, sizeof o->service, name);
    const cJSON *anns = k8s_get(dep, "metadata.annotations");
    const cJSON *replicas = k8s_get(dep, "spec.replicas");
    o->replicas = replica_count(replicas);
    o->ready_replicas = replica_count(k8s_get(dep, "status.readyReplicas"));

    const cJSON *pod_spec = k8s_get(dep, "spec.template.spec");
    o->gpu_slices = gpu_slices(pod_spec);
    /* Port and health path from the first container, when it says. */
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pod_spec, "containers"),
                                         0);
    const cJSON *p0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c0, "ports"), 0);
    const cJSON *cport = cJSON_GetObjectItemCaseSensitive(p0, "containerPort");
    if (cJSON_IsNumber(cport)) {
        o->port = cport->valueint;
    }
    const char *rpath = k8s_get_string(c0, "readinessProbe.httpGet.path");
    if (rpath) {
        copy_str(o->health_path, sizeof o->health_path, rpath);
    }
    /* Tier from the pod's PriorityClass name, e.g. "thaw-critical". */
    const char *pc = k8s_get_string(pod_spec, "priorityClassName");
    if (pc) {
        static const char *const suffix[TIER_COUNT] = {"critical", "standard", "batch"};
        for (int t = 0; t < TIER_COUNT; t++) {
            size_t pl = strlen(pc), sl = strlen(suffix[t]);
            if (pl >= sl && strcmp(pc + pl - sl, suffix[t]) == 0) {
                o->priority = (enum tier)t;
            }
        }
    }

    const char *used;
    const char *v = annotation(anns, "thaw.dev/priority", NULL, &used);
    if (v && tier_parse(v, strlen(v), &o->priority)) {
        add_error(o, used, v, "is not critical, standard or batch; using the default");
    }
    read_uint(anns, "thaw.dev/max-concurrency", "autoscaling.knative.dev/container-concurrency", 1,
              100000, &o->max_concurrency, o);
    read_uint(anns, "thaw.dev/min-scale", "autoscaling.knative.dev/min-scale", 0, 1000,
              &o->min_scale, o);
    read_uint(anns, "thaw.dev/max-scale", "autoscaling.knative.dev/max-scale", 1, 1000,
              &o->max_scale, o);
    read_uint(anns, "thaw.dev/target", "autoscaling.knative.dev/target", 1, 100000, &o->target, o);
    read_duration(anns, "thaw.dev/window", "autoscaling.knative.dev/window", &o->window_ms, o);
    read_duration(anns, "thaw.dev/idle-timeout",
                  "autoscaling.knative.dev/scale-to-zero-pod-retention-period",
                  &o->idle_timeout_ms, o);
    read_duration(anns, "thaw.dev/startup-timeout", NULL, &o->startup_timeout_ms, o);
    uint64_t port = (uint64_t)o->port;
    read_uint(anns, "thaw.dev/port", NULL, 1, 65535, &port, o);
    o->port = (int)port;
    v = annotation(anns, "thaw.dev/health-path", NULL, &used);
    if (v) {
        if (v[0] != '/') {
            add_error(o, used, v, "does not start with '/'; using the default");
        } else {
            copy_str(o->health_path, sizeof o->health_path, v);
        }
    }
    v = annotation(anns, "thaw.dev/service", NULL, &used);
    if (v && *v) {
        copy_str(o->service, sizeof o->service, v);
    }
    v = annotation(anns, "thaw.dev/hosts", NULL, &used);
    copy_str(o->hosts, sizeof o->hosts, v);
    v = annotation(anns, "thaw.dev/aliases", NULL, &used);
    copy_str(o->aliases, sizeof o->aliases, v);
    if (o->min_scale > o->max_scale) {
        char mv[32];
        snprintf(mv, sizeof mv, "%llu", (unsigned long long)o->min_scale);
        add_error(o, "thaw.dev/min-scale", mv, "is above max-scale; using 0");
        o->min_scale = 0;
    }
    return 0;
}

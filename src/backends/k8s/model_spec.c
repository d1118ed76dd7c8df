#include "thaw/k8s/model_spec.h"
#include "thaw/config.h"
#include "thaw/k8s/informer.h"
#include "thaw/k8s/objects.h"
#include "thaw/k8s/json.h"
#include "thaw/jsonscan.h"
#include "thaw/rollout.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
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

/* The longest name in a list separated by commas or spaces. */
static size_t longest_name(const char *list)
{
    size_t longest = 0;
    while (*list) {
        size_t n = strcspn(list, ", ");
        longest = n > longest ? n : longest;
        list += n;
        list += strspn(list, ", ");
    }
    return longest;
}

static void add_error(struct k8s_model_spec *o, const char *key, const char *value,
                      const char *what)
{
    /* The value as written, cut short and with anything unprintable masked:
     * it goes to logs and Events. */
    char shown[64];
    size_t i = 0;
    for (; value[i] && i < sizeof shown - 1; i++) {
        unsigned char ch = (unsigned char)value[i];
        shown[i] = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
    }
    shown[i] = '\0';
    size_t n = strlen(o->errors);
    snprintf(o->errors + n, sizeof o->errors - n, "%s%s: \"%s\" %s", n ? "; " : "", key, shown,
             what);
}

/* Where annotations are read: the Deployment's, then its pod template's
 * (where Knative users put them, on the revision template). */
struct ann_src {
    const cJSON *dep, *tpl;
};

static const cJSON *ann_item(const struct ann_src *a, const char *key)
{
    const cJSON *objs[2] = {a->dep, a->tpl};
    for (int i = 0; i < 2; i++) {
        const cJSON *item =
            cJSON_IsObject(objs[i]) ? cJSON_GetObjectItemCaseSensitive(objs[i], key) : NULL;
        if (cJSON_IsString(item)) {
            return item;
        }
    }
    return NULL;
}

static const char *ann_lookup(const struct ann_src *a, const char *key)
{
    const cJSON *item = ann_item(a, key);
    return item ? item->valuestring : NULL;
}

static const char KNATIVE_PREFIX[] = "autoscaling.knative.dev/";

/* Knative's keys before 1.0 were camelCase (minScale, panicWindowPercentage),
 * and Knative still reads them: the dashed form of such a key, in out. */
static const char *knative_dashed(const char *key, char *out, size_t len)
{
    size_t n = 0;
    for (const char *k = key; *k && n + 2 < len; k++) {
        if (*k >= 'A' && *k <= 'Z') {
            out[n++] = '-';
            out[n++] = (char)(*k - 'A' + 'a');
        } else {
            out[n++] = *k;
        }
    }
    out[n] = '\0';
    return out;
}

/* The camelCase spelling of a dashed Knative key, in out. */
static const char *knative_camel(const char *key, char *out, size_t len)
{
    size_t n = 0;
    for (const char *k = key; *k && n + 1 < len; k++) {
        if (*k == '-' && k[1] >= 'a' && k[1] <= 'z' && k > key) {
            out[n++] = (char)(*++k - 'a' + 'A');
        } else {
            out[n++] = *k;
        }
    }
    out[n] = '\0';
    return out;
}

/* thaw's key wins over its Knative alias; of the alias's spellings, the
 * Deployment's win over the pod template's, and on one object the dashed
 * one over the camelCase one (Knative's order). *used names the one found. */
static const char *annotation(const struct ann_src *a, const char *key, const char *alias,
                              const char **used)
{
    const char *v = ann_lookup(a, key);
    *used = key;
    if (v || !alias) {
        return v;
    }
    char camel[128] = "";
    if (strncmp(alias, KNATIVE_PREFIX, sizeof KNATIVE_PREFIX - 1) == 0) {
        knative_camel(alias, camel, sizeof camel);
    }
    const cJSON *objs[2] = {a->dep, a->tpl};
    for (int i = 0; i < 2; i++) {
        if (!cJSON_IsObject(objs[i])) {
            continue;
        }
        const char *names[2] = {alias, camel};
        for (int n = 0; n < 2 && names[n][0]; n++) {
            const cJSON *item = cJSON_GetObjectItemCaseSensitive(objs[i], names[n]);
            if (cJSON_IsString(item)) {
                *used = item->string; /* lives as long as the object */
                return item->valuestring;
            }
        }
    }
    return NULL;
}

/* Knative writes some numbers as decimals ("150.0", target "0.5"): from a
 * Knative key, a decimal is taken rounded to the nearest whole number (half
 * up). 0, or -1 when v is not a plain decimal. */
static int knative_decimal(const char *v, unsigned long long *out)
{
    const char *dot = strchr(v, '.');
    if (!dot || dot == v || !dot[1]) {
        return -1;
    }
    for (const char *c = v; *c; c++) {
        if (c != dot && !isdigit((unsigned char)*c)) {
            return -1;
        }
    }
    errno = 0;
    unsigned long long whole = strtoull(v, NULL, 10);
    if (errno == ERANGE || whole == ULLONG_MAX) {
        return -1;
    }
    /* Below 1 but above 0 (a target of "0.3") is 1, the least thaw takes,
     * not 0, which no key that may be a decimal accepts. */
    bool fraction = strspn(dot + 1, "0") != strlen(dot + 1);
    *out = whole == 0 && fraction ? 1 : whole + (dot[1] >= '5');
    return 0;
}

static const char *out_of_range(char *what, size_t len, uint64_t min, uint64_t max,
                                 bool duration)
{
    if (duration) {
        snprintf(what, len, "is out of range %llums..%llums; using the default",
                 (unsigned long long)min, (unsigned long long)max);
    } else {
        snprintf(what, len, "is out of range %llu..%llu; using the default",
                 (unsigned long long)min, (unsigned long long)max);
    }
    return what;
}

/* true when the annotation was given and valid (and stored). */
static bool read_uint(const struct ann_src *anns, const char *key, const char *alias,
                      uint64_t min, uint64_t max, uint64_t *field, struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, key, alias, &used);
    if (!v) {
        return false;
    }
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    bool knative = strncmp(used, KNATIVE_PREFIX, sizeof KNATIVE_PREFIX - 1) == 0;
    if ((*end || !*v || !isdigit((unsigned char)v[0])) && !(knative && !knative_decimal(v, &n))) {
        add_error(o, used, v, "is not a whole number; using the default");
        return false;
    }
    if (n < min || n > max) {
        char what[96];
        add_error(o, used, v, out_of_range(what, sizeof what, min, max, false));
        return false;
    }
    *field = n;
    return true;
}

static bool read_duration(const struct ann_src *anns, const char *key, const char *alias,
                          uint64_t min_ms, uint64_t max_ms, uint64_t *field,
                          struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, key, alias, &used);
    if (!v) {
        return false;
    }
    uint64_t ms;
    if (k8s_parse_duration_ms(v, &ms)) {
        add_error(o, used, v, "is not a duration (like 90s, 15m, 1h30m, or seconds); "
                              "using the default");
        return false;
    }
    if (ms < min_ms || ms > max_ms) {
        char what[96];
        add_error(o, used, v, out_of_range(what, sizeof what, min_ms, max_ms, true));
        return false;
    }
    *field = ms;
    return true;
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

/* Does any container ask for a MIG instance (nvidia.com/mig-<profile>)? */
static bool requests_mig(const cJSON *pod_spec)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(pod_spec, "containers"))
    {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(c, "resources");
        const char *const parts[] = {"requests", "limits"};
        for (int i = 0; i < 2; i++) {
            const cJSON *r;
            cJSON_ArrayForEach(r, k8s_get(res, parts[i]))
            {
                if (r->string && strncmp(r->string, "nvidia.com/mig-", 15) == 0) {
                    return true;
                }
            }
        }
    }
    return false;
}

/* thaw.dev/gpu-memory: a quantity of bytes. A bad value leaves the model's
 * memory undeclared (not limited), and says so. */
static void read_gpu_memory(const struct ann_src *anns, const cJSON *pod_spec,
                            struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, "thaw.dev/gpu-memory", NULL, &used);
    uint64_t bytes;
    if (!v) {
        return;
    }
    if (k8s_parse_quantity(v, &bytes)) {
        add_error(o, used, v, "is not a quantity of bytes (like 20Gi, 24000Mi, 16G or plain "
                              "bytes); the model's GPU memory is not limited");
    } else if (bytes && requests_mig(pod_spec)) {
        add_error(o, used, v, "does not apply to a MIG instance (its profile has its own "
                              "memory); ignored");
    } else {
        o->gpu_memory_bytes = bytes;
    }
}

#define H (3600ull * 1000)
#define DAY (24 * H)

bool k8s_model_label_is_marker(const char *value)
{
    return !value || !*value || strcmp(value, "true") == 0;
}

uint64_t k8s_default_queue_timeout_ms(uint64_t startup_timeout_ms, enum tier priority)
{
    /* A minute past the startup timeout: a request that arrives as a start
     * begins is still held when a pod gets ready at the last moment, and a
     * start that fails is answered 503 start_failed (by the startup timeout)
     * rather than 504. Never below the config models' default of 5 minutes,
     * nor an hour for batch (config_default_queue_timeout_ms). */
    return config_default_queue_timeout_ms(priority, startup_timeout_ms ? startup_timeout_ms : 1);
}

static const char THAW_PREFIX[] = "thaw.dev/";

/* Every annotation read below, without its prefix; and last-request-at,
 * which thaw itself writes (the idle clock, idle.c), not a setting. */
static const char *const thaw_keys[] = {
    "last-request-at",
    "priority", "max-concurrency", "max-queue", "queue-timeout", "connect-timeout",
    "first-byte-timeout", "upstream-idle-timeout", "loading-heartbeat", "min-scale", "max-scale",
    "initial-scale", "activation-scale", "target", "target-utilization-percentage", "window",
    "panic-window-percentage", "panic-threshold-percentage", "scale-down-delay", "idle-timeout",
    "startup-timeout", "port", "health-path", "service", "hosts", "aliases", "prewarm",
    "sleep-mode", "idle-before-sleep", "sleep-timeout", "gpu-memory",
    "revision", "traffic-percent", "rollout", "rollout-step-percent", "rollout-step-interval",
    "rollout-min-requests", "rollout-max-error-rate-increase-percent",
    "rollout-max-ttfb-p99-ratio-percent", "rollout-ttfb-p99-tolerance", "rollout-stage", "rollout-step-started-at",
    "fallback-to-warm-revision", "sticky-header", NULL};
static const char *const knative_keys[] = {
    "class", "metric", "container-concurrency", "min-scale", "max-scale", "initial-scale",
    "activation-scale", "target", "target-utilization-percentage", "window",
    "panic-window-percentage", "panic-threshold-percentage", "scale-down-delay",
    "scale-to-zero-pod-retention-period", "target-burst-capacity", NULL};

static bool in_list(const char *const *list, const char *key)
{
    for (; *list; list++) {
        if (strcmp(*list, key) == 0) {
            return true;
        }
    }
    return false;
}

/* Annotations under thaw's or Knative's prefix that nothing reads are
 * reported, not dropped without a word (a typo would otherwise pass). */
static void report_unknown(const cJSON *anns, const cJSON *shadow, struct k8s_model_spec *o)
{
    const cJSON *a;
    cJSON_ArrayForEach(a, anns)
    {
        const char *k = a->string;
        if (!k || (shadow && cJSON_GetObjectItemCaseSensitive(shadow, k))) {
            continue; /* reported once, for the Deployment's copy */
        }
        const char *v = cJSON_IsString(a) ? a->valuestring : "";
        if (strncmp(k, THAW_PREFIX, sizeof THAW_PREFIX - 1) == 0) {
            const char *rest = k + sizeof THAW_PREFIX - 1;
            if (strcmp(rest, "model") == 0) {
                add_error(o, k, v, "is read from the labels, not the annotations; ignored");
            } else if (!in_list(thaw_keys, rest)) {
                add_error(o, k, v, "is not an annotation thaw knows; ignored");
            }
        } else if (strncmp(k, KNATIVE_PREFIX, sizeof KNATIVE_PREFIX - 1) == 0) {
            char dashed[128];
            const char *rest = knative_dashed(k + sizeof KNATIVE_PREFIX - 1, dashed, sizeof dashed);
            if (strcmp(rest, "target-burst-capacity") == 0) {
                add_error(o, k, v, "is not supported (thaw always stays in the request path "
                                   "and queues); ignored");
            } else if (!in_list(knative_keys, rest)) {
                add_error(o, k, v, "is not a Knative autoscaling annotation thaw supports; "
                                   "ignored");
            }
        }
    }
}

/* class and metric: thaw's autoscaler is Knative's KPA on concurrency. */
static void read_knative_mode(const struct ann_src *anns, struct k8s_model_spec *o)
{
    const char *v = ann_lookup(anns, "autoscaling.knative.dev/class");
    if (v && strcmp(v, "kpa.autoscaling.knative.dev") != 0) {
        add_error(o, "autoscaling.knative.dev/class", v,
                  "is not supported (thaw's autoscaler is kpa.autoscaling.knative.dev); "
                  "using it anyway");
    }
    v = ann_lookup(anns, "autoscaling.knative.dev/metric");
    if (v && strcmp(v, "concurrency") != 0) {
        add_error(o, "autoscaling.knative.dev/metric", v,
                  strcmp(v, "rps") == 0
                      ? "is not supported (thaw scales on concurrency: requests in flight and "
                        "queued); using concurrency"
                      : "is not supported (only concurrency); using concurrency");
    }
}

static void read_settings(const struct ann_src *anns, struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, "thaw.dev/priority", NULL, &used);
    if (v && tier_parse(v, strlen(v), &o->priority)) {
        add_error(o, used, v, "is not critical, standard or batch; using the default");
    }
    read_uint(anns, "thaw.dev/max-concurrency", "autoscaling.knative.dev/container-concurrency", 1,
              100000, &o->max_concurrency, o);
    read_uint(anns, "thaw.dev/max-queue", NULL, 0, 1000000, &o->max_queue, o);
    o->queue_timeout_set =
        read_duration(anns, "thaw.dev/queue-timeout", NULL, 1, DAY, &o->queue_timeout_ms, o);
    read_duration(anns, "thaw.dev/connect-timeout", NULL, 1, 10 * 60000, &o->connect_timeout_ms,
                  o);
    read_duration(anns, "thaw.dev/first-byte-timeout", NULL, 1, DAY, &o->first_byte_timeout_ms,
                  o);
    read_duration(anns, "thaw.dev/upstream-idle-timeout", NULL, 1, DAY,
                  &o->upstream_idle_timeout_ms, o);
    read_duration(anns, "thaw.dev/loading-heartbeat", NULL, 0, 10 * 60000,
                  &o->loading_heartbeat_ms, o);
    o->idle_timeout_set = read_duration(anns, "thaw.dev/idle-timeout",
                  "autoscaling.knative.dev/scale-to-zero-pod-retention-period", 0, DAY,
                  &o->idle_timeout_ms, o);
    read_duration(anns, "thaw.dev/startup-timeout", NULL, 1, DAY, &o->startup_timeout_ms, o);
}

static void read_prewarm(const struct ann_src *anns, struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, "thaw.dev/prewarm", NULL, &used);
    if (!v) {
        return;
    }
    static const char *const names[] = {"off", "on", "shadow"};
    static const enum prewarm_mode modes[] = {PREWARM_OFF, PREWARM_ON, PREWARM_SHADOW};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(v, names[i]) == 0) {
            o->prewarm = modes[i];
            return;
        }
    }
    add_error(o, used, v, "is not off, on or shadow; using autoscaler.prewarm");
}

/* thaw.dev/sleep-mode: "true" or "1" (level 1), "2", "false" or "0" (off). */
static void read_sleep(const struct ann_src *anns, struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, "thaw.dev/sleep-mode", NULL, &used);
    if (v) {
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) {
            o->sleep_level = 1;
        } else if (strcmp(v, "2") == 0) {
            o->sleep_level = 2;
        } else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) {
            o->sleep_level = 0;
        } else {
            add_error(o, used, v, "is not true, false, 1 or 2; sleep mode stays off");
        }
    }
    read_duration(anns, "thaw.dev/idle-before-sleep", NULL, 1, DAY, &o->idle_before_sleep_ms, o);
    read_duration(anns, "thaw.dev/sleep-timeout", NULL, 1, 10 * 60000, &o->sleep_timeout_ms, o);
}

static void read_scaling(const struct ann_src *anns, struct k8s_model_spec *o)
{
    read_uint(anns, "thaw.dev/min-scale", "autoscaling.knative.dev/min-scale", 0, 1000,
              &o->min_scale, o);
    read_uint(anns, "thaw.dev/max-scale", "autoscaling.knative.dev/max-scale", 1, 1000,
              &o->max_scale, o);
    o->initial_scale_set = read_uint(anns, "thaw.dev/initial-scale",
                                     "autoscaling.knative.dev/initial-scale", 0, 1000,
                                     &o->initial_scale, o);
    read_uint(anns, "thaw.dev/activation-scale", "autoscaling.knative.dev/activation-scale", 1,
              1000, &o->activation_scale, o);
    read_uint(anns, "thaw.dev/target", "autoscaling.knative.dev/target", 1, 100000, &o->target, o);
    read_uint(anns, "thaw.dev/target-utilization-percentage",
              "autoscaling.knative.dev/target-utilization-percentage", 1, 100,
              &o->target_utilization_pct, o);
    read_duration(anns, "thaw.dev/window", "autoscaling.knative.dev/window", 6000, H,
                  &o->window_ms, o);
    read_uint(anns, "thaw.dev/panic-window-percentage",
              "autoscaling.knative.dev/panic-window-percentage", 1, 100, &o->panic_window_pct, o);
    read_uint(anns, "thaw.dev/panic-threshold-percentage",
              "autoscaling.knative.dev/panic-threshold-percentage", 110, 1000,
              &o->panic_threshold_pct, o);
    o->scale_down_delay_set =
        read_duration(anns, "thaw.dev/scale-down-delay", "autoscaling.knative.dev/scale-down-delay",
                      0, H, &o->scale_down_delay_ms, o);
    read_prewarm(anns, o);
    read_knative_mode(anns, o);
}

static void read_routing(const struct ann_src *anns, struct k8s_model_spec *o)
{
    const char *used;
    uint64_t port = (uint64_t)o->port;
    read_uint(anns, "thaw.dev/port", NULL, 1, 65535, &port, o);
    o->port = (int)port;
    const char *v = annotation(anns, "thaw.dev/health-path", NULL, &used);
    if (v) {
        if (!config_health_path_ok(v)) {
            add_error(o, used, v,
                      "does not start with '/' or holds a space or control character; using the "
                      "default");
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
    if (v && longest_name(v) > JSONSCAN_MODEL_MAX) {
        add_error(o, used, v, "names an alias longer than 256 bytes, which no request can name");
    }
}

static bool read_bool(const struct ann_src *anns, const char *key, bool *field,
                      struct k8s_model_spec *o)
{
    const char *used;
    const char *v = annotation(anns, key, NULL, &used);
    if (!v) {
        return false;
    }
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
        add_error(o, used, v, "is not true or false; using the default");
        return false;
    }
    *field = strcmp(v, "true") == 0;
    return true;
}

static bool name_chars_ok(const char *v)
{
    for (const char *c = v; *c; c++) {
        if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '.' || *c == '_')) {
            return false;
        }
    }
    return *v != '\0';
}

/* The revision (label, else annotation), its share and the rollout. */
static void read_revision(const cJSON *labels, const struct ann_src *anns,
                          struct k8s_model_spec *o)
{
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(labels, "thaw.dev/revision");
    const char *used;
    const char *v = cJSON_IsString(rl) ? rl->valuestring
                                       : annotation(anns, "thaw.dev/revision", NULL, &used);
    if (v && (strlen(v) >= sizeof o->revision || !name_chars_ok(v))) {
        add_error(o, "thaw.dev/revision", v, "is not a revision name (letters, digits, '-', "
                                             "'.', '_'; at most 63); not a revision");
        v = NULL;
    }
    copy_str(o->revision, sizeof o->revision, v);
    o->traffic_percent_set = read_uint(anns, "thaw.dev/traffic-percent",
                                       "serving.kserve.io/canaryTrafficPercent", 0, 100,
                                       &o->traffic_percent, o);
    o->traffic_from_kserve = o->traffic_percent_set &&
                             !ann_lookup(anns, "thaw.dev/traffic-percent");
    read_bool(anns, "thaw.dev/rollout", &o->rollout, o);
    read_uint(anns, "thaw.dev/rollout-step-percent", NULL, 1, 100, &o->rollout_step_percent, o);
    read_duration(anns, "thaw.dev/rollout-step-interval", NULL, 100, DAY,
                  &o->rollout_step_interval_ms, o);
    read_uint(anns, "thaw.dev/rollout-min-requests", NULL, 1, 1000000, &o->rollout_min_requests,
              o);
    read_uint(anns, "thaw.dev/rollout-max-error-rate-increase-percent", NULL, 0, 100,
              &o->rollout_max_error_rate_increase_pct, o);
    read_uint(anns, "thaw.dev/rollout-max-ttfb-p99-ratio-percent", NULL, 100, 10000,
              &o->rollout_max_ttfb_p99_ratio_pct, o);
    read_duration(anns, "thaw.dev/rollout-ttfb-p99-tolerance", NULL, 0, 10 * 60000,
                  &o->rollout_ttfb_p99_tolerance_ms, o);
    v = annotation(anns, "thaw.dev/rollout-stage", NULL, &used);
    o->rollout_stage = v ? rollout_stage_parse(v, strlen(v)) : -1;
    if (v && o->rollout_stage < 0) {
        add_error(o, used, v, "is not progressing, promoted or rolled_back; starting over");
    }
    v = annotation(anns, "thaw.dev/rollout-step-started-at", NULL, &used);
    o->rollout_step_started = 0;
    if (v && (k8s_time_parse_ms(v, &o->rollout_step_started) || o->rollout_step_started <= 0)) {
        add_error(o, used, v, "is not an RFC 3339 time; the step starts now");
        o->rollout_step_started = 0;
    }
    read_bool(anns, "thaw.dev/fallback-to-warm-revision", &o->fallback_to_warm_revision, o);
    v = annotation(anns, "thaw.dev/sticky-header", NULL, &used);
    o->sticky_header[0] = '\0';
    if (v && (strlen(v) >= sizeof o->sticky_header || !name_chars_ok(v))) {
        add_error(o, used, v, "is not a header name; no sticky header");
    } else if (v) {
        for (size_t i = 0; v[i]; i++) {
            o->sticky_header[i] = (char)tolower((unsigned char)v[i]);
            o->sticky_header[i + 1] = '\0';
        }
    }
}

/* Settings that depend on one another, once all are read. */
static void reconcile(struct k8s_model_spec *o)
{
    if (o->min_scale > o->max_scale) {
        char mv[32];
        snprintf(mv, sizeof mv, "%llu", (unsigned long long)o->min_scale);
        add_error(o, "thaw.dev/min-scale", mv, "is above max-scale; using 0");
        o->min_scale = 0;
    }
    if (!o->idle_timeout_set) {
        o->idle_timeout_ms = config_default_idle_timeout_ms(o->priority);
    }
    if (!o->queue_timeout_set) {
        o->queue_timeout_ms = k8s_default_queue_timeout_ms(o->startup_timeout_ms, o->priority);
    }
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
    copy_str(o->uid, sizeof o->uid, k8s_get_string(dep, "metadata.uid"));
    const cJSON *gen = k8s_get(dep, "metadata.generation");
    o->generation = cJSON_IsNumber(gen) ? (int64_t)k8s_json_count(gen) : 0;
    const cJSON *labels = k8s_get(dep, "metadata.labels");
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(labels, K8S_MODEL_LABEL);
    copy_str(o->label, sizeof o->label, cJSON_IsString(ml) ? ml->valuestring : "");
    /* A marker value ("true", "") names the model after its Deployment. */
    copy_str(o->name, sizeof o->name, k8s_model_label_is_marker(o->label) ? name : o->label);
    copy_str(o->service, sizeof o->service, name);
    struct ann_src anns = {k8s_get(dep, "metadata.annotations"),
                           k8s_get(dep, "spec.template.metadata.annotations")};
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
    o->readiness_probe = k8s_get(c0, "readinessProbe") != NULL;
    const char *rpath = k8s_get_string(c0, "readinessProbe.httpGet.path");
    if (rpath && config_health_path_ok(rpath)) {
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
    read_settings(&anns, o);
    read_sleep(&anns, o);
    read_scaling(&anns, o);
    read_routing(&anns, o);
    read_gpu_memory(&anns, pod_spec, o);
    read_revision(labels, &anns, o);
    report_unknown(anns.dep, NULL, o);
    report_unknown(anns.tpl, anns.dep, o);
    reconcile(o);
    return 0;
}

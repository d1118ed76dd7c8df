#include "thaw/k8s/objects.h"
#include "thaw/k8s/informer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void copy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

int k8s_pod_decode(const cJSON *obj, struct k8s_pod_info *o)
{
    memset(o, 0, sizeof *o);
    const char *name = k8s_get_string(obj, "metadata.name");
    if (!name) {
        return -1;
    }
    copy(o->name, sizeof o->name, name);
    copy(o->namespace_, sizeof o->namespace_, k8s_get_string(obj, "metadata.namespace"));
    const cJSON *ml =
        cJSON_GetObjectItemCaseSensitive(k8s_get(obj, "metadata.labels"), K8S_MODEL_LABEL);
    copy(o->model, sizeof o->model, cJSON_IsString(ml) ? ml->valuestring : NULL);
    copy(o->created, sizeof o->created, k8s_get_string(obj, "metadata.creationTimestamp"));
    const cJSON *ref;
    cJSON_ArrayForEach(ref, k8s_get(obj, "metadata.ownerReferences"))
    {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ref, "controller"))) {
            copy(o->owner, sizeof o->owner, k8s_get_string(ref, "name"));
            break;
        }
    }
    copy(o->ip, sizeof o->ip, k8s_get_string(obj, "status.podIP"));
    copy(o->phase, sizeof o->phase, k8s_get_string(obj, "status.phase"));
    o->running = strcmp(o->phase, "Running") == 0;
    o->terminating = k8s_get(obj, "metadata.deletionTimestamp") != NULL ||
                     strcmp(o->phase, "Failed") == 0 || strcmp(o->phase, "Succeeded") == 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, k8s_get(obj, "status.conditions"))
    {
        const char *type = k8s_get_string(c, "type");
        const char *status = k8s_get_string(c, "status");
        const char *reason = k8s_get_string(c, "reason");
        if (type && strcmp(type, "PodScheduled") == 0 && status && strcmp(status, "False") == 0 &&
            reason && strcmp(reason, "Unschedulable") == 0) {
            o->unschedulable = true;
            copy(o->unschedulable_message, sizeof o->unschedulable_message,
                 k8s_get_string(c, "message"));
        }
    }
    return 0;
}

static const char *label_value(const cJSON *labels, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(labels, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* values is a non-empty array of strings: 1 when v is one of them, 0 when
 * not; -1 when values is not such an array. */
static int among(const cJSON *values, const char *v)
{
    if (!cJSON_IsArray(values) || cJSON_GetArraySize(values) == 0) {
        return -1;
    }
    int found = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, values)
    {
        if (!cJSON_IsString(x)) {
            return -1;
        }
        if (v && strcmp(x->valuestring, v) == 0) {
            found = 1;
        }
    }
    return found;
}

/* 1: the requirement holds, 0: it does not, -1: malformed. */
static int requirement_holds(const cJSON *req, const cJSON *labels)
{
    const char *key = k8s_get_string(req, "key");
    const char *op = k8s_get_string(req, "operator");
    if (!key || !op) {
        return -1;
    }
    const cJSON *values = cJSON_GetObjectItemCaseSensitive(req, "values");
    const char *v = label_value(labels, key);
    if (strcmp(op, "In") == 0 || strcmp(op, "NotIn") == 0) {
        int in = among(values, v);
        return in < 0 ? -1 : (op[0] == 'I') == (in == 1);
    }
    if (strcmp(op, "Exists") == 0 || strcmp(op, "DoesNotExist") == 0) {
        if (values && !cJSON_IsNull(values) &&
            !(cJSON_IsArray(values) && cJSON_GetArraySize(values) == 0)) {
            return -1;
        }
        return (op[0] == 'E') == (v != NULL);
    }
    return -1;
}

bool k8s_selector_matches(const cJSON *selector, const cJSON *labels)
{
    if (!cJSON_IsObject(selector)) {
        return false;
    }
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(selector, "matchLabels");
    const cJSON *me = cJSON_GetObjectItemCaseSensitive(selector, "matchExpressions");
    if ((ml && !cJSON_IsNull(ml) && !cJSON_IsObject(ml)) ||
        (me && !cJSON_IsNull(me) && !cJSON_IsArray(me))) {
        return false;
    }
    const cJSON *pairs = cJSON_IsObject(ml) ? ml : NULL;
    const cJSON *exprs = cJSON_IsArray(me) ? me : NULL;
    size_t requirements = 0;
    bool holds = true;
    const cJSON *x;
    cJSON_ArrayForEach(x, pairs)
    {
        if (!cJSON_IsString(x)) {
            return false;
        }
        const char *v = label_value(labels, x->string);
        holds = holds && v && strcmp(v, x->valuestring) == 0;
        requirements++;
    }
    cJSON_ArrayForEach(x, exprs)
    {
        int r = requirement_holds(x, labels);
        if (r < 0) {
            return false;
        }
        holds = holds && r == 1;
        requirements++;
    }
    return requirements > 0 && holds;
}

const char *k8s_slice_service(const cJSON *slice)
{
    const cJSON *svc = cJSON_GetObjectItemCaseSensitive(k8s_get(slice, "metadata.labels"),
                                                        "kubernetes.io/service-name");
    return cJSON_IsString(svc) ? svc->valuestring : NULL;
}

size_t k8s_slice_each(const cJSON *slice, void (*fn)(void *ud, const struct k8s_slice_endpoint *e),
                      void *ud)
{
    size_t n = 0;
    const cJSON *ep;
    cJSON_ArrayForEach(ep, cJSON_GetObjectItemCaseSensitive(slice, "endpoints"))
    {
        const char *pod = k8s_get_string(ep, "targetRef.name");
        const cJSON *a0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ep, "addresses"), 0);
        if (!pod || !cJSON_IsString(a0)) {
            continue;
        }
        const cJSON *ready = k8s_get(ep, "conditions.ready");
        const cJSON *term = k8s_get(ep, "conditions.terminating");
        struct k8s_slice_endpoint e = {
            .pod = pod,
            .address = a0->valuestring,
            .ready = !cJSON_IsFalse(ready),
            .terminating = cJSON_IsTrue(term),
        };
        fn(ud, &e);
        n++;
    }
    return n;
}

static uint64_t num(const cJSON *v)
{
    if (cJSON_IsString(v)) {
        return strtoull(v->valuestring, NULL, 10);
    }
    return k8s_json_count(v);
}

int k8s_node_decode(const cJSON *obj, struct k8s_node_info *o)
{
    memset(o, 0, sizeof *o);
    const char *name = k8s_get_string(obj, "metadata.name");
    if (!name) {
        return -1;
    }
    copy(o->name, sizeof o->name, name);
    o->gpu_allocatable =
        num(cJSON_GetObjectItemCaseSensitive(k8s_get(obj, "status.allocatable"), "nvidia.com/gpu"));
    const cJSON *labels = k8s_get(obj, "metadata.labels");
    o->gpu_count = num(cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.count"));
    o->gpu_replicas = num(cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.replicas"));
    const cJSON *prod = cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.product");
    copy(o->gpu_product, sizeof o->gpu_product, cJSON_IsString(prod) ? prod->valuestring : NULL);
    return 0;
}

int k8s_time_parse_ms(const char *s, int64_t *out_ms)
{
    struct tm tm = {0};
    int n = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                     &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6) {
        return -1;
    }
    if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59 || tm.tm_sec > 60) {
        return -1;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *p = s + n;
    int64_t ms = 0;
    if (*p == '.') {
        int digits = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            if (digits < 3) {
                ms = ms * 10 + (*p - '0');
            }
        }
        if (digits == 0) {
            return -1;
        }
        for (; digits < 3; digits++) {
            ms *= 10;
        }
    }
    long offset = 0;
    if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
        offset = (long)(atoi(p + 1) * 3600 + atoi(p + 4) * 60) * (*p == '-' ? -1 : 1);
    } else if (strcmp(p, "Z") != 0 && strcmp(p, "z") != 0) {
        return -1;
    }
    *out_ms = ((int64_t)timegm(&tm) - offset) * 1000 + ms;
    return 0;
}

void k8s_time_format_ms(int64_t ms, char *out, size_t len)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%03dZ", base, (int)(ms % 1000));
}

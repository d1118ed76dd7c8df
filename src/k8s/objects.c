#include "thaw/k8s/objects.h"
#include "thaw/k8s/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void copy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
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
        if (!cJSON_IsString(a0)) {
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

/* ---- resources ----------------------------------------------------------- */

/* Wide enough for any quantity's digits times its suffix without overflow. */
__extension__ typedef unsigned __int128 u128;

/* The multiplier a quantity's suffix stands for; 0 when it is not one. */
static u128 quantity_suffix(const char *p)
{
    static const char bin[] = "KMGTPE", dec[] = "kMGTPE";
    if (!*p) {
        return 1;
    }
    if ((p[0] == 'e' || p[0] == 'E') && p[1] >= '0' && p[1] <= '9') {
        u128 m = 1;
        for (const char *q = p + 1; *q; q++) {
            if (*q < '0' || *q > '9' || q - p > 2) {
                return 0; /* not digits, or past 10^99 */
            }
        }
        for (int e = atoi(p + 1); e > 0; e--) {
            m *= 10;
            if (m > (u128)UINT64_MAX) {
                return 0;
            }
        }
        return m;
    }
    const char *b = p[0] ? strchr(bin, p[0]) : NULL;
    if (b && p[1] == 'i' && !p[2]) {
        return (u128)1 << (10 * (b - bin + 1));
    }
    const char *d = p[0] ? strchr(dec, p[0]) : NULL;
    if (d && !p[1]) {
        u128 m = 1;
        for (long i = 0; i <= d - dec; i++) {
            m *= 1000;
        }
        return m;
    }
    return 0;
}

int k8s_parse_quantity(const char *s, uint64_t *out)
{
    if (!s) {
        return -1;
    }
    const char *p = s;
    u128 whole = 0, frac = 0, den = 1;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > (u128)UINT64_MAX) {
            return -1;
        }
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            if (den < (u128)1000000000000000000ull) { /* 18 places are plenty */
                frac = frac * 10 + (unsigned)(*p - '0');
                den *= 10;
            }
        }
    }
    u128 mult = quantity_suffix(p);
    if (digits == 0 || mult == 0) {
        return -1;
    }
    u128 v = whole * mult + (frac * mult + den - 1) / den;
    if (v > (u128)UINT64_MAX) {
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

uint64_t k8s_resources_get(const struct k8s_resources *rs, const char *name)
{
    for (size_t i = 0; i < rs->n; i++) {
        if (strcmp(rs->r[i].name, name) == 0) {
            return rs->r[i].amount;
        }
    }
    return 0;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

int k8s_resources_add(struct k8s_resources *rs, const char *name, uint64_t amount)
{
    for (size_t i = 0; i < rs->n; i++) {
        if (strcmp(rs->r[i].name, name) == 0) {
            rs->r[i].amount = sat_add(rs->r[i].amount, amount);
            return 0;
        }
    }
    if (rs->n == K8S_MAX_RESOURCES || strlen(name) >= sizeof rs->r[0].name) {
        rs->truncated = true;
        return -1;
    }
    copy(rs->r[rs->n].name, sizeof rs->r[rs->n].name, name);
    rs->r[rs->n++].amount = amount;
    return 0;
}

uint64_t k8s_resources_total(const struct k8s_resources *rs)
{
    uint64_t t = 0;
    for (size_t i = 0; i < rs->n; i++) {
        t = sat_add(t, rs->r[i].amount);
    }
    return t;
}

/* A resource name of the prefix, in the characters a qualified name allows
 * (so it can go into a metric label as it is). */
static bool counted_resource(const char *name)
{
    if (strncmp(name, K8S_RESOURCE_PREFIX, strlen(K8S_RESOURCE_PREFIX)) != 0) {
        return false;
    }
    static const char qualified[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./";
    return name[strspn(name, qualified)] == '\0';
}

/* The counted resources of a resource map (allocatable, requests, limits). */
static void read_resources(const cJSON *map, struct k8s_resources *out)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, map)
    {
        if (r->string && counted_resource(r->string)) {
            (void)k8s_resources_add(out, r->string, num(r));
        }
    }
}

/* One container's counted requests: requests, limits where a request is
 * absent (the API server defaults an extended resource's request to its
 * limit). */
static void container_requests(const cJSON *c, struct k8s_resources *out)
{
    memset(out, 0, sizeof *out);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(c, "resources");
    const cJSON *req = k8s_get(res, "requests");
    read_resources(req, out);
    const cJSON *l;
    cJSON_ArrayForEach(l, k8s_get(res, "limits"))
    {
        if (l->string && counted_resource(l->string) &&
            !cJSON_GetObjectItemCaseSensitive(req, l->string)) {
            (void)k8s_resources_add(out, l->string, num(l));
        }
    }
}

/* The pod's effective requests: the containers' sum, raised to any init
 * container's own (init containers run one at a time, before the rest). */
static void pod_requests(const cJSON *pod_spec, struct k8s_resources *out)
{
    memset(out, 0, sizeof *out);
    struct k8s_resources one;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(pod_spec, "containers"))
    {
        container_requests(c, &one);
        for (size_t i = 0; i < one.n; i++) {
            (void)k8s_resources_add(out, one.r[i].name, one.r[i].amount);
        }
        out->truncated |= one.truncated;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(pod_spec, "initContainers"))
    {
        container_requests(c, &one);
        for (size_t i = 0; i < one.n; i++) {
            uint64_t have = k8s_resources_get(out, one.r[i].name);
            if (one.r[i].amount > have) {
                (void)k8s_resources_add(out, one.r[i].name, one.r[i].amount - have);
            }
        }
        out->truncated |= one.truncated;
    }
}

/* ---- pods ---------------------------------------------------------------- */

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
    const cJSON *ann = k8s_get(obj, "metadata.annotations");
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(ann, K8S_SLEEP_STATE_ANNOTATION);
    copy(o->sleep_state, sizeof o->sleep_state, cJSON_IsString(ss) ? ss->valuestring : NULL);
    const cJSON *wr = cJSON_GetObjectItemCaseSensitive(ann, K8S_WAKE_REQUEST_ANNOTATION);
    o->wake_requested = cJSON_IsString(wr) && wr->valuestring[0];
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
    copy(o->node_name, sizeof o->node_name, k8s_get_string(obj, "spec.nodeName"));
    pod_requests(k8s_get(obj, "spec"), &o->requests);
    o->running = strcmp(o->phase, "Running") == 0;
    const cJSON *first = cJSON_GetArrayItem(k8s_get(obj, "status.containerStatuses"), 0);
    o->container_started = k8s_get(first, "state.running") != NULL;
    const char *deletion = k8s_get_string(obj, "metadata.deletionTimestamp");
    bool exited = strcmp(o->phase, "Failed") == 0 || strcmp(o->phase, "Succeeded") == 0;
    o->terminating = deletion || exited;
    o->stopping = deletion && !exited;
    o->kill_ms = 0;
    if (o->stopping && k8s_time_parse_ms(deletion, &o->kill_ms)) {
        o->kill_ms = 0;
    }
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
        if (type && strcmp(type, "Ready") == 0 && status && strcmp(status, "True") == 0) {
            o->ready = true;
        }
    }
    return 0;
}

/* ---- nodes --------------------------------------------------------------- */

static char *dup_str(const char *s)
{
    return strdup(s ? s : "");
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        free(v[i]);
    }
    free(v);
}

/* A JSON object of strings as key, value pairs (other values skipped). */
static int read_pairs(const cJSON *map, char ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    int count = cJSON_IsObject(map) ? cJSON_GetArraySize(map) : 0;
    if (count == 0) {
        return 0;
    }
    char **v = calloc((size_t)count * 2, sizeof *v);
    if (!v) {
        return -1;
    }
    *out = v;
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (!e->string || !cJSON_IsString(e)) {
            continue;
        }
        v[2 * *n] = dup_str(e->string);
        v[2 * *n + 1] = dup_str(e->valuestring);
        if (!v[2 * *n] || !v[2 * *n + 1]) {
            free(v[2 * *n]);
            free(v[2 * *n + 1]);
            return -1;
        }
        (*n)++;
    }
    return 0;
}

static const char *pair_value(char *const *pairs, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(pairs[2 * i], key) == 0) {
            return pairs[2 * i + 1];
        }
    }
    return NULL;
}

static enum k8s_taint_effect effect_of(const char *s)
{
    if (!s || !*s) {
        return K8S_EFFECT_ANY;
    }
    if (strcmp(s, "NoSchedule") == 0) {
        return K8S_NO_SCHEDULE;
    }
    if (strcmp(s, "PreferNoSchedule") == 0) {
        return K8S_PREFER_NO_SCHEDULE;
    }
    if (strcmp(s, "NoExecute") == 0) {
        return K8S_NO_EXECUTE;
    }
    return K8S_EFFECT_OTHER;
}

static int read_taints(const cJSON *arr, struct k8s_node_info *o)
{
    int count = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (count == 0) {
        return 0;
    }
    o->taints = calloc((size_t)count, sizeof *o->taints);
    if (!o->taints) {
        return -1;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, arr)
    {
        const char *key = k8s_get_string(t, "key");
        if (!key) {
            continue;
        }
        struct k8s_taint *x = &o->taints[o->n_taints];
        x->key = dup_str(key);
        x->value = dup_str(k8s_get_string(t, "value"));
        x->effect = effect_of(k8s_get_string(t, "effect"));
        o->n_taints++;
        if (!x->key || !x->value) {
            return -1;
        }
    }
    return 0;
}

int k8s_node_decode(const cJSON *obj, struct k8s_node_info *o)
{
    memset(o, 0, sizeof *o);
    const char *name = k8s_get_string(obj, "metadata.name");
    if (!name) {
        return -1;
    }
    copy(o->name, sizeof o->name, name);
    const cJSON *alloc = k8s_get(obj, "status.allocatable");
    o->gpu_allocatable = num(cJSON_GetObjectItemCaseSensitive(alloc, "nvidia.com/gpu"));
    read_resources(alloc, &o->allocatable);
    const cJSON *labels = k8s_get(obj, "metadata.labels");
    o->gpu_count = num(cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.count"));
    o->gpu_replicas = num(cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.replicas"));
    const cJSON *prod = cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.product");
    copy(o->gpu_product, sizeof o->gpu_product, cJSON_IsString(prod) ? prod->valuestring : NULL);
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(labels, "nvidia.com/gpu.memory");
    if (mem) {
        uint64_t mib = 0;
        const char *v = cJSON_IsString(mem) ? mem->valuestring : "";
        char *end;
        mib = strtoull(v, &end, 10);
        o->gpu_memory_bad = !v[0] || *end || v[0] < '0' || v[0] > '9' || mib > (UINT64_MAX >> 20);
        o->gpu_memory = o->gpu_memory_bad ? 0 : mib << 20;
    }
    o->unschedulable = cJSON_IsTrue(k8s_get(obj, "spec.unschedulable"));
    if (read_pairs(labels, &o->labels, &o->n_labels) ||
        read_taints(k8s_get(obj, "spec.taints"), o)) {
        return -1;
    }
    return 0;
}

void k8s_node_info_dispose(struct k8s_node_info *ni)
{
    free_strings(ni->labels, ni->n_labels * 2);
    for (size_t i = 0; i < ni->n_taints; i++) {
        free(ni->taints[i].key);
        free(ni->taints[i].value);
    }
    free(ni->taints);
    ni->labels = NULL;
    ni->taints = NULL;
    ni->n_labels = ni->n_taints = 0;
}

const char *k8s_node_label(const struct k8s_node_info *ni, const char *key)
{
    return pair_value(ni->labels, ni->n_labels, key);
}

/* ---- pod templates ------------------------------------------------------- */

static int read_tolerations(const cJSON *arr, struct k8s_pod_template *o)
{
    int count = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (count == 0) {
        return 0;
    }
    o->tolerations = calloc((size_t)count, sizeof *o->tolerations);
    if (!o->tolerations) {
        return -1;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, arr)
    {
        struct k8s_toleration *x = &o->tolerations[o->n_tolerations++];
        const char *op = k8s_get_string(t, "operator");
        x->op = op && strcmp(op, "Exists") == 0 ? K8S_TOL_EXISTS : K8S_TOL_EQUAL;
        x->key = dup_str(k8s_get_string(t, "key"));
        x->value = dup_str(k8s_get_string(t, "value"));
        x->effect = effect_of(k8s_get_string(t, "effect"));
        if (!x->key || !x->value) {
            return -1;
        }
    }
    return 0;
}

static enum k8s_selector_op selector_op(const char *s)
{
    static const char *const names[] = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i]) == 0) {
            return (enum k8s_selector_op)i;
        }
    }
    return K8S_SEL_INVALID;
}

static int read_requirement(const cJSON *e, bool field, struct k8s_node_requirement *r)
{
    r->field = field;
    r->key = dup_str(k8s_get_string(e, "key"));
    r->op = selector_op(k8s_get_string(e, "operator"));
    const cJSON *vals = cJSON_GetObjectItemCaseSensitive(e, "values");
    int count = cJSON_IsArray(vals) ? cJSON_GetArraySize(vals) : 0;
    if (!r->key || (count && !(r->values = calloc((size_t)count, sizeof *r->values)))) {
        return -1;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, vals)
    {
        if (cJSON_IsString(v) && !(r->values[r->n_values++] = dup_str(v->valuestring))) {
            return -1;
        }
    }
    return 0;
}

static int read_term(const cJSON *term, struct k8s_node_term *t)
{
    const cJSON *exprs = cJSON_GetObjectItemCaseSensitive(term, "matchExpressions");
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(term, "matchFields");
    int count = (cJSON_IsArray(exprs) ? cJSON_GetArraySize(exprs) : 0) +
                (cJSON_IsArray(fields) ? cJSON_GetArraySize(fields) : 0);
    if (count == 0) {
        return 0; /* an empty term matches no node */
    }
    t->reqs = calloc((size_t)count, sizeof *t->reqs);
    if (!t->reqs) {
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, exprs)
    {
        if (read_requirement(e, false, &t->reqs[t->n_reqs++])) {
            return -1;
        }
    }
    cJSON_ArrayForEach(e, fields)
    {
        if (read_requirement(e, true, &t->reqs[t->n_reqs++])) {
            return -1;
        }
    }
    return 0;
}

static int read_affinity(const cJSON *pod_spec, struct k8s_pod_template *o)
{
    const cJSON *terms = k8s_get(
        pod_spec,
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms");
    int count = cJSON_IsArray(terms) ? cJSON_GetArraySize(terms) : 0;
    if (count == 0) {
        return 0;
    }
    o->terms = calloc((size_t)count, sizeof *o->terms);
    if (!o->terms) {
        return -1;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, terms)
    {
        if (read_term(t, &o->terms[o->n_terms++])) {
            return -1;
        }
    }
    return 0;
}

int k8s_pod_template_decode(const cJSON *pod_spec, struct k8s_pod_template *o)
{
    memset(o, 0, sizeof *o);
    pod_requests(pod_spec, &o->requests);
    if (read_pairs(cJSON_GetObjectItemCaseSensitive(pod_spec, "nodeSelector"), &o->node_selector,
                   &o->n_node_selector) ||
        read_tolerations(cJSON_GetObjectItemCaseSensitive(pod_spec, "tolerations"), o) ||
        read_affinity(pod_spec, o)) {
        return -1;
    }
    return 0;
}

void k8s_pod_template_dispose(struct k8s_pod_template *t)
{
    free_strings(t->node_selector, t->n_node_selector * 2);
    for (size_t i = 0; i < t->n_tolerations; i++) {
        free(t->tolerations[i].key);
        free(t->tolerations[i].value);
    }
    free(t->tolerations);
    for (size_t i = 0; i < t->n_terms; i++) {
        for (size_t j = 0; j < t->terms[i].n_reqs; j++) {
            free(t->terms[i].reqs[j].key);
            free_strings(t->terms[i].reqs[j].values, t->terms[i].reqs[j].n_values);
        }
        free(t->terms[i].reqs);
    }
    free(t->terms);
    memset(t, 0, sizeof *t);
}

/* ---- fit ----------------------------------------------------------------- */

const char *k8s_fit_name(enum k8s_fit f)
{
    static const char *const names[] = {"fits",          "cordoned", "taint",
                                        "node_selector", "affinity", "resources"};
    return names[f];
}

bool k8s_tolerates(const struct k8s_toleration *tol, const struct k8s_taint *taint)
{
    if (tol->effect != K8S_EFFECT_ANY && tol->effect != taint->effect) {
        return false;
    }
    if (tol->key[0] && strcmp(tol->key, taint->key) != 0) {
        return false;
    }
    if (tol->op == K8S_TOL_EXISTS) {
        return true;
    }
    /* Equal with an empty key is invalid (the API rejects it): no match. */
    return tol->key[0] && strcmp(tol->value, taint->value) == 0;
}

static bool tolerated(const struct k8s_pod_template *t, const struct k8s_taint *taint)
{
    for (size_t i = 0; i < t->n_tolerations; i++) {
        if (k8s_tolerates(&t->tolerations[i], taint)) {
            return true;
        }
    }
    return false;
}

static bool parse_int(const char *s, long long *out)
{
    char *end;
    if (!s || !*s) {
        return false;
    }
    *out = strtoll(s, &end, 10);
    return *end == '\0';
}

static bool requirement_matches(const struct k8s_node_info *n, const struct k8s_node_requirement *r)
{
    const char *v = r->field ? (strcmp(r->key, "metadata.name") == 0 ? n->name : NULL)
                             : k8s_node_label(n, r->key);
    bool in = false;
    for (size_t i = 0; v && i < r->n_values; i++) {
        in |= strcmp(v, r->values[i]) == 0;
    }
    long long have, bound;
    switch (r->op) {
    case K8S_SEL_IN:
        return in;
    case K8S_SEL_NOT_IN:
        return !in;
    case K8S_SEL_EXISTS:
        return v != NULL;
    case K8S_SEL_DOES_NOT_EXIST:
        return v == NULL;
    case K8S_SEL_GT:
    case K8S_SEL_LT:
        if (r->n_values != 1 || !parse_int(v, &have) || !parse_int(r->values[0], &bound)) {
            return false;
        }
        return r->op == K8S_SEL_GT ? have > bound : have < bound;
    default:
        return false;
    }
}

static bool term_matches(const struct k8s_node_info *n, const struct k8s_node_term *t)
{
    if (t->n_reqs == 0) {
        return false;
    }
    for (size_t i = 0; i < t->n_reqs; i++) {
        if (!requirement_matches(n, &t->reqs[i])) {
            return false;
        }
    }
    return true;
}

enum k8s_fit k8s_node_admits(const struct k8s_node_info *node, const struct k8s_pod_template *t)
{
    if (node->unschedulable) {
        struct k8s_taint cordon = {(char *)K8S_UNSCHEDULABLE_TAINT, (char *)"", K8S_NO_SCHEDULE};
        if (!tolerated(t, &cordon)) {
            return K8S_FIT_CORDONED;
        }
    }
    for (size_t i = 0; i < node->n_taints; i++) {
        const struct k8s_taint *x = &node->taints[i];
        bool blocks = x->effect == K8S_NO_SCHEDULE || x->effect == K8S_NO_EXECUTE;
        if (blocks && !tolerated(t, x)) {
            return K8S_FIT_TAINT;
        }
    }
    for (size_t i = 0; i < t->n_node_selector; i++) {
        const char *v = k8s_node_label(node, t->node_selector[2 * i]);
        if (!v || strcmp(v, t->node_selector[2 * i + 1]) != 0) {
            return K8S_FIT_NODE_SELECTOR;
        }
    }
    if (t->n_terms) {
        bool any = false;
        for (size_t i = 0; i < t->n_terms && !any; i++) {
            any = term_matches(node, &t->terms[i]);
        }
        if (!any) {
            return K8S_FIT_AFFINITY;
        }
    }
    return K8S_FITS;
}

enum k8s_fit k8s_node_fits(const struct k8s_node_info *node, const struct k8s_pod_template *t,
                           const struct k8s_resources *used)
{
    enum k8s_fit f = k8s_node_admits(node, t);
    if (f != K8S_FITS) {
        return f;
    }
    for (size_t i = 0; i < t->requests.n; i++) {
        const struct k8s_resource *want = &t->requests.r[i];
        if (want->amount == 0) {
            continue;
        }
        uint64_t have = k8s_resources_get(&node->allocatable, want->name);
        uint64_t taken = used ? k8s_resources_get(used, want->name) : 0;
        if (taken >= have || have - taken < want->amount) {
            return K8S_FIT_RESOURCES;
        }
    }
    return K8S_FITS;
}

/* A Go time.Duration as String() writes it: [[Nh]Nm]N[.N]s, or N[.N]ms,
 * us, µs, ns for under a second. */
static int go_duration_ms(const char *s, uint64_t *ms)
{
    double total = 0;
    bool any = false;
    while (*s >= '0' && *s <= '9') {
        char *end;
        double v = strtod(s, &end);
        if (end == s) {
            return -1;
        }
        s = end;
        double unit;
        if (strncmp(s, "ms", 2) == 0) {
            unit = 1, s += 2;
        } else if (strncmp(s, "us", 2) == 0 || strncmp(s, "ns", 2) == 0) {
            unit = s[0] == 'u' ? 1e-3 : 1e-6, s += 2;
        } else if (strncmp(s, "\xc2\xb5s", 3) == 0) {
            unit = 1e-3, s += 3;
        } else if (*s == 'h' || *s == 'm' || *s == 's') {
            unit = *s == 'h' ? 3600e3 : *s == 'm' ? 60e3 : 1e3;
            s++;
        } else {
            return -1;
        }
        total += v * unit;
        any = true;
    }
    if (!any || total < 0 || total > 1e12) {
        return -1;
    }
    *ms = (uint64_t)(total + 0.5);
    return 0;
}

int k8s_pulled_duration_ms(const char *message, uint64_t *ms)
{
    static const char prefix[] = "Successfully pulled image \"";
    if (!message || strncmp(message, prefix, sizeof prefix - 1) != 0) {
        return -1;
    }
    /* An image reference has no quote in it: the next one closes it. */
    const char *close = strchr(message + sizeof prefix - 1, '"');
    if (!close || strncmp(close, "\" in ", 5) != 0) {
        return -1;
    }
    return go_duration_ms(close + 5, ms);
}

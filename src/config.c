#include "thaw/config.h"
#include "thaw/jsonpos.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* A numeric key: where it lives, its default and its accepted range. */
struct num_key {
    const char *key;
    size_t offset;
    uint64_t def, min, max;
};

#define LIM(k, d, lo, hi) {#k, offsetof(struct config_limits, k), d, lo, hi}
static const struct num_key limit_keys[] = {
    LIM(max_connections, 10000, 1, 1000000),
    LIM(max_header_bytes, 65536, 1024, 1048576),
    LIM(max_headers, 100, 1, 1000),
    LIM(max_body_bytes, 16777216, 0, 1073741824),
    LIM(header_timeout_ms, 10000, 1, 3600000),
    LIM(body_timeout_ms, 60000, 1, 3600000),
    LIM(keepalive_timeout_ms, 60000, 0, 3600000),
    LIM(send_timeout_ms, 60000, 1, 3600000),
    LIM(max_queue_per_model, 1000, 0, 1000000),
    LIM(max_queue_total, 10000, 0, 10000000),
    LIM(queue_aging_ms, 10000, 1, 3600000),
    LIM(drain_timeout_ms, 30000, 0, 3600000),
    LIM(body_total_timeout_ms, 300000, 1, 86400000),
    LIM(max_buffered_body_bytes, 268435456, 1024, 68719476736ULL),
};
#undef LIM

#define UPS(k, d, lo, hi) {#k, offsetof(struct config_upstream, k), d, lo, hi}
static const struct num_key upstream_keys[] = {
    UPS(keepalive_per_endpoint, 64, 0, 100000),
    UPS(keepalive_timeout_ms, 4000, 1, 3600000),
    UPS(eject_ms, 2000, 0, 600000),
    UPS(max_response_header_bytes, 65536, 1024, 1048576),
};
#undef UPS

#define AS(k, d, lo, hi) {#k, offsetof(struct config_autoscaler, k), d, lo, hi}
static const struct num_key autoscaler_keys[] = {
    AS(tick_ms, 2000, 100, 600000),
    AS(stable_window_ms, 60000, 6000, 3600000),
    AS(panic_window_pct, 10, 1, 100),
    AS(panic_threshold_pct, 200, 110, 1000),
    AS(max_scale_up_rate, 1000, 1, 100000),
    AS(max_scale_down_rate, 2, 1, 1000),
    AS(scale_down_delay_ms, 0, 0, 3600000),
    AS(activation_scale, 1, 1, 1000),
    AS(target_utilization_pct, 70, 1, 100),
};
#undef AS

#define WP(k, d, lo, hi) {#k, offsetof(struct config_warm_pool, k), d, lo, hi}
static const struct num_key warm_pool_keys[] = {
    WP(budget_slices, 0, 0, 100000),
    WP(capacity_slices, 0, 0, 100000),
};
#undef WP

/* max_queue's default is limits.max_queue_per_model; UINT64_MAX marks "unset". */
#define MOD(k, d, lo, hi) {#k, offsetof(struct config_model, k), d, lo, hi}
static const struct num_key model_keys[] = {
    MOD(max_concurrency, 8, 1, 100000),
    MOD(max_queue, UINT64_MAX, 0, 1000000),
    MOD(queue_timeout_ms, 300000, 1, 86400000),
    MOD(connect_timeout_ms, 5000, 1, 600000),
    MOD(first_byte_timeout_ms, 300000, 1, 86400000),
    MOD(upstream_idle_timeout_ms, 300000, 1, 86400000),
    MOD(min_replicas, 0, 0, 1000),
    MOD(max_replicas, 1, 1, 1000),
    MOD(idle_timeout_ms, 300000, 0, 86400000),
    MOD(startup_timeout_ms, 600000, 1, 86400000),
    MOD(stop_grace_ms, 10000, 0, 600000),
    MOD(stop_drain_ms, 30000, 0, 3600000),
    MOD(gpu_slices, 0, 0, 64),
    MOD(loading_heartbeat_ms, 0, 0, 600000),
    MOD(target, 0, 0, 100000),
    MOD(stable_window_ms, 0, 0, 3600000),
};
#undef MOD

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

struct parser {
    const char *label;
    const char *text;
    size_t len;
    struct jsonpos pos;
    struct config_error *err;
};

__attribute__((format(printf, 4, 5))) static int fail(struct parser *p, const cJSON *at,
                                                      const char *key, const char *fmt, ...)
{
    int line = at ? jsonpos_line(&p->pos, at) : 0;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(p->err->msg, sizeof p->err->msg, "%s:%d: %s: %s", p->label, line, key, what);
    return -EINVAL;
}

static void set_defaults(const struct num_key *keys, size_t n, void *base)
{
    for (size_t i = 0; i < n; i++) {
        *(uint64_t *)((char *)base + keys[i].offset) = keys[i].def;
    }
}

static int read_uint(struct parser *p, const cJSON *item, const char *path, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) {
        return fail(p, item, path, "must be a number");
    }
    double v = item->valuedouble;
    if (v != floor(v) || v < 0) {
        return fail(p, item, path, "must be a whole number >= 0");
    }
    if (v < (double)min || v > (double)max) {
        return fail(p, item, path, "must be between %llu and %llu (got %.0f)",
                    (unsigned long long)min, (unsigned long long)max, v);
    }
    *out = (uint64_t)v;
    return 0;
}

/* Reads a numeric key from a table; 1 when key is not in the table. */
static int read_num_key(struct parser *p, const struct num_key *keys, size_t n, void *base,
                        const cJSON *item, const char *prefix)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(keys[i].key, item->string) == 0) {
            char path[256];
            snprintf(path, sizeof path, "%s%s", prefix, item->string);
            return read_uint(p, item, path, keys[i].min, keys[i].max,
                             (uint64_t *)((char *)base + keys[i].offset));
        }
    }
    return 1;
}

struct member {
    const cJSON *item;
    size_t pos; /* in the file */
};

static int by_key_then_position(const void *a, const void *b)
{
    const struct member *x = a, *y = b;
    int c = strcmp(x->item->string, y->item->string);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Names a key given twice in obj. Sorted, so that an object with many keys
 * is not quadratic. */
static int check_duplicates(struct parser *p, const cJSON *obj, const char *prefix)
{
    size_t n = 0;
    for (const cJSON *a = obj->child; a; a = a->next) {
        n++;
    }
    if (n < 2) {
        return 0;
    }
    struct member *m = malloc(n * sizeof *m);
    if (!m) {
        return fail(p, NULL, "(load)", "out of memory");
    }
    size_t i = 0;
    for (const cJSON *a = obj->child; a; a = a->next, i++) {
        m[i].item = a;
        m[i].pos = i;
    }
    qsort(m, n, sizeof *m, by_key_then_position);
    /* Equal keys sit together in file order: of the repeated keys, the one
     * that appears first is reported, at its second appearance. */
    const cJSON *dup = NULL;
    size_t first_pos = SIZE_MAX;
    for (i = 1; i < n; i++) {
        bool repeats = strcmp(m[i - 1].item->string, m[i].item->string) == 0;
        bool starts_group = i == 1 || strcmp(m[i - 2].item->string, m[i - 1].item->string) != 0;
        if (repeats && starts_group && m[i - 1].pos < first_pos) {
            dup = m[i].item;
            first_pos = m[i - 1].pos;
        }
    }
    free(m);
    if (dup) {
        char path[256];
        snprintf(path, sizeof path, "%s%s", prefix, dup->string);
        return fail(p, dup, path, "duplicate key");
    }
    return 0;
}

static int read_string(struct parser *p, const cJSON *item, const char *path, char **out)
{
    if (!cJSON_IsString(item) || !item->valuestring) {
        return fail(p, item, path, "must be a string");
    }
    if (item->valuestring[0] == '\0') {
        return fail(p, item, path, "must not be empty");
    }
    char *s = strdup(item->valuestring);
    if (!s) {
        return fail(p, item, path, "out of memory");
    }
    free(*out);
    *out = s;
    return 0;
}

static int read_bool(struct parser *p, const cJSON *item, const char *path, bool *out)
{
    if (!cJSON_IsBool(item)) {
        return fail(p, item, path, "must be true or false");
    }
    *out = cJSON_IsTrue(item);
    return 0;
}

static int read_string_array(struct parser *p, const cJSON *item, const char *path, char ***out,
                             size_t *n_out, int (*check)(const char *))
{
    if (!cJSON_IsArray(item)) {
        return fail(p, item, path, "must be an array of strings");
    }
    size_t n = (size_t)cJSON_GetArraySize(item);
    char **arr = calloc(n ? n : 1, sizeof *arr);
    if (!arr) {
        return fail(p, item, path, "out of memory");
    }
    size_t i = 0;
    for (const cJSON *e = item->child; e; e = e->next, i++) {
        char epath[300];
        snprintf(epath, sizeof epath, "%s[%zu]", path, i);
        if (!cJSON_IsString(e) || !e->valuestring || !e->valuestring[0]) {
            for (size_t j = 0; j < i; j++) {
                free(arr[j]);
            }
            free(arr);
            return fail(p, e, epath, "must be a non-empty string");
        }
        if (check && check(e->valuestring)) {
            for (size_t j = 0; j < i; j++) {
                free(arr[j]);
            }
            free(arr);
            return fail(p, e, epath, "\"%.100s\" is not valid here", e->valuestring);
        }
        arr[i] = strdup(e->valuestring);
    }
    *out = arr;
    *n_out = n;
    return 0;
}

/* Model names and namespaces: DNS-label-like, as Kubernetes names are. */
#define NAME_MAX_CHARS 253

static int check_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > NAME_MAX_CHARS) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '-' || c == '.' || c == '_')) {
            return -1;
        }
    }
    return 0;
}

static int check_host(const char *s)
{
    size_t n = strlen(s);
    if (n > 253) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '-' || c == '.' || c == '_')) {
            return -1;
        }
    }
    return 0;
}

/* "host:port" or "[v6]:port", port 1..65535. */
static int check_hostport(const char *s)
{
    const char *colon;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') {
            return -1;
        }
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s || memchr(s, ':', (size_t)(colon - s))) {
            return -1;
        }
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || colon[1] == '\0' || port < 1 || port > 65535) {
        return -1;
    }
    return 0;
}

/* Listen addresses also accept port 0 (the kernel picks one). */
static int check_listen(const char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && strcmp(s + n - 2, ":0") == 0) {
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%.*s:1", (int)(n - 2), s);
        return check_hostport(tmp);
    }
    return check_hostport(s);
}

/* Reads a model name or namespace, saying which rule it breaks. */
static int read_name(struct parser *p, const cJSON *item, const char *path, char **out)
{
    int rc = read_string(p, item, path, out);
    if (rc) {
        return rc;
    }
    size_t n = strlen(*out);
    if (n > NAME_MAX_CHARS) {
        return fail(p, item, path, "is too long (%zu characters; at most %d)", n, NAME_MAX_CHARS);
    }
    if (check_name(*out)) {
        return fail(p, item, path, "may hold only letters, digits, '-', '.' and '_'");
    }
    return 0;
}

/* "env": {"NAME": "value", ...} -> "NAME=value" strings. */
static int read_env(struct parser *p, const cJSON *obj, const char *path, struct config_model *m)
{
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, path, "must be an object of strings");
    }
    int rc = check_duplicates(p, obj, "env.");
    if (rc) {
        return rc;
    }
    size_t n = (size_t)cJSON_GetArraySize(obj);
    m->env = calloc(n ? n : 1, sizeof *m->env);
    if (!m->env) {
        return fail(p, obj, path, "out of memory");
    }
    for (const cJSON *e = obj->child; e; e = e->next) {
        char epath[300];
        snprintf(epath, sizeof epath, "%s.%s", path, e->string);
        if (!cJSON_IsString(e)) {
            return fail(p, e, epath, "must be a string");
        }
        if (!e->string[0] || strchr(e->string, '=')) {
            return fail(p, e, epath, "is not a valid variable name");
        }
        size_t len = strlen(e->string) + strlen(e->valuestring) + 2;
        char *kv = malloc(len);
        if (!kv) {
            return fail(p, e, epath, "out of memory");
        }
        snprintf(kv, len, "%s=%s", e->string, e->valuestring);
        m->env[m->n_env++] = kv;
    }
    return 0;
}

static int parse_gpus(struct parser *p, const cJSON *arr, struct config *cfg)
{
    if (!cJSON_IsArray(arr)) {
        return fail(p, arr, "gpus", "must be an array of {\"id\", \"slices\", \"sharing\"}");
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    cfg->gpus = calloc(n ? n : 1, sizeof *cfg->gpus);
    if (!cfg->gpus) {
        return fail(p, arr, "gpus", "out of memory");
    }
    size_t i = 0;
    for (const cJSON *g = arr->child; g; g = g->next, i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "gpus[%zu].", i);
        if (!cJSON_IsObject(g)) {
            return fail(p, g, prefix, "must be an object");
        }
        struct config_gpu *cg = &cfg->gpus[i];
        cg->slices = 1;
        bool have_id = false;
        for (const cJSON *it = g->child; it; it = it->next) {
            char path[128];
            snprintf(path, sizeof path, "%s%s", prefix, it->string);
            int rc = 0;
            if (strcmp(it->string, "id") == 0) {
                rc = read_uint(p, it, path, 0, 1023, &cg->id);
                have_id = true;
            } else if (strcmp(it->string, "slices") == 0) {
                rc = read_uint(p, it, path, 1, 64, &cg->slices);
            } else if (strcmp(it->string, "sharing") == 0) {
                if (cJSON_IsString(it) && strcmp(it->valuestring, "time-slicing") == 0) {
                    cg->sharing = GPU_TIME_SLICING;
                } else if (cJSON_IsString(it) && strcmp(it->valuestring, "mps") == 0) {
                    cg->sharing = GPU_MPS;
                } else {
                    rc = fail(p, it, path, "must be \"time-slicing\" or \"mps\"");
                }
            } else {
                rc = fail(p, it, path, "unknown key");
            }
            if (rc) {
                return rc;
            }
        }
        if (!have_id) {
            return fail(p, g, prefix, "\"id\" is required");
        }
        for (size_t j = 0; j < i; j++) {
            if (cfg->gpus[j].id == cg->id) {
                return fail(p, g, prefix, "GPU id %llu is declared twice",
                            (unsigned long long)cg->id);
            }
        }
        cfg->n_gpus = i + 1;
    }
    return 0;
}

static int parse_kubernetes(struct parser *p, const cJSON *obj, struct config *cfg)
{
    struct config_kubernetes *k = &cfg->kubernetes;
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, "kubernetes", "must be an object");
    }
    int rc = check_duplicates(p, obj, "kubernetes.");
    if (rc) {
        return rc;
    }
    k->enabled = true;
    k->lease_duration_ms = 15000;
    k->renew_interval_ms = 2000;
    k->renew_deadline_ms = 10000;
    k->peers_port = 9090;
    k->peers_poll_ms = 1000;
    k->peers_timeout_ms = 5000;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[128];
        snprintf(path, sizeof path, "kubernetes.%s", it->string);
        if (strcmp(it->string, "namespaces") == 0) {
            rc = read_string_array(p, it, path, &k->namespaces, &k->n_namespaces, check_name);
        } else if (strcmp(it->string, "label_selector") == 0) {
            rc = read_string(p, it, path, &k->label_selector);
        } else if (strcmp(it->string, "kubeconfig") == 0) {
            rc = read_string(p, it, path, &k->kubeconfig);
        } else if (strcmp(it->string, "context") == 0) {
            rc = read_string(p, it, path, &k->context);
        } else if (strcmp(it->string, "probe_pods") == 0) {
            rc = read_bool(p, it, path, &k->probe_pods);
        } else if (strcmp(it->string, "events") == 0) {
            rc = read_bool(p, it, path, &k->events);
        } else if (strcmp(it->string, "default_port") == 0) {
            rc = read_uint(p, it, path, 1, 65535, &k->default_port);
        } else if (strcmp(it->string, "leader_election") == 0) {
            rc = read_bool(p, it, path, &k->leader_election);
        } else if (strcmp(it->string, "lease_name") == 0) {
            rc = read_string(p, it, path, &k->lease_name);
        } else if (strcmp(it->string, "lease_namespace") == 0) {
            rc = read_string(p, it, path, &k->lease_namespace);
        } else if (strcmp(it->string, "identity") == 0) {
            rc = read_string(p, it, path, &k->identity);
        } else if (strcmp(it->string, "lease_duration_ms") == 0) {
            rc = read_uint(p, it, path, 1000, 600000, &k->lease_duration_ms);
        } else if (strcmp(it->string, "renew_interval_ms") == 0) {
            rc = read_uint(p, it, path, 100, 60000, &k->renew_interval_ms);
        } else if (strcmp(it->string, "renew_deadline_ms") == 0) {
            rc = read_uint(p, it, path, 500, 600000, &k->renew_deadline_ms);
        } else if (strcmp(it->string, "peers_service") == 0) {
            rc = read_string(p, it, path, &k->peers_service);
        } else if (strcmp(it->string, "peers_namespace") == 0) {
            rc = read_string(p, it, path, &k->peers_namespace);
        } else if (strcmp(it->string, "peers_port") == 0) {
            rc = read_uint(p, it, path, 1, 65535, &k->peers_port);
        } else if (strcmp(it->string, "peers_poll_ms") == 0) {
            rc = read_uint(p, it, path, 100, 60000, &k->peers_poll_ms);
        } else if (strcmp(it->string, "peers_timeout_ms") == 0) {
            rc = read_uint(p, it, path, 200, 600000, &k->peers_timeout_ms);
        } else {
            rc = fail(p, it, path, "unknown key");
        }
        if (rc) {
            return rc;
        }
    }
    if (k->renew_deadline_ms >= k->lease_duration_ms ||
        k->renew_interval_ms >= k->renew_deadline_ms) {
        return fail(p, obj, "kubernetes",
                    "need renew_interval_ms < renew_deadline_ms < lease_duration_ms");
    }
    return 0;
}

void config_model_defaults(struct config_model *m, const struct config_limits *lim)
{
    memset(m, 0, sizeof *m);
    set_defaults(model_keys, N_ELEMS(model_keys), m);
    m->priority = TIER_STANDARD;
    m->max_queue = lim->max_queue_per_model;
}

static int parse_model(struct parser *p, const cJSON *obj, size_t idx, struct config_model *m,
                       const struct config_limits *lim)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "models[%zu].", idx);
    memset(m, 0, sizeof *m);
    set_defaults(model_keys, N_ELEMS(model_keys), m);
    m->priority = TIER_STANDARD;
    m->line = jsonpos_line(&p->pos, obj);
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, prefix, "must be an object");
    }
    int rc = check_duplicates(p, obj, prefix);
    if (rc) {
        return rc;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[256];
        snprintf(path, sizeof path, "%s%s", prefix, it->string);
        rc = read_num_key(p, model_keys, N_ELEMS(model_keys), m, it, prefix);
        if (rc <= 0) {
            if (rc) {
                return rc;
            }
            continue;
        }
        rc = 0;
        if (strcmp(it->string, "name") == 0) {
            rc = read_name(p, it, path, &m->name);
        } else if (strcmp(it->string, "namespace") == 0) {
            rc = read_name(p, it, path, &m->namespace_);
        } else if (strcmp(it->string, "hosts") == 0) {
            rc = read_string_array(p, it, path, &m->hosts, &m->n_hosts, check_host);
        } else if (strcmp(it->string, "aliases") == 0) {
            rc = read_string_array(p, it, path, &m->aliases, &m->n_aliases, NULL);
        } else if (strcmp(it->string, "endpoints") == 0) {
            rc = read_string_array(p, it, path, &m->endpoints, &m->n_endpoints, check_hostport);
        } else if (strcmp(it->string, "command") == 0) {
            rc = read_string_array(p, it, path, &m->command, &m->n_command, NULL);
        } else if (strcmp(it->string, "env") == 0) {
            rc = read_env(p, it, path, m);
        } else if (strcmp(it->string, "health_path") == 0) {
            rc = read_string(p, it, path, &m->health_path);
            if (!rc && m->health_path[0] != '/') {
                rc = fail(p, it, path, "must start with '/'");
            }
        } else if (strcmp(it->string, "priority") == 0) {
            if (!cJSON_IsString(it) ||
                tier_parse(it->valuestring, strlen(it->valuestring), &m->priority)) {
                rc = fail(p, it, path, "must be one of \"critical\", \"standard\", \"batch\"");
            }
        } else {
            rc = fail(p, it, path, "unknown key");
        }
        if (rc) {
            return rc;
        }
    }
    if (!m->name) {
        return fail(p, obj, prefix, "\"name\" is required");
    }
    if (m->n_endpoints == 0 && m->n_command == 0) {
        return fail(p, obj, prefix,
                    "\"endpoints\" (a list of \"host:port\") or \"command\" (argv) is required");
    }
    if (m->n_endpoints && m->n_command) {
        return fail(p, obj, prefix, "has both \"endpoints\" and \"command\"; choose one");
    }
    if (m->min_replicas > m->max_replicas) {
        return fail(p, cJSON_GetObjectItemCaseSensitive(obj, "min_replicas"), prefix,
                    "min_replicas (%llu) is above max_replicas (%llu)",
                    (unsigned long long)m->min_replicas, (unsigned long long)m->max_replicas);
    }
    if (!m->health_path && !(m->health_path = strdup("/health"))) {
        return fail(p, obj, prefix, "out of memory");
    }
    if (!m->namespace_ && !(m->namespace_ = strdup("default"))) {
        return fail(p, obj, prefix, "out of memory");
    }
    if (m->max_queue == UINT64_MAX) {
        m->max_queue = lim->max_queue_per_model;
    }
    return 0;
}

static int parse_table_object(struct parser *p, const cJSON *obj, const char *name,
                              const struct num_key *keys, size_t n, void *base)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", name);
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, name, "must be an object");
    }
    int rc = check_duplicates(p, obj, prefix);
    if (rc) {
        return rc;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        rc = read_num_key(p, keys, n, base, it, prefix);
        if (rc == 1) {
            char path[256];
            snprintf(path, sizeof path, "%s%s", prefix, it->string);
            return fail(p, it, path, "unknown key");
        }
        if (rc) {
            return rc;
        }
    }
    return 0;
}

/* limits: the numeric table, plus priority_header and trust_forwarded_headers. */
static int parse_limits(struct parser *p, const cJSON *obj, struct config *cfg)
{
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, "limits", "must be an object");
    }
    int rc = check_duplicates(p, obj, "limits.");
    if (rc) {
        return rc;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (strcmp(it->string, "priority_header") == 0) {
            static const char *const names[] = {"any", "lower_only", "ignore"};
            bool ok = false;
            for (int i = 0; i < 3 && cJSON_IsString(it); i++) {
                if (strcmp(it->valuestring, names[i]) == 0) {
                    cfg->limits.priority_header = (enum priority_header_policy)i;
                    ok = true;
                }
            }
            if (!ok) {
                return fail(p, it, "limits.priority_header",
                            "must be \"any\", \"lower_only\" or \"ignore\"");
            }
            continue;
        }
        if (strcmp(it->string, "trust_forwarded_headers") == 0) {
            rc = read_bool(p, it, "limits.trust_forwarded_headers",
                           &cfg->limits.trust_forwarded_headers);
            if (rc) {
                return rc;
            }
            continue;
        }
        rc = read_num_key(p, limit_keys, N_ELEMS(limit_keys), &cfg->limits, it, "limits.");
        if (rc == 1) {
            char path[256];
            snprintf(path, sizeof path, "limits.%s", it->string);
            return fail(p, it, path, "unknown key");
        }
        if (rc) {
            return rc;
        }
    }
    return 0;
}

static int parse_log(struct parser *p, const cJSON *obj, struct config *cfg)
{
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, "log", "must be an object");
    }
    int rc = check_duplicates(p, obj, "log.");
    if (rc) {
        return rc;
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        if (strcmp(it->string, "level") == 0) {
            if (!cJSON_IsString(it) || log_level_parse(it->valuestring, &cfg->log_level)) {
                return fail(p, it, "log.level",
                            "must be one of \"debug\", \"info\", \"warn\", \"error\"");
            }
        } else if (strcmp(it->string, "access_log") == 0) {
            rc = read_bool(p, it, "log.access_log", &cfg->access_log);
            if (rc) {
                return rc;
            }
        } else {
            char path[128];
            snprintf(path, sizeof path, "log.%s", it->string);
            return fail(p, it, path, "unknown key");
        }
    }
    return 0;
}

struct config *config_new_default(void)
{
    struct config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) {
        return NULL;
    }
    set_defaults(limit_keys, N_ELEMS(limit_keys), &cfg->limits);
    set_defaults(upstream_keys, N_ELEMS(upstream_keys), &cfg->upstream);
    set_defaults(autoscaler_keys, N_ELEMS(autoscaler_keys), &cfg->autoscaler);
    set_defaults(warm_pool_keys, N_ELEMS(warm_pool_keys), &cfg->warm_pool);
    cfg->log_level = LOG_INFO;
    cfg->kubernetes.probe_pods = true;
    cfg->kubernetes.events = true;
    cfg->kubernetes.default_port = 8000;
    cfg->listen = strdup("0.0.0.0:8080");
    cfg->admin_listen = strdup("0.0.0.0:9090");
    if (!cfg->listen || !cfg->admin_listen) {
        config_free(cfg);
        return NULL;
    }
    return cfg;
}

static int parse_root(struct parser *p, const cJSON *root, struct config *cfg)
{
    if (!cJSON_IsObject(root)) {
        return fail(p, root, "(top level)", "must be a JSON object");
    }
    int rc = check_duplicates(p, root, "");
    if (rc) {
        return rc;
    }
    /* limits first: model defaults depend on it. */
    const cJSON *limits = cJSON_GetObjectItemCaseSensitive(root, "limits");
    if (limits) {
        rc = parse_limits(p, limits, cfg);
        if (rc) {
            return rc;
        }
    }
    const cJSON *models = NULL;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "listen") == 0 || strcmp(it->string, "admin_listen") == 0) {
            char **field = it->string[0] == 'l' ? &cfg->listen : &cfg->admin_listen;
            rc = read_string(p, it, it->string, field);
            if (!rc && check_listen(*field)) {
                rc = fail(p, it, it->string,
                          "must be \"ADDRESS:PORT\" or \"[IPV6]:PORT\" (got \"%.100s\")", *field);
            }
        } else if (strcmp(it->string, "limits") == 0) {
            continue;
        } else if (strcmp(it->string, "upstream") == 0) {
            rc = parse_table_object(p, it, "upstream", upstream_keys, N_ELEMS(upstream_keys),
                                    &cfg->upstream);
        } else if (strcmp(it->string, "log") == 0) {
            rc = parse_log(p, it, cfg);
        } else if (strcmp(it->string, "gpus") == 0) {
            rc = parse_gpus(p, it, cfg);
        } else if (strcmp(it->string, "kubernetes") == 0) {
            rc = parse_kubernetes(p, it, cfg);
        } else if (strcmp(it->string, "autoscaler") == 0) {
            rc = parse_table_object(p, it, "autoscaler", autoscaler_keys, N_ELEMS(autoscaler_keys),
                                    &cfg->autoscaler);
        } else if (strcmp(it->string, "warm_pool") == 0) {
            rc = parse_table_object(p, it, "warm_pool", warm_pool_keys, N_ELEMS(warm_pool_keys),
                                    &cfg->warm_pool);
        } else if (strcmp(it->string, "models") == 0) {
            models = it;
            if (!cJSON_IsArray(it)) {
                rc = fail(p, it, "models", "must be an array of objects");
            }
        } else {
            rc = fail(p, it, it->string, "unknown key");
        }
        if (rc) {
            return rc;
        }
    }
    if (models) {
        size_t n = (size_t)cJSON_GetArraySize(models);
        cfg->models = calloc(n ? n : 1, sizeof *cfg->models);
        if (!cfg->models) {
            return fail(p, models, "models", "out of memory");
        }
        size_t i = 0;
        for (const cJSON *m = models->child; m; m = m->next, i++) {
            cfg->n_models = i + 1;
            rc = parse_model(p, m, i, &cfg->models[i], &cfg->limits);
            if (rc) {
                return rc;
            }
            for (size_t j = 0; j < i; j++) {
                if (strcmp(cfg->models[j].name, cfg->models[i].name) == 0 &&
                    strcmp(cfg->models[j].namespace_, cfg->models[i].namespace_) == 0) {
                    char path[64];
                    snprintf(path, sizeof path, "models[%zu].name", i);
                    return fail(p, cJSON_GetObjectItemCaseSensitive(m, "name"), path,
                                "model \"%s\" is already defined at line %d", cfg->models[i].name,
                                cfg->models[j].line);
                }
            }
        }
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *m = &cfg->models[i];
        if (m->gpu_slices == 0) {
            continue;
        }
        char path[64];
        snprintf(path, sizeof path, "models[%zu].gpu_slices", i);
        if (m->n_command == 0) {
            return fail(p, NULL, path, "applies only to models with a \"command\"");
        }
        bool fits = false;
        for (size_t g = 0; g < cfg->n_gpus; g++) {
            fits |= cfg->gpus[g].slices >= m->gpu_slices;
        }
        if (!fits) {
            return fail(p, NULL, path,
                        "%llu slices do not fit on any declared GPU (see \"gpus\")",
                        (unsigned long long)m->gpu_slices);
        }
    }
    return 0;
}

/* The host part of "host:port" / "[v6]:port" (validated by check_hostport). */
static void endpoint_host(const char *hostport, char *host, size_t len)
{
    if (hostport[0] == '[') {
        const char *rb = strchr(hostport, ']');
        snprintf(host, len, "%.*s", (int)(rb - hostport - 1), hostport + 1);
    } else {
        const char *colon = strrchr(hostport, ':');
        snprintf(host, len, "%.*s", (int)(colon - hostport), hostport);
    }
}

/* Static endpoints must resolve now, so a typo fails --check-config and a
 * reload rather than the first request. Numeric addresses and localhost
 * need no lookup. */
static int resolve_endpoints(struct parser *p, const cJSON *root, const struct config *cfg)
{
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(root, "models");
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *m = &cfg->models[i];
        const cJSON *eps = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(models, (int)i), "endpoints");
        for (size_t j = 0; j < m->n_endpoints; j++) {
            char host[256];
            endpoint_host(m->endpoints[j], host, sizeof host);
            unsigned char addr[sizeof(struct in6_addr)];
            if (strcmp(host, "localhost") == 0 || inet_pton(AF_INET, host, addr) == 1 ||
                inet_pton(AF_INET6, host, addr) == 1) {
                continue;
            }
            struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
            struct addrinfo *res = NULL;
            int rc = getaddrinfo(host, NULL, &hints, &res);
            if (res) {
                freeaddrinfo(res);
            }
            if (rc || !res) {
                char path[64];
                snprintf(path, sizeof path, "models[%zu].endpoints[%zu]", i, j);
                return fail(p, cJSON_GetArrayItem(eps, (int)j), path,
                            "host \"%.100s\" does not resolve (%s)", host,
                            rc ? gai_strerror(rc) : "no address");
            }
        }
    }
    return 0;
}

/* Offset of the first NUL in the text: a raw byte or a \u0000 escape in a
 * string (cJSON would cut the string there). len when there is none. */
static size_t find_nul(const char *text, size_t len)
{
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\0') {
            return i;
        }
        if (!in_string) {
            in_string = c == '"';
            continue;
        }
        if (c == '"') {
            in_string = false;
        } else if (c == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && memcmp(text + i + 2, "0000", 4) == 0) {
                return i;
            }
            i++; /* the escaped character */
        }
    }
    return len;
}

/* The path ("models[0].name") of the first string on line (or, with
 * strings_only false, of any item there). */
static bool path_on_line(const struct jsonpos *pos, const cJSON *item, int line,
                         bool strings_only, char *path, size_t len)
{
    size_t base = strlen(path);
    size_t idx = 0;
    for (const cJSON *c = item->child; c; c = c->next, idx++) {
        if (c->string) {
            snprintf(path + base, len - base, "%s%s", base ? "." : "", c->string);
        } else {
            snprintf(path + base, len - base, "[%zu]", idx);
        }
        if ((jsonpos_line(pos, c) == line && (!strings_only || cJSON_IsString(c))) ||
            path_on_line(pos, c, line, strings_only, path, len)) {
            return true;
        }
        path[base] = '\0';
    }
    return false;
}

struct config *config_parse(const char *text, size_t len, const char *label,
                            struct config_error *err)
{
    struct parser p = {.label = label, .text = text, .len = len, .err = err};
    err->msg[0] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - text) : 0;
        snprintf(err->msg, sizeof err->msg, "%s:%d: (syntax): not valid JSON near byte %zu", label,
                 jsonpos_line_of_offset(text, len, off), off);
        return NULL;
    }
    /* Only whitespace may follow the object (a second object would
     * otherwise be ignored without a word). */
    size_t off = end ? (size_t)(end - text) : len;
    while (off < len && (unsigned char)text[off] <= ' ' && text[off] != '\0') {
        off++;
    }
    if (off < len) {
        snprintf(err->msg, sizeof err->msg,
                 "%s:%d: (syntax): unexpected content after the JSON object near byte %zu", label,
                 jsonpos_line_of_offset(text, len, off), off);
        cJSON_Delete(root);
        return NULL;
    }
    struct config *cfg = config_new_default();
    if (!cfg || !(cfg->path = strdup(label)) || jsonpos_build(&p.pos, text, len, root)) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (load): out of memory", label);
        cJSON_Delete(root);
        config_free(cfg);
        return NULL;
    }
    int rc = 0;
    size_t nul = find_nul(text, len);
    if (nul < len) {
        int line = jsonpos_line_of_offset(text, len, nul);
        char path[256] = "";
        if (!path_on_line(&p.pos, root, line, true, path, sizeof path) &&
            !path_on_line(&p.pos, root, line, false, path, sizeof path)) {
            snprintf(path, sizeof path, "(string)");
        }
        snprintf(err->msg, sizeof err->msg, "%s:%d: %s: %s", label, line, path,
                 text[nul] == '\0' ? "a NUL byte in the file"
                                    : "a string holds a NUL character (\\u0000)");
        rc = -EINVAL;
    }
    if (!rc) {
        rc = parse_root(&p, root, cfg);
    }
    if (!rc) {
        rc = resolve_endpoints(&p, root, cfg);
    }
    jsonpos_dispose(&p.pos);
    cJSON_Delete(root);
    if (rc) {
        config_free(cfg);
        return NULL;
    }
    return cfg;
}

struct config *config_load(const char *path, struct config_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (file): cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct config *cfg = NULL;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            if (cap >= (size_t)16 << 20) {
                snprintf(err->msg, sizeof err->msg, "%s:0: (file): larger than 16 MiB", path);
                goto out;
            }
            cap = cap ? cap * 2 : 8192;
            char *nt = realloc(text, cap + 1);
            if (!nt) {
                snprintf(err->msg, sizeof err->msg, "%s:0: (file): out of memory", path);
                goto out;
            }
            text = nt;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    if (ferror(f)) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (file): read error", path);
        goto out;
    }
    text[len] = '\0';
    cfg = config_parse(text, len, path, err);
out:
    free(text);
    fclose(f);
    return cfg;
}

static void free_strings(char **arr, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(arr[i]);
    }
    free(arr);
}

void config_free(struct config *cfg)
{
    if (!cfg) {
        return;
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        struct config_model *m = &cfg->models[i];
        free(m->name);
        free(m->namespace_);
        free_strings(m->hosts, m->n_hosts);
        free_strings(m->aliases, m->n_aliases);
        free_strings(m->endpoints, m->n_endpoints);
        free_strings(m->command, m->n_command);
        free_strings(m->env, m->n_env);
        free(m->health_path);
    }
    free(cfg->models);
    free(cfg->gpus);
    free_strings(cfg->kubernetes.namespaces, cfg->kubernetes.n_namespaces);
    free(cfg->kubernetes.label_selector);
    free(cfg->kubernetes.kubeconfig);
    free(cfg->kubernetes.context);
    free(cfg->kubernetes.lease_name);
    free(cfg->kubernetes.lease_namespace);
    free(cfg->kubernetes.identity);
    free(cfg->kubernetes.peers_service);
    free(cfg->kubernetes.peers_namespace);
    free(cfg->path);
    free(cfg->listen);
    free(cfg->admin_listen);
    free(cfg);
}

int config_set_string(char **field, const char *value)
{
    char *s = strdup(value);
    if (!s) {
        return -ENOMEM;
    }
    free(*field);
    *field = s;
    return 0;
}

int config_set_listen(struct config *cfg, char **field, const char *value, const char *flag,
                      struct config_error *err)
{
    (void)cfg;
    if (check_listen(value)) {
        snprintf(err->msg, sizeof err->msg,
                 "%s: must be \"ADDRESS:PORT\" or \"[IPV6]:PORT\" (got \"%.100s\")", flag, value);
        return -EINVAL;
    }
    if (config_set_string(field, value)) {
        snprintf(err->msg, sizeof err->msg, "%s: out of memory", flag);
        return -ENOMEM;
    }
    return 0;
}

#include "thaw/config.h"
#include "thaw/jsonpos.h"
#include "thaw/jsonscan.h"
#include "thaw/netaddr.h"
#include "thaw/strmap.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

struct parser {
    const char *label;
    const char *text;
    size_t len;
    struct jsonpos pos;
    struct config_error *err;
    struct config *cfg; /* the one being read */
    /* Reading a revision: its model's keys are read into it first (without
     * the model-only ones), then the revision's own. */
    enum { READ_MODEL, READ_REVISION_BASE, READ_REVISION } reading;
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
    /* An object's own rule is named by its prefix ("models[0]."): no dot. */
    size_t klen = strlen(key);
    int shown = klen > 1 && key[klen - 1] == '.' ? (int)klen - 1 : (int)klen;
    snprintf(p->err->msg, sizeof p->err->msg, "%s:%d: %.*s: %s", p->label, line, shown, key, what);
    return -EINVAL;
}

static int read_uint(struct parser *p, const cJSON *item, const char *path, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) {
        return fail(p, item, path, "must be a number");
    }
    double v = item->valuedouble;
    if (v != floor(v) || v < 0) {
        return fail(p, item, path, "must be a whole number between %llu and %llu",
                    (unsigned long long)min, (unsigned long long)max);
    }
    if (v < (double)min || v > (double)max) {
        return fail(p, item, path, "must be between %llu and %llu (got %.0f)",
                    (unsigned long long)min, (unsigned long long)max, v);
    }
    *out = (uint64_t)v;
    return 0;
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
    for (size_t j = 0; *out && j < *n_out; j++) {
        free((*out)[j]); /* a revision's own list replaces its model's */
    }
    free(*out);
    *out = arr;
    *n_out = n;
    return 0;
}

/* Model names and namespaces: DNS-label-like, as Kubernetes names are. */
#define NAME_MAX_CHARS 253
/* A revision name: the first label of its tag host, and a Kubernetes label value. */
#define REVISION_MAX_CHARS 63

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
/* A listen address: the shape, and then the numeric address the listener
 * will parse (so a file --check-config passes is one thaw starts with). */
static int check_listen(const char *s)
{
    size_t n = strlen(s);
    int rc;
    if (n >= 2 && strcmp(s + n - 2, ":0") == 0) {
        char tmp[300];
        snprintf(tmp, sizeof tmp, "%.*s:1", (int)(n - 2), s);
        rc = check_hostport(tmp);
    } else {
        rc = check_hostport(s);
    }
    struct sockaddr_storage ss;
    socklen_t len;
    return rc ? rc : netaddr_parse(s, &ss, &len);
}

/* A model name or namespace, just read: says which rule it breaks. */
static int check_name_value(struct parser *p, const cJSON *item, const char *path, void *field)
{
    const char *s = *(char **)field;
    size_t n = strlen(s);
    if (n > NAME_MAX_CHARS) {
        return fail(p, item, path, "is too long (%zu characters; at most %d)", n, NAME_MAX_CHARS);
    }
    if (check_name(s)) {
        return fail(p, item, path, "may hold only letters, digits, '-', '.' and '_'");
    }
    return 0;
}

/* Aliases are the names requests use (in the body's "model" too), so none
 * may be longer than a request can name. */
static int check_aliases(struct parser *p, const cJSON *item, const char *path, void *field)
{
    (void)field;
    size_t i = 0;
    for (const cJSON *e = item->child; e; e = e->next, i++) {
        size_t n = strlen(e->valuestring);
        if (n > JSONSCAN_MODEL_MAX) {
            char epath[300];
            snprintf(epath, sizeof epath, "%s[%zu]", path, i);
            return fail(p, e, epath, "is too long (%zu bytes; a request names at most %d)", n,
                        JSONSCAN_MODEL_MAX);
        }
    }
    return 0;
}

/* "env": {"NAME": "value", ...} -> "NAME=value" strings. */
static int parse_env(struct parser *p, const cJSON *obj, const char *path, void *base)
{
    struct config_model *m = base;
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, path, "must be an object of strings");
    }
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s.", path);
    int rc = check_duplicates(p, obj, prefix);
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

/* Key tables, in the manner of nginx's ngx_command_t: every key of a
 * section, with its type, where it lives, its default, its range and an
 * optional check. Parsing, error text and defaults all come from here. */
enum key_type {
    KEY_NUM,     /* uint64_t in [min, max] */
    KEY_BOOL,    /* bool */
    KEY_STRING,  /* char *, not empty; def_str is its default */
    KEY_ENUM,    /* an enum stored as int: one of names[], or what lookup accepts */
    KEY_STRINGS, /* char ** with its count at count_offset */
    KEY_OBJECT,  /* a nested section, at offset */
    KEY_CUSTOM,  /* parse() reads it */
};

struct section;

struct conf_key {
    const char *name;
    enum key_type type;
    size_t offset;
    uint64_t def;      /* KEY_NUM, KEY_BOOL, KEY_ENUM */
    uint64_t min, max; /* KEY_NUM */
    bool zero_ok;      /* KEY_NUM: 0 (the default's "none") is allowed below min */
    const char *def_str;
    const char *const *names; /* KEY_ENUM: value i is names[i] */
    int n_names;
    int (*lookup)(const char *s, int *value); /* KEY_ENUM, instead of names */
    const char *enum_msg;                     /* KEY_ENUM: the error for anything else */
    size_t count_offset;                      /* KEY_STRINGS */
    int (*elem_check)(const char *s);         /* KEY_STRINGS: nonzero rejects an element */
    /* After a good read: further rules on the value at field. */
    int (*check)(struct parser *p, const cJSON *item, const char *path, void *field);
    /* KEY_CUSTOM: reads item into the section at base. */
    int (*parse)(struct parser *p, const cJSON *item, const char *path, void *base);
    const struct section *sub; /* KEY_OBJECT */
    bool early;                /* read before the section's other keys */
};

struct section {
    const struct conf_key *keys;
    size_t n_keys;
    /* Rules across keys, once every key was read; prefix ends in '.'. */
    int (*finish)(struct parser *p, const cJSON *obj, const char *prefix, void *base);
};

#define SECTION(keys, finish) {keys, N_ELEMS(keys), finish}
#define K_NUM(T, k, d, lo, hi)                                                                     \
    {.name = #k, .type = KEY_NUM, .offset = offsetof(T, k), .def = d, .min = lo, .max = hi}
/* 0, or lo to hi. */
#define K_NUM0(T, k, lo, hi)                                                                       \
    {.name = #k, .type = KEY_NUM, .offset = offsetof(T, k), .min = lo, .max = hi, .zero_ok = true}
#define K_BOOL(T, k, d) {.name = #k, .type = KEY_BOOL, .offset = offsetof(T, k), .def = d}
#define K_STRING(T, k, d, chk)                                                                     \
    {.name = #k, .type = KEY_STRING, .offset = offsetof(T, k), .def_str = d, .check = chk}
#define K_STRINGS(T, k, chk)                                                                       \
    {.name = #k, .type = KEY_STRINGS, .offset = offsetof(T, k), .count_offset = offsetof(T, n_##k), \
     .elem_check = chk}
#define K_OBJECT(T, k, sec) {.name = #k, .type = KEY_OBJECT, .offset = offsetof(T, k), .sub = sec}

static int parse_section(struct parser *p, const struct section *sec, const cJSON *obj,
                         const char *prefix, void *base);

/* Sets every key of sec (and of its nested sections) to its default;
 * strings too when with_strings. 0 or -ENOMEM. */
static int set_defaults(const struct section *sec, void *base, bool with_strings)
{
    for (size_t i = 0; i < sec->n_keys; i++) {
        const struct conf_key *k = &sec->keys[i];
        void *field = (char *)base + k->offset;
        switch (k->type) {
        case KEY_NUM:
            *(uint64_t *)field = k->def;
            break;
        case KEY_BOOL:
            *(bool *)field = k->def != 0;
            break;
        case KEY_ENUM:
            *(int *)field = (int)k->def;
            break;
        case KEY_STRING:
            if (with_strings && k->def_str && config_set_string(field, k->def_str)) {
                return -ENOMEM;
            }
            break;
        case KEY_OBJECT:
            if (set_defaults(k->sub, field, with_strings)) {
                return -ENOMEM;
            }
            break;
        case KEY_STRINGS:
        case KEY_CUSTOM:
            break;
        }
    }
    return 0;
}

static int read_enum(struct parser *p, const struct conf_key *k, const cJSON *item,
                     const char *path, int *out)
{
    if (cJSON_IsString(item)) {
        if (k->lookup) {
            if (k->lookup(item->valuestring, out) == 0) {
                return 0;
            }
        } else {
            for (int i = 0; i < k->n_names; i++) {
                if (strcmp(item->valuestring, k->names[i]) == 0) {
                    *out = i;
                    return 0;
                }
            }
        }
    }
    return fail(p, item, path, "%s", k->enum_msg);
}

/* A nested section: name is its path, without the trailing '.'. */
static int parse_object(struct parser *p, const struct section *sec, const cJSON *obj,
                        const char *name, void *base)
{
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, name, "must be an object");
    }
    char prefix[260]; /* a path (256) and the dot */
    snprintf(prefix, sizeof prefix, "%s.", name);
    return parse_section(p, sec, obj, prefix, base);
}

static int read_key(struct parser *p, const struct conf_key *k, const cJSON *item,
                    const char *path, void *base)
{
    void *field = (char *)base + k->offset;
    int rc = 0;
    switch (k->type) {
    case KEY_NUM:
        if (k->zero_ok && cJSON_IsNumber(item) && item->valuedouble == 0) {
            *(uint64_t *)field = 0;
            break;
        }
        rc = read_uint(p, item, path, k->min, k->max, field);
        if (rc && k->zero_ok && cJSON_IsNumber(item) && item->valuedouble > 0 &&
            item->valuedouble == floor(item->valuedouble)) {
            rc = fail(p, item, path, "must be 0 or between %llu and %llu (got %.0f)",
                      (unsigned long long)k->min, (unsigned long long)k->max, item->valuedouble);
        }
        break;
    case KEY_BOOL:
        rc = read_bool(p, item, path, field);
        break;
    case KEY_STRING:
        rc = read_string(p, item, path, field);
        break;
    case KEY_ENUM:
        rc = read_enum(p, k, item, path, field);
        break;
    case KEY_STRINGS:
        rc = read_string_array(p, item, path, field, (size_t *)((char *)base + k->count_offset),
                               k->elem_check);
        break;
    case KEY_OBJECT:
        rc = parse_object(p, k->sub, item, path, field);
        break;
    case KEY_CUSTOM:
        rc = k->parse(p, item, path, base);
        break;
    }
    if (!rc && k->check) {
        rc = k->check(p, item, path, field);
    }
    return rc;
}

static const struct conf_key *find_key(const struct section *sec, const char *name)
{
    for (size_t i = 0; i < sec->n_keys; i++) {
        if (strcmp(sec->keys[i].name, name) == 0) {
            return &sec->keys[i];
        }
    }
    return NULL;
}

/* Reads the members of obj (already known to be an object) into base:
 * duplicate keys first, then the early keys, then the others in file
 * order (an unknown one is an error where it stands), then finish. */
static int parse_section(struct parser *p, const struct section *sec, const cJSON *obj,
                         const char *prefix, void *base)
{
    int rc = check_duplicates(p, obj, prefix);
    for (int early = 1; !rc && early >= 0; early--) {
        for (const cJSON *it = obj->child; it && !rc; it = it->next) {
            const struct conf_key *k = find_key(sec, it->string);
            if (k ? k->early != (early == 1) : early == 1) {
                continue;
            }
            char path[256];
            snprintf(path, sizeof path, "%s%s", prefix, it->string);
            rc = k ? read_key(p, k, it, path, base) : fail(p, it, path, "unknown key");
        }
    }
    if (!rc && sec->finish) {
        rc = sec->finish(p, obj, prefix, base);
    }
    return rc;
}

/* Enum lookups that another module owns. */
static int lookup_tier(const char *s, int *value)
{
    enum tier t;
    if (tier_parse(s, strlen(s), &t)) {
        return -1;
    }
    *value = (int)t;
    return 0;
}

static int lookup_log_level(const char *s, int *value)
{
    enum log_level l;
    if (log_level_parse(s, &l)) {
        return -1;
    }
    *value = (int)l;
    return 0;
}

/* KEY_ENUM stores through an int. */
_Static_assert(sizeof(enum tier) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum size");
_Static_assert(sizeof(enum priority_header_policy) == sizeof(int), "enum size");
_Static_assert(sizeof(enum gpu_sharing) == sizeof(int), "enum size");
_Static_assert(sizeof(enum prewarm_mode) == sizeof(int), "enum size");

static int lookup_prewarm(const char *s, int *value)
{
    static const char *const names[] = {"off", "on", "shadow"};
    static const enum prewarm_mode modes[] = {PREWARM_OFF, PREWARM_ON, PREWARM_SHADOW};
    for (size_t i = 0; i < N_ELEMS(names); i++) {
        if (strcmp(s, names[i]) == 0) {
            *value = (int)modes[i];
            return 0;
        }
    }
    return -1;
}
#define PREWARM_MSG "must be \"off\", \"on\" or \"shadow\""

/* ---- limits, upstream, autoscaler, warm_pool, log ---- */

static const char *const priority_header_names[] = {"any", "lower_only", "ignore"};

static const struct conf_key limit_keys[] = {
    K_NUM(struct config_limits, max_connections, 10000, 1, 1000000),
    K_NUM(struct config_limits, max_header_bytes, 65536, 1024, 1048576),
    K_NUM(struct config_limits, max_headers, 100, 1, 1000),
    K_NUM(struct config_limits, max_body_bytes, 16777216, 0, 1073741824),
    K_NUM(struct config_limits, header_timeout_ms, 10000, 1, 3600000),
    K_NUM(struct config_limits, body_timeout_ms, 60000, 1, 3600000),
    K_NUM(struct config_limits, keepalive_timeout_ms, 60000, 0, 3600000),
    K_NUM(struct config_limits, send_timeout_ms, 60000, 1, 3600000),
    K_NUM(struct config_limits, max_queue_per_model, 1000, 0, 1000000),
    K_NUM(struct config_limits, max_queue_total, 10000, 0, 10000000),
    K_NUM(struct config_limits, queue_aging_ms, 10000, 1, 3600000),
    K_NUM(struct config_limits, drain_timeout_ms, 30000, 0, 3600000),
    K_NUM(struct config_limits, body_total_timeout_ms, 300000, 1, 86400000),
    K_NUM(struct config_limits, max_buffered_body_bytes, 268435456, 1024, 68719476736ULL),
    {.name = "priority_header", .type = KEY_ENUM,
     .offset = offsetof(struct config_limits, priority_header), .def = PRIORITY_HEADER_ANY,
     .names = priority_header_names, .n_names = (int)N_ELEMS(priority_header_names),
     .enum_msg = "must be \"any\", \"lower_only\" or \"ignore\""},
    K_BOOL(struct config_limits, trust_forwarded_headers, false),
};
static const struct section limits_section = SECTION(limit_keys, NULL);

static const struct conf_key upstream_keys[] = {
    K_NUM(struct config_upstream, keepalive_per_endpoint, 64, 0, 100000),
    K_NUM(struct config_upstream, keepalive_timeout_ms, 4000, 1, 3600000),
    K_NUM(struct config_upstream, eject_ms, 2000, 0, 600000),
    K_NUM(struct config_upstream, max_response_header_bytes, 65536, 1024, 1048576),
};
static const struct section upstream_section = SECTION(upstream_keys, NULL);

static const struct conf_key autoscaler_keys[] = {
    K_NUM(struct config_autoscaler, tick_ms, 2000, 100, 600000),
    K_NUM(struct config_autoscaler, stable_window_ms, 60000, 6000, 3600000),
    K_NUM(struct config_autoscaler, panic_window_pct, 10, 1, 100),
    K_NUM(struct config_autoscaler, panic_threshold_pct, 200, 110, 1000),
    K_NUM(struct config_autoscaler, max_scale_up_rate, 1000, 1, 100000),
    K_NUM(struct config_autoscaler, max_scale_down_rate, 2, 1, 1000),
    K_NUM(struct config_autoscaler, scale_down_delay_ms, 0, 0, 3600000),
    K_NUM(struct config_autoscaler, activation_scale, 1, 1, 1000),
    K_NUM(struct config_autoscaler, target_utilization_pct, 70, 1, 100),
    {.name = "prewarm", .type = KEY_ENUM, .offset = offsetof(struct config_autoscaler, prewarm),
     .def = PREWARM_OFF, .lookup = lookup_prewarm, .enum_msg = PREWARM_MSG},
    K_NUM(struct config_autoscaler, prewarm_min_requests, 1, 1, 100000),
    K_NUM(struct config_autoscaler, prewarm_lead_ms, 300000, 0, 86400000),
    K_NUM(struct config_autoscaler, prewarm_quiet_ms, 3600000, 0, 86400000),
};
static const struct section autoscaler_section = SECTION(autoscaler_keys, NULL);

static const struct conf_key warm_pool_keys[] = {
    K_NUM(struct config_warm_pool, budget_slices, 0, 0, 100000),
    K_NUM(struct config_warm_pool, capacity_slices, 0, 0, 100000),
};
static const struct section warm_pool_section = SECTION(warm_pool_keys, NULL);

/* "log" keys live in struct config itself. */
static const struct conf_key log_keys[] = {
    {.name = "level", .type = KEY_ENUM, .offset = offsetof(struct config, log_level),
     .def = LOG_INFO, .lookup = lookup_log_level,
     .enum_msg = "must be one of \"debug\", \"info\", \"warn\", \"error\""},
    K_BOOL(struct config, access_log, false),
};
static const struct section log_section = SECTION(log_keys, NULL);

/* ---- kubernetes ---- */

/* Present means enabled; the lease timings must nest. */
static int kubernetes_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    struct config_kubernetes *k = base;
    k->enabled = true;
    if (k->renew_deadline_ms >= k->lease_duration_ms ||
        k->renew_interval_ms >= k->renew_deadline_ms) {
        return fail(p, obj, "kubernetes",
                    "need renew_interval_ms < renew_deadline_ms < lease_duration_ms");
    }
    return 0;
}

/* lease_namespace and identity default at run time (credentials, pod name). */
static const struct conf_key kubernetes_keys[] = {
    K_STRINGS(struct config_kubernetes, namespaces, check_name),
    K_STRING(struct config_kubernetes, label_selector, "thaw.dev/model", NULL),
    K_STRING(struct config_kubernetes, kubeconfig, NULL, NULL),
    K_STRING(struct config_kubernetes, context, NULL, NULL),
    K_BOOL(struct config_kubernetes, probe_pods, true),
    K_BOOL(struct config_kubernetes, events, true),
    K_BOOL(struct config_kubernetes, pull_events, true),
    K_NUM(struct config_kubernetes, default_port, 8000, 1, 65535),
    K_BOOL(struct config_kubernetes, leader_election, false),
    K_STRING(struct config_kubernetes, lease_name, "thaw-leader", NULL),
    K_STRING(struct config_kubernetes, lease_namespace, NULL, NULL),
    K_STRING(struct config_kubernetes, identity, NULL, NULL),
    K_NUM(struct config_kubernetes, lease_duration_ms, 15000, 1000, 600000),
    K_NUM(struct config_kubernetes, renew_interval_ms, 2000, 100, 60000),
    K_NUM(struct config_kubernetes, renew_deadline_ms, 10000, 500, 600000),
    K_STRING(struct config_kubernetes, peers_service, NULL, NULL),
    K_STRING(struct config_kubernetes, peers_namespace, NULL, NULL),
    K_NUM(struct config_kubernetes, peers_port, 9090, 1, 65535),
    K_NUM(struct config_kubernetes, peers_poll_ms, 1000, 100, 60000),
    K_NUM(struct config_kubernetes, peers_timeout_ms, 5000, 200, 600000),
    K_NUM(struct config_kubernetes, gpu_memory_bytes, 0, 0, 1ull << 50),
};
static const struct section kubernetes_section = SECTION(kubernetes_keys, kubernetes_finish);

/* ---- models ---- */

bool config_health_path_ok(const char *path)
{
    if (path[0] != '/') {
        return false;
    }
    for (; *path; path++) {
        if ((unsigned char)*path <= ' ' || *path == 0x7f) {
            return false;
        }
    }
    return true;
}

bool config_gpu_unit_takes(const struct config_model *m, const char *unit_profile,
                           uint64_t unit_slices, uint64_t unit_memory)
{
    if (m->mig_profile) {
        return unit_profile && strcmp(unit_profile, m->mig_profile) == 0;
    }
    return !unit_profile && unit_slices >= m->gpu_slices &&
           (!unit_memory || unit_memory >= m->gpu_memory_bytes);
}

static int check_health_path(struct parser *p, const cJSON *item, const char *path, void *field)
{
    const char *s = *(char **)field;
    if (s[0] != '/') {
        return fail(p, item, path, "must start with '/'");
    }
    return config_health_path_ok(s)
               ? 0
               : fail(p, item, path, "must not hold spaces or control characters");
}

#define QUEUE_TIMEOUT_DEFAULT_MS 300000

/* A request held for a process-backed model waits out a whole start: the
 * startup timeout and a minute (so a start that fails is answered by the
 * startup timeout, 503 start_failed, not by a 504). Never below 5 minutes;
 * batch waits an hour for capacity. */
uint64_t config_default_queue_timeout_ms(enum tier priority, uint64_t startup_ms)
{
    uint64_t ms = startup_ms ? startup_ms + 60000 : 0;
    if (ms < QUEUE_TIMEOUT_DEFAULT_MS) {
        ms = QUEUE_TIMEOUT_DEFAULT_MS;
    }
    if (priority == TIER_BATCH && ms < CONFIG_BATCH_QUEUE_TIMEOUT_MS) {
        ms = CONFIG_BATCH_QUEUE_TIMEOUT_MS;
    }
    return ms;
}

uint64_t config_default_idle_timeout_ms(enum tier priority)
{
    return priority == TIER_BATCH ? CONFIG_BATCH_IDLE_TIMEOUT_MS : CONFIG_IDLE_TIMEOUT_DEFAULT_MS;
}

static uint64_t default_queue_timeout(const struct config_model *m)
{
    return config_default_queue_timeout_ms(m->priority, m->n_command ? m->startup_timeout_ms : 0);
}

/* "revisions": [{"name": N, "percent": P, ...model keys}, ...] on a model:
 * here only the split (names and percents); each revision's own keys are
 * read by parse_revisions once every model is read. */
static int parse_revision_list(struct parser *p, const cJSON *arr, const char *path, void *base)
{
    struct config_model *m = base;
    if (p->reading == READ_REVISION_BASE) {
        return 0;
    }
    if (p->reading == READ_REVISION) {
        return fail(p, arr, path, "a revision cannot have revisions of its own");
    }
    size_t n = cJSON_IsArray(arr) ? (size_t)cJSON_GetArraySize(arr) : 0;
    if (n == 0 || n > CONFIG_MAX_REVISIONS) {
        return fail(p, arr, path, "must be an array of 1 to %d revisions "
                    "({\"name\", \"percent\", and the model keys it sets})", CONFIG_MAX_REVISIONS);
    }
    m->revisions = calloc(n, sizeof *m->revisions);
    if (!m->revisions) {
        return fail(p, arr, path, "out of memory");
    }
    size_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        char epath[300];
        snprintf(epath, sizeof epath, "%s[%zu]", path, i);
        if (!cJSON_IsObject(e)) {
            return fail(p, e, epath, "must be an object");
        }
        struct config_revision *r = &m->revisions[i];
        m->n_revisions = i + 1;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *pct = cJSON_GetObjectItemCaseSensitive(e, "percent");
        char kpath[320];
        snprintf(kpath, sizeof kpath, "%s.name", epath);
        if (!name) {
            return fail(p, e, kpath, "is required");
        }
        int rc = read_string(p, name, kpath, &r->name);
        /* Its tag host starts with it (a DNS label: 63 at most), and on
         * Kubernetes it is a label value (63 at most too). */
        size_t len = rc == 0 ? strlen(r->name) : 0;
        if (rc == 0 && len > REVISION_MAX_CHARS) {
            rc = fail(p, name, kpath, "is too long (%zu characters; at most %d)", len,
                      REVISION_MAX_CHARS);
        } else if (rc == 0 && m->name && strlen(m->name) + 1 + len > NAME_MAX_CHARS) {
            rc = fail(p, name, kpath, "makes \"%s@<revision>\" longer than a model name may be "
                      "(%d characters)", m->name, NAME_MAX_CHARS);
        } else if (rc == 0 && check_name(r->name)) {
            rc = fail(p, name, kpath, "may hold only letters, digits, '-', '.' and '_'");
        }
        snprintf(kpath, sizeof kpath, "%s.percent", epath);
        if (rc == 0 && !pct) {
            rc = fail(p, e, kpath, "is required (0 to 100; the revisions' percents add up to 100)");
        }
        if (rc == 0) {
            rc = read_uint(p, pct, kpath, 0, 100, &r->percent);
        }
        for (size_t j = 0; rc == 0 && j < i; j++) {
            if (strcmp(m->revisions[j].name, r->name) == 0) {
                snprintf(kpath, sizeof kpath, "%s.name", epath);
                rc = fail(p, name, kpath, "revision \"%s\" is listed twice", r->name);
            }
        }
        if (rc) {
            return rc;
        }
    }
    return 0;
}

/* The rules for a model with revisions. */
static int revisions_finish(struct parser *p, const cJSON *obj, const char *prefix,
                            struct config_model *m)
{
    char path[300];
    snprintf(path, sizeof path, "%srevisions", prefix);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, "revisions");
    if (m->n_endpoints || m->n_command) {
        return fail(p, obj, prefix, "a model with \"revisions\" takes \"endpoints\" or "
                    "\"command\" in each revision, not in the model");
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < m->n_revisions; i++) {
        sum += m->revisions[i].percent;
    }
    if (sum != 100) {
        return fail(p, arr, path, "the revisions' percents add up to %llu, not 100",
                    (unsigned long long)sum);
    }
    if (m->rollout.enabled && m->n_revisions != 2) {
        snprintf(path, sizeof path, "%srollout", prefix);
        return fail(p, cJSON_GetObjectItemCaseSensitive(obj, "rollout"), path,
                    "a rollout needs exactly two revisions: the stable one first, then the "
                    "canary (has %zu)", m->n_revisions);
    }
    return 0;
}

/* Keys of the model only: a revision may not set them. */
static const char *const model_only_keys[] = {
    "namespace", "hosts", "aliases", "revisions", "fallback_to_warm_revision",
    "sticky_header", "sticky_tenant", "rollout",
};

static bool is_model_only_key(const char *key)
{
    for (size_t i = 0; i < N_ELEMS(model_only_keys); i++) {
        if (strcmp(model_only_keys[i], key) == 0) {
            return true;
        }
    }
    return false;
}

static int model_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    struct config_model *m = base;
    if (!m->name) {
        return fail(p, obj, prefix, "\"name\" is required");
    }
    const cJSON *pct = cJSON_GetObjectItemCaseSensitive(obj, "percent");
    if (pct && p->reading == READ_MODEL) {
        char path[300];
        snprintf(path, sizeof path, "%spercent", prefix);
        return fail(p, pct, path, "applies only to an entry of \"revisions\"");
    }
    if (p->reading == READ_MODEL && m->n_revisions) {
        /* A routing entry: it holds no requests, but shows sane values. */
        if (m->max_queue == UINT64_MAX) {
            m->max_queue = p->cfg->limits.max_queue_per_model;
        }
        if (m->queue_timeout_ms == UINT64_MAX) {
            m->queue_timeout_ms = QUEUE_TIMEOUT_DEFAULT_MS;
        }
        return revisions_finish(p, obj, prefix, m);
    }
    if (p->reading == READ_MODEL && (m->rollout.enabled || m->sticky_header || m->sticky_tenant ||
                                     m->fallback_to_warm_revision)) {
        return fail(p, obj, prefix, "\"rollout\", \"sticky_header\", \"sticky_tenant\" and "
                    "\"fallback_to_warm_revision\" apply only to a model with \"revisions\"");
    }
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(obj, "endpoints");
    if (m->n_endpoints == 0 && m->n_command == 0 && eps) {
        char path[128];
        snprintf(path, sizeof path, "%sendpoints", prefix);
        return fail(p, eps, path, "must list at least one \"host:port\"");
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
    if (m->max_queue == UINT64_MAX) {
        m->max_queue = p->cfg->limits.max_queue_per_model;
    }
    if (m->queue_timeout_ms == UINT64_MAX) {
        m->queue_timeout_ms = default_queue_timeout(m);
    }
    if (m->idle_timeout_ms == UINT64_MAX) {
        m->idle_timeout_ms = config_default_idle_timeout_ms(m->priority);
    }
    return 0;
}

static const struct conf_key sleep_keys[] = {
    K_BOOL(struct config_sleep, enabled, false),
    K_NUM(struct config_sleep, level, 1, 1, 2),
    K_NUM(struct config_sleep, idle_before_sleep_ms, 0, 0, 86400000),
    K_NUM(struct config_sleep, timeout_ms, 30000, 1, 600000),
};
static const struct section sleep_section = SECTION(sleep_keys, NULL);
static const struct conf_key rollout_keys[] = {
    K_BOOL(struct config_rollout, enabled, false),
    K_NUM(struct config_rollout, step_percent, 10, 1, 100),
    K_NUM(struct config_rollout, step_interval_ms, 60000, 100, 86400000),
    K_NUM(struct config_rollout, min_requests, 20, 1, 1000000),
    K_NUM(struct config_rollout, max_error_rate_increase_pct, 5, 0, 100),
    K_NUM(struct config_rollout, max_ttfb_p99_ratio_pct, 150, 100, 10000),
    K_NUM(struct config_rollout, ttfb_p99_tolerance_ms, 50, 0, 600000),
};
static const struct section rollout_section = SECTION(rollout_keys, NULL);

/* A header name: an RFC 9110 token, kept lower-case for lookups. */
static int check_sticky_header(struct parser *p, const cJSON *item, const char *path, void *field)
{
    char *s = *(char **)field;
    for (char *c = s; *c; c++) {
        if (!(isalnum((unsigned char)*c) || strchr("!#$%&'*+-.^_`|~", *c))) {
            return fail(p, item, path, "must be a header name");
        }
        *c = (char)tolower((unsigned char)*c);
    }
    return 0;
}

/* max_queue's default is limits.max_queue_per_model, queue_timeout_ms's
 * default_queue_timeout(), idle_timeout_ms's by the model's priority;
 * UINT64_MAX marks "unset". */
static const struct conf_key model_keys[] = {
    K_STRING(struct config_model, name, NULL, check_name_value),
    {.name = "namespace", .type = KEY_STRING, .offset = offsetof(struct config_model, namespace_),
     .def_str = "default", .check = check_name_value},
    K_STRINGS(struct config_model, hosts, check_host),
    {.name = "aliases", .type = KEY_STRINGS, .offset = offsetof(struct config_model, aliases),
     .count_offset = offsetof(struct config_model, n_aliases), .check = check_aliases},
    K_STRINGS(struct config_model, endpoints, check_hostport),
    K_STRINGS(struct config_model, command, NULL),
    {.name = "env", .type = KEY_CUSTOM, .parse = parse_env},
    K_STRING(struct config_model, health_path, "/health", check_health_path),
    {.name = "priority", .type = KEY_ENUM, .offset = offsetof(struct config_model, priority),
     .def = TIER_STANDARD, .lookup = lookup_tier,
     .enum_msg = "must be one of \"critical\", \"standard\", \"batch\""},
    K_NUM(struct config_model, max_concurrency, 8, 1, 100000),
    K_NUM(struct config_model, max_queue, UINT64_MAX, 0, 1000000),
    K_NUM(struct config_model, queue_timeout_ms, UINT64_MAX, 1, 86400000),
    K_NUM(struct config_model, connect_timeout_ms, 5000, 1, 600000),
    K_NUM(struct config_model, first_byte_timeout_ms, 300000, 1, 86400000),
    K_NUM(struct config_model, upstream_idle_timeout_ms, 300000, 1, 86400000),
    K_NUM(struct config_model, min_replicas, 0, 0, 1000),
    K_NUM(struct config_model, max_replicas, 1, 1, 1000),
    K_NUM(struct config_model, idle_timeout_ms, UINT64_MAX, 0, 86400000),
    K_NUM(struct config_model, startup_timeout_ms, 600000, 1, 86400000),
    K_NUM(struct config_model, stop_grace_ms, 10000, 0, 600000),
    K_NUM(struct config_model, stop_drain_ms, 30000, 0, 3600000),
    K_NUM(struct config_model, gpu_slices, 0, 0, 64),
    K_STRING(struct config_model, mig_profile, NULL, NULL),
    K_NUM(struct config_model, gpu_memory_bytes, 0, 0, 1ull << 50),
    K_NUM(struct config_model, loading_heartbeat_ms, 0, 0, 600000),
    K_NUM(struct config_model, target, 0, 0, 100000),
    K_NUM0(struct config_model, stable_window_ms, 6000, 3600000),
    {.name = "prewarm", .type = KEY_ENUM, .offset = offsetof(struct config_model, prewarm),
     .def = PREWARM_INHERIT, .lookup = lookup_prewarm, .enum_msg = PREWARM_MSG},
    K_OBJECT(struct config_model, sleep, &sleep_section),
    {.name = "revisions", .type = KEY_CUSTOM, .parse = parse_revision_list},
    K_NUM(struct config_model, percent, 0, 0, 100),
    K_BOOL(struct config_model, fallback_to_warm_revision, false),
    K_STRING(struct config_model, sticky_header, NULL, check_sticky_header),
    K_BOOL(struct config_model, sticky_tenant, false),
    K_OBJECT(struct config_model, rollout, &rollout_section),
};
static const struct section model_section = SECTION(model_keys, model_finish);
/* A revision's model keys, before its own: no rules yet (its own keys may
 * complete it). */
static const struct section model_keys_only = SECTION(model_keys, NULL);

void config_model_defaults(struct config_model *m, const struct config_limits *lim)
{
    memset(m, 0, sizeof *m);
    /* No strings: callers point name and namespace at their own. */
    set_defaults(&model_section, m, false);
    m->max_queue = lim->max_queue_per_model;
    m->queue_timeout_ms = QUEUE_TIMEOUT_DEFAULT_MS;
    m->idle_timeout_ms = config_default_idle_timeout_ms(m->priority);
}

static int parse_model(struct parser *p, const cJSON *obj, size_t idx, struct config_model *m)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "models[%zu].", idx);
    memset(m, 0, sizeof *m);
    m->line = jsonpos_line(&p->pos, obj);
    if (set_defaults(&model_section, m, true)) {
        return fail(p, obj, prefix, "out of memory");
    }
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, prefix, "must be an object");
    }
    return parse_section(p, &model_section, obj, prefix, m);
}

/* ---- tenants ---- */

#define TENANTS_MAX 1000
#define TENANT_KEYS_MAX 64

/* "sha256:" and 64 hex digits: the key itself never goes in the file. */
static int check_key_hash(const char *s)
{
    if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != 7 + 64) {
        return -1;
    }
    for (const char *c = s + 7; *c; c++) {
        if (!isxdigit((unsigned char)*c)) {
            return -1;
        }
    }
    return 0;
}

static int check_api_keys(struct parser *p, const cJSON *item, const char *path, void *field)
{
    const struct config_tenant *t = (const struct config_tenant *)((const char *)field -
                                                                   offsetof(struct config_tenant,
                                                                            api_keys));
    if (t->n_api_keys > TENANT_KEYS_MAX) {
        return fail(p, item, path, "at most %d keys per tenant", TENANT_KEYS_MAX);
    }
    size_t i = 0;
    for (const cJSON *e = item->child; e; e = e->next, i++) {
        if (check_key_hash(t->api_keys[i])) {
            char epath[300];
            snprintf(epath, sizeof epath, "%s[%zu]", path, i);
            return fail(p, e, epath,
                        "must be \"sha256:\" and the key's 64-digit hex SHA-256, not the key "
                        "(thaw hash-key, or: printf %%s KEY | sha256sum)");
        }
    }
    return 0;
}

/* An HTTP field name (RFC 9110 token), not one thaw reads for itself. */
static int check_tenant_header(struct parser *p, const cJSON *item, const char *path, void *field)
{
    const char *s = *(char **)field;
    if (strlen(s) > 64) {
        return fail(p, item, path, "is longer than 64 characters");
    }
    for (const char *c = s; *c; c++) {
        if (!isalnum((unsigned char)*c) && !strchr("!#$%&'*+-.^_`|~", *c)) {
            return fail(p, item, path, "must be an HTTP header name");
        }
    }
    static const char *const reserved[] = {"authorization", "api-key", "host", "thaw-priority",
                                           "content-length", "transfer-encoding"};
    for (size_t i = 0; i < N_ELEMS(reserved); i++) {
        if (strcasecmp(s, reserved[i]) == 0) {
            return fail(p, item, path, "\"%s\" cannot name tenants", s);
        }
    }
    return 0;
}

static const struct conf_key tenant_model_keys[] = {
    K_NUM(struct config_tenant_model, max_concurrency, UINT64_MAX, 1, 100000),
    K_NUM(struct config_tenant_model, max_queue, UINT64_MAX, 0, 1000000),
};
static const struct section tenant_model_section = SECTION(tenant_model_keys, NULL);

/* "models": {"NAME": {"max_concurrency": N, "max_queue": N}, ...} */
static int parse_tenant_models(struct parser *p, const cJSON *obj, const char *path, void *base)
{
    struct config_tenant *t = base;
    if (!cJSON_IsObject(obj)) {
        return fail(p, obj, path, "must be an object of model names to {\"max_concurrency\", "
                                  "\"max_queue\"}");
    }
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s.", path);
    int rc = check_duplicates(p, obj, prefix);
    if (rc) {
        return rc;
    }
    size_t n = (size_t)cJSON_GetArraySize(obj);
    t->models = calloc(n ? n : 1, sizeof *t->models);
    if (!t->models) {
        return fail(p, obj, path, "out of memory");
    }
    for (const cJSON *e = obj->child; e; e = e->next) {
        char epath[300];
        snprintf(epath, sizeof epath, "%s.%s", path, e->string);
        if (check_name(e->string)) {
            return fail(p, e, epath, "is not a model name");
        }
        struct config_tenant_model *tm = &t->models[t->n_models++];
        set_defaults(&tenant_model_section, tm, false);
        if (!(tm->model = strdup(e->string))) {
            return fail(p, e, epath, "out of memory");
        }
        rc = parse_object(p, &tenant_model_section, e, epath, tm);
        if (rc) {
            return rc;
        }
    }
    return 0;
}

#define TENANT_CAP_KEYS                                                                            \
    {.name = "tier", .type = KEY_ENUM, .offset = offsetof(struct config_tenant, tier),             \
     .def = TIER_CRITICAL, .lookup = lookup_tier,                                                  \
     .enum_msg = "must be one of \"critical\", \"standard\", \"batch\""},                          \
        K_NUM(struct config_tenant, max_concurrency, UINT64_MAX, 1, 100000),                       \
        K_NUM(struct config_tenant, max_queue, UINT64_MAX, 0, 1000000),                            \
        K_NUM(struct config_tenant, weight, 1, 1, 100),                                            \
    {                                                                                              \
        .name = "models", .type = KEY_CUSTOM, .parse = parse_tenant_models                         \
    }

static int tenant_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    const struct config_tenant *t = base;
    if (!t->name) {
        return fail(p, obj, prefix, "\"name\" is required");
    }
    if (strcmp(t->name, "default") == 0) {
        char path[128];
        snprintf(path, sizeof path, "%sname", prefix);
        return fail(p, cJSON_GetObjectItemCaseSensitive(obj, "name"), path,
                    "\"default\" is the tenant of requests no other tenant claims; "
                    "set it in tenants.default");
    }
    return 0;
}

static const struct conf_key tenant_keys[] = {
    K_STRING(struct config_tenant, name, NULL, check_name_value),
    {.name = "api_keys", .type = KEY_STRINGS, .offset = offsetof(struct config_tenant, api_keys),
     .count_offset = offsetof(struct config_tenant, n_api_keys), .check = check_api_keys},
    TENANT_CAP_KEYS,
};
static const struct section tenant_section = SECTION(tenant_keys, tenant_finish);

static const struct conf_key default_tenant_keys[] = {TENANT_CAP_KEYS};
static const struct section default_tenant_section = SECTION(default_tenant_keys, NULL);

/* The tenants seen so far, by name and by key (lower case: a key is hex). */
struct tenants_seen {
    struct strmap names, keys;
};

/* Names and keys are unique across tenants: a key that named two tenants
 * would be a configuration mistake that charges one tenant for the other.
 * Looked up, not compared pairwise: 1000 tenants of 64 keys each are 64,000. */
static int check_tenant_unique(struct parser *p, const cJSON *elem, const char *prefix,
                               struct config_tenant *t, struct tenants_seen *seen)
{
    const struct config_tenant *o = strmap_get(&seen->names, t->name, strlen(t->name));
    if (o) {
        return fail(p, cJSON_GetObjectItemCaseSensitive(elem, "name"), prefix,
                    "tenant \"%s\" is already defined at line %d", t->name, o->line);
    }
    if (strmap_put(&seen->names, t->name, strlen(t->name), t)) {
        return fail(p, elem, prefix, "out of memory");
    }
    for (size_t a = 0; a < t->n_api_keys; a++) {
        char low[128];
        size_t len = strlen(t->api_keys[a]);
        for (size_t c = 0; c < len && c < sizeof low; c++) {
            low[c] = (char)tolower((unsigned char)t->api_keys[a][c]);
        }
        len = len < sizeof low ? len : sizeof low; /* a checked key is 71 bytes */
        o = strmap_get(&seen->keys, low, len);
        if (o) {
            char path[300];
            snprintf(path, sizeof path, "%sapi_keys[%zu]", prefix, a);
            return fail(p, elem, path, "the same key is given to tenant \"%s\" (line %d)",
                        o->name, o->line);
        }
        if (strmap_put(&seen->keys, low, len, t)) {
            return fail(p, elem, prefix, "out of memory");
        }
    }
    return 0;
}

static int parse_tenant_list(struct parser *p, const cJSON *arr, const char *path, void *base)
{
    struct config_tenants *ts = base;
    if (!cJSON_IsArray(arr)) {
        return fail(p, arr, path, "must be an array of tenant objects");
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n > TENANTS_MAX) {
        return fail(p, arr, path, "at most %d tenants (got %zu)", TENANTS_MAX, n);
    }
    ts->list = calloc(n ? n : 1, sizeof *ts->list);
    if (!ts->list) {
        return fail(p, arr, path, "out of memory");
    }
    struct tenants_seen seen;
    strmap_init(&seen.names);
    strmap_init(&seen.keys);
    size_t i = 0;
    int rc = 0;
    for (const cJSON *e = arr->child; e && !rc; e = e->next, i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "tenants.list[%zu].", i);
        struct config_tenant *t = &ts->list[i];
        ts->n_list = i + 1;
        set_defaults(&tenant_section, t, false);
        t->line = jsonpos_line(&p->pos, e);
        if (!cJSON_IsObject(e)) {
            rc = fail(p, e, prefix, "must be an object");
            break;
        }
        rc = parse_section(p, &tenant_section, e, prefix, t);
        if (!rc) {
            rc = check_tenant_unique(p, e, prefix, t, &seen);
        }
    }
    strmap_dispose(&seen.names);
    strmap_dispose(&seen.keys);
    return rc;
}

static const char *const tenants_source_kinds[] = {"", "secret", "configmap"};

static int source_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    const struct config_tenants_source *s = base;
    if (s->kind == TENANTS_SOURCE_NONE) {
        return fail(p, obj, prefix, "\"kind\" is required: \"secret\" or \"configmap\"");
    }
    if (!s->name) {
        return fail(p, obj, prefix, "\"name\" is required");
    }
    if (!p->cfg || !p->cfg->kubernetes.enabled) {
        return fail(p, obj, prefix, "needs the kubernetes section (cluster mode)");
    }
    return 0;
}

static const struct conf_key tenants_source_keys[] = {
    {.name = "kind", .type = KEY_ENUM, .offset = offsetof(struct config_tenants_source, kind),
     .def = TENANTS_SOURCE_NONE, .names = tenants_source_kinds,
     .n_names = (int)N_ELEMS(tenants_source_kinds),
     .enum_msg = "must be \"secret\" or \"configmap\""},
    {.name = "namespace", .type = KEY_STRING,
     .offset = offsetof(struct config_tenants_source, namespace_), .check = check_name_value},
    K_STRING(struct config_tenants_source, name, NULL, check_name_value),
    K_STRING(struct config_tenants_source, key, "tenants.json", check_name_value),
};
static const struct section tenants_source_section =
    SECTION(tenants_source_keys, source_finish);

/* With a source, the tenants come from it: the file may say only whether
 * they are required until it is loaded. */
static int tenants_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    const struct config_tenants *ts = base;
    if (ts->source.kind == TENANTS_SOURCE_NONE) {
        return 0;
    }
    static const char *const from_source[] = {"header", "default", "list"};
    for (size_t i = 0; i < N_ELEMS(from_source); i++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, from_source[i]);
        if (item) {
            char path[64];
            snprintf(path, sizeof path, "%s%s", prefix, from_source[i]);
            return fail(p, item, path, "comes from the document tenants.source names; "
                                       "leave it out here");
        }
    }
    return 0;
}

static const struct conf_key tenants_keys[] = {
    {.name = "source", .type = KEY_OBJECT, .offset = offsetof(struct config_tenants, source),
     .sub = &tenants_source_section},
    K_BOOL(struct config_tenants, required, false),
    K_STRING(struct config_tenants, header, NULL, check_tenant_header),
    {.name = "default", .type = KEY_OBJECT, .offset = offsetof(struct config_tenants, default_),
     .sub = &default_tenant_section},
    {.name = "list", .type = KEY_CUSTOM, .parse = parse_tenant_list},
};
static const struct section tenants_section = SECTION(tenants_keys, tenants_finish);

/* ---- gpus ---- */

static const char *const gpu_sharing_names[] = {"time-slicing", "mps"};

static int gpu_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    const struct config_gpu *cg = base;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "id")) {
        return fail(p, obj, prefix, "\"id\" is required");
    }
    if (cg->mig) {
        if (strncmp(cg->mig, "MIG-", 4) != 0) {
            return fail(p, obj, prefix, "\"mig\" must be a MIG device UUID (\"MIG-...\", "
                        "as nvidia-smi -L prints it)");
        }
        if (!cg->profile) {
            return fail(p, obj, prefix, "a MIG instance needs its \"profile\" (e.g. \"1g.10gb\")");
        }
        if (cg->slices != 1 || cg->sharing != GPU_TIME_SLICING) {
            return fail(p, obj, prefix, "a MIG instance takes one replica: no \"slices\" or "
                        "\"sharing\" (MPS does not apply to MIG devices)");
        }
    } else if (cg->profile) {
        return fail(p, obj, prefix, "\"profile\" applies only to a MIG instance (\"mig\")");
    }
    for (const struct config_gpu *g = p->cfg->gpus; g < cg; g++) {
        if (cg->mig && g->mig && strcmp(g->mig, cg->mig) == 0) {
            return fail(p, obj, prefix, "MIG instance %s is declared twice", cg->mig);
        }
        if (!cg->mig && !g->mig && g->id == cg->id) {
            return fail(p, obj, prefix, "GPU id %llu is declared twice",
                        (unsigned long long)cg->id);
        }
    }
    return 0;
}

static const struct conf_key gpu_keys[] = {
    K_NUM(struct config_gpu, id, 0, 0, 1023),
    K_NUM(struct config_gpu, slices, 1, 1, 64),
    {.name = "sharing", .type = KEY_ENUM, .offset = offsetof(struct config_gpu, sharing),
     .def = GPU_TIME_SLICING, .names = gpu_sharing_names,
     .n_names = (int)N_ELEMS(gpu_sharing_names), .enum_msg = "must be \"time-slicing\" or \"mps\""},
    K_STRING(struct config_gpu, mig, NULL, NULL),
    K_STRING(struct config_gpu, profile, NULL, NULL),
    K_NUM(struct config_gpu, memory_bytes, 0, 0, 1ull << 50),
};
static const struct section gpu_section = SECTION(gpu_keys, gpu_finish);

static int parse_gpus(struct parser *p, const cJSON *arr, const char *path, void *base)
{
    struct config *cfg = base;
    if (cJSON_IsString(arr) && strcmp(arr->valuestring, "discover") == 0) {
        cfg->gpu_discovery = true;
        return 0;
    }
    if (!cJSON_IsArray(arr)) {
        return fail(p, arr, path, "must be an array of {\"id\", \"slices\", \"sharing\"} "
                    "or {\"id\", \"mig\", \"profile\"}, or \"discover\"");
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    cfg->gpus = calloc(n ? n : 1, sizeof *cfg->gpus);
    if (!cfg->gpus) {
        return fail(p, arr, path, "out of memory");
    }
    size_t i = 0;
    for (const cJSON *g = arr->child; g; g = g->next, i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "gpus[%zu].", i);
        if (!cJSON_IsObject(g)) {
            return fail(p, g, prefix, "must be an object");
        }
        struct config_gpu *cg = &cfg->gpus[i];
        set_defaults(&gpu_section, cg, false);
        cfg->n_gpus = i + 1; /* counted before parsing: config_free frees its strings */
        int rc = parse_section(p, &gpu_section, g, prefix, cg);
        if (rc) {
            return rc;
        }
    }
    return 0;
}

/* ---- the top level ---- */

static int check_listen_value(struct parser *p, const cJSON *item, const char *path, void *field)
{
    const char *s = *(char **)field;
    if (check_listen(s)) {
        return fail(p, item, path, "must be \"ADDRESS:PORT\" or \"[IPV6]:PORT\" (got \"%.100s\")",
                    s);
    }
    return 0;
}

/* Only the shape here: models are read in root_finish, once limits and
 * every other top-level key are. */
static int check_models_array(struct parser *p, const cJSON *item, const char *path, void *base)
{
    return cJSON_IsArray(item) ? 0 : fail(p, item, path, "must be an array of objects");
}

static void free_strings(char **arr, size_t n);

static int set_tag_hosts(struct config_model *rev, const struct config_model *m)
{
    /* The revision's own addresses, as Knative's tags: "<revision>-<model>"
     * with the namespace forms the model's own name has (".ns", ".ns.svc",
     * ".ns.svc.cluster.local"), and "<revision>-<host>" for each host. */
    static const char *const ns_forms[] = {"", ".", ".", "."};
    static const char *const ns_tails[] = {"", "", ".svc", ".svc.cluster.local"};
    free_strings(rev->hosts, rev->n_hosts);
    free_strings(rev->aliases, rev->n_aliases);
    rev->aliases = NULL;
    rev->n_aliases = 0;
    rev->n_hosts = 0;
    rev->hosts = calloc(m->n_hosts + 4, sizeof *rev->hosts);
    if (!rev->hosts) {
        return -ENOMEM;
    }
    const char *ns = m->namespace_ ? m->namespace_ : "";
    for (size_t i = 0; i < 4 + m->n_hosts; i++) {
        if (i > 0 && i < 4 && !ns[0]) {
            continue;
        }
        int rc = i < 4 ? asprintf(&rev->hosts[rev->n_hosts], "%s-%s%s%s%s", rev->revision, m->name,
                                  ns_forms[i], i ? ns : "", ns_tails[i])
                       : asprintf(&rev->hosts[rev->n_hosts], "%s-%s", rev->revision,
                                  m->hosts[i - 4]);
        if (rc < 0) {
            return -ENOMEM;
        }
        rev->n_hosts++;
    }
    return 0;
}

/* Reads revision j of model m (whose object is obj) into rev: the model's
 * keys, then the revision's own, then the model's rules on the result. */
static int parse_revision(struct parser *p, const cJSON *obj, size_t i, size_t j,
                          const struct config_model *m, struct config_model *rev)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "models[%zu].", i);
    const cJSON *robj = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "revisions"),
                                           (int)j);
    memset(rev, 0, sizeof *rev);
    rev->line = jsonpos_line(&p->pos, robj);
    if (set_defaults(&model_section, rev, true)) {
        return fail(p, robj, prefix, "out of memory");
    }
    p->reading = READ_REVISION_BASE;
    int rc = parse_section(p, &model_keys_only, obj, prefix, rev);
    snprintf(prefix, sizeof prefix, "models[%zu].revisions[%zu].", i, j);
    for (const cJSON *k = robj->child; rc == 0 && k; k = k->next) {
        if (is_model_only_key(k->string)) {
            char path[160];
            snprintf(path, sizeof path, "%s%s", prefix, k->string);
            rc = fail(p, k, path, "applies to the model, not to one revision");
        }
    }
    /* What only the model has does not carry over. */
    free(rev->sticky_header);
    rev->sticky_header = NULL;
    rev->sticky_tenant = rev->fallback_to_warm_revision = false;
    rev->rollout.enabled = false;
    p->reading = READ_REVISION;
    if (rc == 0) {
        rc = parse_section(p, &model_section, robj, prefix, rev);
    }
    p->reading = READ_MODEL;
    if (rc) {
        return rc;
    }
    rev->revision = rev->name;
    rev->name = NULL;
    if (asprintf(&rev->name, "%s@%s", m->name, rev->revision) < 0 ||
        !(rev->parent = strdup(m->name)) || set_tag_hosts(rev, m)) {
        return fail(p, robj, prefix, "out of memory");
    }
    return 0;
}

/* Every model's revisions become models of their own, after the models. */
static int parse_revisions(struct parser *p, const cJSON *models, struct config *cfg)
{
    size_t n = cfg->n_models, total = n;
    for (size_t i = 0; i < n; i++) {
        total += cfg->models[i].n_revisions;
    }
    if (total == n) {
        return 0;
    }
    struct config_model *all = realloc(cfg->models, total * sizeof *all);
    if (!all) {
        return fail(p, models, "models", "out of memory");
    }
    cfg->models = all;
    const cJSON *obj = models->child;
    for (size_t i = 0; i < n; i++, obj = obj->next) {
        for (size_t j = 0; j < cfg->models[i].n_revisions; j++) {
            struct config_model *rev = &cfg->models[cfg->n_models++];
            int rc = parse_revision(p, obj, i, j, &cfg->models[i], rev);
            if (rc) {
                return rc;
            }
        }
    }
    return 0;
}

static int parse_models(struct parser *p, const cJSON *models, struct config *cfg)
{
    size_t n = (size_t)cJSON_GetArraySize(models);
    cfg->models = calloc(n ? n : 1, sizeof *cfg->models);
    if (!cfg->models) {
        return fail(p, models, "models", "out of memory");
    }
    size_t i = 0;
    for (const cJSON *m = models->child; m; m = m->next, i++) {
        cfg->n_models = i + 1;
        int rc = parse_model(p, m, i, &cfg->models[i]);
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
    return parse_revisions(p, models, cfg);
}

/* Where model i was written: its object in the file's "models" (NULL when
 * models is) and its path, "models[k]." or, for a revision,
 * "models[k].revisions[j].". */
/* Where cfg->models[i] is in the file: its index, or its model's and its
 * own for a revision (-1: not found). */
static void model_place(const struct config *cfg, size_t i, long *model, long *rev)
{
    const struct config_model *m = &cfg->models[i];
    *model = (long)i;
    *rev = -1;
    if (!m->parent) {
        return;
    }
    *model = -1;
    for (size_t k = 0; k < cfg->n_models; k++) {
        const struct config_model *pm = &cfg->models[k];
        if (pm->parent || strcmp(pm->name, m->parent) != 0 ||
            strcmp(pm->namespace_, m->namespace_) != 0) {
            continue;
        }
        for (size_t j = 0; j < pm->n_revisions; j++) {
            if (strcmp(pm->revisions[j].name, m->revision) == 0) {
                *model = (long)k;
                *rev = (long)j;
                return;
            }
        }
    }
}

void config_model_prefix(const struct config *cfg, size_t i, char *prefix, size_t n)
{
    long k, j;
    model_place(cfg, i, &k, &j);
    if (j >= 0) {
        snprintf(prefix, n, "models[%ld].revisions[%ld].", k, j);
    } else {
        snprintf(prefix, n, "models[%zu].", i);
    }
}

static const cJSON *model_source(const cJSON *models, const struct config *cfg, size_t i,
                                 char *prefix, size_t n)
{
    long k, j;
    model_place(cfg, i, &k, &j);
    config_model_prefix(cfg, i, prefix, n);
    if (k < 0) {
        return NULL;
    }
    const cJSON *obj = cJSON_GetArrayItem(models, (int)k);
    return j < 0 ? obj : cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(obj, "revisions"),
                                            (int)j);
}

/* A model's GPU needs (gpu_slices, gpu_memory_bytes, mig_profile) need a
 * command and a declared GPU that can hold them (checked at start-up
 * instead when the GPUs are discovered). */
static int check_model_gpu(struct parser *p, const cJSON *models, const struct config *cfg,
                           size_t i)
{
    const struct config_model *m = &cfg->models[i];
    const char *key = m->mig_profile ? "mig_profile" : "gpu_slices";
    char prefix[96], path[160];
    const cJSON *obj = model_source(models, cfg, i, prefix, sizeof prefix);
    snprintf(path, sizeof path, "%s%s", prefix, key);
    /* The key's line; a revision that inherits it: the revision's. */
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(obj, key);
    at = at ? at : obj;
    if (m->n_command == 0) {
        return fail(p, at, path, "applies only to models with a \"command\"");
    }
    if (m->mig_profile && m->gpu_slices) {
        return fail(p, at, path, "a model takes a MIG instance or GPU slices, not both");
    }
    /* In a child's environment the first of two settings wins: the model's
     * own would quietly override the GPU thaw placed the replica on. */
    static const char *const placed[] = {"CUDA_VISIBLE_DEVICES",
                                         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"};
    for (size_t v = 0; v < sizeof placed / sizeof *placed; v++) {
        size_t len = strlen(placed[v]);
        for (size_t e = 0; e < m->n_env; e++) {
            if (strncmp(m->env[e], placed[v], len) == 0 && m->env[e][len] == '=') {
                snprintf(path, sizeof path, "%senv.%s", prefix, placed[v]);
                const cJSON *env = cJSON_GetObjectItemCaseSensitive(obj, "env");
                const cJSON *var = env ? cJSON_GetObjectItemCaseSensitive(env, placed[v]) : NULL;
                return fail(p, var ? var : obj, path,
                            "is set by thaw from the GPU it places each replica on (%s)", key);
            }
        }
    }
    if (m->gpu_memory_bytes && !m->gpu_slices) {
        snprintf(path, sizeof path, "%sgpu_memory_bytes", prefix);
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(obj, "gpu_memory_bytes");
        return fail(p, mem ? mem : obj, path,
                    "needs \"gpu_slices\" (a MIG instance has its own memory)");
    }
    if (cfg->gpu_discovery) {
        return 0;
    }
    bool fits = false;
    for (size_t g = 0; g < cfg->n_gpus && !fits; g++) {
        const struct config_gpu *cg = &cfg->gpus[g];
        fits = config_gpu_unit_takes(m, cg->profile, cg->slices, cg->memory_bytes);
    }
    if (!fits && m->mig_profile) {
        return fail(p, at, path, "no declared MIG instance has profile \"%s\" (see \"gpus\")",
                    m->mig_profile);
    }
    if (!fits && m->gpu_memory_bytes) {
        /* The slices alone fit somewhere: the memory is what does not. */
        struct config_model slices_only = *m;
        slices_only.gpu_memory_bytes = 0;
        for (size_t g = 0; g < cfg->n_gpus; g++) {
            const struct config_gpu *cg = &cfg->gpus[g];
            if (config_gpu_unit_takes(&slices_only, cg->profile, cg->slices, cg->memory_bytes)) {
                snprintf(path, sizeof path, "%sgpu_memory_bytes", prefix);
                const cJSON *mem = cJSON_GetObjectItemCaseSensitive(obj, "gpu_memory_bytes");
                return fail(p, mem ? mem : obj, path,
                            "%llu bytes fit on no declared GPU with room for its %llu slices "
                            "(see \"gpus\" memory_bytes)",
                            (unsigned long long)m->gpu_memory_bytes,
                            (unsigned long long)m->gpu_slices);
            }
        }
    }
    if (!fits) {
        return fail(p, at, path,
                    "%llu slices%s do not fit on any declared GPU (see \"gpus\")",
                    (unsigned long long)m->gpu_slices,
                    m->gpu_memory_bytes ? " with their gpu_memory_bytes" : "");
    }
    return 0;
}

static int check_gpu_slices(struct parser *p, const cJSON *models, const struct config *cfg)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *m = &cfg->models[i];
        if (m->gpu_slices || m->mig_profile || m->gpu_memory_bytes) {
            int rc = check_model_gpu(p, models, cfg, i);
            if (rc) {
                return rc;
            }
        }
    }
    return 0;
}

static int root_finish(struct parser *p, const cJSON *obj, const char *prefix, void *base)
{
    struct config *cfg = base;
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(obj, "models");
    int rc = models ? parse_models(p, models, cfg) : 0;
    return rc ? rc : check_gpu_slices(p, models, cfg);
}

/* limits is early: model defaults depend on it. */
static const struct conf_key root_keys[] = {
    K_STRING(struct config, listen, "0.0.0.0:8080", check_listen_value),
    K_STRING(struct config, admin_listen, "0.0.0.0:9090", check_listen_value),
    {.name = "limits", .type = KEY_OBJECT, .offset = offsetof(struct config, limits),
     .sub = &limits_section, .early = true},
    K_OBJECT(struct config, upstream, &upstream_section),
    {.name = "log", .type = KEY_OBJECT, .offset = 0, .sub = &log_section},
    {.name = "gpus", .type = KEY_CUSTOM, .parse = parse_gpus},
    K_STRINGS(struct config, gpu_discovery_command, NULL),
    K_NUM(struct config, gpu_discovery_slices, 1, 1, 64),
    K_OBJECT(struct config, kubernetes, &kubernetes_section),
    K_OBJECT(struct config, autoscaler, &autoscaler_section),
    K_OBJECT(struct config, warm_pool, &warm_pool_section),
    K_OBJECT(struct config, tenants, &tenants_section),
    {.name = "models", .type = KEY_CUSTOM, .parse = check_models_array},
};
static const struct section root_section = SECTION(root_keys, root_finish);

struct config *config_new_default(void)
{
    struct config *cfg = calloc(1, sizeof *cfg);
    if (cfg && set_defaults(&root_section, cfg, true)) {
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
    return parse_section(p, &root_section, root, "", cfg);
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
        char prefix[96];
        const cJSON *eps = cJSON_GetObjectItemCaseSensitive(
            model_source(models, cfg, i, prefix, sizeof prefix), "endpoints");
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
                char path[128];
                snprintf(path, sizeof path, "%sendpoints[%zu]", prefix, j);
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

/* Appends to path the step from a container to its child number idx. */
static void path_step(char *path, size_t len, const cJSON *child, size_t idx)
{
    size_t base = strlen(path);
    if (child->string) {
        snprintf(path + base, len - base, "%s%s", base ? "." : "", child->string);
    } else {
        snprintf(path + base, len - base, "[%zu]", idx);
    }
}

/* The path ("models[0].command[1]") from item down to target. */
static bool path_to(const cJSON *item, const cJSON *target, char *path, size_t len)
{
    if (item == target) {
        return true;
    }
    size_t base = strlen(path);
    size_t idx = 0;
    for (const cJSON *c = item->child; c; c = c->next, idx++) {
        path_step(path, len, c, idx);
        if (path_to(c, target, path, len)) {
            return true;
        }
        path[base] = '\0';
    }
    return false;
}

/* The path ("models[0].name") of the first item on line. */
static bool path_on_line(const struct jsonpos *pos, const cJSON *item, int line, char *path,
                         size_t len)
{
    size_t base = strlen(path);
    size_t idx = 0;
    for (const cJSON *c = item->child; c; c = c->next, idx++) {
        path_step(path, len, c, idx);
        if (jsonpos_line(pos, c) == line || path_on_line(pos, c, line, path, len)) {
            return true;
        }
        path[base] = '\0';
    }
    return false;
}

/* cJSON takes what RFC 8259 does not (leading zeros, raw control bytes in
 * strings or between tokens, bytes that are not UTF-8, a bad \u escape read
 * as the end of its string): an object cJSON read is checked again. */
static int check_strict_json(const char *text, size_t len, const char *label,
                             struct config_error *err)
{
    struct jsonscan *scan = malloc(sizeof *scan);
    if (!scan) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (load): out of memory", label);
        return -ENOMEM;
    }
    jsonscan_init_strict(scan);
    enum jsonscan_status js = jsonscan_feed(scan, text, len);
    if (js != JSONSCAN_INVALID) {
        js = jsonscan_finish(scan);
    }
    int rc = 0;
    if (js == JSONSCAN_INVALID) {
        size_t at = scan->error_offset < len ? (size_t)scan->error_offset : len;
        snprintf(err->msg, sizeof err->msg, "%s:%d: (syntax): not valid JSON: %s at byte %zu",
                 label, jsonpos_line_of_offset(text, len, at), scan->error, at);
        rc = -EINVAL;
    }
    free(scan);
    return rc;
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
    p.cfg = cfg;
    int rc = 0;
    size_t nul = find_nul(text, len);
    if (nul < len) {
        int line = jsonpos_line_of_offset(text, len, nul);
        char path[256] = "";
        const cJSON *holder = jsonpos_item_at(&p.pos, nul);
        if ((!holder || !path_to(root, holder, path, sizeof path)) &&
            !path_on_line(&p.pos, root, line, path, sizeof path)) {
            snprintf(path, sizeof path, "(string)");
        }
        snprintf(err->msg, sizeof err->msg, "%s:%d: %s: %s", label, line, path,
                 text[nul] == '\0' ? "a NUL byte in the file"
                                    : "a string holds a NUL character (\\u0000)");
        rc = -EINVAL;
    }
    if (!rc && cJSON_IsObject(root)) {
        rc = check_strict_json(text, len, label, err);
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

int config_parse_tenants(const char *text, size_t len, const char *label,
                         struct config_tenants *out, struct config_error *err)
{
    struct parser p = {.label = label, .text = text, .len = len, .err = err};
    err->msg[0] = '\0';
    memset(out, 0, sizeof *out);
    if (set_defaults(&tenants_section, out, true)) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (load): out of memory", label);
        return -ENOMEM;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t off = end ? (size_t)(end - text) : 0;
    while (root && off < len && (unsigned char)text[off] <= ' ' && text[off] != '\0') {
        off++;
    }
    if (!root || off < len) {
        snprintf(err->msg, sizeof err->msg, "%s:%d: (syntax): not one valid JSON object (near byte %zu)",
                 label, jsonpos_line_of_offset(text, len, off), off);
        cJSON_Delete(root);
        return -EINVAL;
    }
    if (cJSON_IsObject(root) && check_strict_json(text, len, label, err)) {
        cJSON_Delete(root);
        return -EINVAL;
    }
    if (jsonpos_build(&p.pos, text, len, root)) {
        snprintf(err->msg, sizeof err->msg, "%s:0: (load): out of memory", label);
        cJSON_Delete(root);
        return -ENOMEM;
    }
    int rc;
    const cJSON *source = cJSON_GetObjectItemCaseSensitive(root, "source");
    if (!cJSON_IsObject(root)) {
        rc = fail(&p, root, "(top level)", "must be a JSON object (the tenants section)");
    } else if (find_nul(text, len) < len) {
        rc = fail(&p, root, "(string)", "a string holds a NUL character");
    } else if (source) {
        rc = fail(&p, source, "tenants.source", "only the configuration file names a source");
    } else {
        rc = parse_section(&p, &tenants_section, root, "tenants.", out);
    }
    jsonpos_dispose(&p.pos);
    cJSON_Delete(root);
    return rc;
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

static void config_tenant_free(struct config_tenant *t)
{
    free(t->name);
    free_strings(t->api_keys, t->n_api_keys);
    for (size_t i = 0; i < t->n_models; i++) {
        free(t->models[i].model);
    }
    free(t->models);
}

void config_tenants_dispose(struct config_tenants *ts)
{
    config_tenant_free(&ts->default_);
    for (size_t i = 0; i < ts->n_list; i++) {
        config_tenant_free(&ts->list[i]);
    }
    free(ts->list);
    free(ts->header);
    free(ts->source.namespace_);
    free(ts->source.name);
    free(ts->source.key);
    memset(ts, 0, sizeof *ts);
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
        free(m->mig_profile);
        for (size_t j = 0; j < m->n_revisions; j++) {
            free(m->revisions[j].name);
        }
        free(m->revisions);
        free(m->sticky_header);
        free(m->parent);
        free(m->revision);
    }
    free(cfg->models);
    for (size_t i = 0; i < cfg->n_gpus; i++) {
        free(cfg->gpus[i].mig);
        free(cfg->gpus[i].profile);
    }
    free(cfg->gpus);
    free_strings(cfg->gpu_discovery_command, cfg->n_gpu_discovery_command);
    config_tenants_dispose(&cfg->tenants);
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

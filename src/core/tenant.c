#include "thaw/tenant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

void tenant_hash_key(const char *key, size_t len, unsigned char out[TENANT_DIGEST_BYTES])
{
    /* The one-shot call: EVP_Digest with EVP_sha256() looks the algorithm
     * up on every call (a lookup took 950 ns instead of 600, measured). */
    if (!SHA256((const unsigned char *)key, len, out)) {
        memset(out, 0, TENANT_DIGEST_BYTES); /* matches no configured key but all-zero */
    }
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

int tenant_parse_digest(const char *s, unsigned char out[TENANT_DIGEST_BYTES])
{
    if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != 7 + 2 * TENANT_DIGEST_BYTES) {
        return -EINVAL;
    }
    s += 7;
    for (size_t i = 0; i < TENANT_DIGEST_BYTES; i++) {
        int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return -EINVAL;
        }
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

void tenant_format_digest(const char *key, size_t len, char *out, size_t out_len)
{
    unsigned char d[TENANT_DIGEST_BYTES];
    tenant_hash_key(key, len, d);
    static const char hex[] = "0123456789abcdef";
    char text[8 + 2 * TENANT_DIGEST_BYTES] = "sha256:";
    for (size_t i = 0; i < TENANT_DIGEST_BYTES; i++) {
        text[7 + 2 * i] = hex[d[i] >> 4];
        text[8 + 2 * i] = hex[d[i] & 15];
    }
    text[7 + 2 * TENANT_DIGEST_BYTES] = '\0';
    snprintf(out, out_len, "%s", text);
}

static void tenant_free(struct tenant *t)
{
    if (!t) {
        return;
    }
    for (size_t i = 0; i < t->n_models; i++) {
        free(t->models[i].model);
    }
    free(t->models);
    free(t->name);
    free(t);
}

static struct tenant *tenant_new(uint32_t id, const char *name)
{
    struct tenant *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name))) {
        free(t);
        return NULL;
    }
    t->id = id;
    t->tier = TIER_CRITICAL;
    t->weight = 1;
    t->max_concurrency = UINT64_MAX;
    t->max_queue = UINT64_MAX;
    return t;
}

int tenants_init(struct tenants *ts)
{
    memset(ts, 0, sizeof *ts);
    strmap_init(&ts->by_name);
    ts->all = calloc(1, sizeof *ts->all);
    if (!ts->all || !(ts->all[0] = tenant_new(0, "default"))) {
        free(ts->all);
        ts->all = NULL;
        return -ENOMEM;
    }
    ts->n = 1;
    return 0;
}

void tenants_dispose(struct tenants *ts)
{
    for (size_t i = 0; i < ts->n; i++) {
        tenant_free(ts->all[i]);
    }
    free(ts->all);
    free(ts->keys);
    free(ts->header);
    strmap_dispose(&ts->by_name);
    memset(ts, 0, sizeof *ts);
}

static int by_digest(const void *a, const void *b)
{
    return memcmp(((const struct tenant_key *)a)->digest, ((const struct tenant_key *)b)->digest,
                  TENANT_DIGEST_BYTES);
}

/* Copies of a configured tenant's per-model caps. 0 or -ENOMEM. */
static int copy_model_caps(const struct config_tenant *ct, struct tenant_model_caps **out,
                           size_t *n_out)
{
    struct tenant_model_caps *mc = calloc(ct->n_models ? ct->n_models : 1, sizeof *mc);
    if (!mc) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < ct->n_models; i++) {
        mc[i].max_concurrency = ct->models[i].max_concurrency;
        mc[i].max_queue = ct->models[i].max_queue;
        if (!(mc[i].model = strdup(ct->models[i].model))) {
            for (size_t j = 0; j < i; j++) {
                free(mc[j].model);
            }
            free(mc);
            return -ENOMEM;
        }
    }
    *out = mc;
    *n_out = ct->n_models;
    return 0;
}

/* Sets t's settings from ct, taking over caps (already allocated). */
static void set_from_config(struct tenant *t, const struct config_tenant *ct,
                            struct tenant_model_caps *caps, size_t n_caps)
{
    for (size_t i = 0; i < t->n_models; i++) {
        free(t->models[i].model);
    }
    free(t->models);
    t->models = caps;
    t->n_models = n_caps;
    t->tier = ct->tier;
    t->weight = (uint32_t)(ct->weight ? ct->weight : 1);
    t->max_concurrency = ct->max_concurrency;
    t->max_queue = ct->max_queue;
    t->removed = false;
}

static struct tenant *find_any(const struct tenants *ts, const char *name)
{
    for (size_t i = 1; i < ts->n; i++) {
        if (strcmp(ts->all[i]->name, name) == 0) {
            return ts->all[i];
        }
    }
    return NULL;
}

/* What tenants_apply builds before it changes anything. */
struct staged {
    struct tenant **all; /* grown copy of ts->all, new tenants appended */
    size_t n;
    struct tenant_key *keys;
    size_t n_keys;
    struct strmap by_name;
    struct tenant_model_caps **caps; /* per configured tenant, then the default's */
    size_t *n_caps;
    char *header;
};

static void staged_free(struct staged *s, size_t old_n, size_t n_cfg)
{
    for (size_t i = old_n; i < s->n; i++) {
        tenant_free(s->all[i]);
    }
    free(s->all);
    free(s->keys);
    strmap_dispose(&s->by_name);
    for (size_t i = 0; s->caps && i <= n_cfg; i++) {
        for (size_t j = 0; s->caps[i] && j < s->n_caps[i]; j++) {
            free(s->caps[i][j].model);
        }
        free(s->caps ? s->caps[i] : NULL);
    }
    free(s->caps);
    free(s->n_caps);
    free(s->header);
}

static int stage(const struct tenants *ts, const struct config_tenants *cfg, struct staged *s)
{
    size_t n_keys = 0;
    for (size_t i = 0; i < cfg->n_list; i++) {
        n_keys += cfg->list[i].n_api_keys;
    }
    s->all = calloc(ts->n + cfg->n_list, sizeof *s->all);
    s->keys = calloc(n_keys ? n_keys : 1, sizeof *s->keys);
    s->caps = calloc(cfg->n_list + 1, sizeof *s->caps);
    s->n_caps = calloc(cfg->n_list + 1, sizeof *s->n_caps);
    if (!s->all || !s->keys || !s->caps || !s->n_caps ||
        (cfg->header && !(s->header = strdup(cfg->header)))) {
        return -ENOMEM;
    }
    memcpy(s->all, ts->all, ts->n * sizeof *s->all);
    s->n = ts->n;
    for (size_t i = 0; i < cfg->n_list; i++) {
        const struct config_tenant *ct = &cfg->list[i];
        struct tenant *t = find_any(ts, ct->name);
        if (!t) {
            if (s->n >= TENANTS_MAX_IDS) {
                return -ENOSPC;
            }
            if (!(t = tenant_new((uint32_t)s->n, ct->name))) {
                return -ENOMEM;
            }
            s->all[s->n++] = t;
        }
        if (copy_model_caps(ct, &s->caps[i], &s->n_caps[i]) ||
            strmap_put(&s->by_name, t->name, strlen(t->name), t)) {
            return -ENOMEM;
        }
        for (size_t k = 0; k < ct->n_api_keys; k++) {
            if (tenant_parse_digest(ct->api_keys[k], s->keys[s->n_keys].digest)) {
                return -EINVAL;
            }
            s->keys[s->n_keys++].tenant = t;
        }
    }
    if (copy_model_caps(&cfg->default_, &s->caps[cfg->n_list], &s->n_caps[cfg->n_list])) {
        return -ENOMEM;
    }
    qsort(s->keys, s->n_keys, sizeof *s->keys, by_digest);
    return 0;
}

long tenants_first_over(const struct tenants *ts, const struct config_tenants *cfg)
{
    size_t n = ts->n;
    for (size_t i = 0; i < cfg->n_list; i++) {
        if (!find_any(ts, cfg->list[i].name) && ++n > TENANTS_MAX_IDS) {
            return (long)i;
        }
    }
    return -1;
}

int tenants_apply(struct tenants *ts, const struct config_tenants *cfg)
{
    struct staged s = {0};
    strmap_init(&s.by_name);
    int rc = stage(ts, cfg, &s);
    if (rc) {
        staged_free(&s, ts->n, cfg->n_list);
        return rc;
    }
    /* Nothing can fail from here. */
    for (size_t i = 1; i < s.n; i++) {
        s.all[i]->removed = true;
    }
    for (size_t i = 0; i < cfg->n_list; i++) {
        struct tenant *t = strmap_get(&s.by_name, cfg->list[i].name, strlen(cfg->list[i].name));
        set_from_config(t, &cfg->list[i], s.caps[i], s.n_caps[i]);
    }
    set_from_config(ts->all[0], &cfg->default_, s.caps[cfg->n_list], s.n_caps[cfg->n_list]);
    free(ts->all);
    free(ts->keys);
    free(ts->header);
    strmap_dispose(&ts->by_name);
    ts->all = s.all;
    ts->n = s.n;
    ts->keys = s.keys;
    ts->n_keys = s.n_keys;
    ts->by_name = s.by_name;
    ts->header = s.header;
    ts->required = cfg->required;
    ts->awaiting_source = cfg->source.kind != TENANTS_SOURCE_NONE;
    free(s.caps);
    free(s.n_caps);
    return 0;
}

struct tenant *tenants_find_key(const struct tenants *ts, const char *key, size_t len)
{
    struct tenant_key probe;
    tenant_hash_key(key, len, probe.digest);
    /* The search compares digests, which say nothing an attacker could use
     * about the keys; the last equality is checked in constant time. */
    size_t lo = 0, hi = ts->n_keys;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(ts->keys[mid].digest, probe.digest, TENANT_DIGEST_BYTES);
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < ts->n_keys &&
        CRYPTO_memcmp(ts->keys[lo].digest, probe.digest, TENANT_DIGEST_BYTES) == 0) {
        return ts->keys[lo].tenant;
    }
    return NULL;
}

struct tenant *tenants_find_name(const struct tenants *ts, const char *name, size_t len)
{
    return strmap_get(&ts->by_name, name, len);
}

void tenant_caps(const struct tenant *t, const char *model, uint64_t *max_concurrency,
                 uint64_t *max_queue)
{
    *max_concurrency = t->max_concurrency;
    *max_queue = t->max_queue;
    for (size_t i = 0; i < t->n_models; i++) {
        if (strcmp(t->models[i].model, model) == 0) {
            if (t->models[i].max_concurrency != UINT64_MAX) {
                *max_concurrency = t->models[i].max_concurrency;
            }
            if (t->models[i].max_queue != UINT64_MAX) {
                *max_queue = t->models[i].max_queue;
            }
            break;
        }
    }
}

/* Tenants: who a request is for. A tenant is named, found by an API key
 * (only its SHA-256 is kept, compared in constant time) or by the value of a
 * header a trusted gateway sets, and has a tier ceiling, a weight in its
 * tier's round robin and caps (running and waiting requests) that apply at
 * each model, optionally per model. Requests no tenant claims belong to the
 * default tenant (id 0), unless tenants are required.
 *
 * Tenant objects live as long as the registry: a reload updates them in
 * place by name, adds new ones with new ids, and marks those gone `removed`
 * (no key or header finds them; requests they hold finish), so a tenant's id
 * is stable and is its flow id in every model's queue. Metric cardinality is
 * bounded by the tenants ever configured (at most TENANTS_MAX_IDS).
 * Pure: no clock, no loop. */
#ifndef THAW_TENANT_H
#define THAW_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/config.h"
#include "thaw/metrics.h"
#include "thaw/strmap.h"
#include "thaw/tier.h"

#define TENANT_DIGEST_BYTES 32
/* Tenants a registry holds over its life (ids are never reused). */
#define TENANTS_MAX_IDS 4096

struct tenant_stats {
    uint64_t requests; /* finished, any outcome */
    uint64_t rejections[REJECT_COUNT];
    struct histogram queue_wait; /* placed -> sent to a replica */
};

struct tenant_model_caps {
    char *model;
    uint64_t max_concurrency, max_queue; /* UINT64_MAX: the tenant's */
};

struct tenant {
    uint32_t id; /* its flow in every model's queue; 0: the default tenant */
    char *name;
    enum tier tier; /* ceiling: its requests never run above it */
    uint32_t weight;
    uint64_t max_concurrency, max_queue; /* per model; UINT64_MAX: no cap */
    struct tenant_model_caps *models;
    size_t n_models;
    bool removed; /* no longer configured */
    struct tenant_stats stats;
};

struct tenant_key {
    unsigned char digest[TENANT_DIGEST_BYTES];
    struct tenant *tenant;
};

struct tenants {
    struct tenant **all; /* by id; all[0] is the default tenant */
    size_t n;
    struct tenant_key *keys; /* sorted by digest */
    size_t n_keys;
    struct strmap by_name; /* configured tenants (not the default), for the header */
    bool required;
    /* The tenants come from a watched source not loaded yet: required
     * tenants answer 503 (not 401) until it is. */
    bool awaiting_source;
    char *header; /* the gateway's header; NULL: none */
};

/* The registry with only the default tenant. 0 or -ENOMEM. */
int tenants_init(struct tenants *ts);
void tenants_dispose(struct tenants *ts);
/* Makes the registry match cfg (see above). On failure (-ENOMEM, or -ENOSPC
 * past TENANTS_MAX_IDS) nothing changed. */
int tenants_apply(struct tenants *ts, const struct config_tenants *cfg);
/* Whether cfg's names fit in what is left of TENANTS_MAX_IDS (names ever
 * configured in this process): -1, or the index of the first tenant of cfg
 * that would pass it. */
long tenants_first_over(const struct tenants *ts, const struct config_tenants *cfg);

/* SHA-256 of key[0..len). */
void tenant_hash_key(const char *key, size_t len, unsigned char out[TENANT_DIGEST_BYTES]);
/* "sha256:<64 hex>" (any case) to bytes. 0 or -EINVAL. */
int tenant_parse_digest(const char *s, unsigned char out[TENANT_DIGEST_BYTES]);
/* Writes "sha256:<hex>" of key into out (at least 72 bytes). */
void tenant_format_digest(const char *key, size_t len, char *out, size_t out_len);

/* The tenant whose API key key[0..len) is; NULL when none. */
struct tenant *tenants_find_key(const struct tenants *ts, const char *key, size_t len);
/* The configured tenant named name[0..len); NULL when none. */
struct tenant *tenants_find_name(const struct tenants *ts, const char *name, size_t len);
/* The tenant's caps at model (its per-model ones where set). */
void tenant_caps(const struct tenant *t, const char *model, uint64_t *max_concurrency,
                 uint64_t *max_queue);
/* The tier a request of t runs at when it asked for `tier`: never above t's. */
static inline enum tier tenant_clamp_tier(const struct tenant *t, enum tier tier)
{
    return tier < t->tier ? t->tier : tier;
}

#endif

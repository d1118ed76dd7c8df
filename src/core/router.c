#include "thaw/router.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t normalise_host(const char *h, size_t n, char *out, size_t outlen);

/* What by_host and by_name hold for a bare name several namespaces have. */
static char ambiguous_marker;
#define AMBIGUOUS ((void *)&ambiguous_marker)

struct route_claim {
    void *target;
    char qualified[512]; /* "namespace/name" */
};

struct route_claims {
    size_t n, cap;
    struct route_claim *v;
};

void router_init(struct router *r)
{
    strmap_init(&r->by_host);
    strmap_init(&r->by_name);
    strmap_init(&r->name_claims);
    strmap_init(&r->host_claims);
}

static void free_claims(void *ud, const char *key, void *value)
{
    struct route_claims *c = value;
    free(c->v);
    free(c);
}

void router_dispose(struct router *r)
{
    strmap_dispose(&r->by_host);
    strmap_dispose(&r->by_name);
    strmap_each(&r->name_claims, free_claims, NULL);
    strmap_each(&r->host_claims, free_claims, NULL);
    strmap_dispose(&r->name_claims);
    strmap_dispose(&r->host_claims);
}

/* key lower-cased into out (of 512); 0 when it does not fit. */
static size_t lower(const char *key, char *out)
{
    size_t n = strlen(key);
    if (n >= 512) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = (char)tolower((unsigned char)key[i]);
    }
    out[n] = '\0';
    return n;
}

static void note_conflict(struct route_conflicts *c, const char *key, size_t klen)
{
    if (!c) {
        return;
    }
    size_t used = strlen(c->names);
    size_t room = sizeof c->names - used;
    const char *sep = c->n++ ? ", " : "";
    if (used >= 3 && strcmp(c->names + used - 3, "...") == 0) {
        return; /* already cut short */
    }
    if (strlen(sep) + klen + 4 > room) {
        snprintf(c->names + used, room, "%s...", sep);
        return;
    }
    snprintf(c->names + used, room, "%s%.*s", sep, (int)klen, key);
}

static bool claims_have(const struct route_claims *c, const void *target)
{
    for (size_t i = 0; c && i < c->n; i++) {
        if (c->v[i].target == target) {
            return true;
        }
    }
    return false;
}

/* A bare name: the model's while no other namespace has it, AMBIGUOUS once
 * one does. The same name twice in one namespace, or a name some other
 * model has as an alias or host, stays with the first (a conflict). */
static int claim(struct strmap *map, struct strmap *claims, const char *key, size_t klen,
                 void *target, const char *qualified, struct route_conflicts *conflicts)
{
    void *cur = strmap_get(map, key, klen);
    struct route_claims *c = strmap_get(claims, key, klen);
    if (claims_have(c, target)) {
        return 0;
    }
    bool mine = !cur || cur == AMBIGUOUS || claims_have(c, cur);
    for (size_t i = 0; mine && c && i < c->n; i++) {
        mine = strcmp(c->v[i].qualified, qualified) != 0;
    }
    if (!mine) {
        note_conflict(conflicts, key, klen);
        return 0;
    }
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c || strmap_put(claims, key, klen, c)) {
            free(c);
            return -ENOMEM;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 2;
        struct route_claim *v = realloc(c->v, cap * sizeof *v);
        if (!v) {
            return -ENOMEM;
        }
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n].target = target;
    snprintf(c->v[c->n].qualified, sizeof c->v[c->n].qualified, "%s", qualified);
    c->n++;
    return strmap_put(map, key, klen, c->n == 1 ? target : AMBIGUOUS);
}

struct unclaim {
    void *target;
    struct strmap *map, *claims;
    char (*keys)[512];
    size_t n, cap;
};

static void collect_claimed(void *ud, const char *key, void *value)
{
    struct unclaim *u = ud;
    if (claims_have(value, u->target) && u->n < u->cap) {
        snprintf(u->keys[u->n++], 512, "%s", key);
    }
}

/* target gives up its bare names; a name left to one model is its again. */
static void unclaim_all(struct strmap *map, struct strmap *claims, void *target)
{
    struct unclaim u = {target, map, claims, NULL, 0, claims->count};
    if (!u.cap || !(u.keys = malloc(u.cap * sizeof *u.keys))) {
        return;
    }
    strmap_each(claims, collect_claimed, &u);
    for (size_t k = 0; k < u.n; k++) {
        const char *key = u.keys[k];
        size_t klen = strlen(key);
        struct route_claims *c = strmap_get(claims, key, klen);
        size_t j = 0;
        for (size_t i = 0; i < c->n; i++) {
            if (c->v[i].target != target) {
                c->v[j++] = c->v[i];
            }
        }
        c->n = j;
        if (c->n == 0) {
            if (strmap_get(map, key, klen) == AMBIGUOUS) {
                strmap_del(map, key, klen);
            }
            strmap_del(claims, key, klen);
            free_claims(NULL, key, c);
        } else if (c->n == 1) {
            strmap_put(map, key, klen, c->v[0].target);
        }
    }
    free(u.keys);
}

static int put_lower(struct strmap *m, const char *key, void *target,
                     struct route_conflicts *conflicts)
{
    char tmp[512];
    size_t n = lower(key, tmp);
    if (!n) {
        return 0;
    }
    void *cur = strmap_get(m, tmp, n);
    if (cur && cur != target) {
        note_conflict(conflicts, tmp, n);
        return 0;
    }
    return strmap_put(m, tmp, n, target);
}

int router_add(struct router *r, void *target, const struct route_names *nm,
               struct route_conflicts *conflicts)
{
    char qualified[512];
    snprintf(qualified, sizeof qualified, "%s/%s", nm->namespace_ ? nm->namespace_ : "",
             nm->name);
    char low[512];
    size_t ln = lower(nm->name, low);
    int rc = ln ? claim(&r->by_host, &r->host_claims, low, ln, target, qualified, conflicts) : 0;
    if (!rc && nm->namespace_) {
        static const char *const suffixes[] = {"", ".svc", ".svc.cluster.local"};
        for (size_t i = 0; i < 3 && !rc; i++) {
            char host[600];
            snprintf(host, sizeof host, "%s.%s%s", nm->name, nm->namespace_, suffixes[i]);
            rc = put_lower(&r->by_host, host, target, conflicts);
        }
    }
    for (size_t i = 0; i < nm->n_hosts && !rc; i++) {
        rc = put_lower(&r->by_host, nm->hosts[i], target, conflicts);
    }
    /* Names and aliases match exactly (OpenAI model ids are case-sensitive). */
    if (!rc) {
        rc = claim(&r->by_name, &r->name_claims, nm->name, strlen(nm->name), target, qualified,
                   conflicts);
    }
    if (!rc && nm->namespace_) {
        void *cur = strmap_get(&r->by_name, qualified, strlen(qualified));
        if (cur && cur != target) {
            note_conflict(conflicts, qualified, strlen(qualified));
        } else {
            rc = strmap_put(&r->by_name, qualified, strlen(qualified), target);
        }
    }
    for (size_t i = 0; i < nm->n_aliases && !rc; i++) {
        const char *a = nm->aliases[i];
        void *cur = strmap_get(&r->by_name, a, strlen(a));
        if (cur && cur != target) {
            note_conflict(conflicts, a, strlen(a));
            continue;
        }
        rc = strmap_put(&r->by_name, a, strlen(a), target);
    }
    return rc;
}

void router_remove(struct router *r, void *target)
{
    strmap_del_value(&r->by_host, target);
    strmap_del_value(&r->by_name, target);
    unclaim_all(&r->by_host, &r->host_claims, target);
    unclaim_all(&r->by_name, &r->name_claims, target);
}

size_t router_candidates(const struct router *r, const char *name, size_t len, bool host,
                         char *out, size_t outlen)
{
    char key[512];
    size_t klen = len < sizeof key ? len : 0;
    if (host) {
        klen = normalise_host(name, len, key, sizeof key);
    } else if (klen) {
        memcpy(key, name, len);
        key[len] = '\0';
    }
    const struct route_claims *c = klen ? strmap_get(host ? &r->host_claims : &r->name_claims,
                                                     key, klen)
                                        : NULL;
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; c && i < c->n && used < outlen; i++) {
        int w = snprintf(out + used, outlen - used, "%s%s", i ? ", " : "", c->v[i].qualified);
        used += w > 0 ? (size_t)w : 0;
    }
    return c ? c->n : 0;
}

/* OpenAI endpoints (and the common extensions of vLLM and others) whose
 * body names the model: a JSON "model" field, or a multipart form field. */
static const struct {
    const char *path;
    enum route_body kind;
} body_paths[] = {
    {"/v1/chat/completions", ROUTE_BODY_JSON},
    {"/v1/completions", ROUTE_BODY_JSON},
    {"/v1/embeddings", ROUTE_BODY_JSON},
    {"/v1/responses", ROUTE_BODY_JSON},
    {"/v1/moderations", ROUTE_BODY_JSON},
    {"/v1/images/generations", ROUTE_BODY_JSON},
    {"/v1/audio/speech", ROUTE_BODY_JSON},
    {"/v1/audio/transcriptions", ROUTE_BODY_FORM},
    {"/v1/audio/translations", ROUTE_BODY_FORM},
    {"/v1/images/edits", ROUTE_BODY_FORM},
    {"/rerank", ROUTE_BODY_JSON},
    {"/v1/rerank", ROUTE_BODY_JSON},
    {"/v2/rerank", ROUTE_BODY_JSON},
    {"/score", ROUTE_BODY_JSON},
    {"/v1/score", ROUTE_BODY_JSON},
    {"/tokenize", ROUTE_BODY_JSON},
    {"/detokenize", ROUTE_BODY_JSON},
};

enum route_body router_body_kind(const char *path, size_t len)
{
    const char *q = memchr(path, '?', len);
    if (q) {
        len = (size_t)(q - path);
    }
    for (size_t i = 0; i < sizeof body_paths / sizeof body_paths[0]; i++) {
        if (strlen(body_paths[i].path) == len && memcmp(path, body_paths[i].path, len) == 0) {
            return body_paths[i].kind;
        }
    }
    return ROUTE_BODY_NONE;
}

bool router_is_body_routed_path(const char *path, size_t len)
{
    return router_body_kind(path, len) != ROUTE_BODY_NONE;
}

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    ch = (char)tolower((unsigned char)ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

enum route_models router_models_path(const char *path, size_t len, char *id, size_t idcap,
                                     size_t *idlen)
{
    static const char list[] = "/v1/models";
    const size_t ll = sizeof list - 1;
    const char *q = memchr(path, '?', len);
    if (q) {
        len = (size_t)(q - path);
    }
    if (len < ll || memcmp(path, list, ll) != 0) {
        return ROUTE_MODELS_NONE;
    }
    if (len == ll || (len == ll + 1 && path[ll] == '/')) {
        return ROUTE_MODELS_LIST;
    }
    if (path[ll] != '/') {
        return ROUTE_MODELS_NONE; /* /v1/modelsx */
    }
    /* The id: the rest of the path, percent-decoded (ids such as
     * org/name arrive as org%2Fname or org/name). */
    size_t o = 0;
    for (size_t i = ll + 1; i < len; i++) {
        char ch = path[i];
        if (ch == '%' && i + 2 < len && hex_value(path[i + 1]) >= 0 &&
            hex_value(path[i + 2]) >= 0) {
            ch = (char)(hex_value(path[i + 1]) * 16 + hex_value(path[i + 2]));
            i += 2;
        }
        if (o + 1 >= idcap) {
            id[0] = '\0';
            *idlen = 0;
            return ROUTE_MODELS_ONE; /* longer than any name: not found */
        }
        id[o++] = ch;
    }
    id[o] = '\0';
    *idlen = o;
    return ROUTE_MODELS_ONE;
}

/* Host without port and trailing dot, lower-cased into out. */
static size_t normalise_host(const char *h, size_t n, char *out, size_t outlen)
{
    size_t end = n;
    if (n > 0 && h[0] == '[') {
        const char *rb = memchr(h, ']', n);
        end = rb ? (size_t)(rb - h) + 1 : n;
    } else {
        const char *colon = memchr(h, ':', n);
        if (colon) {
            end = (size_t)(colon - h);
        }
    }
    if (end > 0 && h[end - 1] == '.') {
        end--;
    }
    if (end >= outlen) {
        return 0;
    }
    for (size_t i = 0; i < end; i++) {
        out[i] = (char)tolower((unsigned char)h[i]);
    }
    out[end] = '\0';
    return end;
}

enum route_status router_resolve_head(const struct router *r, const struct http_head *h,
                                      struct route *out)
{
    const char *target = http_target(h);
    size_t tlen = h->target_len;
    size_t path_off = 0;
    const char *host = NULL;
    size_t host_len = 0;

    /* absolute-form: the authority in the target takes the place of Host. */
    size_t scheme = 0;
    if (tlen > 7 && strncasecmp(target, "http://", 7) == 0) {
        scheme = 7;
    } else if (tlen > 8 && strncasecmp(target, "https://", 8) == 0) {
        scheme = 8;
    }
    if (scheme) {
        const char *slash = memchr(target + scheme, '/', tlen - scheme);
        size_t auth_end = slash ? (size_t)(slash - target) : tlen;
        host = target + scheme;
        host_len = auth_end - scheme;
        path_off = auth_end;
    } else {
        const struct http_header *hh = http_head_find(h, "host");
        if (hh) {
            host = http_hvalue(h, hh);
            host_len = hh->value_len;
        }
    }
    out->target = NULL;
    out->ambiguous = NULL;
    out->ambiguous_len = 0;
    out->asked_off = out->asked_len = 0;
    out->path_off = path_off;
    out->path_len = tlen - path_off;
    out->add_slash = out->path_len == 0;

    if (host_len) {
        char norm[512];
        size_t n = normalise_host(host, host_len, norm, sizeof norm);
        void *t = n ? strmap_get(&r->by_host, norm, n) : NULL;
        if (t == AMBIGUOUS) {
            out->ambiguous = host;
            out->ambiguous_len = host_len;
            out->ambiguous_host = true;
            return ROUTE_AMBIGUOUS;
        }
        if (t) {
            out->target = t;
            out->via = ROUTE_VIA_HOST;
            return ROUTE_FOUND;
        }
    }

    const char *path = target + path_off;
    size_t plen = tlen - path_off;
    static const char prefix[] = "/models/";
    size_t pl = sizeof prefix - 1;
    if (plen > pl && memcmp(path, prefix, pl) == 0) {
        size_t i = pl;
        while (i < plen && path[i] != '/' && path[i] != '?') {
            i++;
        }
        /* /models/<namespace>/<name>/ first, then /models/<name>/. */
        size_t j = i;
        if (j < plen && path[j] == '/') {
            j++;
            while (j < plen && path[j] != '/' && path[j] != '?') {
                j++;
            }
            void *t = strmap_get(&r->by_name, path + pl, j - pl);
            if (t && t != AMBIGUOUS && j > i + 1) {
                i = j;
            }
        }
        void *t = strmap_get(&r->by_name, path + pl, i - pl);
        if (t == AMBIGUOUS) {
            out->ambiguous = path + pl;
            out->ambiguous_len = i - pl;
            out->ambiguous_host = false;
            return ROUTE_AMBIGUOUS;
        }
        if (t) {
            out->target = t;
            out->via = ROUTE_VIA_PATH;
            out->path_off = path_off + i;
            out->path_len = plen - i;
            out->add_slash = out->path_len == 0 || path[i] == '?';
            return ROUTE_FOUND;
        }
        out->asked_off = path_off + pl;
        out->asked_len = i - pl;
        return ROUTE_NOT_FOUND;
    }
    if (router_is_body_routed_path(path, plen)) {
        return ROUTE_NEED_BODY;
    }
    return ROUTE_NOT_FOUND;
}

enum route_status router_resolve_name(const struct router *r, const char *name, size_t len,
                                      struct route *out)
{
    void *t = strmap_get(&r->by_name, name, len);
    if (t == AMBIGUOUS) {
        return ROUTE_AMBIGUOUS;
    }
    if (!t) {
        return ROUTE_NOT_FOUND;
    }
    out->target = t;
    out->via = ROUTE_VIA_BODY;
    return ROUTE_FOUND;
}

void *router_lookup_name(const struct router *r, const char *name, size_t len)
{
    void *t = strmap_get(&r->by_name, name, len);
    return t == AMBIGUOUS ? NULL : t;
}

enum route_status router_resolve_scan(const struct router *r, enum jsonscan_status scanned,
                                      const struct jsonscan *scan, struct route *out)
{
    switch (scanned) {
    case JSONSCAN_MODEL: {
        size_t len;
        const char *name = jsonscan_model(scan, &len);
        return router_resolve_name(r, name, len, out);
    }
    case JSONSCAN_MODEL_TOO_LONG:
        return ROUTE_NOT_FOUND; /* longer than any name can be */
    case JSONSCAN_NO_MODEL:
        return ROUTE_NO_MODEL_FIELD;
    case JSONSCAN_MORE:
        return ROUTE_NEED_BODY;
    case JSONSCAN_DUPLICATE_MODEL:
        return ROUTE_DUPLICATE_MODEL;
    default:
        return ROUTE_BAD_JSON;
    }
}

enum route_status router_resolve_body(const struct router *r, const char *body, size_t len,
                                      struct route *out)
{
    struct jsonscan scan;
    jsonscan_init_whole(&scan);
    enum jsonscan_status st = jsonscan_feed(&scan, body, len);
    if (st == JSONSCAN_MORE || st == JSONSCAN_MODEL) {
        st = jsonscan_finish(&scan);
    }
    return router_resolve_scan(r, st, &scan, out);
}

#include "thaw/router.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>


void router_init(struct router *r)
{
    strmap_init(&r->by_host);
    strmap_init(&r->by_name);
}

void router_dispose(struct router *r)
{
    strmap_dispose(&r->by_host);
    strmap_dispose(&r->by_name);
}

static int put_lower(struct strmap *m, const char *key, void *target, size_t *conflicts)
{
    char tmp[512];
    size_t n = strlen(key);
    if (n >= sizeof tmp) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        tmp[i] = (char)tolower((unsigned char)key[i]);
    }
    tmp[n] = '\0';
    void *cur = strmap_get(m, tmp, n);
    if (cur && cur != target) {
        if (conflicts) {
            (*conflicts)++;
        }
        return 0;
    }
    return strmap_put(m, tmp, n, target);
}

int router_add(struct router *r, void *target, const struct route_names *nm, size_t *conflicts)
{
    int rc = put_lower(&r->by_host, nm->name, target, conflicts);
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
        void *cur = strmap_get(&r->by_name, nm->name, strlen(nm->name));
        if (cur && cur != target) {
            if (conflicts) {
                (*conflicts)++;
            }
        } else {
            rc = strmap_put(&r->by_name, nm->name, strlen(nm->name), target);
        }
    }
    for (size_t i = 0; i < nm->n_aliases && !rc; i++) {
        const char *a = nm->aliases[i];
        void *cur = strmap_get(&r->by_name, a, strlen(a));
        if (cur && cur != target) {
            if (conflicts) {
                (*conflicts)++;
            }
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
    out->asked_off = out->asked_len = 0;
    out->path_off = path_off;
    out->path_len = tlen - path_off;
    out->add_slash = out->path_len == 0;

    if (host_len) {
        char norm[512];
        size_t n = normalise_host(host, host_len, norm, sizeof norm);
        void *t = n ? strmap_get(&r->by_host, norm, n) : NULL;
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
        void *t = strmap_get(&r->by_name, path + pl, i - pl);
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
    void *t = router_lookup_name(r, name, len);
    if (!t) {
        return ROUTE_NOT_FOUND;
    }
    out->target = t;
    out->via = ROUTE_VIA_BODY;
    return ROUTE_FOUND;
}

void *router_lookup_name(const struct router *r, const char *name, size_t len)
{
    return strmap_get(&r->by_name, name, len);
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
    default:
        return ROUTE_BAD_JSON;
    }
}

enum route_status router_resolve_body(const struct router *r, const char *body, size_t len,
                                      struct route *out)
{
    struct jsonscan scan;
    jsonscan_init(&scan);
    enum jsonscan_status st = jsonscan_feed(&scan, body, len);
    if (st == JSONSCAN_MORE) {
        st = jsonscan_finish(&scan);
    }
    return router_resolve_scan(r, st, &scan, out);
}

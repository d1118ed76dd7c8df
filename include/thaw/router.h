/* Request -> model. In order: the Host header (a configured host name, the
 * model's name, or name.namespace[.svc[.cluster.local]]), the path prefix
 * /models/<name>/ or /models/<namespace>/<name>/ (stripped before
 * proxying), then the "model" field of the body on the OpenAI endpoints that
 * carry one (router_body_kind: a JSON field, or a multipart/form-data field
 * for audio uploads): a name, an alias, or namespace/name. A bare name that
 * models in several namespaces have is ambiguous: it routes nowhere
 * (ROUTE_AMBIGUOUS) and the qualified forms must be used. Targets are opaque
 * pointers the router does not own. */
#ifndef THAW_ROUTER_H
#define THAW_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "thaw/buf.h"
#include "thaw/http.h"
#include "thaw/jsonscan.h"
#include "thaw/strmap.h"

struct router {
    struct strmap by_host; /* lower-case host names */
    struct strmap by_name; /* names, namespace/name and aliases, for paths and bodies */
    /* Bare model names (exact, and lower-cased as hosts) -> the models of
     * every namespace that have it (struct route_claims). */
    struct strmap name_claims, host_claims;
};

struct route_names {
    const char *name;
    const char *namespace_;
    const char *const *hosts;
    size_t n_hosts;
    const char *const *aliases;
    size_t n_aliases;
};

enum route_status {
    ROUTE_FOUND = 0,
    ROUTE_NEED_BODY, /* decided by the JSON body: call router_resolve_body */
    ROUTE_NOT_FOUND,
    ROUTE_BAD_JSON,     /* body is not a JSON object */
    ROUTE_NO_MODEL_FIELD, /* JSON object without a string "model" */
    ROUTE_AMBIGUOUS,    /* a bare name several namespaces have (see route.ambiguous) */
    ROUTE_DUPLICATE_MODEL, /* the body names a model twice (a whole scan) */
};

enum route_via { ROUTE_VIA_HOST, ROUTE_VIA_PATH, ROUTE_VIA_BODY };

/* How a body-routed path's body names the model. */
enum route_body {
    ROUTE_BODY_NONE,
    ROUTE_BODY_JSON, /* the top-level "model" of a JSON object (jsonscan) */
    ROUTE_BODY_FORM, /* the "model" field of a multipart/form-data body (formscan) */
};

/* GET /v1/models and /v1/models/{id}: answered by thaw from what it knows. */
enum route_models { ROUTE_MODELS_NONE, ROUTE_MODELS_LIST, ROUTE_MODELS_ONE };

struct route {
    void *target;
    enum route_via via;
    /* The path to send upstream: target[path_off .. path_off+path_len),
     * with a '/' in front when add_slash. */
    size_t path_off, path_len;
    bool add_slash;
    /* ROUTE_AMBIGUOUS from the head: the name as the request wrote it (it
     * points into the head) and whether it was the Host. */
    const char *ambiguous;
    size_t ambiguous_len;
    bool ambiguous_host;
    /* ROUTE_NOT_FOUND for a /models/<name>/ prefix: the name asked for,
     * target[asked_off .. asked_off+asked_len); asked_len 0 otherwise. */
    size_t asked_off, asked_len;
};

void router_init(struct router *r);
void router_dispose(struct router *r);
/* Names router_add left to another target: how many, and which (the first
 * of them, ", "-separated, cut short with "..." when they do not fit). */
struct route_conflicts {
    size_t n;
    char names[160];
};

/* Adds every name under which target is reachable. Names already taken by
 * another target are left to it and noted in *conflicts (if not NULL).
 * 0 or -ENOMEM. */
int router_add(struct router *r, void *target, const struct route_names *names,
               struct route_conflicts *conflicts);
void router_remove(struct router *r, void *target);
enum route_status router_resolve_head(const struct router *r, const struct http_head *h,
                                      struct route *out);
/* A whole body at once (see router_resolve_scan). */
enum route_status router_resolve_body(const struct router *r, const char *body, size_t len,
                                      struct route *out);
/* The route for what a body scan found: ROUTE_NEED_BODY while the scan
 * wants more, ROUTE_FOUND, ROUTE_NOT_FOUND (no such name, or a name longer
 * than any), ROUTE_NO_MODEL_FIELD or ROUTE_BAD_JSON. */
enum route_status router_resolve_scan(const struct router *r, enum jsonscan_status scanned,
                                      const struct jsonscan *scan, struct route *out);
/* The model named (exactly) name, namespace/name or alias, or NULL (also
 * when the name is ambiguous). */
void *router_lookup_name(const struct router *r, const char *name, size_t len);
/* The models a bare name could mean, "ns/name, ns/name", into out (as a
 * Host when host). Returns how many. */
size_t router_candidates(const struct router *r, const char *name, size_t len, bool host,
                         char *out, size_t outlen);
/* The route for a model name found in a body (JSON or form): ROUTE_FOUND,
 * ROUTE_AMBIGUOUS or ROUTE_NOT_FOUND. */
enum route_status router_resolve_name(const struct router *r, const char *name, size_t len,
                                      struct route *out);
/* Is this request-target (origin-form path, query allowed) one whose body
 * names the model? */
bool router_is_body_routed_path(const char *path, size_t len);
/* How its body names the model (ROUTE_BODY_NONE: it does not). */
enum route_body router_body_kind(const char *path, size_t len);
/* Is this path (query allowed) /v1/models or /v1/models/{id}? For one id,
 * the id percent-decoded into id (idcap bytes with the NUL), *idlen its
 * length (0 when longer than idcap - 1: no model has such a name). */
enum route_models router_models_path(const char *path, size_t len, char *id, size_t idcap,
                                     size_t *idlen);

#endif

/* Request -> model. In order: the Host header (a configured host name, the
 * model's name, or name.namespace[.svc[.cluster.local]]), the path prefix
 * /models/<name>/ (stripped before proxying), then the "model" field of an
 * OpenAI-style JSON body on /v1/chat/completions, /v1/completions and
 * /v1/embeddings. Targets are opaque pointers the router does not own. */
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
    struct strmap by_name; /* names and aliases, for paths and bodies */
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
};

enum route_via { ROUTE_VIA_HOST, ROUTE_VIA_PATH, ROUTE_VIA_BODY };

struct route {
    void *target;
    enum route_via via;
    /* The path to send upstream: target[path_off .. path_off+path_len),
     * with a '/' in front when add_slash. */
    size_t path_off, path_len;
    bool add_slash;
};

void router_init(struct router *r);
void router_dispose(struct router *r);
/* Adds every name under which target is reachable. Names already taken by
 * another target are left to it; *conflicts (if not NULL) counts them.
 * 0 or -ENOMEM. */
int router_add(struct router *r, void *target, const struct route_names *names,
               size_t *conflicts);
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
/* The model named (exactly) name or alias, or NULL. */
void *router_lookup_name(const struct router *r, const char *name, size_t len);
/* Is this request-target one whose JSON body names the model? */
bool router_is_body_routed_path(const char *path, size_t len);

#endif

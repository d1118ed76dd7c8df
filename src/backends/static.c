/* Static backend: each configured endpoint is a replica that is always
 * ready; scaling is not possible. Passive health (ejection after connect
 * failures) is handled by the request path, as for every backend. */
#include "thaw/backend.h"
#include "thaw/netaddr.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/log.h"

/* Resolves "host:port" to numeric "ip:port" once, at start-up (before the
 * event loop runs, so the blocking lookup stalls nothing). */
static int resolve(const char *hostport, char *out, size_t outlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (netaddr_parse(hostport, &ss, &len) == 0) {
        snprintf(out, outlen, "%s", hostport);
        return 0;
    }
    const char *colon = strrchr(hostport, ':');
    if (!colon) {
        return -EINVAL;
    }
    char host[256];
    snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) || !res) {
        return -ENOENT;
    }
    char ip[64];
    int rc = getnameinfo(res->ai_addr, res->ai_addrlen, ip, sizeof ip, NULL, 0, NI_NUMERICHOST);
    int family = res->ai_family;
    freeaddrinfo(res);
    if (rc) {
        return -ENOENT;
    }
    snprintf(out, outlen, family == AF_INET6 ? "[%s]:%s" : "%s:%s", ip, colon + 1);
    return 0;
}

/* Every configured endpoint becomes a ready replica (one already there is
 * left as it is). */
static int add_endpoints(struct backend *b, struct model *m, const struct config_model *cm)
{
    m->replicas_desired = (unsigned)cm->n_endpoints;
    for (size_t i = 0; i < cm->n_endpoints; i++) {
        char addr[300];
        int rc = resolve(cm->endpoints[i], addr, sizeof addr);
        if (rc) {
            LOGE("cannot resolve endpoint", "model=%s endpoint=%s", m->name, cm->endpoints[i]);
            return rc;
        }
        rc = fleet_replica_ready(b->fleet, m, cm->endpoints[i], addr);
        if (rc) {
            return rc;
        }
    }
    return 0;
}

static int static_attach(struct backend *b, struct model *m, const struct config_model *cm)
{
    m->backend = b;
    m->fixed_replicas = true;
    return add_endpoints(b, m, cm);
}

static bool listed(char **list, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(list[i], s) == 0) {
            return true;
        }
    }
    return false;
}

/* A reload changed the model: endpoints no longer listed go (requests at
 * them finish), new ones come; those in both lists are left alone. */
static int static_update(struct backend *b, struct model *m, const struct config_model *cm)
{
    for (size_t i = m->n_endpoints; i-- > 0;) {
        if (!listed(cm->endpoints, cm->n_endpoints, m->endpoints[i]->id)) {
            fleet_replica_gone(b->fleet, m, m->endpoints[i]->id, "removed from the configuration");
        }
    }
    return add_endpoints(b, m, cm);
}

static int static_scale(struct backend *b, struct model *m, unsigned replicas)
{
    return -ENOTSUP;
}

static uint64_t static_retry_after_ms(struct backend *b, struct model *m)
{
    return 1000;
}

static void static_describe(struct backend *b, struct model *m, cJSON *out)
{
    cJSON_AddStringToObject(out, "backend", "static");
    cJSON_AddNumberToObject(out, "replicas_desired", (double)m->n_endpoints);
}

static void static_stop(struct backend *b)
{
}

static void static_free(struct backend *b)
{
    free(b);
}

static const struct backend_ops static_ops = {
    .name = "static",
    .attach = static_attach,
    .scale = static_scale,
    .retry_after_ms = static_retry_after_ms,
    .describe = static_describe,
    .describe_capacity = NULL,
    .update = static_update,
    .stop = static_stop,
    .free = static_free,
};

struct backend *backend_static_new(struct fleet *fleet)
{
    struct backend *b = calloc(1, sizeof *b);
    if (!b) {
        return NULL;
    }
    b->ops = &static_ops;
    b->fleet = fleet;
    return b;
}

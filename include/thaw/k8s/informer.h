/* An informer: list a resource, then watch it from the list's
 * resourceVersion (allowWatchBookmarks), telling its owner about every
 * object that appears, changes or goes. A 410 Gone (as an HTTP status or as
 * an ERROR event in the stream) relists; a watch that ends is resumed from
 * the last resourceVersion; failures back off (k8s_backoff_ms). After a
 * relist, objects the list no longer has are reported removed, so a watch
 * event missed while disconnected is never missed for good.
 * Lists are read in pages of K8S_LIST_PAGE objects (limit and continue, as
 * client-go's pager does), so a namespace of thousands of Deployments never
 * sits in memory whole; an expired continue token (410) starts the list
 * again, whole (client-go's fallback). The informer keeps only keys and
 * resourceVersions, not objects. */
#ifndef THAW_K8S_INFORMER_H
#define THAW_K8S_INFORMER_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/k8s/client.h"
#include "thaw/k8s/json.h"
#include "thaw/strmap.h"

#define K8S_LIST_PAGE 500

struct k8s_informer_ops {
    void (*upsert)(void *ud, const cJSON *obj);
    void (*remove)(void *ud, const cJSON *obj);
    /* After the first complete list. */
    void (*synced)(void *ud);
};

struct k8s_informer {
    struct k8s_client *client;
    char *name; /* for logs: "deployments" */
    char *path; /* collection path, e.g. /apis/apps/v1/deployments */
    char *label_selector;
    char *field_selector;
    const struct k8s_informer_ops *ops;
    void *ud;
    struct k8s_call *call;
    struct event retry;
    char rv[64];
    struct strmap known; /* "ns/name" -> (unused) */
    /* The list under way: its continue token (NULL: on its first page, or
     * none under way) and the keys its pages have had so far. */
    char *cont;
    struct strmap listed;
    bool listing;
    bool unpaged; /* a continue token expired: the next list is whole */
    bool synced;
    bool relist_needed;
    unsigned failures;
    long watch_timeout_s;
    uint64_t relists, list_pages, watch_restarts, errors, events;
    char last_error[200];
};

void k8s_informer_init(struct k8s_informer *inf, struct k8s_client *client,
                       struct event_base *base, const char *name, const char *path,
                       const char *label_selector, const struct k8s_informer_ops *ops, void *ud);
/* Narrows the list and watch to objects whose fields match (a
 * fieldSelector, e.g. "involvedObject.kind=Pod,reason=Pulled"); before start. */
void k8s_informer_set_field_selector(struct k8s_informer *inf, const char *field_selector);
void k8s_informer_start(struct k8s_informer *inf);
/* Lists again now (a started informer): every object comes to upsert once
 * more, for an owner whose view of them changed (a model renamed). */
void k8s_informer_relist(struct k8s_informer *inf);
void k8s_informer_dispose(struct k8s_informer *inf);
/* What the list and watch responses do, without the network (also used by
 * tests and fuzzing). apply_list: a list response body (a page of one); 0
 * when the list is complete, 1 when a continue token says more pages follow
 * (kept in cont), or -1 when it is not a list (nothing changed).
 * apply_event: one watch event line; non-zero when the watch should end (an
 * ERROR event). */
int k8s_informer_apply_list(struct k8s_informer *inf, const char *body, size_t len);
int k8s_informer_apply_event(struct k8s_informer *inf, const char *line, size_t len);
/* "namespace/name" of an object into out. */
void k8s_object_key(const cJSON *obj, char *out, size_t len);

#endif

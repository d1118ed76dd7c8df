/* Kubernetes backend, tenants source: the tenants document (tenants.source)
 * read from one key of a Secret or ConfigMap, watched through an informer
 * that lists and watches only that object (fieldSelector metadata.name).
 * Each new version is parsed as the configuration's "tenants" section and
 * handed to the server, which applies it as a reload would; a bad one
 * leaves the tenants in force and is reported (log, Warning Event on the
 * object, /status, metrics). Nothing of the document's content is logged:
 * errors name the line and key, never a value. */
#include "internal.h"
#include "thaw/buf.h"
#include "thaw/clock.h"
#include "thaw/k8s/auth.h"
#include "thaw/log.h"
#include "thaw/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A document larger than this is refused (a Secret holds at most 1 MiB). */
#define TENANTS_DOC_MAX (1u << 20)

static const char *kind_name(const struct kube_tenants_source *ts)
{
    return ts->kind == TENANTS_SOURCE_SECRET ? "Secret" : "ConfigMap";
}

static void source_failed(struct kube_tenants_source *ts, const char *what)
{
    ts->rejected++;
    snprintf(ts->last_error, sizeof ts->last_error, "%s", what);
    LOGE("tenants source rejected: keeping the tenants in force",
         "source=%s/%s/%s key=%s error=%s", kind_name(ts), ts->ns, ts->name, ts->key,
         LOG_Q(what));
    if (ts->kb->cfg->kubernetes.events) {
        struct k8s_event_ref obj = {ts->ns, "v1", kind_name(ts), ts->name,
                                    ts->present ? ts->uid : NULL};
        k8s_events_record(&ts->kb->events, &obj, "Warning", "InvalidTenants", what, clock_now_ms());
    }
}

/* The document under ts->key: Secret data is base64, ConfigMap data is
 * text. 0, or -1 with why set. */
static int read_document(const struct kube_tenants_source *ts, const cJSON *obj, struct buf *doc,
                         char *why, size_t why_len)
{
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(obj, "data"), ts->key);
    if (!cJSON_IsString(v)) {
        snprintf(why, why_len, "the %s has no data key \"%s\"", kind_name(ts), ts->key);
        return -1;
    }
    size_t len = strlen(v->valuestring);
    if (len > TENANTS_DOC_MAX * 2) {
        snprintf(why, why_len, "data key \"%s\" is larger than 1 MiB", ts->key);
        return -1;
    }
    if (ts->kind == TENANTS_SOURCE_SECRET) {
        if (k8s_base64_decode(v->valuestring, len, doc)) {
            snprintf(why, why_len, "data key \"%s\" is not base64", ts->key);
            return -1;
        }
    } else if (buf_append(doc, v->valuestring, len)) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    if (doc->len > TENANTS_DOC_MAX) {
        snprintf(why, why_len, "data key \"%s\" is larger than 1 MiB", ts->key);
        return -1;
    }
    return 0;
}

static void apply_document(struct kube_tenants_source *ts, const struct buf *doc, const char *rv)
{
    char label[800];
    snprintf(label, sizeof label, "%s %s/%s key %s", kind_name(ts), ts->ns, ts->name, ts->key);
    struct config_tenants parsed;
    struct config_error err;
    int rc = config_parse_tenants(doc->data ? doc->data : "", doc->len, label, &parsed, &err);
    if (rc) {
        config_tenants_dispose(&parsed);
        source_failed(ts, err.msg);
        return;
    }
    size_t n = parsed.n_list;
    rc = ts->apply(ts->apply_ud, &parsed); /* takes what it keeps */
    config_tenants_dispose(&parsed);
    if (rc) {
        char why[1000];
        snprintf(why, sizeof why, "%.800s: the tenants could not be applied (%s)", label,
                 rc == -ENOSPC ? "more tenant names than this process may have over its life, "
                                 "4096; restart thaw to count again"
                               : strerror(-rc));
        source_failed(ts, why);
        return;
    }
    ts->loaded = true;
    ts->applied++;
    ts->last_error[0] = '\0';
    ts->applied_unix = (int64_t)time(NULL);
    snprintf(ts->applied_rv, sizeof ts->applied_rv, "%s", rv);
    LOGI("tenants loaded from the cluster",
         "source=%s/%s/%s key=%s resource_version=%s tenants=%zu", kind_name(ts), ts->ns, ts->name,
         ts->key, rv, n);
}

static void source_upsert(void *ud, const cJSON *obj)
{
    struct kube_tenants_source *ts = ud;
    const char *rv = k8s_get_string(obj, "metadata.resourceVersion");
    rv = rv ? rv : "";
    ts->present = true;
    const char *uid = k8s_get_string(obj, "metadata.uid");
    snprintf(ts->uid, sizeof ts->uid, "%s", uid ? uid : "");
    /* A relist hands back the version already read. */
    if (rv[0] && strcmp(rv, ts->seen_rv) == 0) {
        return;
    }
    snprintf(ts->seen_rv, sizeof ts->seen_rv, "%s", rv);
    struct buf doc;
    buf_init(&doc);
    char why[300];
    if (read_document(ts, obj, &doc, why, sizeof why) == 0) {
        apply_document(ts, &doc, rv);
    } else {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s %s/%s: %s", kind_name(ts), ts->ns, ts->name, why);
        source_failed(ts, msg);
    }
    buf_dispose(&doc);
}

static void source_remove(void *ud, const cJSON *obj)
{
    struct kube_tenants_source *ts = ud;
    ts->present = false;
    ts->seen_rv[0] = '\0';
    char msg[700];
    snprintf(msg, sizeof msg, "%s %s/%s was deleted", kind_name(ts), ts->ns, ts->name);
    source_failed(ts, msg);
}

static void source_synced(void *ud)
{
    struct kube_tenants_source *ts = ud;
    if (!ts->present) {
        char msg[700];
        snprintf(msg, sizeof msg, "%s %s/%s not found", kind_name(ts), ts->ns, ts->name);
        source_failed(ts, msg);
    }
}

static const struct k8s_informer_ops source_ops = {source_upsert, source_remove, source_synced};

int backend_k8s_watch_tenants(struct backend *b, const struct config_tenants_source *src,
                              backend_tenants_apply_fn apply, void *ud)
{
    struct kube_backend *kb = KB(b);
    struct kube_tenants_source *ts = &kb->tenants;
    const struct k8s_auth *au = k8s_client_auth(kb->client);
    ts->kb = kb;
    ts->kind = src->kind;
    ts->apply = apply;
    ts->apply_ud = ud;
    snprintf(ts->ns, sizeof ts->ns, "%s",
             src->namespace_  ? src->namespace_
             : au->namespace_ ? au->namespace_
                              : "default");
    snprintf(ts->name, sizeof ts->name, "%s", src->name);
    snprintf(ts->key, sizeof ts->key, "%s", src->key ? src->key : "tenants.json");
    char path[600], sel[320];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/%s", ts->ns,
             ts->kind == TENANTS_SOURCE_SECRET ? "secrets" : "configmaps");
    snprintf(sel, sizeof sel, "metadata.name=%s", ts->name);
    k8s_informer_init(&ts->inf, kb->client, kb->evbase,
                      ts->kind == TENANTS_SOURCE_SECRET ? "secrets" : "configmaps", path, NULL,
                      &source_ops, ts);
    k8s_informer_set_field_selector(&ts->inf, sel);
    ts->on = true;
    k8s_informer_start(&ts->inf);
    LOGI("tenants source watched", "source=%s/%s/%s key=%s", kind_name(ts), ts->ns, ts->name,
         ts->key);
    return 0;
}

void kube_tenants_source_dispose(struct kube_tenants_source *ts)
{
    if (ts->on) {
        k8s_informer_dispose(&ts->inf);
        ts->on = false;
    }
}

void kube_tenants_source_describe(const struct kube_tenants_source *ts, cJSON *k)
{
    if (!ts->on) {
        return;
    }
    cJSON *j = cJSON_AddObjectToObject(k, "tenants_source");
    cJSON_AddStringToObject(j, "kind", ts->kind == TENANTS_SOURCE_SECRET ? "secret" : "configmap");
    cJSON_AddStringToObject(j, "namespace", ts->ns);
    cJSON_AddStringToObject(j, "name", ts->name);
    cJSON_AddStringToObject(j, "key", ts->key);
    cJSON_AddStringToObject(j, "state",
                            ts->last_error[0] ? "error"
                            : ts->loaded      ? "loaded"
                                              : "waiting");
    cJSON_AddBoolToObject(j, "loaded", ts->loaded);
    cJSON_AddStringToObject(j, "resource_version", ts->applied_rv);
    cJSON_AddNumberToObject(j, "applied", (double)ts->applied);
    cJSON_AddNumberToObject(j, "rejected", (double)ts->rejected);
    cJSON_AddNumberToObject(j, "applied_unix", (double)ts->applied_unix);
    cJSON_AddStringToObject(j, "last_error", ts->last_error);
    /* The object cannot be read at all (403: no RBAC for it; network). */
    if (ts->inf.failures) {
        cJSON_AddStringToObject(j, "watch_error", ts->inf.last_error);
    }
}

void kube_tenants_source_metrics(const struct kube_tenants_source *ts, struct buf *o)
{
    if (!ts->on) {
        return;
    }
    metrics_single(o, "thaw_tenants_source_loaded", "gauge",
                   "1 once a tenants document from tenants.source is in force.",
                   ts->loaded ? 1 : 0);
    metrics_single(o, "thaw_tenants_source_error", "gauge",
                   "1 while the source's latest version is rejected or the object is missing.",
                   ts->last_error[0] ? 1 : 0);
    metrics_help_type(o, "thaw_tenants_source_updates_total", "counter",
                      "Versions of the tenants document read, by result.");
    buf_printf(o,
               "thaw_tenants_source_updates_total{result=\"applied\"} %llu\n"
               "thaw_tenants_source_updates_total{result=\"rejected\"} %llu\n",
               (unsigned long long)ts->applied, (unsigned long long)ts->rejected);
}

#include "thaw/k8s/events.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

struct k8s_event_entry {
    struct k8s_events *owner;
    char key[1800];
    char namespace_[254], api_version[64], kind[64], obj_name[254], uid[64];
    char type[16], reason[128], message[1024];
    char event_name[254]; /* as the API server named it; "" until created */
    char first_ts[32];
    uint64_t count;   /* occurrences so far */
    uint64_t written; /* the count the API server has */
    uint64_t sending; /* the count the write out now carries */
    uint64_t last_ms;
    struct k8s_call *call;
};

static void wall_time(char *out, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void k8s_events_init(struct k8s_events *e, struct k8s_client *c, const char *component,
                     uint64_t window_ms, size_t max_entries)
{
    memset(e, 0, sizeof *e);
    e->client = c;
    snprintf(e->component, sizeof e->component, "%s", component);
    e->window_ms = window_ms;
    e->max_entries = max_entries;
    strmap_init(&e->entries);
}

static void free_entry(void *ud, const char *key, void *value)
{
    struct k8s_event_entry *en = value;
    k8s_call_cancel(en->call);
    free(en);
}

void k8s_events_dispose(struct k8s_events *e)
{
    strmap_each(&e->entries, free_entry, NULL);
    strmap_dispose(&e->entries);
}

static char *event_body(const struct k8s_events *e, const struct k8s_event_ref *obj,
                        const char *type, const char *reason, const char *message,
                        const char *first_ts, uint64_t count)
{
    cJSON *ev = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(ev, "metadata");
    char gen[300];
    snprintf(gen, sizeof gen, "%s.", obj->name);
    cJSON_AddStringToObject(md, "generateName", gen);
    cJSON_AddStringToObject(md, "namespace", obj->namespace_);
    cJSON *io = cJSON_AddObjectToObject(ev, "involvedObject");
    cJSON_AddStringToObject(io, "apiVersion", obj->api_version);
    cJSON_AddStringToObject(io, "kind", obj->kind);
    cJSON_AddStringToObject(io, "name", obj->name);
    cJSON_AddStringToObject(io, "namespace", obj->namespace_);
    if (obj->uid && obj->uid[0]) {
        cJSON_AddStringToObject(io, "uid", obj->uid);
    }
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddStringToObject(ev, "reason", reason);
    cJSON_AddStringToObject(ev, "message", message);
    cJSON *src = cJSON_AddObjectToObject(ev, "source");
    cJSON_AddStringToObject(src, "component", e->component);
    char now[32];
    wall_time(now, sizeof now);
    cJSON_AddStringToObject(ev, "firstTimestamp", first_ts ? first_ts : now);
    cJSON_AddStringToObject(ev, "lastTimestamp", now);
    cJSON_AddNumberToObject(ev, "count", (double)count);
    char *body = cJSON_PrintUnformatted(ev);
    cJSON_Delete(ev);
    return body;
}

static void write_failed(struct k8s_events *e, long status, const char *err)
{
    e->stats.errors++;
    LOGW("could not write a Kubernetes Event", "status=%ld error=%s", status,
         LOG_Q(err ? err : ""));
}

static void flush(struct k8s_event_entry *en);

static void on_written(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_event_entry *en = ud;
    struct k8s_events *e = en->owner;
    en->call = NULL;
    bool created = en->event_name[0] == '\0';
    if (status == 200 || status == 201) {
        if (created) {
            cJSON *obj = cJSON_ParseWithLength(body, len);
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(obj, "metadata"), "name");
            if (cJSON_IsString(name)) {
                snprintf(en->event_name, sizeof en->event_name, "%s", name->valuestring);
            }
            cJSON_Delete(obj);
            e->stats.created++;
        }
        en->written = en->sending;
    } else if (status == 404 && !created) {
        /* Expired since: the occurrences not yet written start a new one. */
        en->event_name[0] = '\0';
        en->count -= en->written;
        en->written = 0;
        wall_time(en->first_ts, sizeof en->first_ts);
    } else {
        write_failed(e, status, err);
        return; /* best effort: the next occurrence tries again */
    }
    if (en->count > en->written) {
        flush(en);
    }
}

static void flush(struct k8s_event_entry *en)
{
    struct k8s_events *e = en->owner;
    if (en->call || en->count <= en->written) {
        return;
    }
    char *body;
    char path[900];
    const char *method;
    const char *ctype;
    if (!en->event_name[0]) {
        struct k8s_event_ref obj = {en->namespace_, en->api_version, en->kind, en->obj_name,
                                    en->uid};
        body = event_body(e, &obj, en->type, en->reason, en->message, en->first_ts, en->count);
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/events", en->namespace_);
        method = "POST";
        ctype = "application/json";
    } else {
        cJSON *p = cJSON_CreateObject();
        char now[32];
        wall_time(now, sizeof now);
        cJSON_AddNumberToObject(p, "count", (double)en->count);
        cJSON_AddStringToObject(p, "lastTimestamp", now);
        body = cJSON_PrintUnformatted(p);
        cJSON_Delete(p);
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/events/%s", en->namespace_,
                 en->event_name);
        method = "PATCH";
        ctype = "application/merge-patch+json";
    }
    if (!body) {
        return;
    }
    en->sending = en->count;
    en->call = k8s_request(e->client, method, path, ctype, body, strlen(body), 10000, on_written,
                           en);
    free(body);
}

static void on_unaggregated(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_events *e = ud;
    if (status == 200 || status == 201) {
        e->stats.created++;
    } else {
        write_failed(e, status, err);
    }
}

struct stale_scan {
    uint64_t now_ms, window_ms;
    char **keys;
    size_t n;
};

static void find_stale(void *ud, const char *key, void *value)
{
    struct stale_scan *s = ud;
    struct k8s_event_entry *en = value;
    if (!en->call && s->now_ms - en->last_ms > s->window_ms) {
        s->keys[s->n++] = en->key;
    }
}

/* Drops entries past the window with no write out. */
static void evict_stale(struct k8s_events *e, uint64_t now_ms)
{
    struct stale_scan s = {now_ms, e->window_ms, calloc(e->entries.count + 1, sizeof(char *)), 0};
    if (!s.keys) {
        return;
    }
    strmap_each(&e->entries, find_stale, &s);
    for (size_t i = 0; i < s.n; i++) {
        struct k8s_event_entry *en = strmap_del(&e->entries, s.keys[i], strlen(s.keys[i]));
        free(en);
    }
    free(s.keys);
}

void k8s_events_record(struct k8s_events *e, const struct k8s_event_ref *obj, const char *type,
                       const char *reason, const char *message, uint64_t now_ms)
{
    char key[1800];
    /* The uid too: a Deployment made again under its name is another object. */
    const char *uid = obj->uid ? obj->uid : "";
    int kl = snprintf(key, sizeof key, "%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s\x1f%s", obj->namespace_,
                      obj->kind, obj->name, uid, type, reason, message);
    if (kl < 0 || (size_t)kl >= sizeof key) {
        kl = (int)sizeof key - 1; /* a very long message: aggregate on its start */
    }
    struct k8s_event_entry *en = strmap_get(&e->entries, key, (size_t)kl);
    if (en) {
        if (now_ms - en->last_ms <= e->window_ms || en->call) {
            en->count++;
            e->stats.aggregated++;
        } else { /* a new series */
            en->event_name[0] = '\0';
            en->count = 1;
            en->written = 0;
            wall_time(en->first_ts, sizeof en->first_ts);
        }
        en->last_ms = now_ms;
        flush(en);
        return;
    }
    if (e->entries.count >= e->max_entries) {
        evict_stale(e, now_ms);
    }
    if (e->entries.count >= e->max_entries || !(en = calloc(1, sizeof *en))) {
        e->stats.unaggregated++;
        char *body = event_body(e, obj, type, reason, message, NULL, 1);
        char path[400];
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/events", obj->namespace_);
        if (body) {
            k8s_request(e->client, "POST", path, "application/json", body, strlen(body), 10000,
                        on_unaggregated, e);
            free(body);
        }
        return;
    }
    en->owner = e;
    memcpy(en->key, key, (size_t)kl);
    en->key[kl] = '\0';
    snprintf(en->namespace_, sizeof en->namespace_, "%s", obj->namespace_);
    snprintf(en->api_version, sizeof en->api_version, "%s", obj->api_version);
    snprintf(en->kind, sizeof en->kind, "%s", obj->kind);
    snprintf(en->obj_name, sizeof en->obj_name, "%s", obj->name);
    snprintf(en->uid, sizeof en->uid, "%s", uid);
    snprintf(en->type, sizeof en->type, "%s", type);
    snprintf(en->reason, sizeof en->reason, "%s", reason);
    snprintf(en->message, sizeof en->message, "%s", message);
    wall_time(en->first_ts, sizeof en->first_ts);
    en->count = 1;
    en->last_ms = now_ms;
    if (strmap_put(&e->entries, en->key, (size_t)kl, en)) {
        free(en);
        return;
    }
    flush(en);
}

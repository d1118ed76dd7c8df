#include "thaw/k8s/informer.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

static void start_list(struct k8s_informer *inf);
static void request_page(struct k8s_informer *inf);
static void start_watch(struct k8s_informer *inf);

void k8s_object_key(const cJSON *obj, char *out, size_t len)
{
    const char *ns = k8s_get_string(obj, "metadata.namespace");
    const char *name = k8s_get_string(obj, "metadata.name");
    snprintf(out, len, "%s/%s", ns ? ns : "", name ? name : "");
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_informer *inf = arg;
    if (inf->relist_needed || !inf->synced) {
        start_list(inf);
    } else {
        inf->unpaged = false;
        start_watch(inf);
    }
}

static void retry_later(struct k8s_informer *inf, const char *why)
{
    inf->failures++;
    inf->errors++;
    snprintf(inf->last_error, sizeof inf->last_error, "%s", why);
    uint64_t ms = k8s_backoff_ms(inf->failures, (double)rand() / ((double)RAND_MAX + 1));
    LOGW("kubernetes informer retrying", "resource=%s error=%s retry_in_ms=%llu", inf->name,
         LOG_Q(why), (unsigned long long)ms);
    struct timeval tv = clock_timeval(ms);
    event_add(&inf->retry, &tv);
}

static void remember_rv(struct k8s_informer *inf, const cJSON *obj)
{
    const char *rv = k8s_get_string(obj, "metadata.resourceVersion");
    if (rv) {
        snprintf(inf->rv, sizeof inf->rv, "%s", rv);
    }
}

struct sweep {
    struct k8s_informer *inf;
    struct strmap *seen;
    char **gone;
    size_t n_gone, cap;
};

static void collect_gone(void *ud, const char *key, void *value)
{
    struct sweep *s = ud;
    if (strmap_get(s->seen, key, strlen(key))) {
        return;
    }
    if (s->n_gone == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        char **ng = realloc(s->gone, ncap * sizeof *ng);
        if (!ng) {
            return;
        }
        s->gone = ng;
        s->cap = ncap;
    }
    s->gone[s->n_gone++] = strdup(key);
}

/* A removed object we only know by key (it vanished while the watch was
 * down): hand the owner an object with just its name and namespace. */
static void remove_by_key(struct k8s_informer *inf, const char *key)
{
    const char *slash = strchr(key, '/');
    cJSON *key_only = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(key_only, "metadata");
    char ns[256];
    snprintf(ns, sizeof ns, "%.*s", (int)(slash - key), key);
    if (ns[0]) {
        cJSON_AddStringToObject(md, "namespace", ns);
    }
    cJSON_AddStringToObject(md, "name", slash + 1);
    inf->ops->remove(inf->ud, key_only);
    cJSON_Delete(key_only);
}

/* Forgets the list under way (its pages so far and its continue token). */
static void end_listing(struct k8s_informer *inf)
{
    if (inf->listing) {
        strmap_dispose(&inf->listed);
        inf->listing = false;
    }
    free(inf->cont);
    inf->cont = NULL;
}

int k8s_informer_apply_list(struct k8s_informer *inf, const char *body, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    if (!cJSON_IsArray(items)) {
        cJSON_Delete(root);
        return -1;
    }
    if (!inf->listing) {
        strmap_init(&inf->listed);
        inf->listing = true;
    }
    inf->list_pages++;
    const cJSON *it;
    cJSON_ArrayForEach(it, items)
    {
        char key[600];
        k8s_object_key(it, key, sizeof key);
        strmap_put(&inf->listed, key, strlen(key), (void *)1);
        strmap_put(&inf->known, key, strlen(key), (void *)1);
        inf->ops->upsert(inf->ud, it);
    }
    const char *cont = k8s_get_string(root, "metadata.continue");
    if (cont && *cont) {
        char *copy = strdup(cont);
        cJSON_Delete(root);
        free(inf->cont);
        inf->cont = copy;
        return copy ? 1 : -1;
    }
    /* Whatever we knew that the list no longer has went away meanwhile. */
    struct sweep sw = {inf, &inf->listed, NULL, 0, 0};
    strmap_each(&inf->known, collect_gone, &sw);
    for (size_t i = 0; i < sw.n_gone; i++) {
        if (sw.gone[i]) {
            strmap_del(&inf->known, sw.gone[i], strlen(sw.gone[i]));
            remove_by_key(inf, sw.gone[i]);
            free(sw.gone[i]);
        }
    }
    free(sw.gone);
    end_listing(inf);
    const char *rv = k8s_get_string(root, "metadata.resourceVersion");
    snprintf(inf->rv, sizeof inf->rv, "%s", rv ? rv : "");
    cJSON_Delete(root);
    inf->relists++;
    inf->relist_needed = false;
    /* The back-off is reset by a watch that works (an event, or an end at
     * timeoutSeconds), not here: a server that lists but refuses every watch
     * would otherwise be listed anew at the first back-off step forever. */
    bool first = !inf->synced;
    inf->synced = true;
    if (first && inf->ops->synced) {
        inf->ops->synced(inf->ud);
    }
    return 0;
}

static void on_list(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_informer *inf = ud;
    inf->call = NULL;
    if (status == 410 && inf->cont) {
        /* The continue token outlived the server's history: list again,
         * whole this time (as client-go's pager falls back), which cannot
         * expire so. */
        LOGI("kubernetes list page expired (410 Gone): listing again, unpaged", "resource=%s",
             inf->name);
        inf->unpaged = true;
        start_list(inf);
        return;
    }
    if (status != 200) {
        char why[200];
        snprintf(why, sizeof why, "list: %s (HTTP %ld)", err ? err : "error", status);
        retry_later(inf, why);
        return;
    }
    int rc = k8s_informer_apply_list(inf, body, len);
    if (rc < 0) {
        retry_later(inf, "list: not a list object");
    } else if (rc > 0) {
        request_page(inf);
    } else {
        inf->unpaged = false;
        start_watch(inf);
    }
}

int k8s_informer_apply_event(struct k8s_informer *inf, const char *line, size_t len)
{
    cJSON *ev = cJSON_ParseWithLength(line, len);
    const char *type = k8s_get_string(ev, "type");
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(ev, "object");
    int stop = 0;
    if (!type || !cJSON_IsObject(obj)) {
        LOGW("kubernetes watch: bad event", "resource=%s", inf->name);
    } else if (strcmp(type, "ADDED") == 0 || strcmp(type, "MODIFIED") == 0) {
        char key[600];
        k8s_object_key(obj, key, sizeof key);
        strmap_put(&inf->known, key, strlen(key), (void *)1);
        remember_rv(inf, obj);
        inf->events++;
        inf->failures = 0;
        inf->ops->upsert(inf->ud, obj);
    } else if (strcmp(type, "DELETED") == 0) {
        char key[600];
        k8s_object_key(obj, key, sizeof key);
        strmap_del(&inf->known, key, strlen(key));
        remember_rv(inf, obj);
        inf->events++;
        inf->failures = 0;
        inf->ops->remove(inf->ud, obj);
    } else if (strcmp(type, "BOOKMARK") == 0) {
        remember_rv(inf, obj);
        inf->failures = 0;
    } else if (strcmp(type, "ERROR") == 0) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(obj, "code");
        if (cJSON_IsNumber(code) && code->valueint == 410) {
            LOGI("kubernetes watch expired (410 Gone): relisting", "resource=%s", inf->name);
            inf->relist_needed = true;
        } else {
            const char *msg = k8s_get_string(obj, "message");
            LOGW("kubernetes watch error event", "resource=%s message=%s", inf->name,
                 LOG_Q(msg ? msg : ""));
        }
        stop = 1;
    }
    cJSON_Delete(ev);
    return stop;
}

static int on_line(void *ud, const char *line, size_t len)
{
    return k8s_informer_apply_event(ud, line, len);
}

static void on_watch_done(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_informer *inf = ud;
    inf->call = NULL;
    inf->watch_restarts++;
    if (status == 410 || inf->relist_needed) {
        inf->relist_needed = true;
        start_list(inf);
        return;
    }
    if (status == 200 && !err) {
        /* The server ended it (timeoutSeconds): carry on from where we are. */
        inf->failures = 0;
        start_watch(inf);
        return;
    }
    /* The server refused the watch (an error event, or an HTTP error but 429):
     * what it holds may not follow from what this informer saw, as when it
     * was restored from an older etcd or restarted empty and answers a
     * resourceVersion it has not reached with 504 ResourceVersionTooLarge.
     * Listed again after the back-off, as client-go's reflector does; a
     * failed transport or a 429 watches again from where it was. */
    bool event = status == 200 && err && strcmp(err, "stopped") == 0;
    if (event || (status != 0 && status != 200 && status != 429)) {
        inf->relist_needed = true;
    }
    char why[200];
    if (event) {
        snprintf(why, sizeof why, "watch: error event");
    } else {
        snprintf(why, sizeof why, "watch: %s (HTTP %ld)", err ? err : "ended", status);
    }
    retry_later(inf, why);
}

/* "&labelSelector=...&fieldSelector=..." for the selectors set, escaped. */
static void selectors(const struct k8s_informer *inf, char *out, size_t len)
{
    out[0] = '\0';
    const char *names[] = {"labelSelector", "fieldSelector"};
    const char *values[] = {inf->label_selector, inf->field_selector};
    for (size_t i = 0; i < 2; i++) {
        if (values[i] && *values[i]) {
            char *esc = curl_easy_escape(NULL, values[i], 0);
            size_t at = strlen(out);
            snprintf(out + at, len - at, "&%s=%s", names[i], esc ? esc : "");
            curl_free(esc);
        }
    }
}

static void build_path(struct k8s_informer *inf, char *out, size_t len, bool watch)
{
    char sel[1024];
    selectors(inf, sel, sizeof sel);
    if (watch) {
        snprintf(out, len,
                 "%s?watch=true&allowWatchBookmarks=true&timeoutSeconds=%ld"
                 "&resourceVersion=%s%s",
                 inf->path, inf->watch_timeout_s, inf->rv, sel);
    } else {
        char *cont = inf->cont ? curl_easy_escape(NULL, inf->cont, 0) : NULL;
        if (inf->unpaged) {
            snprintf(out, len, "%s%s%s", inf->path, sel[0] ? "?" : "", sel[0] ? sel + 1 : "");
        } else {
            snprintf(out, len, "%s?limit=%d%s%s%s", inf->path, K8S_LIST_PAGE,
                     cont ? "&continue=" : "", cont ? cont : "", sel);
        }
        curl_free(cont);
    }
}

/* Asks for the list's next page (its first when no continue token is kept). */
static void request_page(struct k8s_informer *inf)
{
    char path[4096];
    build_path(inf, path, sizeof path, false);
    inf->call = k8s_request(inf->client, "GET", path, NULL, NULL, 0, 60000, on_list, inf);
    if (!inf->call) {
        retry_later(inf, "out of memory");
    }
}

/* A list from its first page; one under way is dropped. */
static void start_list(struct k8s_informer *inf)
{
    end_listing(inf);
    request_page(inf);
}

static void start_watch(struct k8s_informer *inf)
{
    char path[2048];
    /* Vary the server-side timeout as client-go does, so watches do not all
     * reconnect at once. */
    inf->watch_timeout_s = 240 + rand() % 120;
    build_path(inf, path, sizeof path, true);
    inf->call = k8s_watch(inf->client, path, (inf->watch_timeout_s + 60) * 1000, on_line,
                          on_watch_done, inf);
    if (!inf->call) {
        retry_later(inf, "out of memory");
    }
}

void k8s_informer_init(struct k8s_informer *inf, struct k8s_client *client,
                       struct event_base *base, const char *name, const char *path,
                       const char *label_selector, const struct k8s_informer_ops *ops, void *ud)
{
    memset(inf, 0, sizeof *inf);
    inf->client = client;
    inf->name = strdup(name);
    inf->path = strdup(path);
    inf->label_selector = label_selector ? strdup(label_selector) : NULL;
    inf->ops = ops;
    inf->ud = ud;
    strmap_init(&inf->known);
    event_assign(&inf->retry, base, -1, 0, on_retry, inf);
}

void k8s_informer_set_field_selector(struct k8s_informer *inf, const char *field_selector)
{
    free(inf->field_selector);
    inf->field_selector = field_selector ? strdup(field_selector) : NULL;
}

void k8s_informer_start(struct k8s_informer *inf)
{
    start_list(inf);
}

void k8s_informer_relist(struct k8s_informer *inf)
{
    if (!inf->call && !event_pending(&inf->retry, EV_TIMEOUT, NULL)) {
        return; /* not started */
    }
    k8s_call_cancel(inf->call);
    inf->call = NULL;
    event_del(&inf->retry);
    inf->relist_needed = true;
    start_list(inf);
}

void k8s_informer_dispose(struct k8s_informer *inf)
{
    k8s_call_cancel(inf->call);
    inf->call = NULL;
    event_del(&inf->retry);
    end_listing(inf);
    strmap_dispose(&inf->known);
    free(inf->name);
    free(inf->path);
    free(inf->label_selector);
    free(inf->field_selector);
}

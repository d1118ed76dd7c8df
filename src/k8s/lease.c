#include "thaw/k8s/lease.h"
#include "thaw/clock.h"
#include "thaw/k8s/informer.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <cjson/cJSON.h>


static void step(struct k8s_lease *l);

/* metav1.MicroTime: 2026-01-02T03:04:05.123456Z */
static void micro_time(char *out, size_t len)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%06ldZ", base, (long)tv.tv_usec);
}

static void arm(struct k8s_lease *l, uint64_t ms)
{
    struct timeval tv = clock_timeval(ms);
    event_add(&l->timer, &tv);
}

static void set_leading(struct k8s_lease *l, bool leading, const char *why)
{
    if (l->leading == leading) {
        return;
    }
    l->leading = leading;
    if (leading) {
        l->acquisitions++;
        LOGI("became the leader", "lease=%s/%s identity=%s", l->namespace_, l->name, l->identity);
    } else {
        LOGW("stopped leading", "lease=%s/%s identity=%s reason=\"%s\"", l->namespace_, l->name,
             l->identity, why);
    }
    l->changed(l->ud, leading);
}

char *k8s_lease_body(struct k8s_lease *l, const cJSON *cur, bool take_over)
{
    cJSON *o = cur ? cJSON_Duplicate(cur, 1) : cJSON_CreateObject();
    cJSON_DeleteItemFromObject(o, "status");
    if (!cur) {
        cJSON_AddStringToObject(o, "apiVersion", "coordination.k8s.io/v1");
        cJSON_AddStringToObject(o, "kind", "Lease");
        cJSON *md = cJSON_AddObjectToObject(o, "metadata");
        cJSON_AddStringToObject(md, "name", l->name);
        cJSON_AddStringToObject(md, "namespace", l->namespace_);
    }
    cJSON *spec = cJSON_GetObjectItemCaseSensitive(o, "spec");
    if (!spec) {
        spec = cJSON_AddObjectToObject(o, "spec");
    }
    char now[64];
    micro_time(now, sizeof now);
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(spec, "leaseTransitions");
    double transitions = cJSON_IsNumber(tr) ? tr->valuedouble : 0;
    cJSON_DeleteItemFromObject(spec, "holderIdentity");
    cJSON_DeleteItemFromObject(spec, "renewTime");
    cJSON_DeleteItemFromObject(spec, "leaseDurationSeconds");
    cJSON_AddStringToObject(spec, "holderIdentity", l->identity);
    cJSON_AddNumberToObject(spec, "leaseDurationSeconds",
                            (double)((l->duration_ms + 999) / 1000));
    cJSON_AddStringToObject(spec, "renewTime", now);
    if (!cur || take_over) {
        cJSON_DeleteItemFromObject(spec, "acquireTime");
        cJSON_DeleteItemFromObject(spec, "leaseTransitions");
        cJSON_AddStringToObject(spec, "acquireTime", now);
        cJSON_AddNumberToObject(spec, "leaseTransitions", cur ? transitions + 1 : 0);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

void k8s_lease_observe(struct k8s_lease *l, const cJSON *cur, uint64_t now, bool *mine,
                       bool *expired)
{
    const char *holder = k8s_get_string(cur, "spec.holderIdentity");
    const char *renew = k8s_get_string(cur, "spec.renewTime");
    if (!holder || !renew || strcmp(holder, l->holder) || strcmp(renew, l->observed_renew)) {
        snprintf(l->holder, sizeof l->holder, "%s", holder ? holder : "");
        snprintf(l->observed_renew, sizeof l->observed_renew, "%s", renew ? renew : "");
        l->observed_ms = now;
    }
    const cJSON *tr = k8s_get(cur, "spec.leaseTransitions");
    l->transitions = k8s_json_count(tr);
    *mine = holder && strcmp(holder, l->identity) == 0;
    *expired = !holder || !*holder || now - l->observed_ms >= l->duration_ms;
}

static void on_written(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_lease *l = ud;
    l->call = NULL;
    uint64_t now = clock_now_ms();
    if ((status == 200 || status == 201) && now - l->write_sent_ms >= l->renew_deadline_ms) {
        /* Written, but answered too late to lead on: the others may see the
         * new renewTime as soon as it was sent, and this one's deadline
         * counts from then, so it has passed. The next round renews. */
        snprintf(l->holder, sizeof l->holder, "%s", l->identity);
        if (l->leading) {
            set_leading(l, false, "the renewal was answered after renew_deadline_ms");
        }
    } else if (status == 200 || status == 201) {
        l->last_renew_ms = l->write_sent_ms;
        snprintf(l->holder, sizeof l->holder, "%s", l->identity);
        set_leading(l, true, "");
        struct timeval tv = clock_timeval(l->write_sent_ms + l->renew_deadline_ms - now);
        event_add(&l->deadline, &tv);
    } else {
        if (status == 409) {
            LOGD("lease write lost a race", "lease=%s", l->name);
        } else {
            l->renew_failures++;
        }
        if (l->leading && now - l->last_renew_ms >= l->renew_deadline_ms) {
            set_leading(l, false, "could not renew within renew_deadline_ms");
        }
    }
    arm(l, l->renew_interval_ms);
}

static void on_read(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct k8s_lease *l = ud;
    l->call = NULL;
    uint64_t now = clock_now_ms();
    char path[700];
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases", l->namespace_);
    if (status == 404) {
        char *b = k8s_lease_body(l, NULL, true);
        l->write_sent_ms = now;
        l->call = k8s_request(l->client, "POST", path, "application/json", b, strlen(b), 5000,
                              on_written, l);
        free(b);
        return;
    }
    if (status != 200) {
        if (l->leading && now - l->last_renew_ms >= l->renew_deadline_ms) {
            set_leading(l, false, "could not reach the API server within renew_deadline_ms");
        }
        arm(l, l->renew_interval_ms);
        return;
    }
    cJSON *cur = cJSON_ParseWithLength(body, len);
    bool mine, expired;
    k8s_lease_observe(l, cur, now, &mine, &expired);
    if (!mine && l->leading) {
        set_leading(l, false, "another activator holds the lease");
    }
    if (mine || expired) {
        char *b = k8s_lease_body(l, cur, !mine);
        char one[1200];
        snprintf(one, sizeof one, "%s/%s", path, l->name);
        l->write_sent_ms = now;
        l->call = k8s_request(l->client, "PUT", one, "application/json", b, strlen(b), 5000,
                              on_written, l);
        free(b);
    } else {
        arm(l, l->renew_interval_ms);
    }
    cJSON_Delete(cur);
}

static void step(struct k8s_lease *l)
{
    if (l->call) {
        return;
    }
    uint64_t now = clock_now_ms();
    if (l->leading && now - l->last_renew_ms >= l->renew_deadline_ms) {
        set_leading(l, false, "renew deadline passed");
    }
    char path[800];
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s",
             l->namespace_, l->name);
    l->call = k8s_request(l->client, "GET", path, NULL, NULL, 0, 5000, on_read, l);
    if (!l->call) {
        arm(l, l->renew_interval_ms);
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    step(arg);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_lease *l = arg;
    if (!l->leading) {
        return;
    }
    uint64_t since = clock_now_ms() - l->last_renew_ms;
    if (since >= l->renew_deadline_ms) {
        set_leading(l, false, "could not renew within renew_deadline_ms");
        return;
    }
    /* A timer may fire a millisecond early (its clock and clock_now_ms
     * round apart): it waits for the rest, or the leader would lead on
     * until its hung renewal is answered. */
    struct timeval tv = clock_timeval(l->renew_deadline_ms - since);
    event_add(&l->deadline, &tv);
}

void k8s_lease_init(struct k8s_lease *l, struct k8s_client *c, struct event_base *base,
                    const char *name, const char *namespace_, const char *identity,
                    uint64_t duration_ms, uint64_t renew_interval_ms, uint64_t renew_deadline_ms,
                    k8s_lease_cb changed, void *ud)
{
    memset(l, 0, sizeof *l);
    l->client = c;
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(l->namespace_, sizeof l->namespace_, "%s", namespace_);
    snprintf(l->identity, sizeof l->identity, "%s", identity);
    l->duration_ms = duration_ms;
    l->renew_interval_ms = renew_interval_ms;
    l->renew_deadline_ms = renew_deadline_ms;
    l->changed = changed;
    l->ud = ud;
    event_assign(&l->timer, base, -1, 0, on_timer, l);
    event_assign(&l->deadline, base, -1, 0, on_deadline, l);
}

void k8s_lease_start(struct k8s_lease *l)
{
    arm(l, 0);
}

void k8s_lease_dispose(struct k8s_lease *l)
{
    event_del(&l->timer);
    event_del(&l->deadline);
    k8s_call_cancel(l->call);
    l->call = NULL;
}

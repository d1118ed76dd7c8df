/* Kubernetes backend, the idle clock across restarts and leader changes.
 *
 * A model goes to zero idle-timeout after its last request (autoscaler.h).
 * That moment lives in the autoscaler's memory, so a restarted activator, or
 * a new leader that never saw the traffic, would find "no demand ever" and
 * scale every warm model to zero at once. So the leader (or the single
 * activator) records it on the Deployment as the annotation
 * K8S_LAST_REQUEST_ANNOTATION (RFC 3339, UTC, milliseconds), and every
 * activator starts a model's idle clock from that annotation when it sees
 * the Deployment, or from that moment when there is none (never from
 * "no demand ever"); a new leader does the same when it takes the lease.
 *
 * Writes are rate limited: per model at most one per max(idle-timeout / 4,
 * IDLE_WRITE_MIN_MS), the last one trailing (when the interval is up, the
 * newest request is written), so after a restart a model can lose at most
 * one interval of its idle time. Only while the model has replicas and no
 * scale PATCH is out: at zero there is nothing to keep warm, and the write
 * would change the resourceVersion a conditional scale from zero carries.
 *
 * Other activators' requests reach the leader the way their demand does:
 * each one's GET /demand says, per model, how many ms ago its last request
 * was (kube_idle_demand_age), and the leader takes the newest. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static int64_t wall_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t write_interval_ms(const struct kmodel *km)
{
    uint64_t quarter = km->spec.idle_timeout_ms / 4;
    return quarter > IDLE_WRITE_MIN_MS ? quarter : IDLE_WRITE_MIN_MS;
}

/* ms from a wall-clock time to now; 0 for times ahead (clock skew). */
static uint64_t age_of_wall(int64_t wall_ms)
{
    int64_t now = wall_now_ms();
    return wall_ms < now ? (uint64_t)(now - wall_ms) : 0;
}

void kube_idle_observe(struct kmodel *km, const cJSON *deployment, bool discovered)
{
    const cJSON *anns = k8s_get(deployment, "metadata.annotations");
    const cJSON *v = cJSON_IsObject(anns)
                         ? cJSON_GetObjectItemCaseSensitive(anns, K8S_LAST_REQUEST_ANNOTATION)
                         : NULL;
    int64_t wall;
    uint64_t now = clock_now_ms();
    if (cJSON_IsString(v) && k8s_time_parse_ms(v->valuestring, &wall) == 0 && wall > 0) {
        km->annotated_ms = wall;
        as_note_demand(&km->sc.ass, now, age_of_wall(wall));
    } else {
        if (cJSON_IsString(v) && km->annotated_ms >= 0) {
            LOGW("unreadable annotation ignored", "deployment=%s annotation=%s", km->key,
                 K8S_LAST_REQUEST_ANNOTATION);
        }
        km->annotated_ms = cJSON_IsString(v) ? -1 : 0;
        if (discovered) {
            as_note_demand(&km->sc.ass, now, 0); /* from sync, not "never" */
        }
    }
}

static void start_unannotated_clock(void *ud, const char *key, void *value)
{
    struct kmodel *km = value;
    if (km->annotated_ms <= 0) {
        as_note_demand(&km->sc.ass, clock_now_ms(), 0);
    }
}

void kube_idle_on_leadership(struct kube_backend *kb)
{
    strmap_each(&kb->models, start_unannotated_clock, NULL);
}

static void on_written(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct kmodel *km = ud;
    km->idle_call = NULL;
    if (status == 200) {
        km->written_traffic_ms = km->writing_traffic_ms;
        km->kb->idle_writes++;
        return;
    }
    km->kb->idle_write_errors++;
    LOGW("recording a model's last request failed", "model=%s deployment=%s status=%ld "
         "error=%s", km->m->name, km->key, status, LOG_Q(err ? err : ""));
}

static void write_last_request(struct kmodel *km, uint64_t now)
{
    int64_t wall = wall_now_ms() - (int64_t)(now - km->traffic_ms);
    if (km->annotated_ms > 0 && km->annotated_ms >= wall - 1000) {
        km->written_traffic_ms = km->traffic_ms; /* already there (a previous leader wrote it) */
        return;
    }
    char when[40], body[160], path[700];
    k8s_time_format_ms(wall, when, sizeof when);
    snprintf(body, sizeof body, "{\"metadata\":{\"annotations\":{\"%s\":\"%s\"}}}",
             K8S_LAST_REQUEST_ANNOTATION, when);
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s", km->spec.namespace_,
             km->spec.deployment);
    km->last_write_ms = now;
    km->writing_traffic_ms = km->traffic_ms;
    km->idle_call = k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json",
                                body, strlen(body), 15000, on_written, km);
}

/* Requests seen here since the last tick (including ones that came and
 * went between two ticks) and, on the leader, the peers' newest. */
static void note_traffic(struct kmodel *km, uint64_t now)
{
    struct model *m = km->m;
    uint64_t requests = m->stats.proxied + m->stats.rejected + m->stats.aborted;
    if (m->inflight || m->queue.count || requests != km->requests_seen) {
        km->traffic_ms = now;
        as_note_demand(&km->sc.ass, now, 0);
    }
    km->requests_seen = requests;
    struct kube_backend *kb = km->kb;
    if (!kb->leading || !kb->have_peers) {
        return;
    }
    uint64_t age = k8s_peers_idle_ms(&kb->peers, km->key);
    if (age < now && (!km->traffic_ms || now - age > km->traffic_ms)) {
        km->traffic_ms = now - age;
        as_note_demand(&km->sc.ass, now, age);
    }
}

void kube_idle_tick(struct kmodel *km, uint64_t now)
{
    note_traffic(km, now);
    if (!km->kb->leading || !km->traffic_ms || km->traffic_ms == km->written_traffic_ms ||
        km->idle_call || km->spec.replicas == 0 || km->scale_inflight) {
        return;
    }
    if (km->last_write_ms && now - km->last_write_ms < write_interval_ms(km)) {
        return;
    }
    write_last_request(km, now);
}

uint64_t kube_idle_demand_age(const struct kmodel *km, uint64_t now)
{
    if (!km->traffic_ms || now - km->traffic_ms >= km->spec.idle_timeout_ms) {
        return UINT64_MAX; /* nothing the leader's idle clock could use */
    }
    return now - km->traffic_ms;
}

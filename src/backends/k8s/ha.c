/* Kubernetes backend, several activators: this one's identity, the leader
 * lease (only the leader plans and scales down, and records when a model's
 * last request passed; any activator scales from zero, conditionally), the
 * peers whose counts the leader adds to its own, and the /demand answer the
 * leader reads. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void on_leadership(void *ud, bool leading)
{
    struct kube_backend *kb = ud;
    kb->leading = leading;
    kb->leader_since_ms = clock_now_ms();
    if (leading) {
        kube_idle_on_leadership(kb);
    }
    if (kb->have_peers) {
        k8s_peers_set_polling(&kb->peers, leading);
        kube_sleep_leadership(kb);
    }
}

/* The configured identity, else the pod's name, else host-pid. */
static void set_identity(struct kube_backend *kb, const char *configured)
{
    const char *pod = getenv("POD_NAME");
    if (configured) {
        snprintf(kb->identity, sizeof kb->identity, "%s", configured);
    } else if (pod && *pod) {
        snprintf(kb->identity, sizeof kb->identity, "%s", pod);
    } else {
        char host[200] = "thaw";
        gethostname(host, sizeof host - 1);
        snprintf(kb->identity, sizeof kb->identity, "%s-%d", host, (int)getpid());
    }
}

void kube_ha_start(struct kube_backend *kb)
{
    const struct config *cfg = kb->cfg;
    const struct config_kubernetes *k = &cfg->kubernetes;
    struct event_base *base = kb->evbase;
    kb->leading = true; /* alone, this activator decides */
    set_identity(kb, k->identity);
    const struct k8s_auth *au = k8s_client_auth(kb->client);
    const char *lease_ns = k->lease_namespace ? k->lease_namespace
                           : au->namespace_   ? au->namespace_
                                              : "default";
    if (k->leader_election) {
        kb->elect = true;
        kb->leading = false;
        k8s_lease_init(&kb->lease, kb->client, base, k->lease_name ? k->lease_name : "thaw-leader",
                       lease_ns, kb->identity, k->lease_duration_ms, k->renew_interval_ms,
                       k->renew_deadline_ms, on_leadership, kb);
        k8s_lease_start(&kb->lease);
    }
    if (k->peers_service) {
        const char *self_ip = getenv("POD_IP");
        char listen_ip[128] = "";
        if (!self_ip || !*self_ip) {
            snprintf(listen_ip, sizeof listen_ip, "%s", cfg->admin_listen);
            char *colon = strrchr(listen_ip, ':');
            if (colon) {
                *colon = '\0';
            }
            self_ip = listen_ip;
        }
        kb->have_peers = true;
        k8s_peers_init(&kb->peers, kb->client, base,
                       k->peers_namespace ? k->peers_namespace : lease_ns, k->peers_service,
                       (unsigned)k->peers_port, self_ip, k->peers_poll_ms, k->peers_timeout_ms);
        k8s_peers_set_polling(&kb->peers, kb->leading);
        kb->peers.on_change = kube_peers_changed; /* the models' slots are split anew */
        kb->peers.on_change_ud = kb;
        k8s_peers_start(&kb->peers);
    }
}

void kube_ha_dispose(struct kube_backend *kb)
{
    if (kb->elect) {
        k8s_lease_dispose(&kb->lease);
    }
    if (kb->have_peers) {
        k8s_peers_dispose(&kb->peers);
    }
}

void kube_ha_describe(struct kube_backend *kb, cJSON *k)
{
    cJSON *le = cJSON_AddObjectToObject(k, "leader_election");
    cJSON_AddBoolToObject(le, "enabled", kb->elect);
    cJSON_AddStringToObject(le, "identity", kb->identity);
    cJSON_AddBoolToObject(le, "leading", kb->leading);
    if (kb->elect) {
        cJSON_AddStringToObject(le, "lease", kb->lease.name);
        cJSON_AddStringToObject(le, "holder", kb->lease.holder);
        cJSON_AddNumberToObject(le, "lease_transitions", (double)kb->lease.transitions);
    }
    cJSON_AddNumberToObject(le, "conditional_scales", (double)kb->conditional_scales);
    cJSON_AddNumberToObject(le, "conditional_conflicts", (double)kb->conditional_conflicts);
    if (kb->have_peers) {
        k8s_peers_describe(&kb->peers, k);
    }
}

/* GET /demand: this activator's own counts per model, for the leader. */

/* [in flight, queued, ms since the last request here]: a model is listed
 * while busy or while its last request is within its idle timeout, so the
 * leader's idle clock counts requests that came and went between polls. */
static void add_demand_cb(void *ud, const char *key, void *value)
{
    struct kmodel *km = value;
    uint64_t age = kube_idle_demand_age(km, clock_now_ms());
    /* Requests on pods this activator unrouted (asleep, terminating) too:
     * the model's load until they end (inflight_leaving). */
    uint64_t inflight = km->m->inflight + km->m->inflight_leaving;
    if (inflight || km->m->queue.count || age != UINT64_MAX) {
        cJSON *counts = cJSON_CreateArray();
        cJSON_AddItemToArray(counts, cJSON_CreateNumber((double)inflight));
        /* Waiting that more replicas could start (not held by a tenant's cap). */
        cJSON_AddItemToArray(counts, cJSON_CreateNumber((double)queue_runnable(&km->m->queue)));
        cJSON_AddItemToArray(counts, cJSON_CreateNumber(age != UINT64_MAX ? (double)age : 0));
        cJSON_AddItemToObject(ud, key, counts);
    }
}

void kube_demand(struct backend *b, cJSON *out)
{
    struct kube_backend *kb = KB(b);
    cJSON_AddStringToObject(out, "identity", kb->identity);
    cJSON_AddBoolToObject(out, "leader", kb->leading);
    cJSON *models = cJSON_AddObjectToObject(out, "models");
    strmap_each(&kb->models, add_demand_cb, models);
    kube_sleep_unrouted(kb, out);
}

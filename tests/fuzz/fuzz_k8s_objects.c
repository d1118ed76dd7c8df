/* libFuzzer target: what the Kubernetes API server sends thaw.
 * The input goes to an informer twice over: as a list response body, then
 * line by line as watch events, then as a list again (so objects the
 * informer knows are swept). Every object the informer hands on goes through
 * all of thaw's decoders (Deployment model spec, Pod, EndpointSlice, Node,
 * a Pulled Event's message),
 * the label selector matcher and the Lease reader and writer, whatever its kind, as a confused or
 * hostile API server could send anything anywhere. Each line is also read
 * as a peer activator's demand report. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "thaw/k8s/informer.h"
#include "thaw/k8s/lease.h"
#include "thaw/k8s/model_spec.h"
#include "thaw/k8s/objects.h"
#include "thaw/k8s/peers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *base;

static void on_endpoint(void *ud, const struct k8s_slice_endpoint *e)
{
    size_t *total = ud;
    *total += (e->pod ? strlen(e->pod) : 0) + strlen(e->address);
}

static void ignore_leading(void *ud, bool leading)
{
}

static void decode_all(const cJSON *obj)
{
    struct k8s_model_spec defaults = {0}, spec;
    defaults.max_concurrency = 8;
    defaults.max_scale = 1000;
    defaults.idle_timeout_ms = 300000;
    defaults.startup_timeout_ms = 600000;
    defaults.port = 8000;
    strcpy(defaults.health_path, "/health");
    if (k8s_model_spec_parse(obj, &defaults, &spec) == 0) {
        if (spec.min_scale > spec.max_scale || strlen(spec.errors) >= sizeof spec.errors) {
            __builtin_trap();
        }
    }
    struct k8s_pod_info pod;
    (void)k8s_pod_decode(obj, &pod);
    uint64_t pull_ms;
    (void)k8s_pulled_duration_ms(k8s_get_string(obj, "message"), &pull_ms); /* a Pulled Event */
    /* Its selector against its own labels, and against a Deployment's. */
    (void)k8s_selector_matches(k8s_get(obj, "spec.selector"), k8s_get(obj, "metadata.labels"));
    (void)k8s_selector_matches(obj, k8s_get(obj, "spec.template.metadata.labels"));
    size_t total = 0;
    (void)k8s_slice_service(obj);
    (void)k8s_slice_each(obj, on_endpoint, &total);
    struct k8s_node_info node;
    (void)k8s_node_decode(obj, &node);
    struct k8s_pod_template tpl;
    (void)k8s_pod_template_decode(k8s_get(obj, "spec.template.spec"), &tpl);
    (void)k8s_node_fits(&node, &tpl, &pod.requests);
    struct k8s_pod_template own;
    (void)k8s_pod_template_decode(k8s_get(obj, "spec"), &own);
    (void)k8s_node_fits(&node, &own, NULL);
    k8s_pod_template_dispose(&own);
    k8s_pod_template_dispose(&tpl);
    k8s_node_info_dispose(&node);

    struct k8s_lease lease;
    k8s_lease_init(&lease, NULL, base, "thaw", "default", "thaw-0", 15000, 2000, 10000,
                   ignore_leading, NULL);
    bool mine, expired;
    k8s_lease_observe(&lease, obj, 1000, &mine, &expired);
    char *body = k8s_lease_body(&lease, obj, !mine);
    free(body);
    k8s_lease_dispose(&lease);
}

static void on_upsert(void *ud, const cJSON *obj)
{
    decode_all(obj);
}

static void on_remove(void *ud, const cJSON *obj)
{
    decode_all(obj);
}

static const struct k8s_informer_ops ops = {on_upsert, on_remove, NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base) {
        base = event_base_new();
    }
    const char *text = (const char *)data;
    struct k8s_informer inf;
    k8s_informer_init(&inf, NULL, base, "fuzz", "/apis/apps/v1/deployments", NULL, &ops, NULL);
    (void)k8s_informer_apply_list(&inf, text, size);
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || text[i] == '\n') {
            if (i > start) {
                (void)k8s_informer_apply_event(&inf, text + start, i - start);
                struct strmap demand, idle, unrouted;
                char identity[254];
                strmap_init(&demand);
                strmap_init(&idle);
                strmap_init(&unrouted);
                (void)k8s_peer_demand_parse(text + start, i - start, &demand, &idle, &unrouted,
                                            identity, sizeof identity);
                strmap_dispose(&demand);
                strmap_dispose(&idle);
                strmap_dispose(&unrouted);
            }
            start = i + 1;
        }
    }
    (void)k8s_informer_apply_list(&inf, text, size);
    k8s_informer_dispose(&inf);
    return 0;
}

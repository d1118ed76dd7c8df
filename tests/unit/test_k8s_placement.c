/* Placement pieces of the Kubernetes objects: a Node's extended resources,
 * labels, taints and cordon; a Pod's node and requests; a pod template's
 * requests, nodeSelector, required node affinity and tolerations; and
 * whether a node would take the pod (k8s_node_fits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/k8s/objects.h"

static const char *GPU = "nvidia.com/gpu";

static void node_from(const char *json, struct k8s_node_info *ni)
{
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    assert_int_equal(k8s_node_decode(o, ni), 0);
    cJSON_Delete(o);
}

static void template_from(const char *json, struct k8s_pod_template *t)
{
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    assert_int_equal(k8s_pod_template_decode(o, t), 0);
    cJSON_Delete(o);
}

static const char *A100_NODE =
    "{\"metadata\":{\"name\":\"gpu-a\",\"labels\":{\"nvidia.com/gpu.product\":\"NVIDIA-A100\","
    "\"zone\":\"z1\",\"gpu-mem\":\"80\"}},"
    "\"spec\":{\"taints\":[{\"key\":\"nvidia.com/gpu\",\"effect\":\"NoSchedule\"},"
    "{\"key\":\"team\",\"value\":\"ml\",\"effect\":\"PreferNoSchedule\"}]},"
    "\"status\":{\"allocatable\":{\"cpu\":\"96\",\"nvidia.com/gpu\":\"4\","
    "\"nvidia.com/mig-1g.10gb\":7,\"nvidia.com/gpu.shared\":\"8\",\"example.com/fpga\":\"2\"}}}";

static void test_node_decoding(void **state)
{
    struct k8s_node_info ni;
    node_from(A100_NODE, &ni);
    assert_string_equal(ni.name, "gpu-a");
    assert_int_equal(ni.allocatable.n, 3); /* only nvidia.com/ resources */
    assert_int_equal(k8s_resources_get(&ni.allocatable, GPU), 4);
    assert_int_equal(k8s_resources_get(&ni.allocatable, "nvidia.com/mig-1g.10gb"), 7);
    assert_int_equal(k8s_resources_get(&ni.allocatable, "nvidia.com/gpu.shared"), 8);
    assert_int_equal(k8s_resources_get(&ni.allocatable, "example.com/fpga"), 0);
    assert_false(ni.unschedulable);
    assert_string_equal(k8s_node_label(&ni, "zone"), "z1");
    assert_null(k8s_node_label(&ni, "nope"));
    assert_int_equal(ni.n_taints, 2);
    assert_string_equal(ni.taints[0].key, GPU);
    assert_string_equal(ni.taints[0].value, "");
    assert_int_equal(ni.taints[0].effect, K8S_NO_SCHEDULE);
    assert_string_equal(ni.taints[1].value, "ml");
    assert_int_equal(ni.taints[1].effect, K8S_PREFER_NO_SCHEDULE);
    k8s_node_info_dispose(&ni);

    node_from("{\"metadata\":{\"name\":\"c\"},\"spec\":{\"unschedulable\":true}}", &ni);
    assert_true(ni.unschedulable);
    assert_int_equal(ni.allocatable.n, 0);
    k8s_node_info_dispose(&ni);
}

static void test_pod_node_and_requests(void **state)
{
    cJSON *pod = cJSON_Parse(
        "{\"metadata\":{\"name\":\"p\",\"namespace\":\"m\"},\"spec\":{\"nodeName\":\"gpu-a\","
        "\"initContainers\":[{\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"3\"}}}],"
        "\"containers\":["
        "{\"resources\":{\"requests\":{\"nvidia.com/gpu\":\"1\",\"cpu\":\"4\"},"
        "\"limits\":{\"nvidia.com/gpu\":\"1\",\"nvidia.com/mig-1g.10gb\":\"2\"}}},"
        "{\"resources\":{\"limits\":{\"nvidia.com/gpu\":1}}}]},"
        "\"status\":{\"phase\":\"Running\"}}");
    struct k8s_pod_info pi;
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_string_equal(pi.node_name, "gpu-a");
    /* 1 + 1 (a limit stands for an absent request), raised to the init
     * container's 3; the mig limit with no request counts too. */
    assert_int_equal(k8s_resources_get(&pi.requests, GPU), 3);
    assert_int_equal(k8s_resources_get(&pi.requests, "nvidia.com/mig-1g.10gb"), 2);
    assert_int_equal(k8s_resources_get(&pi.requests, "cpu"), 0);
    cJSON_Delete(pod);
}

static void test_template_decoding(void **state)
{
    struct k8s_pod_template t;
    template_from(
        "{\"containers\":[{\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"2\"}}}],"
        "\"nodeSelector\":{\"nvidia.com/gpu.product\":\"NVIDIA-A100\"},"
        "\"tolerations\":[{\"key\":\"nvidia.com/gpu\",\"operator\":\"Exists\","
        "\"effect\":\"NoSchedule\"},{\"key\":\"team\",\"value\":\"ml\"}],"
        "\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"
        "{\"nodeSelectorTerms\":[{\"matchExpressions\":[{\"key\":\"zone\",\"operator\":\"In\","
        "\"values\":[\"z1\",\"z2\"]}]}]}}}}",
        &t);
    assert_int_equal(k8s_resources_get(&t.requests, GPU), 2);
    assert_int_equal(t.n_node_selector, 1);
    assert_string_equal(t.node_selector[0], "nvidia.com/gpu.product");
    assert_int_equal(t.n_tolerations, 2);
    assert_int_equal(t.tolerations[0].op, K8S_TOL_EXISTS);
    assert_int_equal(t.tolerations[1].op, K8S_TOL_EQUAL);
    assert_int_equal(t.tolerations[1].effect, K8S_EFFECT_ANY);
    assert_int_equal(t.n_terms, 1);
    assert_int_equal(t.terms[0].n_reqs, 1);
    assert_int_equal(t.terms[0].reqs[0].op, K8S_SEL_IN);
    assert_int_equal(t.terms[0].reqs[0].n_values, 2);
    k8s_pod_template_dispose(&t);
    assert_int_equal(k8s_pod_template_decode(NULL, &t), 0); /* no spec: an empty template */
    assert_int_equal(t.requests.n, 0);
    k8s_pod_template_dispose(&t);
}

static enum k8s_fit fit(const char *node_json, const char *tpl_json)
{
    struct k8s_node_info ni;
    struct k8s_pod_template t;
    node_from(node_json, &ni);
    template_from(tpl_json, &t);
    enum k8s_fit f = k8s_node_fits(&ni, &t, NULL);
    k8s_pod_template_dispose(&t);
    k8s_node_info_dispose(&ni);
    return f;
}

#define TAINTED(effect)                                                                            \
    "{\"metadata\":{\"name\":\"n\"},\"spec\":{\"taints\":[{\"key\":\"dedicated\","                 \
    "\"value\":\"llm\",\"effect\":\"" effect "\"}]},"                                              \
    "\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"2\"}}}"
#define GPUS(n) "\"containers\":[{\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"" #n "\"}}}]"

static void test_taints_against_tolerations(void **state)
{
    const char *none = "{" GPUS(1) "}";
    assert_int_equal(fit(TAINTED("NoSchedule"), none), K8S_FIT_TAINT);
    assert_int_equal(fit(TAINTED("NoExecute"), none), K8S_FIT_TAINT);
    assert_int_equal(fit(TAINTED("PreferNoSchedule"), none), K8S_FITS); /* only a preference */
    /* Equal: key and value must match. */
    const char *equal =
        "{" GPUS(1) ",\"tolerations\":[{\"key\":\"dedicated\","
                    "\"operator\":\"Equal\",\"value\":\"llm\",\"effect\":\"NoSchedule\"}]}";
    assert_int_equal(fit(TAINTED("NoSchedule"), equal), K8S_FITS);
    assert_int_equal(fit(TAINTED("NoExecute"), equal), K8S_FIT_TAINT); /* other effect */
    const char *wrong_value = "{" GPUS(1) ",\"tolerations\":[{\"key\":\"dedicated\","
                                          "\"value\":\"batch\"}]}";
    assert_int_equal(fit(TAINTED("NoSchedule"), wrong_value), K8S_FIT_TAINT);
    /* Exists on the key: any value; no effect: every effect. */
    const char *exists = "{" GPUS(1) ",\"tolerations\":[{\"key\":\"dedicated\","
                                     "\"operator\":\"Exists\"}]}";
    assert_int_equal(fit(TAINTED("NoExecute"), exists), K8S_FITS);
    /* Exists with an empty key: every taint. */
    const char *all = "{" GPUS(1) ",\"tolerations\":[{\"operator\":\"Exists\"}]}";
    assert_int_equal(fit(TAINTED("NoSchedule"), all), K8S_FITS);
    /* An empty key with Equal tolerates nothing (the API rejects it). */
    const char *bad = "{" GPUS(1) ",\"tolerations\":[{\"value\":\"llm\"}]}";
    assert_int_equal(fit(TAINTED("NoSchedule"), bad), K8S_FIT_TAINT);
}

static void test_cordoned_node(void **state)
{
    const char *cordoned = "{\"metadata\":{\"name\":\"n\"},\"spec\":{\"unschedulable\":true},"
                           "\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"8\"}}}";
    assert_int_equal(fit(cordoned, "{" GPUS(1) "}"), K8S_FIT_CORDONED);
    /* A pod tolerating the cordon's taint may still go there (as DaemonSets do). */
    assert_int_equal(fit(cordoned,
                         "{" GPUS(1) ",\"tolerations\":[{\"key\":"
                                     "\"node.kubernetes.io/unschedulable\",\"operator\":\"Exists\","
                                     "\"effect\":\"NoSchedule\"}]}"),
                     K8S_FITS);
}

static void test_node_selector_and_affinity(void **state)
{
    const char *node = "{\"metadata\":{\"name\":\"gpu-a\",\"labels\":{"
                       "\"nvidia.com/gpu.product\":\"NVIDIA-A100\",\"gpu-mem\":\"80\"}},"
                       "\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"8\"}}}";
    assert_int_equal(fit(node, "{\"nodeSelector\":{\"nvidia.com/gpu.product\":\"NVIDIA-A100\"}}"),
                     K8S_FITS);
    assert_int_equal(fit(node, "{\"nodeSelector\":{\"nvidia.com/gpu.product\":\"NVIDIA-H100\"}}"),
                     K8S_FIT_NODE_SELECTOR);
    assert_int_equal(fit(node, "{\"nodeSelector\":{\"zone\":\"z1\"}}"), K8S_FIT_NODE_SELECTOR);
#define AFF(terms)                                                                                 \
    "{\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":"         \
    "{\"nodeSelectorTerms\":[" terms "]}}}}"
#define EXPR(key, op, vals) "{\"key\":\"" key "\",\"operator\":\"" op "\",\"values\":[" vals "]}"
#define TERM(exprs) "{\"matchExpressions\":[" exprs "]}"
    assert_int_equal(fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "In",
                                             "\"NVIDIA-H100\",\"NVIDIA-A100\"")))),
                     K8S_FITS);
    assert_int_equal(
        fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "NotIn", "\"NVIDIA-A100\"")))),
        K8S_FIT_AFFINITY);
    assert_int_equal(fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "NotIn", "\"NVIDIA-T4\"")))),
                     K8S_FITS);
    assert_int_equal(fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "Exists", "")))), K8S_FITS);
    assert_int_equal(fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "DoesNotExist", "")))),
                     K8S_FIT_AFFINITY);
    assert_int_equal(fit(node, AFF(TERM(EXPR("zone", "DoesNotExist", "")))), K8S_FITS);
    assert_int_equal(fit(node, AFF(TERM(EXPR("gpu-mem", "Gt", "\"40\"")))), K8S_FITS);
    assert_int_equal(fit(node, AFF(TERM(EXPR("gpu-mem", "Lt", "\"40\"")))), K8S_FIT_AFFINITY);
    /* Expressions of a term are ANDed; terms are ORed. */
    assert_int_equal(fit(node, AFF(TERM(EXPR("nvidia.com/gpu.product", "Exists",
                                             "") "," EXPR("zone", "Exists", "")))),
                     K8S_FIT_AFFINITY);
    assert_int_equal(
        fit(node, AFF(TERM(EXPR("zone", "Exists", "")) "," TERM(EXPR("gpu-mem", "In", "\"80\"")))),
        K8S_FITS);
    /* matchFields on the node's name. */
    assert_int_equal(
        fit(node, AFF("{\"matchFields\":[" EXPR("metadata.name", "In", "\"gpu-a\"") "]}")),
        K8S_FITS);
    assert_int_equal(
        fit(node, AFF("{\"matchFields\":[" EXPR("metadata.name", "In", "\"gpu-b\"") "]}")),
        K8S_FIT_AFFINITY);
    /* An empty term matches no node; an unknown operator matches nothing. */
    assert_int_equal(fit(node, AFF("{}")), K8S_FIT_AFFINITY);
    assert_int_equal(fit(node, AFF(TERM(EXPR("zone", "Near", "\"z\"")))), K8S_FIT_AFFINITY);
}

static void test_resources(void **state)
{
    const char *node = "{\"metadata\":{\"name\":\"n\"},\"status\":{\"allocatable\":{"
                       "\"nvidia.com/gpu\":\"2\",\"nvidia.com/mig-1g.10gb\":\"1\"}}}";
    struct k8s_node_info ni;
    struct k8s_pod_template two, mig2, cpu;
    node_from(node, &ni);
    template_from("{" GPUS(2) "}", &two);
    template_from("{\"containers\":[{\"resources\":{\"requests\":{\"nvidia.com/mig-1g.10gb\":"
                  "\"2\"}}}]}",
                  &mig2);
    template_from("{\"containers\":[{\"resources\":{\"requests\":{\"cpu\":\"2\"}}}]}", &cpu);
    assert_int_equal(k8s_node_fits(&ni, &two, NULL), K8S_FITS);
    struct k8s_resources used = {0};
    k8s_resources_add(&used, GPU, 1);
    assert_int_equal(k8s_node_fits(&ni, &two, &used), K8S_FIT_RESOURCES); /* one left */
    assert_int_equal(k8s_node_fits(&ni, &mig2, NULL), K8S_FIT_RESOURCES); /* only one there */
    assert_int_equal(k8s_node_fits(&ni, &cpu, &used), K8S_FITS);          /* asks nothing counted */
    k8s_resources_add(&used, GPU, 5);                                     /* overcommitted */
    assert_int_equal(k8s_node_fits(&ni, &two, &used), K8S_FIT_RESOURCES);
    assert_string_equal(k8s_fit_name(K8S_FIT_RESOURCES), "resources");
    k8s_pod_template_dispose(&two);
    k8s_pod_template_dispose(&mig2);
    k8s_pod_template_dispose(&cpu);
    k8s_node_info_dispose(&ni);
}

static void test_resource_sets(void **state)
{
    struct k8s_resources rs = {0};
    char name[32];
    for (int i = 0; i < K8S_MAX_RESOURCES; i++) {
        snprintf(name, sizeof name, "nvidia.com/r%d", i);
        assert_int_equal(k8s_resources_add(&rs, name, 1), 0);
    }
    assert_int_equal(k8s_resources_add(&rs, "nvidia.com/one-more", 1), -1);
    assert_true(rs.truncated);
    assert_int_equal(k8s_resources_add(&rs, "nvidia.com/r0", UINT64_MAX), 0); /* saturates */
    assert_true(k8s_resources_get(&rs, "nvidia.com/r0") == UINT64_MAX);
    assert_true(k8s_resources_total(&rs) == UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_decoding),     cmocka_unit_test(test_pod_node_and_requests),
        cmocka_unit_test(test_template_decoding), cmocka_unit_test(test_taints_against_tolerations),
        cmocka_unit_test(test_cordoned_node),     cmocka_unit_test(test_node_selector_and_affinity),
        cmocka_unit_test(test_resources),         cmocka_unit_test(test_resource_sets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Kubernetes pieces: Deployment decoding with annotations (thaw's and
 * Knative's), bad values, durations, kubeconfig parsing, base64, backoff. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "thaw/k8s/auth.h"
#include "thaw/k8s/client.h"
#include "thaw/k8s/execcred.h"
#include "thaw/k8s/informer.h"
#include "thaw/k8s/lease.h"
#include "thaw/k8s/model_spec.h"
#include "thaw/k8s/objects.h"
#include "thaw/k8s/peers.h"

static const char *DEPLOYMENT =
    "{\"apiVersion\":\"apps/v1\",\"kind\":\"Deployment\","
    "\"metadata\":{\"name\":\"llama-3-8b\",\"namespace\":\"models\",\"resourceVersion\":\"4711\","
    "\"uid\":\"u\",\"generation\":3,\"labels\":{\"thaw.dev/model\":\"llama\"},"
    "\"annotations\":ANNS},"
    "\"spec\":{SPECREPLICAS\"selector\":{\"matchLabels\":{\"app\":\"llama\"}},"
    "\"template\":{\"metadata\":{\"labels\":{\"app\":\"llama\",\"thaw.dev/model\":\"llama\"}},"
    "\"spec\":{\"priorityClassName\":\"thaw-batch\",\"containers\":[{\"name\":\"vllm\","
    "\"image\":\"vllm/vllm-openai\",\"ports\":[{\"containerPort\":8080}],"
    "\"readinessProbe\":{\"httpGet\":{\"path\":\"/v1/models\",\"port\":8080}},"
    "\"resources\":{\"requests\":{\"nvidia.com/gpu\":\"2\"},\"limits\":{\"nvidia.com/gpu\":\"2\"}}},"
    "{\"name\":\"sidecar\",\"image\":\"x\"}]}}},"
    "\"status\":{\"replicas\":1,\"readyReplicas\":1}}";

static struct k8s_model_spec defaults(void)
{
    struct k8s_model_spec d = {0};
    d.max_concurrency = 8;
    d.priority = TIER_STANDARD;
    d.max_scale = 1000;
    d.idle_timeout_ms = 300000;
    d.startup_timeout_ms = 600000;
    d.port = 8000;
    strcpy(d.health_path, "/health");
    return d;
}

static int parse(const char *anns, const char *replicas, struct k8s_model_spec *out)
{
    char text[4096];
    const char *a = strstr(DEPLOYMENT, "ANNS");
    const char *r = strstr(DEPLOYMENT, "SPECREPLICAS");
    snprintf(text, sizeof text, "%.*s%s%.*s%s%s", (int)(a - DEPLOYMENT), DEPLOYMENT, anns,
             (int)(r - a - 4), a + 4, replicas, r + 12);
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    struct k8s_model_spec d = defaults();
    int rc = k8s_model_spec_parse(obj, &d, out);
    cJSON_Delete(obj);
    return rc;
}

static void test_deployment_defaults_from_the_pod_template(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{}", "\"replicas\":2,", &s), 0);
    assert_string_equal(s.name, "llama"); /* the label's value */
    assert_string_equal(s.deployment, "llama-3-8b");
    assert_string_equal(s.namespace_, "models");
    assert_string_equal(s.service, "llama-3-8b");
    assert_int_equal(s.port, 8080);
    assert_string_equal(s.health_path, "/v1/models");
    assert_int_equal(s.gpu_slices, 2);
    assert_int_equal(s.priority, TIER_BATCH); /* from priorityClassName thaw-batch */
    assert_int_equal(s.replicas, 2);
    assert_int_equal(s.ready_replicas, 1);
    assert_string_equal(s.resource_version, "4711");
    assert_string_equal(s.errors, "");
    /* A missing spec.replicas means 0. */
    assert_int_equal(parse("{}", "", &s), 0);
    assert_int_equal(s.replicas, 0);
}

static void test_sleep_mode_annotations(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{}", "", &s), 0);
    assert_int_equal(s.sleep_level, 0); /* off unless asked */
    assert_int_equal(parse("{\"thaw.dev/sleep-mode\":\"true\",\"thaw.dev/idle-before-sleep\":"
                           "\"90s\",\"thaw.dev/sleep-timeout\":\"10s\"}", "", &s), 0);
    assert_int_equal(s.sleep_level, 1);
    assert_int_equal(s.idle_before_sleep_ms, 90000);
    assert_int_equal(s.sleep_timeout_ms, 10000);
    assert_string_equal(s.errors, "");
    assert_int_equal(parse("{\"thaw.dev/sleep-mode\":\"2\"}", "", &s), 0);
    assert_int_equal(s.sleep_level, 2);
    assert_int_equal(parse("{\"thaw.dev/sleep-mode\":\"deep\",\"thaw.dev/sleep-timeout\":"
                           "\"1h\"}", "", &s), 0);
    assert_int_equal(s.sleep_level, 0);
    assert_non_null(strstr(s.errors, "thaw.dev/sleep-mode"));
    assert_non_null(strstr(s.errors, "thaw.dev/sleep-timeout"));
    assert_int_equal(parse("{\"thaw.dev/gpu-memory\":\"14Gi\"}", "", &s), 0);
    assert_int_equal(s.gpu_memory_bytes, 14ull << 30);
    assert_int_equal(parse("{\"thaw.dev/gpu-memory\":\"lots\"}", "", &s), 0);
    assert_int_equal(s.gpu_memory_bytes, 0);
    assert_non_null(strstr(s.errors, "thaw.dev/gpu-memory"));
}

/* A revision: its name, share (thaw's or KServe's), the rollout's settings
 * and the state thaw writes; bad values are reported and not used. */
static void test_revision_annotations(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{}", "", &s), 0);
    assert_string_equal(s.revision, "");
    assert_false(s.traffic_percent_set);
    assert_int_equal(s.rollout_stage, -1);
    assert_int_equal(
        parse("{\"thaw.dev/revision\":\"v2\",\"thaw.dev/traffic-percent\":\"10\","
              "\"thaw.dev/rollout\":\"true\",\"thaw.dev/rollout-step-percent\":\"25\","
              "\"thaw.dev/rollout-step-interval\":\"300ms\","
              "\"thaw.dev/rollout-min-requests\":\"7\","
              "\"thaw.dev/rollout-max-error-rate-increase-percent\":\"2\","
              "\"thaw.dev/rollout-max-ttfb-p99-ratio-percent\":\"200\","
              "\"thaw.dev/rollout-ttfb-p99-tolerance\":\"20ms\","
              "\"thaw.dev/rollout-stage\":\"progressing\","
              "\"thaw.dev/rollout-step-started-at\":\"2026-01-02T03:04:05.678Z\","
              "\"thaw.dev/sticky-header\":\"X-User\","
              "\"thaw.dev/fallback-to-warm-revision\":\"true\"}",
              "", &s),
        0);
    assert_string_equal(s.errors, "");
    assert_string_equal(s.revision, "v2");
    assert_true(s.traffic_percent_set);
    assert_false(s.traffic_from_kserve);
    assert_int_equal(s.traffic_percent, 10);
    assert_true(s.rollout);
    assert_int_equal(s.rollout_step_percent, 25);
    assert_int_equal(s.rollout_step_interval_ms, 300);
    assert_int_equal(s.rollout_min_requests, 7);
    assert_int_equal(s.rollout_max_error_rate_increase_pct, 2);
    assert_int_equal(s.rollout_max_ttfb_p99_ratio_pct, 200);
    assert_int_equal(s.rollout_ttfb_p99_tolerance_ms, 20);
    assert_int_equal(s.rollout_stage, 0);
    assert_true(s.rollout_step_started > 1700000000000LL);
    assert_string_equal(s.sticky_header, "x-user");
    assert_true(s.fallback_to_warm_revision);
    /* KServe's canaryTrafficPercent is read as the share when thaw's is absent. */
    assert_int_equal(parse("{\"thaw.dev/revision\":\"v2\","
                           "\"serving.kserve.io/canaryTrafficPercent\":\"30\"}",
                           "", &s),
                     0);
    assert_true(s.traffic_percent_set && s.traffic_from_kserve);
    assert_int_equal(s.traffic_percent, 30);
    assert_int_equal(parse("{\"thaw.dev/revision\":\"v/2\",\"thaw.dev/traffic-percent\":\"120\","
                           "\"thaw.dev/rollout\":\"yes\",\"thaw.dev/rollout-stage\":\"done\"}",
                           "", &s),
                     0);
    assert_string_equal(s.revision, "");
    assert_false(s.traffic_percent_set);
    assert_false(s.rollout);
    assert_int_equal(s.rollout_stage, -1);
    assert_non_null(strstr(s.errors, "thaw.dev/revision: \"v/2\" is not a revision name"));
    assert_non_null(strstr(s.errors, "thaw.dev/traffic-percent: \"120\" is out of range 0..100"));
    assert_non_null(strstr(s.errors, "thaw.dev/rollout: \"yes\" is not true or false"));
    assert_non_null(strstr(s.errors, "thaw.dev/rollout-stage: \"done\""));
}

static void test_thaw_annotations(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(
        parse("{\"thaw.dev/priority\":\"critical\",\"thaw.dev/max-concurrency\":\"32\","
              "\"thaw.dev/min-scale\":\"1\",\"thaw.dev/max-scale\":\"4\","
              "\"thaw.dev/idle-timeout\":\"10m\",\"thaw.dev/startup-timeout\":\"1h30m\","
              "\"thaw.dev/hosts\":\"a.example,b.example\",\"thaw.dev/aliases\":\"x/y\","
              "\"thaw.dev/service\":\"llama-private\",\"thaw.dev/port\":\"9000\","
              "\"thaw.dev/health-path\":\"/healthz\",\"thaw.dev/target\":\"10\","
              "\"thaw.dev/window\":\"60s\"}",
              "", &s),
        0);
    assert_int_equal(s.priority, TIER_CRITICAL);
    assert_int_equal(s.max_concurrency, 32);
    assert_int_equal(s.min_scale, 1);
    assert_int_equal(s.max_scale, 4);
    assert_int_equal(s.idle_timeout_ms, 600000);
    assert_int_equal(s.startup_timeout_ms, 5400000);
    assert_string_equal(s.hosts, "a.example,b.example");
    assert_string_equal(s.aliases, "x/y");
    assert_string_equal(s.service, "llama-private");
    assert_int_equal(s.port, 9000);
    assert_string_equal(s.health_path, "/healthz");
    assert_int_equal(s.target, 10);
    assert_int_equal(s.window_ms, 60000);
    assert_string_equal(s.errors, "");
}

/* An alias no request could name (over 256 bytes) is said, in the Event. */
static void test_an_alias_too_long_to_name_is_said(void **state)
{
    struct k8s_model_spec s;
    char anns[600];
    char alias[300];
    memset(alias, 'x', 257);
    alias[257] = '\0';
    snprintf(anns, sizeof anns, "{\"thaw.dev/aliases\":\"ok, %s\"}", alias);
    assert_int_equal(parse(anns, "", &s), 0);
    assert_non_null(strstr(s.errors, "thaw.dev/aliases: \"ok, xxx"));
    assert_non_null(strstr(s.errors, "longer than 256 bytes"));
    alias[256] = '\0';
    snprintf(anns, sizeof anns, "{\"thaw.dev/aliases\":\"ok, %s\"}", alias);
    assert_int_equal(parse(anns, "", &s), 0);
    assert_string_equal(s.errors, "");
}

static void test_knative_aliases_and_precedence(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{\"autoscaling.knative.dev/min-scale\":\"2\","
                           "\"autoscaling.knative.dev/max-scale\":\"5\","
                           "\"autoscaling.knative.dev/target\":\"7\","
                           "\"autoscaling.knative.dev/window\":\"2m\","
                           "\"autoscaling.knative.dev/scale-to-zero-pod-retention-period\":\"90s\","
                           "\"thaw.dev/max-scale\":\"3\"}",
                           "", &s),
                     0);
    assert_int_equal(s.min_scale, 2);
    assert_int_equal(s.max_scale, 3); /* thaw's own annotation wins */
    assert_int_equal(s.target, 7);
    assert_int_equal(s.window_ms, 120000);
    assert_int_equal(s.idle_timeout_ms, 90000);
}

static void parse_custom(const char *label, const char *anns, const char *tpl_anns,
                         struct k8s_model_spec *out);

/* Knative's pre-1.0 camelCase keys and its decimal numbers, as migrated
 * InferenceServices and Knative's own examples write them. */
static void test_knative_camel_case_keys_and_decimals(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{\"autoscaling.knative.dev/minScale\":\"1\","
                           "\"autoscaling.knative.dev/maxScale\":\"4\","
                           "\"autoscaling.knative.dev/initialScale\":\"2\","
                           "\"autoscaling.knative.dev/panicWindowPercentage\":\"20.0\","
                           "\"autoscaling.knative.dev/panicThresholdPercentage\":\"150.0\","
                           "\"autoscaling.knative.dev/targetUtilizationPercentage\":\"70.5\","
                           "\"autoscaling.knative.dev/target\":\"0.5\"}",
                           "", &s),
                     0);
    assert_string_equal(s.errors, "");
    assert_int_equal(s.min_scale, 1);
    assert_int_equal(s.max_scale, 4);
    assert_int_equal(s.initial_scale, 2);
    assert_int_equal(s.panic_window_pct, 20);
    assert_int_equal(s.panic_threshold_pct, 150);
    assert_int_equal(s.target_utilization_pct, 71); /* rounded, half up */
    assert_int_equal(s.target, 1);
    /* A decimal below 1 is 1, not 0 (which no key takes). */
    assert_int_equal(parse("{\"autoscaling.knative.dev/target\":\"0.3\"}", "", &s), 0);
    assert_string_equal(s.errors, "");
    assert_int_equal(s.target, 1);
    /* The dashed spelling wins over the camelCase one, as in Knative. */
    assert_int_equal(parse("{\"autoscaling.knative.dev/minScale\":\"1\","
                           "\"autoscaling.knative.dev/min-scale\":\"3\"}",
                           "", &s),
                     0);
    assert_int_equal(s.min_scale, 3);
    /* The Deployment's spelling wins over the pod template's, whichever. */
    parse_custom("chat", "{\"autoscaling.knative.dev/minScale\":\"2\"}",
                 "{\"autoscaling.knative.dev/min-scale\":\"5\"}", &s);
    assert_int_equal(s.min_scale, 2);
    /* thaw's own keys stay whole numbers; a bad camelCase value is named. */
    parse("{\"thaw.dev/max-scale\":\"4.0\",\"autoscaling.knative.dev/maxScale\":\"x\"}", "",
          &s);
    assert_non_null(strstr(s.errors, "thaw.dev/max-scale: \"4.0\" is not a whole number"));
    parse("{\"autoscaling.knative.dev/maxScale\":\"1.\"}", "", &s);
    assert_non_null(strstr(s.errors, "autoscaling.knative.dev/maxScale: \"1.\" is not a whole"));
}

static void test_bad_values_keep_defaults_and_say_why(void **state)
{
    struct k8s_model_spec s;
    assert_int_equal(parse("{\"thaw.dev/max-concurrency\":\"lots\",\"thaw.dev/priority\":\"vip\","
                           "\"thaw.dev/idle-timeout\":\"soon\",\"thaw.dev/port\":\"70000\","
                           "\"thaw.dev/health-path\":\"health\","
                           "\"thaw.dev/min-scale\":\"9\",\"thaw.dev/max-scale\":\"2\"}",
                           "", &s),
                     0);
    assert_int_equal(s.max_concurrency, 8);
    assert_int_equal(s.priority, TIER_BATCH); /* priorityClassName still applies */
    assert_int_equal(s.idle_timeout_ms, 30000); /* a batch model's default */
    assert_int_equal(s.port, 8080);
    assert_string_equal(s.health_path, "/v1/models");
    assert_int_equal(s.min_scale, 0);
    assert_non_null(strstr(s.errors, "thaw.dev/max-concurrency: \"lots\" is not a whole number"));
    assert_non_null(strstr(s.errors, "thaw.dev/priority: \"vip\""));
    assert_non_null(strstr(s.errors, "thaw.dev/idle-timeout: \"soon\" is not a duration"));
    assert_non_null(strstr(s.errors, "thaw.dev/port: \"70000\" is out of range"));
    assert_non_null(strstr(s.errors, "thaw.dev/health-path"));
    assert_non_null(strstr(s.errors, "above max-scale"));
    /* A path that would break the request line it goes into. */
    assert_int_equal(parse("{\"thaw.dev/health-path\":\"/health\\r\\nX: 1\"}", "", &s), 0);
    assert_string_equal(s.health_path, "/v1/models");
    assert_non_null(strstr(s.errors, "holds a space or control character"));
}

/* A Deployment with the model label value, Deployment annotations and pod
 * template annotations given as JSON object texts. */
static void parse_custom(const char *label, const char *anns, const char *tpl_anns,
                         struct k8s_model_spec *out)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"metadata\":{\"name\":\"chat\",\"namespace\":\"team-a\",\"generation\":1,"
             "\"labels\":{\"thaw.dev/model\":\"%s\"},\"annotations\":%s},"
             "\"spec\":{\"template\":{\"metadata\":{\"annotations\":%s},"
             "\"spec\":{\"containers\":[{\"name\":\"s\"}]}}}}",
             label, anns, tpl_anns);
    cJSON *obj = cJSON_Parse(text);
    assert_non_null(obj);
    struct k8s_model_spec d = defaults();
    assert_int_equal(k8s_model_spec_parse(obj, &d, out), 0);
    cJSON_Delete(obj);
}

/* Every per-model setting a config model has, as an annotation. */
static void test_every_setting_as_an_annotation(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat",
                 "{\"thaw.dev/max-queue\":\"7\",\"thaw.dev/queue-timeout\":\"90s\","
                 "\"thaw.dev/connect-timeout\":\"2s\",\"thaw.dev/first-byte-timeout\":\"15m\","
                 "\"thaw.dev/upstream-idle-timeout\":\"1h\","
                 "\"thaw.dev/loading-heartbeat\":\"250ms\",\"thaw.dev/startup-timeout\":\"20m\"}",
                 "{}", &s);
    assert_string_equal(s.errors, "");
    assert_int_equal(s.max_queue, 7);
    assert_int_equal(s.queue_timeout_ms, 90000);
    assert_true(s.queue_timeout_set);
    assert_int_equal(s.connect_timeout_ms, 2000);
    assert_int_equal(s.first_byte_timeout_ms, 900000);
    assert_int_equal(s.upstream_idle_timeout_ms, 3600000);
    assert_int_equal(s.loading_heartbeat_ms, 250);
    assert_int_equal(s.startup_timeout_ms, 1200000);
    assert_int_equal(s.generation, 1);
    assert_int_equal(s.prewarm, PREWARM_INHERIT);
    parse_custom("chat", "{}", "{\"thaw.dev/prewarm\":\"shadow\"}", &s);
    assert_string_equal(s.errors, "");
    assert_int_equal(s.prewarm, PREWARM_SHADOW);
    parse_custom("chat", "{\"thaw.dev/prewarm\":\"yes\"}", "{}", &s);
    assert_non_null(strstr(s.errors, "thaw.dev/prewarm: \"yes\" is not off, on or shadow"));
    assert_int_equal(s.prewarm, PREWARM_INHERIT);
}

/* Without a queue timeout, a held request waits out a whole start. */
static void test_queue_timeout_covers_the_startup_timeout(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat", "{\"thaw.dev/startup-timeout\":\"15m\"}", "{}", &s);
    assert_false(s.queue_timeout_set);
    assert_true(s.queue_timeout_ms > s.startup_timeout_ms);
    assert_int_equal(s.queue_timeout_ms, 960000);
    parse_custom("chat", "{}", "{}", &s); /* the defaults' 10 minutes */
    assert_int_equal(s.queue_timeout_ms, 660000);
    assert_int_equal(k8s_default_queue_timeout_ms(1000, TIER_STANDARD), 300000); /* never below 5 minutes */
    assert_int_equal(k8s_default_queue_timeout_ms(1000, TIER_BATCH), 3600000); /* batch: an hour */
    /* Shorter, when asked. */
    parse_custom("chat", "{\"thaw.dev/queue-timeout\":\"30s\"}", "{}", &s);
    assert_int_equal(s.queue_timeout_ms, 30000);
}

/* A batch model waits an hour for capacity and goes to zero 30 s after its
 * last request, unless its annotations say otherwise. */
static void test_batch_model_defaults(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat", "{\"thaw.dev/priority\":\"batch\"}", "{}", &s);
    assert_int_equal(s.queue_timeout_ms, 3600000);
    assert_int_equal(s.idle_timeout_ms, 30000);
    parse_custom("chat", "{\"thaw.dev/priority\":\"batch\",\"thaw.dev/idle-timeout\":\"10m\"}",
                 "{}", &s);
    assert_int_equal(s.idle_timeout_ms, 600000);
    parse_custom("chat", "{\"thaw.dev/priority\":\"critical\"}", "{}", &s);
    assert_int_equal(s.queue_timeout_ms, 660000);
    assert_int_equal(s.idle_timeout_ms, 300000);
}

static void test_marker_label_names_the_model_after_its_deployment(void **state)
{
    struct k8s_model_spec s;
    parse_custom("true", "{}", "{}", &s);
    assert_string_equal(s.name, "chat");
    assert_string_equal(s.label, "true");
    parse_custom("", "{}", "{}", &s);
    assert_string_equal(s.name, "chat");
    parse_custom("llama", "{}", "{}", &s);
    assert_string_equal(s.name, "llama");
    assert_true(k8s_model_label_is_marker("true") && k8s_model_label_is_marker(""));
    assert_false(k8s_model_label_is_marker("True") || k8s_model_label_is_marker("llama"));
}

static void test_knative_annotations_on_the_pod_template(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat",
                 "{\"autoscaling.knative.dev/max-scale\":\"3\"}",
                 "{\"autoscaling.knative.dev/max-scale\":\"9\","
                 "\"autoscaling.knative.dev/scale-down-delay\":\"15m\","
                 "\"autoscaling.knative.dev/initial-scale\":\"2\","
                 "\"autoscaling.knative.dev/activation-scale\":\"3\","
                 "\"autoscaling.knative.dev/target-utilization-percentage\":\"50\","
                 "\"autoscaling.knative.dev/panic-window-percentage\":\"20\","
                 "\"autoscaling.knative.dev/panic-threshold-percentage\":\"300\","
                 "\"autoscaling.knative.dev/metric\":\"concurrency\","
                 "\"autoscaling.knative.dev/class\":\"kpa.autoscaling.knative.dev\"}",
                 &s);
    assert_string_equal(s.errors, "");
    assert_int_equal(s.max_scale, 3); /* the Deployment's wins */
    assert_int_equal(s.scale_down_delay_ms, 900000);
    assert_true(s.scale_down_delay_set);
    assert_int_equal(s.initial_scale, 2);
    assert_true(s.initial_scale_set);
    assert_int_equal(s.activation_scale, 3);
    assert_int_equal(s.target_utilization_pct, 50);
    assert_int_equal(s.panic_window_pct, 20);
    assert_int_equal(s.panic_threshold_pct, 300);
}

static void test_unknown_and_unsupported_annotations_are_reported(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat",
                 "{\"thaw.dev/idle-timout\":\"5m\",\"autoscaling.knative.dev/metric\":\"rps\","
                 "\"autoscaling.knative.dev/minscale\":\"1\",\"other.io/x\":\"y\","
                 "\"autoscaling.knative.dev/class\":\"hpa.autoscaling.knative.dev\","
                 "\"autoscaling.knative.dev/target-burst-capacity\":\"200\","
                 "\"thaw.dev/scale-down-delay\":\"2h\",\"thaw.dev/window\":\"1s\","
                 "\"thaw.dev/last-request-at\":\"2026-01-01T00:00:00.000Z\"}",
                 "{\"thaw.dev/typo\":\"1\",\"sim.thaw.dev/load-ms\":\"5\"}", &s);
    assert_non_null(strstr(s.errors, "thaw.dev/idle-timout: \"5m\" is not an annotation thaw knows"));
    assert_non_null(strstr(s.errors, "autoscaling.knative.dev/metric: \"rps\" is not supported"));
    assert_non_null(strstr(s.errors, "autoscaling.knative.dev/minscale: \"1\" is not a Knative"));
    assert_non_null(strstr(s.errors, "autoscaling.knative.dev/class: \"hpa.autoscaling"));
    assert_non_null(strstr(s.errors, "target-burst-capacity: \"200\" is not supported"));
    assert_non_null(strstr(s.errors, "thaw.dev/scale-down-delay: \"2h\" is out of range"));
    assert_non_null(strstr(s.errors, "thaw.dev/window: \"1s\" is out of range"));
    assert_non_null(strstr(s.errors, "thaw.dev/typo"));
    assert_null(strstr(s.errors, "other.io"));
    assert_null(strstr(s.errors, "load-ms"));
    assert_null(strstr(s.errors, "last-request-at")); /* thaw's own record */
    assert_int_equal(s.scale_down_delay_ms, 0);
    assert_false(s.scale_down_delay_set);
    /* Unprintable bytes in a value are masked before they reach a log. */
    parse_custom("chat", "{\"thaw.dev/port\":\"8\\u001b[31m\"}", "{}", &s);
    assert_non_null(strstr(s.errors, "thaw.dev/port: \"8?[31m\" is not a whole number"));
}

static void test_not_a_deployment(void **state)
{
    cJSON *obj = cJSON_Parse("{\"kind\":\"Status\",\"code\":410}");
    struct k8s_model_spec d = defaults(), s;
    assert_int_equal(k8s_model_spec_parse(obj, &d, &s), -1);
    cJSON_Delete(obj);
}

static void test_durations(void **state)
{
    uint64_t ms;
    const struct {
        const char *in;
        uint64_t ms;
    } ok[] = {{"30", 30000}, {"30s", 30000}, {"5m", 300000}, {"1h", 3600000},
              {"1m30s", 90000}, {"250ms", 250}, {"1.5s", 1500}, {"0s", 0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(k8s_parse_duration_ms(ok[i].in, &ms), 0);
        assert_int_equal(ms, ok[i].ms);
    }
    const char *bad[] = {"", "s", "5x", "-5s", "5 m", "m5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(k8s_parse_duration_ms(bad[i], &ms), -1);
    }
}

/* Numbers from the API server (or a peer) that no integer holds: found by
 * fuzzing, where converting them was undefined behaviour. Counts saturate,
 * negatives read as 0, durations past any sense are refused. */
static void test_out_of_range_numbers(void **state)
{
    uint64_t ms;
    assert_int_equal(k8s_parse_duration_ms("99999999999999999999999h", &ms), -1);
    assert_int_equal(k8s_parse_duration_ms("18446744073709551615", &ms), -1);
    assert_int_equal(k8s_parse_duration_ms("9223372036854775807s", &ms), -1);
    assert_int_equal(k8s_parse_duration_ms("5000000000000h5000000000000h", &ms), -1);
    assert_int_equal(k8s_parse_duration_ms("9000000000000000s", &ms), 0);
    assert_true(ms == 9000000000000000000ull);

    cJSON *dep = cJSON_Parse(
        "{\"metadata\":{\"name\":\"d\"},\"spec\":{\"replicas\":1e300,\"template\":{\"spec\":"
        "{\"containers\":[{\"resources\":{\"requests\":{\"nvidia.com/gpu\":1e112}}},"
        "{\"resources\":{\"limits\":{\"nvidia.com/gpu\":-4}}},"
        "{\"resources\":{\"limits\":{\"nvidia.com/gpu\":3}}}]}}},"
        "\"status\":{\"readyReplicas\":-2}}");
    struct k8s_model_spec d = defaults(), sp;
    assert_int_equal(k8s_model_spec_parse(dep, &d, &sp), 0);
    assert_int_equal(sp.replicas, INT64_MAX);
    assert_int_equal(sp.ready_replicas, 0);
    assert_true(sp.gpu_slices == UINT64_MAX);
    cJSON_Delete(dep);

    cJSON *node = cJSON_Parse("{\"metadata\":{\"name\":\"n\"},\"status\":{\"allocatable\":"
                              "{\"nvidia.com/gpu\":1e30}}}");
    struct k8s_node_info ni;
    assert_int_equal(k8s_node_decode(node, &ni), 0);
    assert_true(ni.gpu_allocatable == UINT64_MAX);
    k8s_node_info_dispose(&ni);
    cJSON_Delete(node);

    struct k8s_lease lease;
    memset(&lease, 0, sizeof lease);
    strcpy(lease.identity, "me");
    lease.duration_ms = 15000;
    cJSON *cur = cJSON_Parse("{\"spec\":{\"holderIdentity\":\"other\",\"renewTime\":\"t\","
                             "\"leaseTransitions\":1e300}}");
    bool mine, expired;
    k8s_lease_observe(&lease, cur, 1000, &mine, &expired);
    assert_true(lease.transitions == UINT64_MAX);
    assert_false(mine);
    assert_false(expired);
    cJSON_Delete(cur);

    static const char report[] =
        "{\"identity\":\"thaw-1\",\"models\":{\"a/x\":[1e300,5],\"a/y\":[-5,2,1500],"
        "\"a/z\":[3,4,-1],\"a/w\":[0,0,\"7\"]},\"unrouted\":[\"a/p-1\",5,\"\"]}";
    struct strmap demand, idle, unrouted;
    char identity[64];
    strmap_init(&demand);
    strmap_init(&idle);
    strmap_init(&unrouted);
    assert_int_equal(k8s_peer_demand_parse(report, sizeof report - 1, &demand, &idle, &unrouted,
                                           identity, sizeof identity), 0);
    /* The pods it keeps out of routing (names only). */
    assert_non_null(strmap_get(&unrouted, "a/p-1", 5));
    assert_int_equal(unrouted.count, 1);
    assert_string_equal(identity, "thaw-1");
    assert_true((uintptr_t)strmap_get(&demand, "a/x", 3) == UINTPTR_MAX);
    assert_true((uintptr_t)strmap_get(&demand, "a/y", 3) == 2 + 1);
    assert_true((uintptr_t)strmap_get(&demand, "a/z", 3) == 7 + 1);
    /* The third element, when a non-negative number: ms since the last request. */
    assert_true((uintptr_t)strmap_get(&idle, "a/y", 3) == 1500 + 1);
    assert_null(strmap_get(&idle, "a/x", 3));
    assert_null(strmap_get(&idle, "a/z", 3));
    assert_null(strmap_get(&idle, "a/w", 3));
    assert_int_equal(k8s_peer_demand_parse("[]", 2, &demand, &idle, &unrouted, identity,
                                           sizeof identity), -1);
    assert_int_equal(k8s_peer_demand_parse(report, sizeof report - 1, &demand, NULL, NULL,
                                           identity, sizeof identity), 0);
    /* Which models have requests queued there (the second element), for the
     * leader to give that activator a slot. */
    struct strmap queued;
    strmap_init(&queued);
    assert_int_equal(k8s_peer_report_parse(report, sizeof report - 1, &demand, &queued, NULL,
                                           NULL, identity, sizeof identity), 0);
    assert_true((uintptr_t)strmap_get(&queued, "a/x", 3) == 5 + 1);
    assert_true((uintptr_t)strmap_get(&queued, "a/y", 3) == 2 + 1);
    assert_true((uintptr_t)strmap_get(&queued, "a/z", 3) == 4 + 1);
    assert_null(strmap_get(&queued, "a/w", 3));
    assert_int_equal(queued.count, 3);
    strmap_dispose(&queued);
    strmap_dispose(&demand);
    strmap_dispose(&idle);
    strmap_dispose(&unrouted);
}

static void test_watch_event_objects(void **state)
{
    cJSON *ev = cJSON_Parse("{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":"
                            "\"v1\",\"status\":\"Failure\",\"message\":\"too old resource version"
                            "\",\"reason\":\"Expired\",\"code\":410}}");
    assert_string_equal(k8s_get_string(ev, "type"), "ERROR");
    assert_string_equal(k8s_get_string(ev, "object.reason"), "Expired");
    assert_int_equal(k8s_get(ev, "object.code")->valueint, 410);
    assert_null(k8s_get(ev, "object.metadata.name"));
    cJSON_Delete(ev);
    cJSON *pod = cJSON_Parse("{\"metadata\":{\"name\":\"p\",\"namespace\":\"ns\"}}");
    char key[64];
    k8s_object_key(pod, key, sizeof key);
    assert_string_equal(key, "ns/p");
    cJSON_Delete(pod);
    cJSON *node = cJSON_Parse("{\"metadata\":{\"name\":\"gpu-1\"}}");
    k8s_object_key(node, key, sizeof key);
    assert_string_equal(key, "/gpu-1");
    cJSON_Delete(node);
}

static void test_pod_decoding(void **state)
{
    cJSON *pod = cJSON_Parse(
        "{\"kind\":\"Pod\",\"metadata\":{\"name\":\"llama-7d9f-x2\",\"namespace\":\"models\","
        "\"labels\":{\"thaw.dev/model\":\"llama\"}},\"spec\":{\"nodeName\":\"n1\"},"
        "\"status\":{\"phase\":\"Running\",\"podIP\":\"10.1.2.3\",\"conditions\":["
        "{\"type\":\"Ready\",\"status\":\"False\"}]}}");
    struct k8s_pod_info pi;
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_string_equal(pi.name, "llama-7d9f-x2");
    assert_string_equal(pi.model, "llama");
    assert_string_equal(pi.ip, "10.1.2.3");
    assert_true(pi.running);
    assert_false(pi.terminating);
    assert_false(pi.unschedulable);
    cJSON_Delete(pod);
    pod = cJSON_Parse("{\"metadata\":{\"name\":\"p\",\"namespace\":\"m\"},"
                      "\"status\":{\"phase\":\"Pending\",\"conditions\":[{\"type\":"
                      "\"PodScheduled\",\"status\":\"False\",\"reason\":\"Unschedulable\","
                      "\"message\":\"0/3 nodes are available: 3 Insufficient nvidia.com/gpu.\"}]}}");
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_true(pi.unschedulable);
    assert_false(pi.running);
    assert_string_equal(pi.ip, "");
    assert_string_equal(pi.model, "");
    assert_non_null(strstr(pi.unschedulable_message, "Insufficient nvidia.com/gpu"));
    cJSON_Delete(pod);
    pod = cJSON_Parse("{\"metadata\":{\"name\":\"p\",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
                      "\"status\":{\"phase\":\"Running\",\"podIP\":\"127.0.0.19\"}}");
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_true(pi.terminating);
    cJSON_Delete(pod);
}

/* Whether selector (JSON) selects an object with labels (JSON). */
static bool selects(const char *selector, const char *labels)
{
    cJSON *sel = cJSON_Parse(selector);
    cJSON *lab = cJSON_Parse(labels);
    bool r = k8s_selector_matches(sel, lab);
    cJSON_Delete(sel);
    cJSON_Delete(lab);
    return r;
}

static void test_selector_match_labels(void **state)
{
    const char *app = "{\"matchLabels\":{\"app\":\"llama\"}}";
    assert_true(selects(app, "{\"app\":\"llama\"}"));
    /* Other labels do not matter: no thaw.dev/model needed on the pod. */
    assert_true(selects(app, "{\"app\":\"llama\",\"pod-template-hash\":\"7d9f\"}"));
    assert_false(selects(app, "{\"app\":\"mistral\"}"));
    assert_false(selects(app, "{}"));
    assert_false(selects(app, "null"));
    const char *two = "{\"matchLabels\":{\"app\":\"llama\",\"tier\":\"gpu\"}}";
    assert_true(selects(two, "{\"app\":\"llama\",\"tier\":\"gpu\"}"));
    assert_false(selects(two, "{\"app\":\"llama\"}"));
    assert_false(selects(two, "{\"app\":\"llama\",\"tier\":\"cpu\"}"));
    /* A label value is a string; a number is not the same label. */
    assert_false(selects(app, "{\"app\":7}"));
}

static void test_selector_match_expressions(void **state)
{
    const char *in = "{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"In\","
                     "\"values\":[\"llama\",\"llama-canary\"]}]}";
    assert_true(selects(in, "{\"app\":\"llama\"}"));
    assert_true(selects(in, "{\"app\":\"llama-canary\"}"));
    assert_false(selects(in, "{\"app\":\"mistral\"}"));
    assert_false(selects(in, "{}"));
    const char *notin = "{\"matchExpressions\":[{\"key\":\"track\",\"operator\":\"NotIn\","
                        "\"values\":[\"canary\"]}]}";
    assert_true(selects(notin, "{\"track\":\"stable\"}"));
    assert_true(selects(notin, "{}")); /* NotIn holds without the key */
    assert_false(selects(notin, "{\"track\":\"canary\"}"));
    const char *exists = "{\"matchExpressions\":[{\"key\":\"gpu\",\"operator\":\"Exists\"}]}";
    assert_true(selects(exists, "{\"gpu\":\"\"}"));
    assert_false(selects(exists, "{\"cpu\":\"x\"}"));
    const char *absent = "{\"matchExpressions\":[{\"key\":\"debug\",\"operator\":\"DoesNotExist\","
                         "\"values\":[]}]}";
    assert_true(selects(absent, "{\"app\":\"llama\"}"));
    assert_false(selects(absent, "{\"debug\":\"1\"}"));
    /* matchLabels and matchExpressions together: all must hold. */
    const char *both = "{\"matchLabels\":{\"app\":\"llama\"},\"matchExpressions\":["
                       "{\"key\":\"track\",\"operator\":\"In\",\"values\":[\"stable\"]},"
                       "{\"key\":\"debug\",\"operator\":\"DoesNotExist\"}]}";
    assert_true(selects(both, "{\"app\":\"llama\",\"track\":\"stable\"}"));
    assert_false(selects(both, "{\"app\":\"llama\",\"track\":\"stable\",\"debug\":\"y\"}"));
    assert_false(selects(both, "{\"app\":\"mistral\",\"track\":\"stable\"}"));
}

static void test_selector_rollout_selects_both_replicasets(void **state)
{
    /* The Deployment controller adds pod-template-hash to each ReplicaSet's
     * pods, never to the Deployment's selector: old and new pods both match. */
    const char *sel = "{\"matchLabels\":{\"app\":\"llama\"}}";
    assert_true(selects(sel, "{\"app\":\"llama\",\"pod-template-hash\":\"5f8c\"}"));
    assert_true(selects(sel, "{\"app\":\"llama\",\"pod-template-hash\":\"7d9f\"}"));
}

static void test_selector_empty_or_malformed_selects_nothing(void **state)
{
    const char *labels = "{\"app\":\"llama\"}";
    assert_false(selects("null", labels));
    assert_false(selects("{}", labels));
    assert_false(selects("{\"matchLabels\":{}}", labels));
    assert_false(selects("{\"matchLabels\":[]}", labels));
    assert_false(selects("{\"matchLabels\":{\"app\":1}}", labels));
    assert_false(selects("{\"matchExpressions\":{}}", labels));
    assert_false(selects("{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"Like\","
                         "\"values\":[\"llama\"]}]}",
                         labels));
    assert_false(selects("{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"In\"}]}", labels));
    assert_false(selects("{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"In\","
                         "\"values\":[]}]}",
                         labels));
    assert_false(selects("{\"matchExpressions\":[{\"key\":\"app\",\"operator\":\"Exists\","
                         "\"values\":[\"llama\"]}]}",
                         labels));
    assert_false(selects("{\"matchExpressions\":[{\"operator\":\"Exists\"}]}", labels));
    /* A malformed requirement spoils the selector even after one that fails. */
    assert_false(selects("{\"matchLabels\":{\"app\":\"llama\"},\"matchExpressions\":["
                         "{\"key\":\"x\",\"operator\":\"In\",\"values\":[1]}]}",
                         labels));
}

static void test_pod_owner(void **state)
{
    cJSON *pod =
        cJSON_Parse("{\"metadata\":{\"name\":\"llama-7d9f-x2\","
                    "\"creationTimestamp\":\"2026-12-03T06:30:00Z\",\"ownerReferences\":["
                    "{\"kind\":\"Node\",\"name\":\"n1\"},"
                    "{\"kind\":\"ReplicaSet\",\"name\":\"llama-7d9f\",\"controller\":true}]}}");
    struct k8s_pod_info pi;
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_string_equal(pi.owner, "llama-7d9f");
    assert_string_equal(pi.created, "2026-12-03T06:30:00Z");
    cJSON_Delete(pod);
    pod = cJSON_Parse("{\"metadata\":{\"name\":\"bare\"}}");
    assert_int_equal(k8s_pod_decode(pod, &pi), 0);
    assert_string_equal(pi.owner, "");
    assert_string_equal(pi.created, "");
    cJSON_Delete(pod);
}

/* Totals per activator and per pod over pods x concurrency slots. */
static void deal(uint32_t conc, unsigned n, size_t pods, uint32_t *per_activator, uint32_t *per_pod)
{
    for (unsigned r = 0; r < n; r++) {
        per_activator[r] = 0;
    }
    for (size_t i = 0; i < pods; i++) {
        per_pod[i] = 0;
        for (unsigned r = 0; r < n; r++) {
            uint32_t s = k8s_activator_share(conc, n, r, i);
            per_activator[r] += s;
            per_pod[i] += s;
        }
    }
}

static void test_activator_share(void **state)
{
    uint32_t act[8], pod[16];
    /* 8 slots (4 pods x 2) over 3 activators: 3 + 3 + 2, no pod over 2. */
    deal(2, 3, 4, act, pod);
    assert_int_equal(act[0], 3);
    assert_int_equal(act[1], 3);
    assert_int_equal(act[2], 2);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pod[i], 2);
    }
    /* Concurrency below the activator count: some get 0 on a pod, slots on others. */
    deal(1, 2, 3, act, pod);
    assert_int_equal(act[0], 2);
    assert_int_equal(act[1], 1);
    assert_int_equal(k8s_activator_share(1, 2, 0, 0), 1);
    assert_int_equal(k8s_activator_share(1, 2, 1, 0), 0);
    assert_int_equal(k8s_activator_share(1, 2, 1, 1), 1);
    /* One pod, one slot, three activators: only the first holds it. */
    deal(1, 3, 1, act, pod);
    assert_int_equal(act[0], 1);
    assert_int_equal(act[1] + act[2], 0);
    /* Alone: everything. */
    assert_int_equal(k8s_activator_share(5, 1, 0, 3), 5);
    assert_int_equal(k8s_activator_share(5, 0, 0, 3), 5);
    /* Every combination: each pod's slots are all dealt, totals within one. */
    for (uint32_t c = 1; c <= 7; c++) {
        for (unsigned n = 2; n <= 8; n++) {
            for (size_t p = 1; p <= 16; p++) {
                deal(c, n, p, act, pod);
                uint32_t lo = UINT32_MAX, hi = 0;
                for (unsigned r = 0; r < n; r++) {
                    lo = act[r] < lo ? act[r] : lo;
                    hi = act[r] > hi ? act[r] : hi;
                    /* The remainder goes to the first activators. */
                    assert_true(r == 0 || act[r] <= act[r - 1]);
                }
                assert_true(hi - lo <= 1);
                for (size_t i = 0; i < p; i++) {
                    assert_int_equal(pod[i], c);
                }
            }
        }
    }
}

/* The pods a deal needs before activator rank gets a slot on one of them,
 * checked against the deal itself for every small case. */
static void test_pods_to_reach(void **state)
{
    assert_int_equal(k8s_pods_to_reach(1, 0), 1);
    assert_int_equal(k8s_pods_to_reach(1, 1), 2); /* a limit of 1: rank 1 needs a second pod */
    assert_int_equal(k8s_pods_to_reach(2, 1), 1);
    assert_int_equal(k8s_pods_to_reach(2, 3), 2);
    assert_int_equal(k8s_pods_to_reach(0, 3), 4);
    uint32_t act[8], pod[16];
    for (uint32_t c = 1; c <= 7; c++) {
        for (unsigned n = 2; n <= 8; n++) {
            for (unsigned r = 0; r < n; r++) {
                unsigned need = k8s_pods_to_reach(c, r);
                assert_true(need >= 1 && need <= 16);
                deal(c, n, need, act, pod);
                assert_true(act[r] >= 1);
                deal(c, n, need - 1, act, pod);
                assert_int_equal(need > 1 ? act[r] : 0, 0);
            }
        }
    }
}

/* A terminating activator keeps its place in the deal (itself or a peer):
 * requests still reach it while kube-proxy catches up, and it serves what
 * it holds, until it leaves the Service. */
static void test_terminating_activators_keep_their_place(void **state)
{
    struct event_base *base = event_base_new();
    struct k8s_peers p;
    k8s_peers_init(&p, NULL, base, "thaw", "thaw", 9090, "127.0.9.12", 1000, 5000);
#define SLICE_LIST(rv, eps)                                                                  \
    "{\"metadata\":{\"resourceVersion\":\"" rv "\"},\"items\":[{\"metadata\":{\"name\":"    \
    "\"thaw-abc\",\"namespace\":\"thaw\",\"labels\":{\"kubernetes.io/service-name\":"      \
    "\"thaw\"}},\"addressType\":\"IPv4\",\"endpoints\":[" eps "]}]}"
#define ENDPOINT(ip, pod, conditions)                                                        \
    "{\"addresses\":[\"" ip "\"],\"targetRef\":{\"name\":\"" pod "\"},\"conditions\":"     \
    conditions "}"
#define TERMINATING "{\"ready\":false,\"serving\":true,\"terminating\":true}"
    const char *list = SLICE_LIST("3", ENDPOINT("127.0.9.13", "thaw-c", TERMINATING) ","
                                       ENDPOINT("127.0.9.12", "thaw-b", TERMINATING) ","
                                       ENDPOINT("127.0.9.11", "thaw-a", "{\"ready\":true}"));
    assert_int_equal(k8s_informer_apply_list(&p.slices, list, strlen(list)), 0);
    unsigned rank = 9, n = 9;
    assert_true(k8s_peers_place(&p, &rank, &n));
    assert_int_equal(n, 3);
    assert_int_equal(rank, 1);
    /* Nothing heard from the peers: nobody waits anywhere. */
    assert_int_equal(k8s_peers_waiting_span(&p, "m/llama"), 0);
    /* Gone from the Service: the deal is the others'. */
    const char *left = SLICE_LIST("4", ENDPOINT("127.0.9.12", "thaw-b", "{}") ","
                                       ENDPOINT("127.0.9.11", "thaw-a", "{}"));
    assert_int_equal(k8s_informer_apply_list(&p.slices, left, strlen(left)), 0);
    assert_true(k8s_peers_place(&p, &rank, &n));
    assert_int_equal(n, 2);
    assert_int_equal(rank, 1);
#undef SLICE_LIST
#undef ENDPOINT
#undef TERMINATING
    k8s_peers_dispose(&p);
    event_base_free(base);
}

static void test_pods_in_deal(void **state)
{
    const uint64_t startup = 60000;
    /* Placed from creation, ready or not, while it may still be starting:
     * every activator counts it, whenever its own probe saw it ready. */
    assert_true(k8s_pod_in_deal(false, false, false, 0, startup));
    assert_true(k8s_pod_in_deal(false, false, true, 10, startup));
    /* Past its startup time only while Ready: a pod stuck starting gives
     * its place (and the slots dealt after it) back. */
    assert_false(k8s_pod_in_deal(false, false, false, 60000, startup));
    assert_true(k8s_pod_in_deal(false, false, true, 600000, startup));
    /* Terminating, failed or unschedulable: never. */
    assert_false(k8s_pod_in_deal(true, false, true, 10, startup));
    assert_false(k8s_pod_in_deal(false, true, false, 10, startup));
}

static void test_share_settles_before_growing(void **state)
{
    struct k8s_share_hold h = {0};
    /* The first deal is used at once. */
    assert_int_equal(k8s_share_settle(&h, 1, 1000, 500), 1);
    /* Shrinking is immediate. */
    assert_int_equal(k8s_share_settle(&h, 0, 2000, 500), 0);
    /* Growing back waits until the deal has held 500 ms... */
    assert_int_equal(k8s_share_settle(&h, 2, 2100, 500), 0);
    assert_int_equal(k8s_share_settle(&h, 2, 2599, 500), 0);
    assert_int_equal(k8s_share_settle(&h, 2, 2600, 500), 2);
    /* ...and a second change within the wait restarts it from the smallest. */
    assert_int_equal(k8s_share_settle(&h, 1, 3000, 500), 1);
    assert_int_equal(k8s_share_settle(&h, 3, 3200, 500), 1);
    assert_int_equal(k8s_share_settle(&h, 3, 3700, 500), 3);
    /* Worked example: two activators, a limit of 1, pods p0 p1 p2 created
     * together; before, p1 was dealt to rank 1 (index 1). p0 is deleted:
     * p1 moves to index 0 (rank 0), p2 to index 1 (rank 1). Whatever the
     * order the two see the deletion in, within the settle time each uses
     * the smaller share, so p1 and p2 never get 2. */
    struct k8s_share_hold a1 = {0}, a2 = {0}, b1 = {0}, b2 = {0};
    k8s_share_settle(&a1, k8s_activator_share(1, 2, 0, 1), 0, 500);
    k8s_share_settle(&a2, k8s_activator_share(1, 2, 0, 2), 0, 500);
    k8s_share_settle(&b1, k8s_activator_share(1, 2, 1, 1), 0, 500);
    k8s_share_settle(&b2, k8s_activator_share(1, 2, 1, 2), 0, 500);
    /* Rank 0 sees the deletion at 100 ms, rank 1 at 300 ms. */
    uint32_t a1_100 = k8s_share_settle(&a1, k8s_activator_share(1, 2, 0, 0), 100, 500);
    uint32_t a2_100 = k8s_share_settle(&a2, k8s_activator_share(1, 2, 0, 1), 100, 500);
    uint32_t b1_200 = k8s_share_settle(&b1, k8s_activator_share(1, 2, 1, 1), 200, 500);
    uint32_t b2_200 = k8s_share_settle(&b2, k8s_activator_share(1, 2, 1, 2), 200, 500);
    assert_true(a1_100 + b1_200 <= 1 && a2_100 + b2_200 <= 1);
    uint32_t b1_300 = k8s_share_settle(&b1, k8s_activator_share(1, 2, 1, 0), 300, 500);
    uint32_t b2_300 = k8s_share_settle(&b2, k8s_activator_share(1, 2, 1, 1), 300, 500);
    assert_true(a1_100 + b1_300 <= 1 && a2_100 + b2_300 <= 1);
    /* Settled: p1 at rank 0, p2 at rank 1. */
    assert_int_equal(k8s_share_settle(&a1, k8s_activator_share(1, 2, 0, 0), 900, 500), 1);
    assert_int_equal(k8s_share_settle(&a2, k8s_activator_share(1, 2, 0, 1), 900, 500), 0);
    assert_int_equal(k8s_share_settle(&b1, k8s_activator_share(1, 2, 1, 0), 900, 500), 0);
    assert_int_equal(k8s_share_settle(&b2, k8s_activator_share(1, 2, 1, 1), 900, 500), 1);
}

struct seen {
    int n;
    char pods[5][32];
    bool ready[5], term[5];
};

static void collect_ep(void *ud, const struct k8s_slice_endpoint *e)
{
    struct seen *s = ud;
    snprintf(s->pods[s->n], sizeof s->pods[0], "%s@%s", e->pod ? e->pod : "-", e->address);
    s->ready[s->n] = e->ready;
    s->term[s->n] = e->terminating;
    s->n++;
}

static void test_endpointslice_decoding(void **state)
{
    cJSON *slice = cJSON_Parse(
        "{\"apiVersion\":\"discovery.k8s.io/v1\",\"kind\":\"EndpointSlice\","
        "\"metadata\":{\"name\":\"llama-abcde\",\"namespace\":\"models\",\"labels\":{"
        "\"kubernetes.io/service-name\":\"llama\"}},\"addressType\":\"IPv4\","
        "\"ports\":[{\"name\":\"http\",\"port\":8000,\"protocol\":\"TCP\"}],"
        "\"endpoints\":["
        "{\"addresses\":[\"127.0.0.11\"],\"conditions\":{\"ready\":true},"
        "\"targetRef\":{\"kind\":\"Pod\",\"name\":\"a\"}},"
        "{\"addresses\":[\"127.0.0.12\"],\"conditions\":{\"ready\":false,\"serving\":true,"
        "\"terminating\":true},\"targetRef\":{\"kind\":\"Pod\",\"name\":\"b\"}},"
        "{\"addresses\":[\"127.0.0.13\"],\"conditions\":{},\"targetRef\":{\"name\":\"c\"}},"
        "{\"addresses\":[],\"targetRef\":{\"name\":\"d\"}},"
        "{\"addresses\":[\"127.0.0.14\"],\"conditions\":{\"ready\":true}}]}");
    assert_string_equal(k8s_slice_service(slice), "llama");
    struct seen s = {0};
    assert_int_equal(k8s_slice_each(slice, collect_ep, &s), 4);
    assert_string_equal(s.pods[0], "a@127.0.0.11");
    assert_true(s.ready[0] && !s.term[0]);
    assert_true(!s.ready[1] && s.term[1]);
    assert_true(s.ready[2]); /* absent ready condition means ready */
    /* targetRef is optional (a slice written by hand, for activators found
     * by address): the endpoint still counts, with no pod name */
    assert_string_equal(s.pods[3], "-@127.0.0.14");
    assert_true(s.ready[3] && !s.term[3]);
    cJSON_Delete(slice);
}

static void test_node_decoding(void **state)
{
    cJSON *node = cJSON_Parse(
        "{\"kind\":\"Node\",\"metadata\":{\"name\":\"gpu-a\",\"labels\":{"
        "\"nvidia.com/gpu.count\":\"8\",\"nvidia.com/gpu.replicas\":\"4\","
        "\"nvidia.com/gpu.product\":\"NVIDIA-A100-SXM4-80GB-SHARED\","
        "\"nvidia.com/gpu.memory\":\"81920\"}},"
        "\"status\":{\"allocatable\":{\"cpu\":\"96\",\"nvidia.com/gpu\":\"32\"}}}");
    struct k8s_node_info ni;
    assert_int_equal(k8s_node_decode(node, &ni), 0);
    assert_int_equal(ni.gpu_memory, 81920ull << 20); /* MiB per GPU */
    assert_false(ni.gpu_memory_bad);
    assert_string_equal(ni.name, "gpu-a");
    assert_int_equal(ni.gpu_allocatable, 32);
    assert_int_equal(ni.gpu_count, 8);
    assert_int_equal(ni.gpu_replicas, 4);
    assert_string_equal(ni.gpu_product, "NVIDIA-A100-SXM4-80GB-SHARED");
    k8s_node_info_dispose(&ni);
    cJSON_Delete(node);
    node = cJSON_Parse("{\"metadata\":{\"name\":\"cpu-only\"},\"status\":{\"allocatable\":{}}}");
    assert_int_equal(k8s_node_decode(node, &ni), 0);
    assert_int_equal(ni.gpu_allocatable, 0);
    assert_int_equal(ni.gpu_memory, 0);
    k8s_node_info_dispose(&ni);
    cJSON_Delete(node);
    node = cJSON_Parse("{\"metadata\":{\"name\":\"odd\",\"labels\":{"
                       "\"nvidia.com/gpu.memory\":\"80GB\"}}}");
    assert_int_equal(k8s_node_decode(node, &ni), 0);
    assert_true(ni.gpu_memory_bad);
    assert_int_equal(ni.gpu_memory, 0);
    k8s_node_info_dispose(&ni);
    cJSON_Delete(node);
}

static void test_quantities(void **state)
{
    const struct {
        const char *in;
        uint64_t v;
    } ok[] = {{"20Gi", 20ull << 30}, {"24000Mi", 24000ull << 20}, {"16G", 16000000000ull},
              {"1073741824", 1073741824ull}, {"1.5Gi", 3ull << 29}, {"3e9", 3000000000ull},
              {"1Ei", 1ull << 60}, {"2E", 2000000000000000000ull}, {"1k", 1000}, {"0", 0},
              {"0.5", 1}, {"1Ki", 1024}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 12345;
        assert_int_equal(k8s_parse_quantity(ok[i].in, &v), 0);
        assert_true(v == ok[i].v);
    }
    const char *bad[] = {"", "20GB", "twenty", "-1Gi", "100m", "Gi", "1.2.3", "20 Gi",
                         "99999999999999999999", "16Ei", "1e99", "1gi", NULL};
    for (size_t i = 0; bad[i]; i++) {
        uint64_t v = 7;
        assert_int_equal(k8s_parse_quantity(bad[i], &v), -1);
        assert_true(v == 7);
    }
}

static void test_gpu_memory_annotation(void **state)
{
    struct k8s_model_spec s;
    parse_custom("chat", "{}", "{\"thaw.dev/gpu-memory\":\"30Gi\"}", &s);
    assert_string_equal(s.errors, "");
    assert_true(s.gpu_memory_bytes == 30ull << 30); /* the pod template's, like the others */
    parse_custom("chat", "{\"thaw.dev/gpu-memory\":\"24000Mi\"}",
                 "{\"thaw.dev/gpu-memory\":\"1Gi\"}", &s);
    assert_true(s.gpu_memory_bytes == 24000ull << 20); /* the Deployment's wins */
    parse_custom("chat", "{\"thaw.dev/gpu-memory\":\"30 GB\"}", "{}", &s);
    assert_int_equal(s.gpu_memory_bytes, 0);
    assert_non_null(strstr(s.errors, "thaw.dev/gpu-memory: \"30 GB\" is not a quantity of bytes"));
}

static void test_base64(void **state)
{
    struct buf out;
    buf_init(&out);
    assert_int_equal(k8s_base64_decode("aGVsbG8gd29ybGQ=", 16, &out), 0);
    assert_int_equal(out.len, 11);
    assert_memory_equal(out.data, "hello world", 11);
    assert_int_equal(k8s_base64_decode("aGVs\nbG8", 8, &out), 0); /* no padding, a newline */
    assert_int_equal(out.len, 5);
    assert_memory_equal(out.data, "hello", 5);
    assert_int_not_equal(k8s_base64_decode("!!!!", 4, &out), 0);
    buf_dispose(&out);
}

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/thaw-kubeconfig-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_kubeconfig(void **state)
{
    char *path = write_tmp("apiVersion: v1\nkind: Config\ncurrent-context: prod\n"
                           "clusters:\n"
                           "- name: dev\n  cluster: {server: 'https://dev:6443'}\n"
                           "- name: prod\n  cluster:\n    server: https://127.0.0.11:6443/\n"
                           "    certificate-authority-data: aGVsbG8=\n"
                           "users:\n"
                           "- name: admin\n  user:\n    token: abc.def\n"
                           "- name: certuser\n  user:\n    client-certificate: certs/c.pem\n"
                           "    client-key-data: a2V5\n"
                           "contexts:\n"
                           "- name: prod\n  context: {cluster: prod, user: admin, namespace: models}\n"
                           "- name: dev\n  context: {cluster: dev, user: certuser}\n");
    struct k8s_auth a;
    char err[256];
    k8s_auth_init(&a);
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, NULL, err, sizeof err), 0);
    assert_string_equal(a.server, "https://127.0.0.11:6443");
    assert_int_equal(a.ca_pem.len, 5);
    assert_string_equal(a.token, "abc.def");
    assert_string_equal(a.namespace_, "models");
    k8s_auth_dispose(&a);
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, "dev", err, sizeof err), 0);
    assert_string_equal(a.server, "https://dev:6443");
    assert_non_null(strstr(a.cert_file, "/certs/c.pem")); /* relative to the file */
    assert_int_equal(a.key_pem.len, 3);
    assert_null(a.token);
    k8s_auth_dispose(&a);
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, "nope", err, sizeof err), -1);
    assert_non_null(strstr(err, "context \"nope\" not found"));
    unlink(path);
    free(path);
    path = write_tmp("clusters: [\n");
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    unlink(path);
    free(path);
    path = write_tmp("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
                     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n"
                     "users: [{name: u, user: {exec: {command: aws}}}]\n");
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "exec.apiVersion"));
    unlink(path);
    free(path);
    k8s_auth_dispose(&a);
    path = write_tmp("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
                     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n"
                     "users: [{name: u, user: {exec: {apiVersion: "
                     "client.authentication.k8s.io/v1, command: bin/get-token, "
                     "args: [eks, get-token], env: [{name: REGION, value: eu-west-1}]}}}]\n");
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, NULL, err, sizeof err), 0);
    assert_non_null(strstr(a.exec_argv[0], "/bin/get-token")); /* relative to the file */
    assert_string_equal(a.exec_argv[0] + strlen(a.exec_argv[0]) - 14, "/bin/get-token");
    assert_string_equal(a.exec_argv[1], "eks");
    assert_string_equal(a.exec_argv[2], "get-token");
    assert_null(a.exec_argv[3]);
    assert_string_equal(a.exec_env[0], "REGION=eu-west-1");
    assert_null(a.exec_env[1]);
    unlink(path);
    free(path);
    k8s_auth_dispose(&a);
    k8s_auth_init(&a);
    path = write_tmp("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
                     "clusters: [{name: k, cluster: {server: 'https://k'}}]\n"
                     "users: [{name: u, user: {auth-provider: {name: gcp}}}]\n");
    assert_int_equal(k8s_auth_from_kubeconfig(&a, path, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "auth-provider"));
    unlink(path);
    free(path);
    k8s_auth_dispose(&a);
}

static void test_exec_credential(void **state)
{
    const char *v1 = "client.authentication.k8s.io/v1";
    char err[300];
    char *tok = NULL;
    int64_t valid = 0;
    const time_t now = 1796217600; /* 2026-12-02T13:20:00Z */
#define CRED(status) "{\"apiVersion\":\"client.authentication.k8s.io/v1\"," \
                     "\"kind\":\"ExecCredential\",\"status\":" status "}"
    const char *ok = CRED("{\"token\":\"s3cr3t\",\"expirationTimestamp\":"
                          "\"2026-12-02T14:20:00Z\"}");
    assert_int_equal(k8s_execcred_parse(ok, strlen(ok), v1, now, &tok, &valid, err, sizeof err),
                     0);
    assert_string_equal(tok, "s3cr3t");
    assert_int_equal(valid, 3600);
    free(tok);
    /* Offsets and fractions, as RFC 3339 allows. */
    const char *off = CRED("{\"token\":\"t\",\"expirationTimestamp\":"
                           "\"2026-12-02T15:20:00.123+01:00\"}");
    assert_int_equal(k8s_execcred_parse(off, strlen(off), v1, now, &tok, &valid, err, sizeof err),
                     0);
    assert_int_equal(valid, 3600);
    free(tok);
    /* No expiry: valid for good. An expired one: 0 s left. */
    const char *forever = CRED("{\"token\":\"t\"}");
    assert_int_equal(k8s_execcred_parse(forever, strlen(forever), v1, now, &tok, &valid, err,
                                        sizeof err), 0);
    assert_int_equal(valid, -1);
    free(tok);
    const char *old = CRED("{\"token\":\"t\",\"expirationTimestamp\":\"2020-01-01T00:00:00Z\"}");
    assert_int_equal(k8s_execcred_parse(old, strlen(old), v1, now, &tok, &valid, err, sizeof err),
                     0);
    assert_int_equal(valid, 0);
    free(tok);
    struct {
        const char *json, *error;
    } bad[] = {
        {"not json", "not JSON"},
        {"{\"kind\":\"Secret\"}", "not an ExecCredential"},
        {"{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
         "\"status\":{\"token\":\"t\"}}", "asked for client.authentication.k8s.io/v1"},
        {CRED("{\"clientCertificateData\":\"x\"}"), "no status.token"},
        {CRED("{\"token\":\"\"}"), "no status.token"},
        {CRED("{\"token\":\"t\",\"expirationTimestamp\":\"tomorrow\"}"), "not RFC 3339"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tok = NULL;
        assert_int_equal(k8s_execcred_parse(bad[i].json, strlen(bad[i].json), v1, now, &tok,
                                            &valid, err, sizeof err), -1);
        assert_null(tok);
        assert_non_null(strstr(err, bad[i].error));
    }
#undef CRED
}

struct seen_objects {
    char upserted[8][64];
    char removed[8][64];
    size_t n_up, n_rm;
};

static void note_upsert(void *ud, const cJSON *obj)
{
    struct seen_objects *s = ud;
    if (s->n_up < 8) {
        k8s_object_key(obj, s->upserted[s->n_up++], 64);
    }
}

static void note_remove(void *ud, const cJSON *obj)
{
    struct seen_objects *s = ud;
    if (s->n_rm < 8) {
        k8s_object_key(obj, s->removed[s->n_rm++], 64);
    }
}

/* The informer's list and watch handling, fed text directly. */
static void test_informer_without_network(void **state)
{
    static const struct k8s_informer_ops ops = {note_upsert, note_remove, NULL};
    struct seen_objects seen = {0};
    struct event_base *base = event_base_new();
    struct k8s_informer inf;
    k8s_informer_init(&inf, NULL, base, "pods", "/api/v1/pods", NULL, &ops, &seen);
    const char *not_list = "{\"kind\":\"Status\",\"code\":500}";
    assert_int_equal(k8s_informer_apply_list(&inf, not_list, strlen(not_list)), -1);
    assert_false(inf.synced);
    const char *list = "{\"metadata\":{\"resourceVersion\":\"10\"},\"items\":["
                       "{\"metadata\":{\"name\":\"a\",\"namespace\":\"m\"}},"
                       "{\"metadata\":{\"name\":\"b\",\"namespace\":\"m\"}}]}";
    assert_int_equal(k8s_informer_apply_list(&inf, list, strlen(list)), 0);
    assert_true(inf.synced);
    assert_string_equal(inf.rv, "10");
    assert_int_equal(seen.n_up, 2);
    const char *added = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"c\","
                        "\"namespace\":\"m\",\"resourceVersion\":\"11\"}}}";
    assert_int_equal(k8s_informer_apply_event(&inf, added, strlen(added)), 0);
    assert_string_equal(inf.rv, "11");
    assert_string_equal(seen.upserted[2], "m/c");
    assert_int_equal(k8s_informer_apply_event(&inf, "not json", 8), 0);
    /* A relist without b and c: both are reported gone, by key. */
    const char *relist = "{\"metadata\":{\"resourceVersion\":\"20\"},\"items\":["
                         "{\"metadata\":{\"name\":\"a\",\"namespace\":\"m\"}}]}";
    assert_int_equal(k8s_informer_apply_list(&inf, relist, strlen(relist)), 0);
    assert_int_equal(seen.n_rm, 2);
    assert_true((strcmp(seen.removed[0], "m/b") == 0 && strcmp(seen.removed[1], "m/c") == 0) ||
                (strcmp(seen.removed[0], "m/c") == 0 && strcmp(seen.removed[1], "m/b") == 0));
    const char *gone = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410}}";
    assert_int_not_equal(k8s_informer_apply_event(&inf, gone, strlen(gone)), 0);
    assert_true(inf.relist_needed);
    k8s_informer_dispose(&inf);
    event_base_free(base);
}

/* A list in pages (limit and continue): the continue token is kept for the
 * next page, nothing is swept until the last, and what no page had is gone. */
static void test_informer_list_in_pages(void **state)
{
    static const struct k8s_informer_ops ops = {note_upsert, note_remove, NULL};
    struct seen_objects seen = {0};
    struct event_base *base = event_base_new();
    struct k8s_informer inf;
    k8s_informer_init(&inf, NULL, base, "pods", "/api/v1/pods", NULL, &ops, &seen);
    const char *before = "{\"metadata\":{\"resourceVersion\":\"5\"},\"items\":["
                         "{\"metadata\":{\"name\":\"a\",\"namespace\":\"m\"}},"
                         "{\"metadata\":{\"name\":\"x\",\"namespace\":\"m\"}},"
                         "{\"metadata\":{\"name\":\"z\",\"namespace\":\"m\"}}]}";
    assert_int_equal(k8s_informer_apply_list(&inf, before, strlen(before)), 0);
    assert_null(inf.cont);
    const char *page1 = "{\"metadata\":{\"resourceVersion\":\"9\",\"continue\":\"tok1\","
                        "\"remainingItemCount\":1},\"items\":["
                        "{\"metadata\":{\"name\":\"a\",\"namespace\":\"m\"}}]}";
    assert_int_equal(k8s_informer_apply_list(&inf, page1, strlen(page1)), 1);
    assert_string_equal(inf.cont, "tok1");
    assert_int_equal(seen.n_rm, 0); /* x and z may still come */
    assert_int_equal(seen.n_up, 4);
    const char *page2 = "{\"metadata\":{\"resourceVersion\":\"9\"},\"items\":["
                        "{\"metadata\":{\"name\":\"z\",\"namespace\":\"m\"}}]}";
    assert_int_equal(k8s_informer_apply_list(&inf, page2, strlen(page2)), 0);
    assert_null(inf.cont);
    assert_string_equal(inf.rv, "9");
    assert_int_equal(seen.n_rm, 1);
    assert_string_equal(seen.removed[0], "m/x");
    assert_int_equal(inf.list_pages, 3);
    k8s_informer_dispose(&inf);
    event_base_free(base);
}

/* A kubeconfig from memory: relative paths are relative to the name given. */
static void test_kubeconfig_text(void **state)
{
    const char *text = "current-context: c\n"
                       "clusters: [{name: k, cluster: {server: 'https://k:6443/'}}]\n"
                       "users: [{name: u, user: {tokenFile: t/token}}]\n"
                       "contexts: [{name: c, context: {cluster: k, user: u, namespace: ns}}]\n";
    struct k8s_auth a;
    char err[256];
    k8s_auth_init(&a);
    assert_int_equal(k8s_auth_from_kubeconfig_text(&a, text, strlen(text), "/etc/kube/config",
                                                   NULL, err, sizeof err), 0);
    assert_string_equal(a.server, "https://k:6443");
    assert_string_equal(a.token_file, "/etc/kube/t/token");
    assert_string_equal(a.namespace_, "ns");
    k8s_auth_dispose(&a);
    assert_int_equal(k8s_auth_from_kubeconfig_text(&a, "a: [", 4, "mem", NULL, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "kubeconfig mem:"));
    k8s_auth_dispose(&a);
}

static void test_in_cluster(void **state)
{
    char dir[] = "/tmp/thaw-sa-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[256];
    snprintf(p, sizeof p, "%s/namespace", dir);
    FILE *f = fopen(p, "w");
    fputs("thaw-system\n", f);
    fclose(f);
    setenv("KUBERNETES_SERVICE_HOST", "::1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    struct k8s_auth a;
    char err[256];
    k8s_auth_init(&a);
    assert_int_equal(k8s_auth_in_cluster(&a, dir, err, sizeof err), 0);
    assert_string_equal(a.server, "https://[::1]:443");
    assert_string_equal(a.namespace_, "thaw-system");
    assert_non_null(strstr(a.token_file, "/token"));
    assert_non_null(strstr(a.ca_file, "/ca.crt"));
    k8s_auth_dispose(&a);
    unsetenv("KUBERNETES_SERVICE_HOST");
    assert_int_equal(k8s_auth_in_cluster(&a, dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "not in a cluster"));
    unlink(p);
    rmdir(dir);
}

static void test_backoff_is_capped_and_jittered(void **state)
{
    assert_int_equal(k8s_backoff_ms(1, 0.5), 250);
    assert_int_equal(k8s_backoff_ms(2, 0.5), 500);
    assert_int_equal(k8s_backoff_ms(5, 0.5), 4000);
    assert_int_equal(k8s_backoff_ms(30, 0.5), 30000);
    assert_int_equal(k8s_backoff_ms(3, 0.0), 500);  /* -50% */
    assert_int_equal(k8s_backoff_ms(3, 0.99), 1490); /* +49% */
    assert_true(k8s_backoff_ms(100, 0.99) <= 45000);
}

static void test_pulled_event_duration(void **state)
{
    uint64_t ms = 0;
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"nginx:latest\" in 1.234s "
                                            "(1.234s including waiting). Image size: 67219037 "
                                            "bytes.", &ms), 0);
    assert_int_equal(ms, 1234);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"vllm/vllm-openai:v0.6\" "
                                            "in 2m3.5s (2m10s including waiting).", &ms), 0);
    assert_int_equal(ms, 123500);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x\" in 850ms (850ms "
                                            "including waiting)", &ms), 0);
    assert_int_equal(ms, 850);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x\" in 1h0m0s", &ms), 0);
    assert_int_equal(ms, 3600000);
    /* Older kubelets: no "including waiting". */
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x\" in 5.1s", &ms), 0);
    assert_int_equal(ms, 5100);
    assert_int_equal(k8s_pulled_duration_ms("Container image \"x\" already present on machine",
                                            &ms), -1);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x\" in", &ms), -1);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x\" in abc", &ms), -1);
    assert_int_equal(k8s_pulled_duration_ms("Successfully pulled image \"x", &ms), -1);
    assert_int_equal(k8s_pulled_duration_ms(NULL, &ms), -1);
}

static void test_rfc3339_times(void **state)
{
    int64_t ms;
    assert_int_equal(k8s_time_parse_ms("2026-12-02T15:04:05Z", &ms), 0);
    assert_true(ms == 1796223845000LL);
    assert_int_equal(k8s_time_parse_ms("2026-12-02T15:04:05.1234567Z", &ms), 0);
    assert_true(ms == 1796223845123LL);
    assert_int_equal(k8s_time_parse_ms("2026-12-02T17:04:05.5+02:00", &ms), 0);
    assert_true(ms == 1796223845500LL);
    char out[40];
    k8s_time_format_ms(1796223845007LL, out, sizeof out);
    assert_string_equal(out, "2026-12-02T15:04:05.007Z");
    assert_int_equal(k8s_time_parse_ms(out, &ms), 0);
    assert_true(ms == 1796223845007LL);
    const char *bad[] = {"", "yesterday", "2026-12-02T15:04:05", "2026-12-02T15:04:05.Z",
                         "2026-13-02T15:04:05Z", "2026-12-02T15:04:05Zjunk", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_int_equal(k8s_time_parse_ms(bad[i], &ms), -1);
    }
    assert_int_equal(k8s_time_parse_ms(NULL, &ms), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deployment_defaults_from_the_pod_template),
        cmocka_unit_test(test_thaw_annotations),
        cmocka_unit_test(test_sleep_mode_annotations),
        cmocka_unit_test(test_revision_annotations),
        cmocka_unit_test(test_knative_aliases_and_precedence),
        cmocka_unit_test(test_knative_camel_case_keys_and_decimals),
        cmocka_unit_test(test_an_alias_too_long_to_name_is_said),
        cmocka_unit_test(test_bad_values_keep_defaults_and_say_why),
        cmocka_unit_test(test_not_a_deployment),
        cmocka_unit_test(test_every_setting_as_an_annotation),
        cmocka_unit_test(test_queue_timeout_covers_the_startup_timeout),
        cmocka_unit_test(test_batch_model_defaults),
        cmocka_unit_test(test_marker_label_names_the_model_after_its_deployment),
        cmocka_unit_test(test_knative_annotations_on_the_pod_template),
        cmocka_unit_test(test_unknown_and_unsupported_annotations_are_reported),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_out_of_range_numbers),
        cmocka_unit_test(test_watch_event_objects),
        cmocka_unit_test(test_pod_decoding),
        cmocka_unit_test(test_pod_owner),
        cmocka_unit_test(test_selector_match_labels),
        cmocka_unit_test(test_selector_match_expressions),
        cmocka_unit_test(test_selector_rollout_selects_both_replicasets),
        cmocka_unit_test(test_selector_empty_or_malformed_selects_nothing),
        cmocka_unit_test(test_activator_share),
        cmocka_unit_test(test_pods_to_reach),
        cmocka_unit_test(test_terminating_activators_keep_their_place),
        cmocka_unit_test(test_pods_in_deal),
        cmocka_unit_test(test_share_settles_before_growing),
        cmocka_unit_test(test_endpointslice_decoding),
        cmocka_unit_test(test_node_decoding),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_kubeconfig),
        cmocka_unit_test(test_exec_credential),
        cmocka_unit_test(test_informer_without_network),
        cmocka_unit_test(test_informer_list_in_pages),
        cmocka_unit_test(test_kubeconfig_text),
        cmocka_unit_test(test_in_cluster),
        cmocka_unit_test(test_backoff_is_capped_and_jittered),
        cmocka_unit_test(test_rfc3339_times),
        cmocka_unit_test(test_quantities),
        cmocka_unit_test(test_gpu_memory_annotation),
        cmocka_unit_test(test_pulled_event_duration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

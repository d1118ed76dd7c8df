/* Config: defaults, every kind of error with file, line and key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/config.h"

static struct config *parse(const char *text, struct config_error *err)
{
    return config_parse(text, strlen(text), "test.json", err);
}

static void expect_error(const char *text, const char *want)
{
    struct config_error err;
    struct config *cfg = parse(text, &err);
    if (cfg) {
        config_free(cfg);
        fail_msg("expected an error containing \"%s\"", want);
    }
    if (!strstr(err.msg, want)) {
        fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
    }
}

static void expect_tenants_error(const char *text, const char *want)
{
    struct config_tenants ts;
    struct config_error err;
    assert_int_not_equal(config_parse_tenants(text, strlen(text), "doc", &ts, &err), 0);
    config_tenants_dispose(&ts);
    if (!strstr(err.msg, want)) {
        fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
    }
}

/* tenants.source in the file, and the document it names. */
static void test_tenants_source_and_document(void **state)
{
    struct config_error err;
    struct config *cfg = parse("{\"kubernetes\": {}, \"tenants\": {\"required\": true,\n"
                               " \"source\": {\"kind\": \"secret\", \"name\": \"t\"}}}",
                               &err);
    assert_non_null(cfg);
    assert_int_equal(cfg->tenants.source.kind, TENANTS_SOURCE_SECRET);
    assert_null(cfg->tenants.source.namespace_);
    assert_string_equal(cfg->tenants.source.key, "tenants.json");
    config_free(cfg);
    expect_error("{\"tenants\": {\"source\": {\"kind\": \"secret\", \"name\": \"t\"}}}",
                 "test.json:1: tenants.source: needs the kubernetes section");
    expect_error("{\"kubernetes\": {}, \"tenants\": {\"source\": {\"kind\": \"vault\"}}}",
                 "tenants.source.kind: must be \"secret\" or \"configmap\"");
    expect_error("{\"kubernetes\": {}, \"tenants\": {\"source\": {\"kind\": \"secret\"}}}",
                 "\"name\" is required");
    expect_error("{\"kubernetes\": {},\n\"tenants\": {\"header\": \"x-t\",\n"
                 "\"source\": {\"kind\": \"configmap\", \"name\": \"t\"}}}",
                 "test.json:2: tenants.header: comes from the document tenants.source names");
    /* The document: the tenants section's keys, errors with its line and key. */
    const char *doc = "{\"required\": true,\n \"list\": [{\"name\": \"a\", \"tier\": \"batch\"}]}";
    struct config_tenants ts;
    assert_int_equal(config_parse_tenants(doc, strlen(doc), "doc", &ts, &err), 0);
    assert_true(ts.required);
    assert_int_equal(ts.n_list, 1);
    assert_int_equal(ts.list[0].tier, TIER_BATCH);
    assert_int_equal(ts.source.kind, TENANTS_SOURCE_NONE);
    config_tenants_dispose(&ts);
    expect_tenants_error("{\"list\": [\n{\"name\": \"a\",\n \"api_keys\": [\"sk-raw-key\"]}]}",
                         "doc:3: tenants.list[0].api_keys[0]: must be \"sha256:\"");
    expect_tenants_error("{\"required\": true, \"lst\": []}", "doc:1: tenants.lst");
    expect_tenants_error("{\"source\": {}}", "doc:1: tenants.source: only the configuration file");
    expect_tenants_error("[1]", "doc:1: (top level): must be a JSON object");
    /* RFC 8259 as the file is: a bad \u escape cut the name to "team". */
    expect_tenants_error("{\"list\": [{\"name\": \"team\\u12G4-b\"}]}",
                         "doc:1: (syntax): not valid JSON: invalid \\u escape in a string");
    expect_tenants_error("{\"required\": tru", "doc:1: (syntax)");
    /* A raw key in the document never shows in the error. */
    struct config_tenants t2;
    const char *raw = "{\"list\": [{\"name\": \"a\", \"api_keys\": [\"sk-secret-123\"]}]}";
    assert_int_not_equal(config_parse_tenants(raw, strlen(raw), "doc", &t2, &err), 0);
    assert_null(strstr(err.msg, "sk-secret-123"));
    config_tenants_dispose(&t2);
}

static void test_defaults(void **state)
{
    struct config_error err;
    struct config *cfg = parse("{\"models\":[{\"name\":\"m\",\"endpoints\":[\"127.0.0.1:1\"]}]}",
                               &err);
    assert_non_null(cfg);
    assert_int_equal(cfg->limits.max_header_bytes, 65536);
    assert_int_equal(cfg->limits.max_headers, 100);
    assert_int_equal(cfg->limits.max_body_bytes, 16 * 1024 * 1024);
    assert_int_equal(cfg->limits.header_timeout_ms, 10000);
    assert_int_equal(cfg->limits.keepalive_timeout_ms, 60000);
    /* Below uvicorn's (vLLM's) 5 s idle close, so thaw closes a pooled
     * connection before the replica does. */
    assert_true(cfg->upstream.keepalive_timeout_ms < 5000);
    assert_int_equal(cfg->limits.max_queue_per_model, 1000);
    assert_int_equal(cfg->limits.max_queue_total, 10000);
    assert_int_equal(cfg->limits.priority_header, PRIORITY_HEADER_ANY);
    assert_int_equal(cfg->limits.body_total_timeout_ms, 300000);
    assert_false(cfg->limits.trust_forwarded_headers);
    assert_int_equal(cfg->n_models, 1);
    struct config_model *m = &cfg->models[0];
    assert_string_equal(m->namespace_, "default");
    assert_int_equal(m->priority, TIER_STANDARD);
    assert_int_equal(m->max_queue, 1000);
    assert_true(m->first_byte_timeout_ms >= 60000); /* LLM first tokens can take minutes */
    assert_int_equal(m->queue_timeout_ms, 300000);
    config_free(cfg);
}

/* A request held for a process-backed model waits out a whole start unless
 * a queue timeout is set; one that is set is kept, shorter or not. */
static void test_queue_timeout_covers_a_process_models_start(void **state)
{
    struct config_error err;
    struct config *cfg = parse("{\"models\": [{\"name\": \"a\", \"command\": [\"srv\"]},"
                               "{\"name\": \"b\", \"command\": [\"srv\"], "
                               "\"startup_timeout_ms\": 1200000},"
                               "{\"name\": \"c\", \"command\": [\"srv\"], "
                               "\"queue_timeout_ms\": 30000},"
                               "{\"name\": \"d\", \"endpoints\": [\"127.0.0.1:1\"]}]}",
                               &err);
    assert_non_null(cfg);
    assert_int_equal(cfg->models[0].queue_timeout_ms, 660000);  /* 10 minutes + 1 */
    assert_int_equal(cfg->models[1].queue_timeout_ms, 1260000); /* 20 minutes + 1 */
    assert_int_equal(cfg->models[2].queue_timeout_ms, 30000);
    assert_int_equal(cfg->models[3].queue_timeout_ms, 300000); /* nothing to start */
    config_free(cfg);
}

/* A batch model waits an hour for capacity and goes to zero 30 s after its
 * last request unless told otherwise; other tiers keep 5 minutes of each. */
static void test_batch_models_wait_an_hour_and_idle_30s(void **state)
{
    struct config_error err;
    struct config *cfg = parse("{\"models\": [{\"name\": \"a\", \"endpoints\": [\"127.0.0.1:1\"], "
                               "\"priority\": \"batch\"},"
                               "{\"name\": \"b\", \"endpoints\": [\"127.0.0.1:1\"], "
                               "\"priority\": \"batch\", \"queue_timeout_ms\": 60000, "
                               "\"idle_timeout_ms\": 600000},"
                               "{\"name\": \"c\", \"endpoints\": [\"127.0.0.1:1\"], "
                               "\"priority\": \"critical\"}]}",
                               &err);
    assert_non_null(cfg);
    assert_int_equal(cfg->models[0].queue_timeout_ms, 3600000);
    assert_int_equal(cfg->models[0].idle_timeout_ms, 30000);
    assert_int_equal(cfg->models[1].queue_timeout_ms, 60000); /* what is set is kept */
    assert_int_equal(cfg->models[1].idle_timeout_ms, 600000);
    assert_int_equal(cfg->models[2].queue_timeout_ms, 300000);
    assert_int_equal(cfg->models[2].idle_timeout_ms, 300000);
    assert_int_equal(config_default_queue_timeout_ms(TIER_BATCH, 7200000), 7260000);
    config_free(cfg);
}

static void test_full_model(void **state)
{
    struct config_error err;
    const char *text = "{\n"
                       "  \"listen\": \"[::1]:0\",\n"
                       "  \"limits\": {\"max_queue_per_model\": 7, \"body_total_timeout_ms\": 5000, "
                       "\"trust_forwarded_headers\": true},\n"
                       "  \"models\": [{\n"
                       "    \"name\": \"llama\", \"namespace\": \"models\",\n"
                       "    \"hosts\": [\"a.example\"], \"aliases\": [\"x/y\"],\n"
                       "    \"endpoints\": [\"127.0.0.11:8000\", \"[::1]:8000\"],\n"
                       "    \"priority\": \"critical\", \"max_concurrency\": 3\n"
                       "  }]\n"
                       "}\n";
    struct config *cfg = parse(text, &err);
    assert_non_null(cfg);
    assert_string_equal(cfg->listen, "[::1]:0");
    assert_int_equal(cfg->limits.body_total_timeout_ms, 5000);
    assert_true(cfg->limits.trust_forwarded_headers);
    struct config_model *m = &cfg->models[0];
    assert_int_equal(m->priority, TIER_CRITICAL);
    assert_int_equal(m->max_concurrency, 3);
    assert_int_equal(m->max_queue, 7); /* inherits limits.max_queue_per_model */
    assert_int_equal(m->n_endpoints, 2);
    assert_int_equal(m->line, 4);
    config_free(cfg);
}

static void test_errors_name_file_line_and_key(void **state)
{
    expect_error("{\n  \"listen\": \"x\",\n  \"bogus\": 1\n}", "test.json:2: listen:");
    /* The shape is right, the address is not one a listener can take. */
    expect_error("{\n  \"listen\": \"999.0.0.1:0\"\n}", "test.json:2: listen:");
    expect_error("{\n  \"admin_listen\": \"[::g]:0\"\n}", "test.json:2: admin_listen:");
    expect_error("{\n  \"listen\": \"1.2.3:8080\"\n}", "test.json:2: listen:");
    expect_error("{\n  \"listen\": \"127.0.0.1:80\",\n  \"bogus\": 1\n}",
                 "test.json:3: bogus: unknown key");
    expect_error("{\"limits\": {\n\"max_headers\": 0}}",
                 "test.json:2: limits.max_headers: must be between 1 and 1000 (got 0)");
    expect_error("{\"limits\": {\"max_headers\": 1.5}}", "limits.max_headers: must be a whole");
    expect_error("{\"limits\": {\"max_headers\": -1}}",
                 "limits.max_headers: must be a whole number between 1 and ");
    expect_error("{\"limits\": {\"max_headers\": \"10\"}}", "limits.max_headers: must be a number");
    expect_error("{\"limits\": {\"max_heders\": 10}}", "limits.max_heders: unknown key");
    expect_error("{\"autoscaler\": {\n\"prewarm\": \"maybe\"}}",
                 "test.json:2: autoscaler.prewarm: must be \"off\", \"on\" or \"shadow\"");
    expect_error("{\"models\": [\n{\"name\": \"a\",\n \"endpoints\": [\"h:1\"],\n"
                 " \"priority\": \"urgent\"}]}",
                 "test.json:4: models[0].priority: must be one of");
    expect_error("{\"models\": [{\"name\": \"a\"}]}",
                 "models[0]: \"endpoints\" (a list of \"host:port\") or \"command\"");
    expect_error("{\"models\": [{\"endpoints\": [\"h:1\"]}]}", "\"name\" is required");
    expect_error("{\"models\": [{\"name\": \"a\", \"endpoints\": [\"nohost\"]}]}",
                 "models[0].endpoints[0]: \"nohost\" is not valid");
    expect_error("{\"models\": [{\"name\": \"a\", \"endpoints\": [\"h:70000\"]}]}",
                 "models[0].endpoints[0]");
    expect_error("{\"models\": [{\"name\": \"a b\", \"endpoints\": [\"h:1\"]}]}",
                 "models[0].name: may hold only");
    expect_error("{\"models\": [{\"name\": \"a\", \"endpoints\": [\"h:1\"]},\n"
                 "{\"name\": \"a\", \"endpoints\": [\"h:2\"]}]}",
                 "test.json:2: models[1].name: model \"a\" is already defined at line 1");
    expect_error("{\"listen\": \"127.0.0.1:1\",\n\"listen\": \"127.0.0.1:2\"}",
                 "test.json:2: listen: duplicate key");
    expect_error("{\"models\": {}}", "models: must be an array");
    expect_error("{\"log\": {\"level\": \"loud\"}}", "log.level: must be one of");
    expect_error("[]", "(top level): must be a JSON object");
    expect_error("{\"limits\": {\n\"body_total_timeout_ms\": 0}}",
                 "test.json:2: limits.body_total_timeout_ms: must be between 1 and 86400000 (got 0)");
    expect_error("{\"limits\": {\n\"trust_forwarded_headers\": 1}}",
                 "test.json:2: limits.trust_forwarded_headers: must be true or false");
    expect_error("{\"limits\": {\"priority_header\": \"never\"}}",
                 "limits.priority_header: must be \"any\", \"lower_only\" or \"ignore\"");
}

static void test_process_models(void **state)
{
    struct config_error err;
    const char *text = "{\"gpus\": [{\"id\": 1, \"slices\": 4, \"sharing\": \"mps\"}],\n"
                       " \"models\": [{\"name\": \"m\", \"command\": [\"srv\", \"--port\", \"{port}\"],\n"
                       "   \"env\": {\"A\": \"b\"}, \"gpu_slices\": 2, \"max_replicas\": 3}]}";
    struct config *cfg = parse(text, &err);
    assert_non_null(cfg);
    struct config_model *m = &cfg->models[0];
    assert_int_equal(m->n_command, 3);
    assert_string_equal(m->env[0], "A=b");
    assert_string_equal(m->health_path, "/health");
    assert_int_equal(m->max_replicas, 3);
    assert_int_equal(m->min_replicas, 0);
    assert_int_equal(cfg->n_gpus, 1);
    assert_int_equal(cfg->gpus[0].sharing, GPU_MPS);
    config_free(cfg);
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"], \"gpu_slices\": 1}]}",
                 "models[0].gpu_slices: 1 slices do not fit on any declared GPU");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"],\n"
                 "\"min_replicas\": 2, \"max_replicas\": 1}]}",
                 "test.json:2: models[0]: min_replicas (2) is above max_replicas (1)");
    expect_error("{\"gpus\": [{\"id\": 0}, {\"id\": 0}]}", "gpus[1]: GPU id 0 is declared twice");
    expect_error("{\"gpus\": [{\"id\": 0, \"sharing\": \"mig\"}]}", "gpus[0].sharing: must be");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"], \"env\": {\"A\": 1}}]}",
                 "models[0].env.A: must be a string");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"], \"health_path\": \"h\"}]}",
                 "models[0].health_path: must start with '/'");
}

static void test_syntax_error_line(void **state)
{
    expect_error("{\n\"listen\": \"127.0.0.1:1\",\n\"limits\": {,}\n}", "test.json:3: (syntax)");
    /* Text after the object used to be ignored: a second object was lost. */
    expect_error("{\"listen\": \"127.0.0.1:1\"}\n\n{\"bogus\": 1}",
                 "test.json:3: (syntax): unexpected content after the JSON object near byte 27");
    struct config_error err;
    struct config *cfg = parse("{\"listen\": \"127.0.0.1:1\"}\n \t\r\n", &err);
    assert_non_null(cfg); /* trailing whitespace is fine */
    config_free(cfg);
}

static void expect_error_len(const char *text, size_t len, const char *want)
{
    struct config_error err;
    struct config *cfg = config_parse(text, len, "test.json", &err);
    if (cfg) {
        config_free(cfg);
        fail_msg("expected an error containing \"%s\"", want);
    }
    if (!strstr(err.msg, want)) {
        fail_msg("error \"%s\" does not contain \"%s\"", err.msg, want);
    }
}

/* cJSON skips every byte up to the space as whitespace (NUL and control
 * bytes too) and a leading byte order mark; the line finder must do the
 * same (though the file is refused), and must end even when it loses step (found by fuzzing: a NUL
 * made it spin forever on a closing bracket). */
static void test_odd_whitespace_lines(void **state)
{
    static const char hang[] = "[\0{\"a\":1}]";
    expect_error_len(hang, sizeof hang - 1, "test.json:1: ");
    expect_error_len(hang, sizeof hang - 1, "a NUL byte in the file");
    static const char ctl[] = "{\x01\n\"listen\": \"127.0.0.1:1\",\n\x0b\0\"bogus\": 1}";
    expect_error_len(ctl, sizeof ctl - 1, "test.json:3: ");
    /* Control bytes other than RFC 8259's four whitespace are not JSON. */
    static const char ctl2[] = "{\n\"listen\": \"127.0.0.1:1\",\n\x0b\x1f\"bogus\": 1}";
    expect_error_len(ctl2, sizeof ctl2 - 1,
                     "test.json:3: (syntax): not valid JSON: expected a string key at byte 27");
    expect_error("\xEF\xBB\xBF{\n\"bogus\": 1}", "test.json:2: bogus: unknown key");
}

/* Errors found after the keys were read still name the key's line, and
 * the key in full. */
static void test_late_errors_name_line_and_key(void **state)
{
    expect_error("{\"gpus\": [{\"id\": 0, \"slices\": 4}],\n\"models\": [{\"name\": \"m\",\n"
                 "\"command\": [\"x\"],\n\"gpu_slices\": 5}]}",
                 "test.json:4: models[0].gpu_slices: 5 slices do not fit on any declared GPU");
    /* The model's env would override the GPU thaw places a replica on. */
    expect_error("{\"gpus\": [{\"id\": 0, \"slices\": 4}],\n\"models\": [{\"name\": \"m\",\n"
                 "\"command\": [\"x\"], \"gpu_slices\": 1, \"env\": {\"A\": \"b\",\n"
                 "\"CUDA_VISIBLE_DEVICES\": \"1\"}}]}",
                 "test.json:4: models[0].env.CUDA_VISIBLE_DEVICES: is set by thaw from the GPU");
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
                 "\"gpu_slices\": 1}]}",
                 "test.json:2: models[0].gpu_slices: applies only to models with a \"command\"");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"],\n\"mig_profile\": "
                 "\"1g.10gb\"}]}",
                 "test.json:2: models[0].mig_profile: no declared MIG instance");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"], \"env\": {\"A\": \"1\",\n"
                 "\"A\": \"2\"}}]}",
                 "test.json:2: models[0].env.A: duplicate key");
    expect_error("{\"models\": [{\"name\": \"m\",\n\"endpoints\": []}]}",
                 "test.json:2: models[0].endpoints: must list at least one \"host:port\"");
    expect_error("{\"tenants\": {\"list\": [{\n\"name\": \"default\"}]}}",
                 "test.json:2: tenants.list[0].name: \"default\" is the tenant");
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
                 "\"revisions\": [{\"name\": \"a\", \"percent\": 50},\n"
                 "{\"name\": \"a\", \"percent\": 50}]}]}",
                 "test.json:3: models[0].revisions[1].name: revision \"a\" is listed twice");
}

/* The health path goes into a request line as it is. */
static void test_health_path_is_one_token(void **state)
{
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
                 "\"health_path\": \"/health\\r\\nX-Evil: 1\"}]}",
                 "test.json:2: models[0].health_path: must not hold spaces or control characters");
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
                 "\"health_path\": \"/health now\"}]}",
                 "models[0].health_path: must not hold spaces");
}

/* A model's stable window is 0 (the global one) or 6000 to 3600000 ms. */
static void test_zero_or_range(void **state)
{
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
                 "  \"stable_window_ms\": 1}]}",
                 "test.json:2: models[0].stable_window_ms: must be 0 or between 6000 and 3600000 "
                 "(got 1)");
    struct config_error err;
    for (int i = 0; i < 2; i++) {
        struct config *cfg = parse(i ? "{\"models\": [{\"name\": \"m\", \"endpoints\": "
                                       "[\"127.0.0.1:1\"], \"stable_window_ms\": 6000}]}"
                                     : "{\"models\": [{\"name\": \"m\", \"endpoints\": "
                                       "[\"127.0.0.1:1\"], \"stable_window_ms\": 0}]}",
                                   &err);
        if (!cfg) {
            fail_msg("refused: %s", err.msg);
        }
        assert_int_equal(cfg->models[0].stable_window_ms, i ? 6000 : 0);
        config_free(cfg);
    }
}

/* cJSON takes these and reads some of them as something else (a bad \u
 * escape ends the string there: the alias "org"); RFC 8259 does not. */
static void test_rfc8259_only(void **state)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:1\"],\n"
         "  \"aliases\": [\"org\\u12G4name\"]}]}",
         "test.json:2: (syntax): not valid JSON: invalid \\u escape in a string"},
        {"{\"listen\": \"a\tb\"}", "control character in a string"},
        {"{\"limits\": {\"max_connections\": 010}}", "test.json:1: (syntax): not valid JSON"},
        {"{\"limits\": {\"max_connections\": 10.}}", "invalid number"},
        {"{\"listen\": \"127.0.0.1:1\"}\x1a", "unexpected data after the JSON object"},
        {"{\"listen\": \"\xff\"}", "invalid UTF-8 in a string"},
        {"{\"listen\": \"\xc0\xaf\"}", "invalid UTF-8 in a string"},
        {"{\"limits\": {\"max_connections\": NaN}}", "test.json:1: (syntax): not valid JSON"},
        {"{\"listen\": \"\\ud800\"}", "test.json:1: (syntax): not valid JSON"},
        {"{\"listen\": \"\xed\xa0\x80\"}", "invalid UTF-8 in a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        expect_error(bad[i].text, bad[i].want);
    }
    /* Still fine: a byte order mark, UTF-8, an escaped surrogate pair. */
    struct config_error err;
    struct config *cfg = parse("\xEF\xBB\xBF{\"models\": [{\"name\": \"m\", \"endpoints\": "
                               "[\"127.0.0.1:1\"], \"aliases\": [\"caf\xc3\xa9\", \"\\ud83d\\ude00\"]}]}",
                               &err);
    if (!cfg) {
        fail_msg("refused: %s", err.msg);
    }
    config_free(cfg);
}

/* Duplicate keys are found by sorting: an object with many keys used to
 * take quadratic time (200 000 keys: minutes), which is a hang at start-up. */
static void test_many_keys_and_first_duplicate(void **state)
{
    expect_error("{\"log\": {}, \"listen\": \"127.0.0.1:1\",\n\"listen\": \"127.0.0.1:2\",\n"
                 "\"log\": {}}",
                 "test.json:3: log: duplicate key");
    size_t n = 200000, cap = n * 16 + 64, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    len += (size_t)snprintf(text + len, cap - len, "{\"limits\": {");
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(text + len, cap - len, "\"k%zu\": 1,", i);
    }
    len += (size_t)snprintf(text + len, cap - len, "\n\"k%zu\": 2}}", n - 1);
    expect_error_len(text, len, "test.json:2: limits.k199999: duplicate key");
    free(text);
}

/* A GPU object is an object like the others: a key given twice is an
 * error (it was taken silently, the last one winning). */
static void test_gpu_duplicate_key(void **state)
{
    expect_error("{\"gpus\": [\n {\"id\": 0,\n  \"id\": 1}]}",
                 "test.json:3: gpus[0].id: duplicate key");
}

/* Kubernetes defaults come from the key table whether or not the section
 * is present; present turns it on. */
static void test_kubernetes_defaults(void **state)
{
    struct config *cfg = config_new_default();
    assert_non_null(cfg);
    assert_false(cfg->kubernetes.enabled);
    assert_string_equal(cfg->kubernetes.label_selector, "thaw.dev/model");
    assert_string_equal(cfg->kubernetes.lease_name, "thaw-leader");
    assert_null(cfg->kubernetes.lease_namespace);
    assert_int_equal(cfg->kubernetes.default_port, 8000);
    assert_int_equal(cfg->kubernetes.lease_duration_ms, 15000);
    assert_int_equal(cfg->kubernetes.peers_port, 9090);
    config_free(cfg);
}

static void test_missing_file(void **state)
{
    struct config_error err;
    assert_null(config_load("/nonexistent/thaw.json", &err));
    assert_non_null(strstr(err.msg, "/nonexistent/thaw.json:0: (file): cannot open"));
}

static void test_listen_override(void **state)
{
    struct config_error err;
    struct config *cfg = config_new_default();
    assert_int_equal(config_set_listen(cfg, &cfg->listen, "127.0.0.1:0", "--listen", &err), 0);
    assert_string_equal(cfg->listen, "127.0.0.1:0");
    assert_int_not_equal(config_set_listen(cfg, &cfg->listen, "nonsense", "--listen", &err), 0);
    assert_non_null(strstr(err.msg, "--listen: must be"));
    config_free(cfg);
}

/* Text after the object, NULs inside strings, over-long names and
 * endpoints that do not resolve are errors with line and key. */
static void test_strictness(void **state)
{
    expect_error("{}\n xyz", "test.json:2: (syntax): unexpected content after the JSON object");
    expect_error("{} {}", "test.json:1: (syntax): unexpected content");
    struct config_error err;
    struct config *cfg = parse("{}\n\n  \n", &err); /* trailing white space is fine */
    assert_non_null(cfg);
    config_free(cfg);
    expect_error("{\"models\": [\n{\"name\": \"a\\u0000b\", \"endpoints\": [\"127.0.0.1:1\"]}]}",
                 "test.json:2: models[0].name: a string holds a NUL character");
    expect_error("{\n\"log\": {\"level\": \"info\\u0000\"}}", "test.json:2: log.level:");
    /* The key named is the string that holds it, not the first on its line. */
    expect_error("{\"models\": [{\"name\": \"a\", \"command\": [\"x\", \"\\u0000\"]}]}",
                 "test.json:1: models[0].command[1]: a string holds a NUL character");
    expect_error("{\"tenants\": {\"list\": [{\"name\": \"a\", \"api_keys\": [\"k\"]}, "
                 "{\"name\": \"b\", \"api_keys\": [\"x\\u0000\"]}]}}",
                 "test.json:1: tenants.list[1].api_keys[0]: a string holds a NUL");
    /* An escaped backslash before "u0000" is not a NUL. */
    expect_error("{\"models\": [{\"name\": \"a\\\\u0000\", \"endpoints\": [\"127.0.0.1:1\"]}]}",
                 "may hold only letters");
    char text[700];
    char name[300];
    memset(name, 'a', 254);
    name[254] = '\0';
    snprintf(text, sizeof text, "{\"models\": [{\"name\": \"%s\", \"endpoints\": [\"127.0.0.1:1\"]}]}",
             name);
    expect_error(text, "models[0].name: is too long (254 characters; at most 253)");
    name[253] = '\0';
    snprintf(text, sizeof text, "{\"models\": [{\"name\": \"%s\", \"endpoints\": [\"127.0.0.1:1\"]}]}",
             name);
    cfg = parse(text, &err);
    assert_non_null(cfg);
    config_free(cfg);
    /* An alias a request's body could not name: longer than 256 bytes. */
    char alias[300];
    memset(alias, 'x', 257);
    alias[257] = '\0';
    snprintf(text, sizeof text,
             "{\"models\": [{\"name\": \"a\",\n\"aliases\": [\"b\", \"%s\"], "
             "\"endpoints\": [\"127.0.0.1:1\"]}]}",
             alias);
    expect_error(text, "test.json:2: models[0].aliases[1]: is too long (257 bytes; a request "
                       "names at most 256)");
    alias[256] = '\0';
    snprintf(text, sizeof text,
             "{\"models\": [{\"name\": \"a\", \"aliases\": [\"%s\"], "
             "\"endpoints\": [\"127.0.0.1:1\"]}]}",
             alias);
    cfg = parse(text, &err);
    assert_non_null(cfg);
    config_free(cfg);
    expect_error("{\"models\": [\n{\"name\": \"a\",\n \"endpoints\": [\"127.0.0.1:1\",\n"
                 " \"no-such-host.invalid:80\"]}]}",
                 "test.json:4: models[0].endpoints[1]: host \"no-such-host.invalid\" does not "
                 "resolve");
    cfg = parse("{\"models\": [{\"name\": \"a\", \"endpoints\": [\"localhost:1\", \"[::1]:2\"]}]}",
                &err);
    assert_non_null(cfg);
    config_free(cfg);
}

static struct config *parse_ok(const char *text)
{
    struct config_error err;
    struct config *cfg = config_parse(text, strlen(text), "test.json", &err);
    if (!cfg) {
        fprintf(stderr, "%s\n", err.msg);
    }
    assert_non_null(cfg);
    return cfg;
}

/* A model with revisions: each becomes a model "<model>@<revision>" with the
 * model's keys as defaults, its own on top, and tag hosts. */
static void test_revisions(void **state)
{
    (void)state;
    struct config *cfg = parse_ok(
        "{\"models\": [{\"name\": \"m\", \"hosts\": [\"m.example\"], \"max_concurrency\": 4,\n"
        " \"sticky_header\": \"X-User\", \"rollout\": {\"enabled\": true},\n"
        " \"revisions\": [{\"name\": \"v1\", \"percent\": 90, \"command\": [\"a\"]},\n"
        "   {\"name\": \"v2\", \"percent\": 10, \"endpoints\": [\"127.0.0.1:1\"], \"max_concurrency\": 2}]}]}");
    assert_int_equal(cfg->n_models, 3);
    const struct config_model *m = &cfg->models[0], *v1 = &cfg->models[1], *v2 = &cfg->models[2];
    assert_int_equal(m->n_revisions, 2);
    assert_string_equal(m->revisions[1].name, "v2");
    assert_int_equal(m->revisions[1].percent, 10);
    assert_string_equal(m->sticky_header, "x-user");
    assert_true(m->rollout.enabled);
    assert_int_equal(m->rollout.step_percent, 10);
    assert_int_equal(m->rollout.step_interval_ms, 60000);
    assert_string_equal(v1->name, "m@v1");
    assert_string_equal(v1->parent, "m");
    assert_string_equal(v1->revision, "v1");
    assert_int_equal(v1->max_concurrency, 4);
    assert_int_equal(v1->n_command, 1);
    assert_int_equal(v2->max_concurrency, 2);
    assert_int_equal(v2->n_endpoints, 1);
    /* The tags: the model's name with its namespace's forms, then its hosts. */
    assert_int_equal(v2->n_hosts, 5);
    assert_string_equal(v2->hosts[0], "v2-m");
    assert_string_equal(v2->hosts[1], "v2-m.default");
    assert_string_equal(v2->hosts[2], "v2-m.default.svc");
    assert_string_equal(v2->hosts[3], "v2-m.default.svc.cluster.local");
    assert_string_equal(v2->hosts[4], "v2-m.example");
    assert_null(v2->sticky_header);
    assert_false(v2->rollout.enabled);
    config_free(cfg);
}

static void test_revision_errors(void **state)
{
    (void)state;
    expect_error("{\"models\": [{\"name\": \"m\",\n\"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 60, \"command\": [\"x\"]},\n"
                 "{\"name\": \"b\", \"percent\": 30, \"command\": [\"x\"]}]}]}",
                 "test.json:2: models[0].revisions: the revisions' percents add up to 90, not 100");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100}]}]}",
                 "models[0].revisions[0]: \"endpoints\"");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100, \"command\": [\"x\"], \"hosts\": [\"h\"]}]}]}",
                 "models[0].revisions[0].hosts: applies to the model");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 50, \"command\": [\"x\"]},\n"
                 "{\"name\": \"a\", \"percent\": 50, \"command\": [\"x\"]}]}]}",
                 "revision \"a\" is listed twice");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 101, \"command\": [\"x\"]}]}]}",
                 "models[0].revisions[0].percent: must be between 0 and 100");
    expect_error("{\"models\": [{\"name\": \"m\", \"command\": [\"x\"], \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100}]}]}",
                 "in each revision, not in the model");
    expect_error("{\"models\": [{\"name\": \"m\", \"rollout\": {\"enabled\": true}, \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100, \"command\": [\"x\"]}]}]}",
                 "a rollout needs exactly two revisions");
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"h:1\"], \"percent\": 5}]}",
                 "models[0].percent: applies only to an entry of \"revisions\"");
    expect_error("{\"models\": [{\"name\": \"m\", \"endpoints\": [\"h:1\"], \"sticky_tenant\": true}]}",
                 "apply only to a model with \"revisions\"");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100,\n \"endpoints\": [\"nosuchhost.invalid:1\"]}]}]}",
                 "test.json:3: models[0].revisions[0].endpoints[0]: host");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [\n"
                 "{\"name\": \"a\", \"percent\": 100, \"endpoints\": [\"h:1\"], \"gpu_slices\": 1}]}]}",
                 "models[0].revisions[0].gpu_slices: applies only to models with a \"command\"");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": []}]}",
                 "models[0].revisions: must be an array of 1 to 8");
    expect_error("{\"models\": [{\"name\": \"m\", \"revisions\": [{\"name\": \"a@b\", \"percent\": 100}]}]}",
                 "may hold only letters");
    /* A name of letters only, too long for its tag host's first label. */
    char longrev[512];
    snprintf(longrev, sizeof longrev,
             "{\"models\": [{\"name\": \"m\", \"revisions\": [{\"name\": \"%064d\", "
             "\"percent\": 100, \"command\": [\"x\"]}]}]}", 0);
    expect_error(longrev, "models[0].revisions[0].name: is too long (64 characters; at most 63)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_model),
        cmocka_unit_test(test_queue_timeout_covers_a_process_models_start),
        cmocka_unit_test(test_batch_models_wait_an_hour_and_idle_30s),
        cmocka_unit_test(test_errors_name_file_line_and_key),
        cmocka_unit_test(test_tenants_source_and_document),
        cmocka_unit_test(test_process_models),
        cmocka_unit_test(test_syntax_error_line),
        cmocka_unit_test(test_strictness),
        cmocka_unit_test(test_odd_whitespace_lines),
        cmocka_unit_test(test_rfc8259_only),
        cmocka_unit_test(test_zero_or_range),
        cmocka_unit_test(test_health_path_is_one_token),
        cmocka_unit_test(test_late_errors_name_line_and_key),
        cmocka_unit_test(test_many_keys_and_first_duplicate),
        cmocka_unit_test(test_gpu_duplicate_key),
        cmocka_unit_test(test_kubernetes_defaults),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_listen_override),
        cmocka_unit_test(test_revisions),
        cmocka_unit_test(test_revision_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

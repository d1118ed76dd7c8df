/* Tenants: lookup by key hash and by gateway header value, caps per model,
 * the tier ceiling, and a reload that adds, changes and removes tenants. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "thaw/config.h"
#include "thaw/tenant.h"

static struct config *parse(const char *tenants_json)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"models\": [{\"name\": \"m\", \"endpoints\": [\"127.0.0.1:9\"]}], "
             "\"tenants\": %s}",
             tenants_json);
    struct config_error err;
    struct config *cfg = config_parse(text, strlen(text), "t.json", &err);
    if (!cfg) {
        fprintf(stderr, "%s\n", err.msg);
    }
    assert_non_null(cfg);
    return cfg;
}

static void key_hash(const char *key, char *out)
{
    tenant_format_digest(key, strlen(key), out, 80);
}

static struct tenant *by_key(const struct tenants *ts, const char *key)
{
    return tenants_find_key(ts, key, strlen(key));
}

static void test_digest_matches_sha256sum(void **state)
{
    char d[80];
    key_hash("sk-alpha", d);
    /* printf %s sk-alpha | sha256sum */
    assert_string_equal(d,
                        "sha256:2179e632e89277f18aa600491b68ad55121fd6caa045e047fdeb426088a5a5f1");
    unsigned char bytes[TENANT_DIGEST_BYTES];
    assert_int_equal(tenant_parse_digest(d, bytes), 0);
    assert_int_equal(bytes[0], 0x21);
    assert_int_equal(tenant_parse_digest("sha256:21", bytes), -EINVAL);
}

static void test_lookup_by_key_and_header(void **state)
{
    char a[80], a2[80], b[80], json[1024];
    key_hash("sk-alpha", a);
    key_hash("sk-alpha-2", a2);
    key_hash("sk-beta", b);
    snprintf(json, sizeof json,
             "{\"header\": \"x-tenant\", \"list\": ["
             "{\"name\": \"alpha\", \"api_keys\": [\"%s\", \"%s\"], \"tier\": \"standard\"},"
             "{\"name\": \"beta\", \"api_keys\": [\"%s\"]}]}",
             a, a2, b);
    struct config *cfg = parse(json);
    struct tenants ts;
    assert_int_equal(tenants_init(&ts), 0);
    assert_int_equal(tenants_apply(&ts, &cfg->tenants), 0);
    assert_string_equal(ts.header, "x-tenant");
    assert_string_equal(by_key(&ts, "sk-alpha")->name, "alpha");
    assert_string_equal(by_key(&ts, "sk-alpha-2")->name, "alpha");
    assert_string_equal(by_key(&ts, "sk-beta")->name, "beta");
    assert_null(by_key(&ts, "sk-gamma"));
    assert_null(by_key(&ts, ""));
    assert_null(tenants_find_key(&ts, "sk-alpha", 7)); /* a prefix is another key */
    assert_string_equal(tenants_find_name(&ts, "beta", 4)->name, "beta");
    assert_null(tenants_find_name(&ts, "default", 7)); /* not claimable by header */
    assert_null(tenants_find_name(&ts, "gamma", 5));
    assert_int_equal(by_key(&ts, "sk-alpha")->tier, TIER_STANDARD);
    assert_int_equal(by_key(&ts, "sk-beta")->tier, TIER_CRITICAL); /* no ceiling */
    tenants_dispose(&ts);
    config_free(cfg);
}

static void test_tier_ceiling(void **state)
{
    struct tenant t = {.tier = TIER_STANDARD};
    assert_int_equal(tenant_clamp_tier(&t, TIER_CRITICAL), TIER_STANDARD);
    assert_int_equal(tenant_clamp_tier(&t, TIER_STANDARD), TIER_STANDARD);
    assert_int_equal(tenant_clamp_tier(&t, TIER_BATCH), TIER_BATCH); /* lowering is fine */
}

static void test_caps_per_model(void **state)
{
    struct config *cfg = parse("{\"default\": {\"max_queue\": 3, \"tier\": \"batch\"}, "
                               "\"list\": [{\"name\": \"alpha\", \"max_concurrency\": 4, "
                               "\"max_queue\": 10, \"weight\": 2, "
                               "\"models\": {\"m\": {\"max_concurrency\": 1}}}]}");
    struct tenants ts;
    tenants_init(&ts);
    assert_int_equal(tenants_apply(&ts, &cfg->tenants), 0);
    struct tenant *alpha = tenants_find_name(&ts, "alpha", 5);
    uint64_t conc, q;
    tenant_caps(alpha, "m", &conc, &q);
    assert_int_equal(conc, 1);
    assert_int_equal(q, 10); /* not overridden: the tenant's */
    tenant_caps(alpha, "other", &conc, &q);
    assert_int_equal(conc, 4);
    assert_int_equal(alpha->weight, 2);
    tenant_caps(ts.all[0], "m", &conc, &q);
    assert_true(conc == UINT64_MAX);
    assert_int_equal(q, 3);
    assert_int_equal(ts.all[0]->tier, TIER_BATCH);
    assert_false(ts.required);
    tenants_dispose(&ts);
    config_free(cfg);
}

/* A reload: a new key applies, a removed key stops working, a removed tenant
 * keeps its id (requests it holds finish), a returning one gets it back. */
static void test_reload_changes_keys(void **state)
{
    char a[80], a_new[80], b[80], json[1024];
    key_hash("sk-alpha", a);
    key_hash("sk-alpha-new", a_new);
    key_hash("sk-beta", b);
    snprintf(json, sizeof json,
             "{\"list\": [{\"name\": \"alpha\", \"api_keys\": [\"%s\"]},"
             "{\"name\": \"beta\", \"api_keys\": [\"%s\"]}]}",
             a, b);
    struct config *c1 = parse(json);
    snprintf(json, sizeof json,
             "{\"required\": true, \"list\": [{\"name\": \"alpha\", \"api_keys\": [\"%s\"], "
             "\"max_concurrency\": 2}]}",
             a_new);
    struct config *c2 = parse(json);
    struct tenants ts;
    tenants_init(&ts);
    assert_int_equal(tenants_apply(&ts, &c1->tenants), 0);
    struct tenant *alpha = by_key(&ts, "sk-alpha"), *beta = by_key(&ts, "sk-beta");
    uint32_t alpha_id = alpha->id, beta_id = beta->id;
    assert_true(alpha_id != beta_id && alpha_id != 0 && beta_id != 0);
    assert_int_equal(tenants_apply(&ts, &c2->tenants), 0);
    assert_true(ts.required);
    assert_null(by_key(&ts, "sk-alpha"));
    assert_ptr_equal(by_key(&ts, "sk-alpha-new"), alpha);
    assert_int_equal(alpha->max_concurrency, 2);
    assert_null(by_key(&ts, "sk-beta"));
    assert_true(beta->removed);
    assert_null(tenants_find_name(&ts, "beta", 4));
    assert_int_equal(tenants_apply(&ts, &c1->tenants), 0);
    assert_ptr_equal(by_key(&ts, "sk-beta"), beta);
    assert_int_equal(beta->id, beta_id);
    assert_false(beta->removed);
    assert_int_equal(ts.n, 3);
    tenants_dispose(&ts);
    config_free(c1);
    config_free(c2);
}

static void config_error_for(const char *tenants_json, const char *want)
{
    char text[2048];
    snprintf(text, sizeof text, "{\"tenants\": %s}", tenants_json);
    struct config_error err;
    struct config *cfg = config_parse(text, strlen(text), "t.json", &err);
    assert_null(cfg);
    if (!strstr(err.msg, want)) {
        fprintf(stderr, "got: %s\nwant: %s\n", err.msg, want);
        fail();
    }
}

static void test_config_errors(void **state)
{
    config_error_for("{\"list\": [{\"name\": \"a\", \"api_keys\": [\"sk-raw\"]}]}",
                     "t.json:1: tenants.list[0].api_keys[0]: must be \"sha256:\"");
    config_error_for("{\"list\": [{\"api_keys\": []}]}", "\"name\" is required");
    config_error_for("{\"list\": [{\"name\": \"default\"}]}", "tenants.default");
    config_error_for("{\"list\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}",
                     "tenant \"a\" is already defined");
    config_error_for("{\"header\": \"Authorization\"}", "tenants.header");
    config_error_for("{\"header\": \"x tenant\"}", "must be an HTTP header name");
    config_error_for("{\"list\": [{\"name\": \"a\", \"tier\": \"gold\"}]}", "tenants.list[0].tier");
    config_error_for("{\"list\": [{\"name\": \"a\", \"weight\": 0}]}",
                     "tenants.list[0].weight: must be between 1 and 100");
    config_error_for("{\"list\": [{\"name\": \"a\", \"models\": {\"m\": {\"max_queue\": -1}}}]}",
                     "tenants.list[0].models.m.max_queue");
    config_error_for("{\"default\": {\"api_keys\": []}}", "tenants.default.api_keys: unknown key");
    config_error_for("{\"bogus\": 1}", "tenants.bogus: unknown key");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_matches_sha256sum),
        cmocka_unit_test(test_lookup_by_key_and_header),
        cmocka_unit_test(test_tier_ceiling),
        cmocka_unit_test(test_caps_per_model),
        cmocka_unit_test(test_reload_changes_keys),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

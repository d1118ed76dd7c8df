/* Router: host forms, path prefix stripping, body model field, conflicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "thaw/http.h"
#include "thaw/router.h"

static struct router R;
static int model_a, model_b;

static int setup(void **state)
{
    router_init(&R);
    const char *hosts[] = {"llm.example.com"};
    const char *aliases[] = {"meta-llama/Llama-3-8B", "llama3"};
    struct route_names a = {"llama", "models", hosts, 1, aliases, 2};
    struct route_conflicts conflicts = {0};
    assert_int_equal(router_add(&R, &model_a, &a, &conflicts), 0);
    const char *aliases_b[] = {"llama3", "mistral-7b"}; /* llama3 is taken */
    struct route_names b = {"mistral", "default", NULL, 0, aliases_b, 2};
    assert_int_equal(router_add(&R, &model_b, &b, &conflicts), 0);
    assert_int_equal(conflicts.n, 1);
    assert_string_equal(conflicts.names, "llama3");
    return 0;
}

static int teardown(void **state)
{
    router_dispose(&R);
    return 0;
}

static struct http_limits lim = {65536, 100, 1 << 20};

/* Parses a request head into h. */
static void parse(struct http_head *h, const char *raw)
{
    struct http_parser p;
    http_parser_init(&p, HTTP_REQUEST, &lim);
    http_head_init(h);
    struct buf body;
    buf_init(&body);
    http_parser_next(&p, h, &body);
    size_t used;
    assert_int_equal(http_parser_execute(&p, raw, strlen(raw), &used), HTTP_EV_HEAD);
    buf_dispose(&body);
}

static enum route_status resolve(const char *raw, struct route *rt, char *path, size_t plen)
{
    struct http_head h;
    parse(&h, raw);
    enum route_status st = router_resolve_head(&R, &h, rt);
    if (st == ROUTE_FOUND && path) {
        snprintf(path, plen, "%s%.*s", rt->add_slash ? "/" : "", (int)rt->path_len,
                 http_target(&h) + rt->path_off);
    }
    http_head_dispose(&h);
    return st;
}

static void test_host_forms(void **state)
{
    const char *hosts[] = {"llama", "llama.models", "llama.models.svc",
                           "llama.models.svc.cluster.local", "LLAMA.Models.SVC:8080",
                           "llm.example.com", "llm.example.com.", "llama:80"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        char raw[256], path[128];
        snprintf(raw, sizeof raw, "GET /v1/models HTTP/1.1\r\nHost: %s\r\n\r\n", hosts[i]);
        struct route rt;
        assert_int_equal(resolve(raw, &rt, path, sizeof path), ROUTE_FOUND);
        assert_ptr_equal(rt.target, &model_a);
        assert_int_equal(rt.via, ROUTE_VIA_HOST);
        assert_string_equal(path, "/v1/models");
    }
}

static void test_wrong_namespace_falls_through(void **state)
{
    struct route rt;
    assert_int_equal(resolve("GET /x HTTP/1.1\r\nHost: llama.default.svc\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NOT_FOUND);
    assert_int_equal(resolve("GET /x HTTP/1.1\r\nHost: mistral.default\r\n\r\n", &rt, NULL, 0),
                     ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_b);
}

static void test_path_prefix_is_stripped(void **state)
{
    struct route rt;
    char path[128];
    const char *cases[][2] = {
        {"/models/llama/v1/chat/completions", "/v1/chat/completions"},
        {"/models/llama", "/"},
        {"/models/llama/", "/"},
        {"/models/llama?x=1", "/?x=1"},
        {"/models/mistral-7b/health", "/health"},
    };
    for (size_t i = 0; i < 5; i++) {
        char raw[256];
        snprintf(raw, sizeof raw, "GET %s HTTP/1.1\r\nHost: thaw:8080\r\n\r\n", cases[i][0]);
        assert_int_equal(resolve(raw, &rt, path, sizeof path), ROUTE_FOUND);
        assert_int_equal(rt.via, ROUTE_VIA_PATH);
        assert_string_equal(path, cases[i][1]);
    }
    assert_int_equal(resolve("GET /models/nope/x HTTP/1.1\r\nHost: t\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NOT_FOUND);
    assert_int_equal(resolve("GET /modelsllama/x HTTP/1.1\r\nHost: t\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NOT_FOUND);
    /* The name asked for, for the 404's message. */
    struct http_head h;
    parse(&h, "GET /models/nope/x HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(router_resolve_head(&R, &h, &rt), ROUTE_NOT_FOUND);
    assert_int_equal(rt.asked_len, 4);
    assert_memory_equal(http_target(&h) + rt.asked_off, "nope", 4);
    http_head_dispose(&h);
}

static void test_host_wins_over_path(void **state)
{
    struct route rt;
    char path[128];
    assert_int_equal(
        resolve("GET /models/mistral/x HTTP/1.1\r\nHost: llama\r\n\r\n", &rt, path, sizeof path),
        ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_a);
    assert_string_equal(path, "/models/mistral/x"); /* not stripped: Host decided */
}

static void test_absolute_form_target(void **state)
{
    struct route rt;
    char path[128];
    assert_int_equal(resolve("GET http://llama.models/v1/x HTTP/1.1\r\nHost: other\r\n\r\n", &rt,
                             path, sizeof path),
                     ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_a);
    assert_string_equal(path, "/v1/x");
}

static void test_body_routed_paths(void **state)
{
    struct route rt;
    assert_int_equal(
        resolve("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n", &rt, NULL, 0),
        ROUTE_NEED_BODY);
    assert_int_equal(resolve("POST /v1/embeddings?x HTTP/1.1\r\nHost: t\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NEED_BODY);
    assert_int_equal(resolve("POST /v1/images HTTP/1.1\r\nHost: t\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NOT_FOUND);
    static const char *const json[] = {
        "/v1/responses",    "/v1/moderations", "/v1/images/generations",
        "/v1/audio/speech", "/rerank",         "/v1/rerank",
        "/v2/rerank",       "/score",          "/v1/score",
        "/tokenize",        "/detokenize?x=1"};
    for (size_t i = 0; i < sizeof json / sizeof json[0]; i++) {
        assert_int_equal(router_body_kind(json[i], strlen(json[i])), ROUTE_BODY_JSON);
    }
    static const char *const forms[] = {"/v1/audio/transcriptions", "/v1/audio/translations",
                                        "/v1/images/edits"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        assert_int_equal(router_body_kind(forms[i], strlen(forms[i])), ROUTE_BODY_FORM);
    }
    assert_int_equal(router_body_kind("/v1/audio", 9), ROUTE_BODY_NONE);
    assert_int_equal(router_body_kind("/v1/rerankx", 11), ROUTE_BODY_NONE);
}

static void test_models_paths(void **state)
{
    char id[16];
    size_t n = 99;
    assert_int_equal(router_models_path("/v1/models", 10, id, sizeof id, &n), ROUTE_MODELS_LIST);
    assert_int_equal(router_models_path("/v1/models/?a", 13, id, sizeof id, &n), ROUTE_MODELS_LIST);
    assert_int_equal(router_models_path("/v1/modelsx", 11, id, sizeof id, &n), ROUTE_MODELS_NONE);
    assert_int_equal(router_models_path("/v2/models", 10, id, sizeof id, &n), ROUTE_MODELS_NONE);
    const char *p = "/v1/models/org%2fname?x";
    assert_int_equal(router_models_path(p, strlen(p), id, sizeof id, &n), ROUTE_MODELS_ONE);
    assert_string_equal(id, "org/name");
    assert_int_equal(n, 8);
    p = "/v1/models/a/b%zz%4";
    assert_int_equal(router_models_path(p, strlen(p), id, sizeof id, &n), ROUTE_MODELS_ONE);
    assert_string_equal(id, "a/b%zz%4");
    p = "/v1/models/0123456789abcdefgh"; /* longer than id can hold: no such model */
    assert_int_equal(router_models_path(p, strlen(p), id, sizeof id, &n), ROUTE_MODELS_ONE);
    assert_int_equal(n, 0);
}

static void test_body_model_field(void **state)
{
    struct route rt;
    const char *ok = "{\"messages\":[{\"role\":\"user\"}],\"model\":\"meta-llama/Llama-3-8B\"}";
    assert_int_equal(router_resolve_body(&R, ok, strlen(ok), &rt), ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_a);
    assert_int_equal(rt.via, ROUTE_VIA_BODY);
    const char *alias_b = "{\"model\":\"mistral-7b\"}";
    assert_int_equal(router_resolve_body(&R, alias_b, strlen(alias_b), &rt), ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_b);
    const char *taken = "{\"model\":\"llama3\"}"; /* first model keeps a shared alias */
    assert_int_equal(router_resolve_body(&R, taken, strlen(taken), &rt), ROUTE_FOUND);
    assert_ptr_equal(rt.target, &model_a);
    const char *cases[][2] = {
        {"{\"model\":\"LLAMA\"}", "nf"}, /* ids are case-sensitive */
        {"{\"model\":\"gpt-4\"}", "nf"},
        {"{\"model\":42}", "nm"},
        {"{\"prompt\":\"x\"}", "nm"},
        {"[1,2]", "bj"},
        {"{\"model\":", "bj"},
        {"", "bj"},
    };
    for (size_t i = 0; i < 7; i++) {
        enum route_status want = cases[i][1][0] == 'n' && cases[i][1][1] == 'f' ? ROUTE_NOT_FOUND
                                 : cases[i][1][1] == 'm'                   ? ROUTE_NO_MODEL_FIELD
                                                                           : ROUTE_BAD_JSON;
        assert_int_equal(router_resolve_body(&R, cases[i][0], strlen(cases[i][0]), &rt), want);
    }
}

static void test_remove(void **state)
{
    router_remove(&R, &model_b);
    struct route rt;
    assert_int_equal(resolve("GET /x HTTP/1.1\r\nHost: mistral\r\n\r\n", &rt, NULL, 0),
                     ROUTE_NOT_FOUND);
    assert_int_equal(resolve("GET /x HTTP/1.1\r\nHost: llama\r\n\r\n", &rt, NULL, 0), ROUTE_FOUND);
}

/* One name in two namespaces: the bare name routes nowhere and says which
 * models it could mean; the qualified forms always work; when one of the
 * two goes, the bare name is the other's again. */
/* A warning names what a model did not get: an alias taking a later
 * model's own name, and every name past the first few counted but cut. */
static void test_conflicts_are_named(void **state)
{
    (void)state;
    struct router rt;
    router_init(&rt);
    static int first, second, third;
    const char *aliases[] = {"b"};
    struct route_names a = {"a", "default", NULL, 0, aliases, 1};
    struct route_names b = {"b", "default", NULL, 0, NULL, 0};
    struct route_conflicts c = {0};
    assert_int_equal(router_add(&rt, &first, &a, &c), 0);
    assert_int_equal(c.n, 0);
    assert_int_equal(router_add(&rt, &second, &b, &c), 0);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.names, "b");

    char many[40][40];
    const char *names[40];
    for (int i = 0; i < 40; i++) {
        snprintf(many[i], sizeof many[i], "alias-number-%02d", i);
        names[i] = many[i];
    }
    struct route_names lots = {"c", "default", NULL, 0, names, 40};
    struct route_names again = {"d", "default", NULL, 0, names, 40};
    assert_int_equal(router_add(&rt, &first, &lots, NULL), 0);
    struct route_conflicts d = {0};
    assert_int_equal(router_add(&rt, &third, &again, &d), 0);
    assert_int_equal(d.n, 40);
    assert_true(strncmp(d.names, "alias-number-00, alias-number-01, ", 34) == 0);
    size_t len = strlen(d.names);
    assert_true(len < sizeof d.names);
    assert_string_equal(d.names + len - 5, ", ...");
    router_dispose(&rt);
}

static void test_same_name_in_two_namespaces(void **state)
{
    struct router rt;
    router_init(&rt);
    static int in_a, in_b, dup;
    struct route_names a = {"llama", "team-a", NULL, 0, NULL, 0};
    struct route_names b = {"llama", "team-b", NULL, 0, NULL, 0};
    struct route_conflicts conflicts = {0};
    assert_int_equal(router_add(&rt, &in_a, &a, &conflicts), 0);
    assert_int_equal(router_add(&rt, &in_b, &b, &conflicts), 0);
    assert_int_equal(conflicts.n, 0);
    /* The same name twice in one namespace is a conflict: the first keeps it. */
    assert_int_equal(router_add(&rt, &dup, &a, &conflicts), 0);
    assert_true(conflicts.n > 0);

    struct route r;
    assert_int_equal(router_resolve_body(&rt, "{\"model\":\"llama\"}", 17, &r), ROUTE_AMBIGUOUS);
    char cands[200];
    assert_int_equal(router_candidates(&rt, "llama", 5, false, cands, sizeof cands), 2);
    assert_string_equal(cands, "team-a/llama, team-b/llama");
    assert_int_equal(router_candidates(&rt, "LLAMA:8000", 10, true, cands, sizeof cands), 2);
    assert_null(router_lookup_name(&rt, "llama", 5));
    assert_int_equal(router_resolve_body(&rt, "{\"model\":\"team-b/llama\"}", 24, &r),
                     ROUTE_FOUND);
    assert_ptr_equal(r.target, &in_b);

    struct http_head h;
    parse(&h, "POST /v1/completions HTTP/1.1\r\nHost: llama\r\n\r\n");
    assert_int_equal(router_resolve_head(&rt, &h, &r), ROUTE_AMBIGUOUS);
    assert_true(r.ambiguous_host && r.ambiguous_len == 5);
    http_head_dispose(&h);
    parse(&h, "POST /v1/completions HTTP/1.1\r\nHost: llama.team-a.svc\r\n\r\n");
    assert_int_equal(router_resolve_head(&rt, &h, &r), ROUTE_FOUND);
    assert_ptr_equal(r.target, &in_a);
    http_head_dispose(&h);
    parse(&h, "GET /models/llama/v1/models HTTP/1.1\r\nHost: thaw\r\n\r\n");
    assert_int_equal(router_resolve_head(&rt, &h, &r), ROUTE_AMBIGUOUS);
    assert_false(r.ambiguous_host);
    http_head_dispose(&h);
    parse(&h, "GET /models/team-b/llama/v1/models HTTP/1.1\r\nHost: thaw\r\n\r\n");
    assert_int_equal(router_resolve_head(&rt, &h, &r), ROUTE_FOUND);
    assert_ptr_equal(r.target, &in_b);
    assert_int_equal(r.path_len, strlen("/v1/models"));
    http_head_dispose(&h);

    router_remove(&rt, &in_a);
    assert_ptr_equal(router_lookup_name(&rt, "llama", 5), &in_b);
    parse(&h, "GET / HTTP/1.1\r\nHost: llama\r\n\r\n");
    assert_int_equal(router_resolve_head(&rt, &h, &r), ROUTE_FOUND);
    assert_ptr_equal(r.target, &in_b);
    http_head_dispose(&h);
    router_remove(&rt, &in_b);
    assert_null(router_lookup_name(&rt, "llama", 5));
    router_dispose(&rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_host_forms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_namespace_falls_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_prefix_is_stripped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_wins_over_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absolute_form_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_routed_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_model_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_models_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test(test_same_name_in_two_namespaces),
        cmocka_unit_test(test_conflicts_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

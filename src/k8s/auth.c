#include "thaw/k8s/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <yaml.h>

void k8s_auth_init(struct k8s_auth *a)
{
    memset(a, 0, sizeof *a);
    buf_init(&a->ca_pem);
    buf_init(&a->cert_pem);
    buf_init(&a->key_pem);
}

static void free_strv(char **v)
{
    for (size_t i = 0; v && v[i]; i++) {
        free(v[i]);
    }
    free(v);
}

void k8s_auth_dispose(struct k8s_auth *a)
{
    free(a->server);
    free(a->ca_file);
    free(a->cert_file);
    free(a->key_file);
    if (a->token) {
        memset(a->token, 0, strlen(a->token)); /* no token left in freed memory */
    }
    free(a->token);
    free(a->token_file);
    free_strv(a->exec_argv);
    free_strv(a->exec_env);
    free(a->exec_api_version);
    free(a->namespace_);
    buf_dispose(&a->ca_pem);
    buf_dispose(&a->cert_pem);
    if (a->key_pem.data) {
        memset(a->key_pem.data, 0, a->key_pem.cap);
    }
    buf_dispose(&a->key_pem);
    k8s_auth_init(a);
}

int k8s_base64_decode(const char *in, size_t len, struct buf *out)
{
    /* EVP_DecodeBlock wants no whitespace and a multiple of 4. */
    struct buf clean;
    buf_init(&clean);
    for (size_t i = 0; i < len; i++) {
        char c = in[i];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            buf_append(&clean, &c, 1);
        }
    }
    while (clean.len % 4) {
        buf_append(&clean, "=", 1);
    }
    size_t pad = 0;
    if (clean.len >= 1 && clean.data[clean.len - 1] == '=') {
        pad++;
    }
    if (clean.len >= 2 && clean.data[clean.len - 2] == '=') {
        pad++;
    }
    buf_reset(out);
    if (clean.len == 0) {
        buf_dispose(&clean);
        return 0;
    }
    if (buf_reserve(out, clean.len / 4 * 3 + 1)) {
        buf_dispose(&clean);
        return -1;
    }
    int n = EVP_DecodeBlock((unsigned char *)out->data, (const unsigned char *)clean.data,
                            (int)clean.len);
    buf_dispose(&clean);
    if (n < 0) {
        return -1;
    }
    out->len = (size_t)n - pad;
    return 0;
}

/* ---- a small view over a libyaml document ------------------------------ */

static yaml_node_t *map_get(yaml_document_t *doc, yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE) {
        return NULL;
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp((char *)k->data.scalar.value, key) == 0) {
            return yaml_document_get_node(doc, p->value);
        }
    }
    return NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* In a sequence of {name: X, <field>: {...}}, the <field> of the one named name. */
static yaml_node_t *named(yaml_document_t *doc, yaml_node_t *seq, const char *name,
                          const char *field)
{
    if (!seq || seq->type != YAML_SEQUENCE_NODE || !name) {
        return NULL;
    }
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(doc, *it);
        const char *n = scalar(map_get(doc, e, "name"));
        if (n && strcmp(n, name) == 0) {
            return map_get(doc, e, field);
        }
    }
    return NULL;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Relative paths in a kubeconfig are relative to the file. */
static char *resolve_path(const char *kubeconfig, const char *p)
{
    if (!p) {
        return NULL;
    }
    if (p[0] == '/') {
        return strdup(p);
    }
    const char *slash = strrchr(kubeconfig, '/');
    if (!slash) {
        return strdup(p);
    }
    size_t n = (size_t)(slash - kubeconfig) + 1 + strlen(p) + 1;
    char *out = malloc(n);
    if (out) {
        snprintf(out, n, "%.*s/%s", (int)(slash - kubeconfig), kubeconfig, p);
    }
    return out;
}

/* user.exec: command (a bare name is looked up on PATH, a relative path is
 * relative to the kubeconfig, as kubectl does), args, env, apiVersion. */
static int parse_exec(yaml_document_t *doc, yaml_node_t *exec, const char *path,
                      struct k8s_auth *a, char *err, size_t errlen)
{
    const char *cmd = scalar(map_get(doc, exec, "command"));
    const char *api = scalar(map_get(doc, exec, "apiVersion"));
    if (!cmd || !*cmd) {
        snprintf(err, errlen, "kubeconfig %s: users[].user.exec.command: missing", path);
        return -1;
    }
    if (!api || (strcmp(api, "client.authentication.k8s.io/v1") != 0 &&
                 strcmp(api, "client.authentication.k8s.io/v1beta1") != 0)) {
        snprintf(err, errlen, "kubeconfig %s: users[].user.exec.apiVersion: \"%s\" is not "
                 "client.authentication.k8s.io/v1 or v1beta1", path, api ? api : "");
        return -1;
    }
    yaml_node_t *args = map_get(doc, exec, "args");
    yaml_node_t *env = map_get(doc, exec, "env");
    size_t nargs = args && args->type == YAML_SEQUENCE_NODE
                       ? (size_t)(args->data.sequence.items.top - args->data.sequence.items.start)
                       : 0;
    size_t nenv = env && env->type == YAML_SEQUENCE_NODE
                      ? (size_t)(env->data.sequence.items.top - env->data.sequence.items.start)
                      : 0;
    a->exec_api_version = strdup(api);
    a->exec_argv = calloc(nargs + 2, sizeof(char *));
    a->exec_env = calloc(nenv + 1, sizeof(char *));
    if (!a->exec_api_version || !a->exec_argv || !a->exec_env) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a->exec_argv[0] = strchr(cmd, '/') ? resolve_path(path, cmd) : strdup(cmd);
    for (size_t i = 0; i < nargs; i++) {
        const char *v = scalar(yaml_document_get_node(doc, args->data.sequence.items.start[i]));
        if (!v) {
            snprintf(err, errlen, "kubeconfig %s: users[].user.exec.args[%zu]: not a string",
                     path, i);
            return -1;
        }
        a->exec_argv[i + 1] = strdup(v);
    }
    for (size_t i = 0; i < nenv; i++) {
        yaml_node_t *e = yaml_document_get_node(doc, env->data.sequence.items.start[i]);
        const char *name = scalar(map_get(doc, e, "name"));
        const char *value = scalar(map_get(doc, e, "value"));
        if (!name || !*name || strchr(name, '=') || !value) {
            snprintf(err, errlen, "kubeconfig %s: users[].user.exec.env[%zu]: needs a name and "
                     "a value", path, i);
            return -1;
        }
        size_t n = strlen(name) + strlen(value) + 2;
        a->exec_env[i] = malloc(n);
        if (a->exec_env[i]) {
            snprintf(a->exec_env[i], n, "%s=%s", name, value);
        }
    }
    return 0;
}

static int decode_field(yaml_node_t *n, struct buf *out, const char *what, char *err,
                        size_t errlen)
{
    const char *v = scalar(n);
    if (!v) {
        return 0;
    }
    if (k8s_base64_decode(v, strlen(v), out)) {
        snprintf(err, errlen, "%s is not valid base64", what);
        return -1;
    }
    return 0;
}

/* The kubeconfig on parser's input; path names it in errors and anchors
 * its relative paths. */
static int load_kubeconfig(struct k8s_auth *a, yaml_parser_t *parser, const char *path,
                           const char *context, char *err, size_t errlen)
{
    yaml_document_t doc;
    int rc = -1;
    if (!yaml_parser_load(parser, &doc)) {
        snprintf(err, errlen, "kubeconfig %s:%zu: %s", path, parser->problem_mark.line + 1,
                 parser->problem ? parser->problem : "invalid YAML");
        return -1;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    const char *ctx_name = context ? context : scalar(map_get(&doc, root, "current-context"));
    yaml_node_t *ctx = named(&doc, map_get(&doc, root, "contexts"), ctx_name, "context");
    if (!ctx) {
        snprintf(err, errlen, "kubeconfig %s: context \"%s\" not found", path,
                 ctx_name ? ctx_name : "(no current-context)");
        goto out;
    }
    const char *cluster_name = scalar(map_get(&doc, ctx, "cluster"));
    const char *user_name = scalar(map_get(&doc, ctx, "user"));
    yaml_node_t *cluster = named(&doc, map_get(&doc, root, "clusters"), cluster_name, "cluster");
    if (!cluster || !scalar(map_get(&doc, cluster, "server"))) {
        snprintf(err, errlen, "kubeconfig %s: cluster \"%s\" not found or has no server", path,
                 cluster_name ? cluster_name : "");
        goto out;
    }
    yaml_node_t *user = named(&doc, map_get(&doc, root, "users"), user_name, "user");
    a->server = strdup(scalar(map_get(&doc, cluster, "server")));
    size_t sl = strlen(a->server);
    if (sl && a->server[sl - 1] == '/') {
        a->server[sl - 1] = '\0';
    }
    a->ca_file = resolve_path(path, scalar(map_get(&doc, cluster, "certificate-authority")));
    const char *insecure = scalar(map_get(&doc, cluster, "insecure-skip-tls-verify"));
    a->insecure = insecure && strcmp(insecure, "true") == 0;
    if (decode_field(map_get(&doc, cluster, "certificate-authority-data"), &a->ca_pem,
                     "certificate-authority-data", err, errlen)) {
        goto out;
    }
    if (user) {
        a->cert_file = resolve_path(path, scalar(map_get(&doc, user, "client-certificate")));
        a->key_file = resolve_path(path, scalar(map_get(&doc, user, "client-key")));
        a->token = dup_or_null(scalar(map_get(&doc, user, "token")));
        a->token_file = resolve_path(path, scalar(map_get(&doc, user, "tokenFile")));
        if (decode_field(map_get(&doc, user, "client-certificate-data"), &a->cert_pem,
                         "client-certificate-data", err, errlen) ||
            decode_field(map_get(&doc, user, "client-key-data"), &a->key_pem, "client-key-data",
                         err, errlen)) {
            goto out;
        }
        if (map_get(&doc, user, "auth-provider")) {
            snprintf(err, errlen,
                     "kubeconfig %s: user \"%s\" uses an auth-provider plugin (removed from "
                     "Kubernetes); use an exec plugin, a token, tokenFile or client certificate",
                     path, user_name ? user_name : "");
            goto out;
        }
        yaml_node_t *exec = map_get(&doc, user, "exec");
        if (exec && parse_exec(&doc, exec, path, a, err, errlen)) {
            goto out;
        }
    }
    a->namespace_ = dup_or_null(scalar(map_get(&doc, ctx, "namespace")));
    snprintf(a->source, sizeof a->source, "kubeconfig %s (context %s)", path,
             ctx_name ? ctx_name : "");
    rc = 0;
out:
    yaml_document_delete(&doc);
    return rc;
}

int k8s_auth_from_kubeconfig(struct k8s_auth *a, const char *path, const char *context, char *err,
                             size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "kubeconfig %s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int rc = load_kubeconfig(a, &parser, path, context, err, errlen);
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

int k8s_auth_from_kubeconfig_text(struct k8s_auth *a, const char *text, size_t len,
                                  const char *path, const char *context, char *err, size_t errlen)
{
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = load_kubeconfig(a, &parser, path, context, err, errlen);
    yaml_parser_delete(&parser);
    return rc;
}

int k8s_auth_in_cluster(struct k8s_auth *a, const char *sa_dir, char *err, size_t errlen)
{
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port) {
        snprintf(err, errlen,
                 "not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset) and no kubeconfig given "
                 "(--kubeconfig, KUBECONFIG or kubernetes.kubeconfig)");
        return -1;
    }
    const char *dir = sa_dir ? sa_dir : K8S_SA_DIR;
    char path[512];
    size_t n = strlen(host) + strlen(port) + 16;
    a->server = malloc(n);
    if (!a->server) {
        return -1;
    }
    /* IPv6 service hosts need brackets. */
    snprintf(a->server, n, strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s", host, port);
    snprintf(path, sizeof path, "%s/token", dir);
    a->token_file = strdup(path);
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    a->ca_file = strdup(path);
    snprintf(path, sizeof path, "%s/namespace", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        char ns[256] = "";
        if (fgets(ns, sizeof ns, f)) {
            ns[strcspn(ns, "\r\n")] = '\0';
            a->namespace_ = strdup(ns);
        }
        fclose(f);
    }
    snprintf(a->source, sizeof a->source, "in-cluster service account (%s)", dir);
    return 0;
}

int k8s_auth_resolve(struct k8s_auth *a, const char *flag_path, const char *config_path,
                     const char *context, char *err, size_t errlen)
{
    if (flag_path) {
        return k8s_auth_from_kubeconfig(a, flag_path, context, err, errlen);
    }
    const char *env = getenv("KUBECONFIG");
    if (env && *env) {
        char first[4096];
        snprintf(first, sizeof first, "%s", env);
        first[strcspn(first, ":")] = '\0';
        return k8s_auth_from_kubeconfig(a, first, context, err, errlen);
    }
    if (config_path) {
        return k8s_auth_from_kubeconfig(a, config_path, context, err, errlen);
    }
    return k8s_auth_in_cluster(a, NULL, err, errlen);
}

#include "thaw/k8s/execcred.h"
#include "thaw/k8s/json.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

extern char **environ;

#define RUN_TIMEOUT_MS 30000
#define MAX_OUTPUT (1u << 20)
#define REFRESH_BEFORE_MS 60000
#define RETRY_MS 10000

static void on_refresh_due(evutil_socket_t fd, short what, void *arg);

static void arm(struct event *ev, uint64_t ms)
{
    struct timeval tv = clock_timeval(ms);
    event_add(ev, &tv);
}

int k8s_execcred_parse(const char *json, size_t len, const char *api_version, time_t now_wall,
                       char **token, int64_t *valid_for_s, char *err, size_t errlen)
{
    cJSON *j = cJSON_ParseWithLength(json, len);
    int rc = -1;
    if (!j) {
        snprintf(err, errlen, "the plugin's output is not JSON");
        goto out;
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    const cJSON *api = cJSON_GetObjectItemCaseSensitive(j, "apiVersion");
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, "ExecCredential") != 0) {
        snprintf(err, errlen, "the plugin's output is not an ExecCredential");
        goto out;
    }
    if (!cJSON_IsString(api) || strcmp(api->valuestring, api_version) != 0) {
        snprintf(err, errlen, "the plugin answered apiVersion \"%s\", the kubeconfig asked for %s",
                 cJSON_IsString(api) ? api->valuestring : "", api_version);
        goto out;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(st, "token");
    if (!cJSON_IsString(tok) || !tok->valuestring[0]) {
        snprintf(err, errlen, "the ExecCredential has no status.token (client certificates from "
                 "plugins are not supported)");
        goto out;
    }
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(st, "expirationTimestamp");
    *valid_for_s = -1;
    if (cJSON_IsString(exp)) {
        int64_t t_ms;
        if (k8s_time_parse_ms(exp->valuestring, &t_ms)) {
            snprintf(err, errlen, "status.expirationTimestamp \"%s\" is not RFC 3339",
                     exp->valuestring);
            goto out;
        }
        time_t t = (time_t)(t_ms / 1000);
        *valid_for_s = t > now_wall ? (int64_t)(t - now_wall) : 0;
    }
    *token = strdup(tok->valuestring);
    rc = *token ? 0 : -1;
    if (rc) {
        snprintf(err, errlen, "out of memory");
    }
out:
    if (j) {
        /* The token is a secret: wipe it before the JSON's memory is freed. */
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "status"), "token");
        if (cJSON_IsString(t)) {
            memset(t->valuestring, 0, strlen(t->valuestring));
        }
        cJSON_Delete(j);
    }
    return rc;
}

static void set_token(struct k8s_execcred *x, char *token, int64_t valid_for_s)
{
    if (x->token) {
        memset(x->token, 0, strlen(x->token));
        free(x->token);
    }
    x->token = token;
    uint64_t now = clock_now_ms();
    x->expires_ms = valid_for_s < 0 ? 0 : now + (uint64_t)valid_for_s * 1000;
    event_del(&x->refresh_due);
    if (token && x->expires_ms) {
        /* A minute ahead, so no request goes out with an expired token. */
        uint64_t at = x->expires_ms > now + REFRESH_BEFORE_MS ? x->expires_ms - REFRESH_BEFORE_MS
                                                              : now;
        arm(&x->refresh_due, at - now < 1000 ? 1000 : at - now);
    }
}

/* thaw's environment without its own KUBERNETES_EXEC_INFO, then info and
 * the kubeconfig's env. The array is the caller's to free; its strings are
 * not. */
static char **plugin_env(const struct k8s_auth *a, char *info)
{
    size_t n_environ = 0, n_extra = 0;
    while (environ && environ[n_environ]) {
        n_environ++;
    }
    while (a->exec_env && a->exec_env[n_extra]) {
        n_extra++;
    }
    char **envp = calloc(n_environ + n_extra + 2, sizeof(char *));
    if (!envp) {
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_environ; i++) {
        if (strncmp(environ[i], "KUBERNETES_EXEC_INFO=", 21) != 0) {
            envp[k++] = environ[i];
        }
    }
    envp[k++] = info;
    for (size_t i = 0; i < n_extra; i++) {
        envp[k++] = a->exec_env[i];
    }
    return envp;
}

/* Runs the plugin: waits for it (done NULL: start-up), or starts it on the
 * loop. 0, or -1 with err set when it could not be started. */
static int run_plugin(struct k8s_execcred *x, command_done_fn done, char *err, size_t errlen)
{
    const struct k8s_auth *a = x->auth;
    char info[256];
    snprintf(info, sizeof info,
             "KUBERNETES_EXEC_INFO={\"apiVersion\":\"%s\",\"kind\":\"ExecCredential\","
             "\"spec\":{\"interactive\":false}}", a->exec_api_version);
    char **envp = plugin_env(a, info);
    if (!envp) {
        snprintf(err, errlen, "cannot start the exec plugin: out of memory");
        return -1;
    }
    struct command_spec spec = {.task = "exec_credential", .argv = a->exec_argv, .envp = envp,
                                .timeout_ms = RUN_TIMEOUT_MS, .max_output = MAX_OUTPUT,
                                .secret_output = true};
    if (done) {
        command_start(&x->run, x->base, &spec, done, x);
    } else {
        command_run(&x->run, &spec);
    }
    free(envp);
    if (x->run.end == COMMAND_NOT_RUN) {
        snprintf(err, errlen, "cannot run the exec plugin %s: %s", a->exec_argv[0],
                 strerror(x->run.code));
        return -1;
    }
    x->runs++;
    return 0;
}

/* Takes the finished run's output: the token, or -1 with err set. */
static int take_output(struct k8s_execcred *x, char *err, size_t errlen)
{
    struct command *c = &x->run;
    /* COMMAND_ENDED: another waitpid took its status; its output tells. */
    if (c->end != COMMAND_ENDED && !command_succeeded(c)) {
        char how[200];
        command_describe(c, how, sizeof how);
        snprintf(err, errlen, "the exec plugin %s %s", x->auth->exec_argv[0], how);
        command_clear_output(c);
        return -1;
    }
    char *token = NULL;
    int64_t valid = -1;
    int rc = k8s_execcred_parse(c->out.data ? buf_read_ptr(&c->out) : "", buf_unread(&c->out),
                                x->auth->exec_api_version, time(NULL), &token, &valid, err,
                                errlen);
    command_clear_output(c); /* wiped: it held the token */
    if (rc == 0) {
        set_token(x, token, valid);
    }
    return rc;
}

int k8s_execcred_init(struct k8s_execcred *x, struct event_base *base,
                      const struct k8s_auth *auth, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    x->base = base;
    x->auth = auth;
    command_init(&x->run);
    event_assign(&x->refresh_due, base, -1, 0, on_refresh_due, x);
    /* Start-up: wait for it, as kubectl does, before the loop turns. */
    if (run_plugin(x, NULL, err, errlen) || take_output(x, err, errlen)) {
        x->failures++;
        return -1;
    }
    return 0;
}

static void on_run_done(struct command *c, void *ud)
{
    struct k8s_execcred *x = ud;
    char err[300];
    if (take_output(x, err, sizeof err)) {
        x->failures++;
        LOGW("exec credential plugin failed: keeping the current token", "command=%s error=%s "
             "retry_in_ms=%d", LOG_Q(x->auth->exec_argv[0]), LOG_Q(err), RETRY_MS);
        arm(&x->refresh_due, RETRY_MS);
        return;
    }
    LOGI("exec credential plugin gave a new token", "command=%s expires_in_s=%lld",
         LOG_Q(x->auth->exec_argv[0]),
         x->expires_ms ? (long long)((x->expires_ms - clock_now_ms()) / 1000) : -1LL);
}

static void on_refresh_due(evutil_socket_t fd, short what, void *arg)
{
    k8s_execcred_refresh(arg);
}

void k8s_execcred_refresh(struct k8s_execcred *x)
{
    if (command_busy(&x->run)) {
        return; /* a run is going */
    }
    char err[300];
    if (run_plugin(x, on_run_done, err, sizeof err)) {
        x->failures++;
        LOGW("exec credential plugin failed: keeping the current token", "command=%s error=%s "
             "retry_in_ms=%d", LOG_Q(x->auth->exec_argv[0]), LOG_Q(err), RETRY_MS);
        arm(&x->refresh_due, RETRY_MS);
        return;
    }
    event_del(&x->refresh_due);
}

void k8s_execcred_dispose(struct k8s_execcred *x)
{
    command_dispose(&x->run); /* a run under way: its group killed, reaped */
    set_token(x, NULL, -1);
    event_del(&x->refresh_due);
}

#include "thaw/k8s/execcred.h"
#include "thaw/k8s/json.h"
#include "thaw/clock.h"
#include "thaw/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

extern char **environ;

#define RUN_TIMEOUT_MS 30000
#define MAX_OUTPUT (1u << 20)
#define REFRESH_BEFORE_MS 60000
#define RETRY_MS 10000

static void on_readable(evutil_socket_t fd, short what, void *arg);
static void on_deadline(evutil_socket_t fd, short what, void *arg);
static void on_reap(evutil_socket_t fd, short what, void *arg);
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

static void wipe_out(struct k8s_execcred *x)
{
    if (x->out.data) {
        memset(x->out.data, 0, x->out.cap);
    }
    buf_dispose(&x->out);
    buf_init(&x->out);
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

/* Starts the plugin with its stdout on a pipe. 0, or -1 with err set. */
static int spawn_plugin(struct k8s_execcred *x, char *err, size_t errlen)
{
    const struct k8s_auth *a = x->auth;
    size_t n_environ = 0, n_extra = 0;
    while (environ && environ[n_environ]) {
        n_environ++;
    }
    while (a->exec_env && a->exec_env[n_extra]) {
        n_extra++;
    }
    char **envp = calloc(n_environ + n_extra + 2, sizeof(char *));
    char info[256];
    snprintf(info, sizeof info,
             "KUBERNETES_EXEC_INFO={\"apiVersion\":\"%s\",\"kind\":\"ExecCredential\","
             "\"spec\":{\"interactive\":false}}", a->exec_api_version);
    int fds[2] = {-1, -1};
    if (!envp || pipe2(fds, O_CLOEXEC)) {
        free(envp);
        snprintf(err, errlen, "cannot start the exec plugin: %s", strerror(errno));
        return -1;
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
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    pid_t pid;
    int rc = posix_spawnp(&pid, a->exec_argv[0], &fa, NULL, a->exec_argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    close(fds[1]);
    if (rc) {
        close(fds[0]);
        snprintf(err, errlen, "cannot run the exec plugin %s: %s", a->exec_argv[0],
                 strerror(rc));
        return -1;
    }
    x->pid = pid;
    x->fd = fds[0];
    x->runs++;
    wipe_out(x);
    return 0;
}

/* Takes the finished run's output. exit_status -1: not known (reaped elsewhere or still
 * exiting). */
static int take_output(struct k8s_execcred *x, int exit_status, char *err, size_t errlen)
{
    if (exit_status > 0) {
        snprintf(err, errlen, "the exec plugin %s exited with status %d", x->auth->exec_argv[0],
                 exit_status);
        wipe_out(x);
        return -1;
    }
    char *token = NULL;
    int64_t valid = -1;
    int rc = k8s_execcred_parse(buf_read_ptr(&x->out), buf_unread(&x->out),
                                x->auth->exec_api_version, time(NULL), &token, &valid, err,
                                errlen);
    wipe_out(x);
    if (rc == 0) {
        set_token(x, token, valid);
    }
    return rc;
}

static int exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int k8s_execcred_init(struct k8s_execcred *x, struct event_base *base,
                      const struct k8s_auth *auth, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    x->base = base;
    x->auth = auth;
    x->fd = -1;
    buf_init(&x->out);
    event_assign(&x->deadline, base, -1, 0, on_deadline, x);
    event_assign(&x->reap, base, -1, 0, on_reap, x);
    event_assign(&x->refresh_due, base, -1, 0, on_refresh_due, x);
    if (spawn_plugin(x, err, errlen)) {
        x->failures++;
        return -1;
    }
    /* Start-up: wait for it, as kubectl does, before the loop turns. */
    uint64_t deadline = clock_now_ms() + RUN_TIMEOUT_MS;
    bool timed_out = false;
    for (;;) {
        uint64_t now = clock_now_ms();
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        struct pollfd p = {x->fd, POLLIN, 0};
        int r = poll(&p, 1, (int)(deadline - now));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            continue;
        }
        char chunk[4096];
        ssize_t got = read(x->fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0 || x->out.len + (size_t)got > MAX_OUTPUT ||
            buf_append(&x->out, chunk, (size_t)got)) {
            break;
        }
    }
    close(x->fd);
    x->fd = -1;
    if (timed_out) {
        kill(x->pid, SIGKILL);
    }
    int status = 0;
    pid_t w;
    while ((w = waitpid(x->pid, &status, 0)) < 0 && errno == EINTR) {
    }
    x->pid = 0;
    if (timed_out) {
        snprintf(err, errlen, "the exec plugin %s did not answer within %d s",
                 auth->exec_argv[0], RUN_TIMEOUT_MS / 1000);
        wipe_out(x);
        x->failures++;
        return -1;
    }
    if (take_output(x, w == -1 ? -1 : exit_code(status), err, errlen)) {
        x->failures++;
        return -1;
    }
    return 0;
}

static void end_run_events(struct k8s_execcred *x)
{
    if (x->reading) {
        event_del(&x->read_ev);
        x->reading = false;
    }
    event_del(&x->deadline);
    if (x->fd >= 0) {
        close(x->fd);
        x->fd = -1;
    }
}

/* Reaps the child after its output ended; a few tries, then it is killed. */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_execcred *x = arg;
    int status;
    pid_t w = waitpid(x->pid, &status, WNOHANG);
    if (w == 0 && ++x->reap_tries < 50) {
        arm(&x->reap, 100);
        return;
    }
    if (w == 0) {
        kill(x->pid, SIGKILL);
        waitpid(x->pid, &status, 0); /* SIGKILL: at once */
    }
    x->pid = 0;
}

static void finish_background(struct k8s_execcred *x, bool timed_out)
{
    end_run_events(x);
    char err[300];
    int status = 0;
    pid_t w = timed_out ? 0 : waitpid(x->pid, &status, WNOHANG);
    int code = w > 0 ? exit_code(status) : -1;
    int rc;
    if (timed_out) {
        snprintf(err, sizeof err, "no answer within %d s", RUN_TIMEOUT_MS / 1000);
        wipe_out(x);
        kill(x->pid, SIGKILL);
        rc = -1;
    } else {
        rc = take_output(x, code, err, sizeof err);
    }
    if (rc) {
        x->failures++;
        LOGW("exec credential plugin failed: keeping the current token", "command=%s error=%s "
             "retry_in_ms=%d", x->auth->exec_argv[0], LOG_Q(err), RETRY_MS);
        arm(&x->refresh_due, RETRY_MS);
    } else {
        LOGI("exec credential plugin gave a new token", "command=%s expires_in_s=%lld",
             x->auth->exec_argv[0],
             x->expires_ms ? (long long)((x->expires_ms - clock_now_ms()) / 1000) : -1LL);
    }
    if (w != 0) {
        x->pid = 0; /* reaped here, or by someone else (ECHILD) */
        return;
    }
    x->reap_tries = 0;
    on_reap(-1, 0, x);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct k8s_execcred *x = arg;
    char chunk[4096];
    for (;;) {
        ssize_t got = read(x->fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        }
        if (got <= 0 || x->out.len + (size_t)got > MAX_OUTPUT ||
            buf_append(&x->out, chunk, (size_t)got)) {
            finish_background(x, false);
            return;
        }
    }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    finish_background(arg, true);
}

static void on_refresh_due(evutil_socket_t fd, short what, void *arg)
{
    k8s_execcred_refresh(arg);
}

void k8s_execcred_refresh(struct k8s_execcred *x)
{
    if (x->pid) {
        return; /* a run is going (or being reaped) */
    }
    char err[300];
    if (spawn_plugin(x, err, sizeof err)) {
        x->failures++;
        LOGW("exec credential plugin failed: keeping the current token", "error=%s "
             "retry_in_ms=%d", LOG_Q(err), RETRY_MS);
        arm(&x->refresh_due, RETRY_MS);
        return;
    }
    event_del(&x->refresh_due);
    fcntl(x->fd, F_SETFL, fcntl(x->fd, F_GETFL) | O_NONBLOCK);
    event_assign(&x->read_ev, x->base, x->fd, EV_READ | EV_PERSIST, on_readable, x);
    x->reading = true;
    event_add(&x->read_ev, NULL);
    arm(&x->deadline, RUN_TIMEOUT_MS);
}

void k8s_execcred_dispose(struct k8s_execcred *x)
{
    end_run_events(x);
    event_del(&x->reap);
    if (x->pid) {
        kill(x->pid, SIGKILL);
        waitpid(x->pid, NULL, 0);
        x->pid = 0;
    }
    wipe_out(x);
    set_token(x, NULL, -1);
    event_del(&x->refresh_due);
}

/* kubeconfig exec credential plugins (client.authentication.k8s.io), as
 * kubectl runs them: the command gets KUBERNETES_EXEC_INFO and the
 * kubeconfig's env, and prints an ExecCredential whose status.token is the
 * bearer token, valid until status.expirationTimestamp (or for good).
 *
 * The first run, at start-up before the event loop turns, waits for the
 * plugin (up to 30 s) so thaw's first request is authenticated. Later runs,
 * a minute before the token expires or when the API server answered 401,
 * happen in the background on the loop: the old token is used until the
 * new one arrives; a failed run is retried every 10 s. A plugin runs as a
 * command (command.h): in its own process group, killed whole at its
 * deadline, its stdout capped at 1 MiB, its stderr lines logged quoted. The
 * token is never logged. */
#ifndef THAW_K8S_EXECCRED_H
#define THAW_K8S_EXECCRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/command.h"
#include "thaw/k8s/auth.h"

struct k8s_execcred {
    struct event_base *base;
    const struct k8s_auth *auth; /* exec_argv, exec_env, exec_api_version */
    char *token;
    uint64_t expires_ms; /* monotonic; 0: does not expire */
    struct command run;  /* the plugin's runs, one at a time */
    struct event refresh_due;
    uint64_t runs, failures;
};

/* Parses an ExecCredential. now_wall: seconds since the epoch. On success
 * *token is malloc'd and *valid_for_s is the seconds left (-1: no expiry). */
int k8s_execcred_parse(const char *json, size_t len, const char *api_version, time_t now_wall,
                       char **token, int64_t *valid_for_s, char *err, size_t errlen);

/* Runs the plugin and waits for it. 0, or -1 with err set. */
int k8s_execcred_init(struct k8s_execcred *x, struct event_base *base,
                      const struct k8s_auth *auth, char *err, size_t errlen);
/* Starts a background run unless one is going. Runs due before expiry
 * start by themselves; call this when the API server refuses the token. */
void k8s_execcred_refresh(struct k8s_execcred *x);
void k8s_execcred_dispose(struct k8s_execcred *x);

#endif

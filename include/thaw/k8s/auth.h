/* How to reach and authenticate to a Kubernetes API server: from a
 * kubeconfig file (parsed with libyaml: server, CA, client certificate,
 * token, tokenFile or an exec credential plugin, namespace of the current
 * or named context), or from
 * the in-cluster service account (KUBERNETES_SERVICE_HOST/PORT, the mounted
 * token, which rotates and is re-read, and CA). struct k8s_auth owns its
 * strings and buffers. */
#ifndef THAW_K8S_AUTH_H
#define THAW_K8S_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "thaw/buf.h"

struct k8s_auth {
    char *server;     /* "https://host:port" */
    char *ca_file;    /* or: */
    struct buf ca_pem;
    char *cert_file;  /* client certificate, or: */
    struct buf cert_pem;
    char *key_file;
    struct buf key_pem;
    char *token;      /* static token, or: */
    char *token_file; /* re-read as it rotates */
    /* An exec credential plugin (user.exec): argv[0] is the command, NULL
     * ends argv; env holds "NAME=value" entries added to thaw's own. */
    char **exec_argv;
    char **exec_env;
    char *exec_api_version;
    bool insecure;    /* insecure-skip-tls-verify */
    char *namespace_;
    char source[300]; /* where this came from, for logs */
};

#define K8S_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

void k8s_auth_init(struct k8s_auth *a);
void k8s_auth_dispose(struct k8s_auth *a);
/* context NULL: the current-context. 0, or -1 with err set. */
int k8s_auth_from_kubeconfig(struct k8s_auth *a, const char *path, const char *context, char *err,
                             size_t errlen);
/* The same on kubeconfig text in memory; path names it in errors and is what
 * relative file paths in it are relative to. */
int k8s_auth_from_kubeconfig_text(struct k8s_auth *a, const char *text, size_t len,
                                  const char *path, const char *context, char *err,
                                  size_t errlen);
/* sa_dir NULL: K8S_SA_DIR. 0, or -1 with err set. */
int k8s_auth_in_cluster(struct k8s_auth *a, const char *sa_dir, char *err, size_t errlen);
/* As kubectl users expect: flag_path (--kubeconfig), else $KUBECONFIG (the
 * first file of its list), else config_path, else the in-cluster service
 * account. 0, or -1 with err set. */
int k8s_auth_resolve(struct k8s_auth *a, const char *flag_path, const char *config_path,
                     const char *context, char *err, size_t errlen);
/* Base64 (standard alphabet, padding optional, whitespace ignored). 0 or -1. */
int k8s_base64_decode(const char *in, size_t len, struct buf *out);

#endif

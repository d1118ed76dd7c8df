/* libFuzzer target: the kubeconfig reader (YAML through libyaml; contexts,
 * clusters, users, base64 data fields, exec plugin settings). The current
 * context and a named one are both looked up. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/k8s/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void load(const uint8_t *data, size_t size, const char *context)
{
    struct k8s_auth a;
    char err[512];
    k8s_auth_init(&a);
    err[0] = '\0';
    int rc = k8s_auth_from_kubeconfig_text(&a, (const char *)data, size, "/etc/thaw/kubeconfig",
                                           context, err, sizeof err);
    if (rc == 0 && !a.server) {
        __builtin_trap(); /* a loaded kubeconfig names its server */
    }
    if (rc != 0 && err[0] == '\0') {
        __builtin_trap(); /* a failure always says why */
    }
    k8s_auth_dispose(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load(data, size, NULL);
    load(data, size, "dev");
    return 0;
}

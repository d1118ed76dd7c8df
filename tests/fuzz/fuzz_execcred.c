/* libFuzzer target: the ExecCredential an exec credential plugin prints
 * (kind, apiVersion, status.token, status.expirationTimestamp). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "thaw/k8s/execcred.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse(const uint8_t *data, size_t size, const char *api_version)
{
    char *token = NULL;
    int64_t valid_for = 0;
    char err[256];
    err[0] = '\0';
    /* A fixed "now" keeps runs reproducible: 2026-12-03T00:00:00Z. */
    int rc = k8s_execcred_parse((const char *)data, size, api_version, (time_t)1796256000, &token,
                                &valid_for, err, sizeof err);
    if (rc == 0) {
        if (!token || !token[0] || valid_for < -1) {
            __builtin_trap();
        }
        free(token);
    } else if (err[0] == '\0') {
        __builtin_trap(); /* a failure always says why */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse(data, size, "client.authentication.k8s.io/v1");
    parse(data, size, "client.authentication.k8s.io/v1beta1");
    return 0;
}

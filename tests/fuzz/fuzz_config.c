/* libFuzzer target: the configuration loader (JSON text, validation, the
 * FILE:LINE error positions), as `thaw --config` and a reload read it. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct config_error err;
    struct config *cfg = config_parse((const char *)data, size, "fuzz.json", &err);
    if (cfg) {
        config_free(cfg);
    } else if (memchr(err.msg, '\0', sizeof err.msg) == NULL || err.msg[0] == '\0') {
        __builtin_trap(); /* a failure always says why */
    }
    return 0;
}

#include "thaw/tier.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

static const char *const tier_names[TIER_COUNT] = {"critical", "standard", "batch"};

const char *tier_name(enum tier t)
{
    return (unsigned)t < TIER_COUNT ? tier_names[t] : "unknown";
}

int tier_parse(const char *s, size_t n, enum tier *out)
{
    for (int i = 0; i < TIER_COUNT; i++) {
        if (strlen(tier_names[i]) == n && strncasecmp(s, tier_names[i], n) == 0) {
            *out = (enum tier)i;
            return 0;
        }
    }
    return -EINVAL;
}

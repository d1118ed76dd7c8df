/* Request tiers: a leaf header, so pure modules (queue, warm pool, the
 * Kubernetes model spec) need not include the configuration. */
#ifndef THAW_TIER_H
#define THAW_TIER_H

#include <stddef.h>

/* Request tiers, in service order. */
enum tier { TIER_CRITICAL = 0, TIER_STANDARD = 1, TIER_BATCH = 2, TIER_COUNT = 3 };

/* "critical", "standard", "batch"; "unknown" out of range. */
const char *tier_name(enum tier t);
/* Case-insensitive on s[0..n). 0, or -EINVAL for no tier of that name. */
int tier_parse(const char *s, size_t n, enum tier *out);

#endif

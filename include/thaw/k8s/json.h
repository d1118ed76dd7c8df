/* Reading the API server's JSON: dotted lookups, counts, and RFC 3339
 * times. A leaf of the Kubernetes library (cJSON and libc only). */
#ifndef THAW_K8S_JSON_H
#define THAW_K8S_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Dotted lookup ("metadata.name"); NULL when absent. */
const cJSON *k8s_get(const cJSON *obj, const char *dotted);
const char *k8s_get_string(const cJSON *obj, const char *dotted);
/* A JSON number read as a count: 0 for non-numbers, negatives and NaN,
 * UINT64_MAX for anything larger (converting an out-of-range double to an
 * integer is undefined, and the API server's numbers are outside input). */
uint64_t k8s_json_count(const cJSON *v);

/* RFC 3339 ("2026-12-02T15:04:05Z"; an optional fraction, read to the
 * millisecond; Z or +hh:mm) as milliseconds since the epoch. 0, or -1. */
int k8s_time_parse_ms(const char *s, int64_t *out_ms);
/* ms since the epoch (not negative) as RFC 3339 UTC: "2026-12-02T15:04:05.123Z". */
void k8s_time_format_ms(int64_t ms, char *out, size_t len);

#endif

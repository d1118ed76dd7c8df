#include "thaw/k8s/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const cJSON *k8s_get(const cJSON *obj, const char *dotted)
{
    char part[128];
    const char *p = dotted;
    const cJSON *cur = obj;
    while (cur && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof part) {
            return NULL;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        cur = cJSON_GetObjectItemCaseSensitive(cur, part);
        p += n + (dot ? 1 : 0);
        if (!dot) {
            break;
        }
    }
    return cur;
}

const char *k8s_get_string(const cJSON *obj, const char *dotted)
{
    const cJSON *v = k8s_get(obj, dotted);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

uint64_t k8s_json_count(const cJSON *v)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
        return 0;
    }
    if (v->valuedouble >= 18446744073709551616.0) { /* 2^64 */
        return UINT64_MAX;
    }
    return (uint64_t)v->valuedouble;
}

int k8s_time_parse_ms(const char *s, int64_t *out_ms)
{
    struct tm tm = {0};
    int n = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                     &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &n) != 6) {
        return -1;
    }
    if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59 || tm.tm_sec > 60) {
        return -1;
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *p = s + n;
    int64_t ms = 0;
    if (*p == '.') {
        int digits = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            if (digits < 3) {
                ms = ms * 10 + (*p - '0');
            }
        }
        if (digits == 0) {
            return -1;
        }
        for (; digits < 3; digits++) {
            ms *= 10;
        }
    }
    long offset = 0;
    if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
        offset = (long)(atoi(p + 1) * 3600 + atoi(p + 4) * 60) * (*p == '-' ? -1 : 1);
    } else if (strcmp(p, "Z") != 0 && strcmp(p, "z") != 0) {
        return -1;
    }
    *out_ms = ((int64_t)timegm(&tm) - offset) * 1000 + ms;
    return 0;
}

void k8s_time_format_ms(int64_t ms, char *out, size_t len)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%03dZ", base, (int)(ms % 1000));
}

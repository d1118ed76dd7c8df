#include "thaw/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Set once by log_init before the event loop starts; read-only after. */
static enum log_level min_level_setting = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_init(enum log_level min_level)
{
    min_level_setting = min_level;
}

int log_level_parse(const char *s, enum log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

int log_enabled(enum log_level level)
{
    return level >= min_level_setting;
}

char *log_quote(char *dst, size_t dstlen, const char *src, size_t n, size_t max_chars)
{
    size_t o = 0;
    if (dstlen < 8) {
        if (dstlen) {
            dst[0] = '\0';
        }
        return dst;
    }
    dst[o++] = '"';
    size_t lim = n < max_chars ? n : max_chars;
    for (size_t i = 0; i < lim && o + 8 < dstlen; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c == '"' || c == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            o += (size_t)snprintf(dst + o, dstlen - o, "\\x%02x", c);
        } else {
            dst[o++] = (char)c;
        }
    }
    if (n > lim && o + 5 < dstlen) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o++] = '"';
    dst[o] = '\0';
    return dst;
}

bool log_limit_pass(struct log_limit *l, uint64_t now_ms, uint64_t interval_ms,
                    uint64_t *suppressed)
{
    if (l->last_ms && now_ms - l->last_ms < interval_ms) {
        l->suppressed++;
        return false;
    }
    *suppressed = l->suppressed;
    l->last_ms = now_ms ? now_ms : 1; /* 0 means never */
    l->suppressed = 0;
    return true;
}

void log_write(enum log_level level, const char *msg, const char *kvfmt, ...)
{
    if (level < min_level_setting) {
        return;
    }
    char line[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line,
                     "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s msg=\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level_names[level], msg);
    if (n < 0) {
        return;
    }
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (kvfmt && *kvfmt && len + 2 < sizeof line) {
        line[len++] = ' ';
        va_list ap;
        va_start(ap, kvfmt);
        int m = vsnprintf(line + len, sizeof line - len, kvfmt, ap);
        va_end(ap);
        if (m > 0) {
            len += (size_t)m < sizeof line - len ? (size_t)m : sizeof line - len - 1;
        }
    }
    if (len + 1 >= sizeof line) {
        len = sizeof line - 2;
    }
    line[len++] = '\n';
    /* One write per line so lines from concurrent processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

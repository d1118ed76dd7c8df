/* Logging: one logfmt line per event on stderr:
 *   ts=2026-01-02T03:04:05.678Z level=info msg="..." key=value ...
 * The level is fixed once at start-up (log_init) and only read afterwards.
 * Never pass a token or a request body here; client-supplied text goes
 * through log_quote(), which escapes and truncates it. */
#ifndef THAW_LOG_H
#define THAW_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

void log_init(enum log_level min_level);
int log_level_parse(const char *s, enum log_level *out);
int log_enabled(enum log_level level);
/* kvfmt is a printf format for the key=value part, or NULL. */
void log_write(enum log_level level, const char *msg, const char *kvfmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes src[0..n) into dst as a double-quoted logfmt value, escaping quotes,
 * backslashes and control bytes, truncated to at most max_chars source bytes
 * (with "..." appended when cut). Returns dst. */
char *log_quote(char *dst, size_t dstlen, const char *src, size_t n, size_t max_chars);

/* A recurring warning written at most once per interval (running out of file
 * descriptors can repeat it for every connection and request): embedded in
 * whoever logs it, zeroed to start. */
struct log_limit {
    uint64_t last_ms;    /* when a line was last written; 0: never */
    uint64_t suppressed; /* occurrences not written since */
};
/* Whether the occurrence at now_ms gets its line: true at most once per
 * interval_ms, with *suppressed set to the occurrences held back since the
 * last line (for its suppressed=N), and the count restarted; false: it is
 * counted and nothing is written. now_ms is a monotonic time (clock_now_ms). */
bool log_limit_pass(struct log_limit *l, uint64_t now_ms, uint64_t interval_ms,
                    uint64_t *suppressed);
/* The interval thaw's recurring warnings use: one line a second. */
#define LOG_LIMIT_MS 1000

/* A value quoted for a log line (escaped, cut at 1000 bytes), in a buffer that
 * lives as long as the enclosing block: LOGW("...", "error=%s", LOG_Q(text)). */
#define LOG_Q_BYTES 4096
#define LOG_Q(s) log_quote((char[LOG_Q_BYTES]){0}, LOG_Q_BYTES, (s), strlen(s), 1000)

#define LOGD(msg, ...) (log_enabled(LOG_DEBUG) ? log_write(LOG_DEBUG, msg, __VA_ARGS__) : (void)0)
#define LOGI(msg, ...) log_write(LOG_INFO, msg, __VA_ARGS__)
#define LOGW(msg, ...) log_write(LOG_WARN, msg, __VA_ARGS__)
#define LOGE(msg, ...) log_write(LOG_ERROR, msg, __VA_ARGS__)

#endif

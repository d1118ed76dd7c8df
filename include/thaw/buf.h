/* A growable byte buffer with a read offset. Embedded (buf_init/buf_dispose);
 * it owns its storage. Growth is geometric; callers enforce their own limits
 * before appending (buf never refuses except on allocation failure). */
#ifndef THAW_BUF_H
#define THAW_BUF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct buf {
    char *data;
    size_t off; /* first unread byte */
    size_t len; /* bytes in use, from data[0] */
    size_t cap;
};

void buf_init(struct buf *b);
void buf_dispose(struct buf *b);
/* Ensures room for `extra` more bytes after len. 0 or -ENOMEM. */
int buf_reserve(struct buf *b, size_t extra);
/* Appending is inline where the bytes fit (most of a head built into a
 * buffer that has grown before): a copy, no call. */
int buf_append_slow(struct buf *b, const void *p, size_t n);
static inline int buf_append(struct buf *b, const void *p, size_t n)
{
    if (n && b->cap - b->len >= n && (b->off == 0 || b->off < b->len)) {
        memcpy(b->data + b->len, p, n);
        b->len += n;
        return 0;
    }
    return buf_append_slow(b, p, n);
}
static inline int buf_append_str(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}
/* Appends v in decimal (a head's Content-Length, a chunk's size: no printf). */
int buf_append_u64(struct buf *b, uint64_t v);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as the inside of a JSON string (no quotes), escaping as needed. */
int buf_append_json_escaped(struct buf *b, const char *s, size_t n);
/* Appends s, each byte that starts no valid UTF-8 sequence replaced by
 * U+FFFD (JSON printed from strings of outside origin stays UTF-8). */
int buf_append_utf8_repaired(struct buf *b, const char *s, size_t n);
/* Unread bytes. */
static inline size_t buf_unread(const struct buf *b)
{
    return b->len - b->off;
}
static inline const char *buf_read_ptr(const struct buf *b)
{
    return b->data + b->off;
}
/* Marks n bytes read; resets to empty when all are read. */
void buf_consume(struct buf *b, size_t n);
/* Empties the buffer, keeping its storage. */
void buf_reset(struct buf *b);
/* Frees storage larger than keep bytes (for idle connections). */
void buf_shrink(struct buf *b, size_t keep);

#endif

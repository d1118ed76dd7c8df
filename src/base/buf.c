#include "thaw/buf.h"
#include "thaw/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(struct buf *b)
{
    b->data = NULL;
    b->off = b->len = b->cap = 0;
}

void buf_dispose(struct buf *b)
{
    free(b->data);
    buf_init(b);
}

int buf_reserve(struct buf *b, size_t extra)
{
    if (b->off > 0 && b->off == b->len) {
        b->off = b->len = 0;
    }
    if (b->cap - b->len >= extra) {
        return 0;
    }
    /* Compact before growing when most of the buffer has been read. */
    if (b->off > 0 && b->cap - (b->len - b->off) >= extra && b->off >= b->cap / 2) {
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        return 0;
    }
    size_t need = b->len + extra;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) {
            return -ENOMEM;
        }
        ncap *= 2;
    }
    char *nd = realloc(b->data, ncap);
    if (!nd) {
        return -ENOMEM;
    }
    b->data = nd;
    b->cap = ncap;
    return 0;
}

/* buf_append when the bytes may not fit: reserves first. */
int buf_append_slow(struct buf *b, const void *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    int rc = buf_reserve(b, n);
    if (rc) {
        return rc;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int buf_append_u64(struct buf *b, uint64_t v)
{
    char tmp[20];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return buf_append(b, tmp + i, sizeof tmp - i);
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return -EINVAL;
    }
    if ((size_t)n < sizeof tmp) {
        return buf_append(b, tmp, (size_t)n);
    }
    int rc = buf_reserve(b, (size_t)n + 1);
    if (rc) {
        return rc;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int buf_append_utf8_repaired(struct buf *b, const char *s, size_t n)
{
    size_t i = 0, clean = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t take = c < 0x80 ? 1 : utf8_sequence((const unsigned char *)s + i, n - i);
        if (take) {
            i += take;
            continue;
        }
        int rc = buf_append(b, s + clean, i - clean);
        if (rc || (rc = buf_append(b, "\xef\xbf\xbd", 3))) {
            return rc;
        }
        clean = ++i;
    }
    return buf_append(b, s + clean, n - clean);
}

/* Client input (a model's name, say) goes into error bodies: bytes that are
 * not UTF-8 become U+FFFD, so the body stays JSON. */
int buf_append_json_escaped(struct buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    int rc = buf_reserve(b, n + 8);
    if (rc) {
        return rc;
    }
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 0, take = 1;
        switch (c) {
        case '"': esc[0] = '\\'; esc[1] = '"'; elen = 2; break;
        case '\\': esc[0] = '\\'; esc[1] = '\\'; elen = 2; break;
        case '\n': esc[0] = '\\'; esc[1] = 'n'; elen = 2; break;
        case '\r': esc[0] = '\\'; esc[1] = 'r'; elen = 2; break;
        case '\t': esc[0] = '\\'; esc[1] = 't'; elen = 2; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                esc[0] = '\\'; esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
                esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
                elen = 6;
            } else if (c >= 0x80) {
                take = utf8_sequence((const unsigned char *)s + i, n - i);
                if (take == 0) {
                    memcpy(esc, "\\ufffd", 6);
                    elen = 6;
                    take = 1;
                }
            }
        }
        rc = elen ? buf_append(b, esc, elen) : buf_append(b, &s[i], take);
        if (rc) {
            return rc;
        }
        i += take;
    }
    return 0;
}

void buf_consume(struct buf *b, size_t n)
{
    b->off += n;
    if (b->off >= b->len) {
        b->off = b->len = 0;
    }
}

void buf_reset(struct buf *b)
{
    b->off = b->len = 0;
}

void buf_shrink(struct buf *b, size_t keep)
{
    if (b->cap > keep && b->off == b->len) {
        buf_dispose(b);
    }
}

/* UTF-8 as RFC 3629 has it: no overlong forms, no surrogates, nothing past
 * U+10FFFF. Pure. */
#ifndef THAW_UTF8_H
#define THAW_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A lead byte: how many continuation bytes follow it, and the range the
 * first of them must lie in (the rest are 0x80..0xBF). False: c starts no
 * sequence (ASCII is not asked about). */
bool utf8_lead(unsigned char c, uint8_t *more, uint8_t *lo, uint8_t *hi);

/* The length of the valid sequence at s (of n bytes), or 0 when s[0] starts
 * none or the sequence is cut short by n. */
size_t utf8_sequence(const unsigned char *s, size_t n);

#endif

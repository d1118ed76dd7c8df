#include "thaw/utf8.h"

bool utf8_lead(unsigned char c, uint8_t *more, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        *more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        *more = 2;
        *lo = c == 0xe0 ? 0xa0 : 0x80; /* overlong below */
        *hi = c == 0xed ? 0x9f : 0xbf; /* surrogates above */
    } else if (c >= 0xf0 && c <= 0xf4) {
        *more = 3;
        *lo = c == 0xf0 ? 0x90 : 0x80; /* overlong below */
        *hi = c == 0xf4 ? 0x8f : 0xbf; /* past U+10FFFF above */
    } else {
        return false;
    }
    return true;
}

size_t utf8_sequence(const unsigned char *s, size_t n)
{
    uint8_t more, lo, hi;
    if (!utf8_lead(s[0], &more, &lo, &hi) || n <= more || s[1] < lo || s[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i <= more; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
    }
    return (size_t)more + 1;
}

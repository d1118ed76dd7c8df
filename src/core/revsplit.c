#include "thaw/revsplit.h"

#include <errno.h>
#include <string.h>

void revsplit_init(struct revsplit *s)
{
    memset(s, 0, sizeof *s);
}

int revsplit_set(struct revsplit *s, const uint32_t *percent, size_t n)
{
    if (n == 0 || n > REVSPLIT_MAX) {
        return -EINVAL;
    }
    uint32_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (percent[i] > 100) {
            return -EINVAL;
        }
        sum += percent[i];
    }
    if (sum != 100) {
        return -EINVAL;
    }
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        s->percent[i] = percent[i];
        s->score[i] = 0;
    }
    return 0;
}

int revsplit_pick(struct revsplit *s)
{
    int best = -1;
    for (size_t i = 0; i < s->n; i++) {
        if (s->percent[i] == 0) {
            continue;
        }
        s->score[i] += s->percent[i];
        if (best < 0 || s->score[i] > s->score[best]) {
            best = (int)i;
        }
    }
    if (best >= 0) {
        s->score[best] -= 100;
    }
    return best;
}

int revsplit_pick_sticky(const struct revsplit *s, uint64_t key_hash)
{
    if (s->n == 0) {
        return -1;
    }
    uint32_t bucket = (uint32_t)(key_hash % 100);
    uint32_t upto = 0;
    for (size_t k = s->n; k-- > 0;) {
        upto += s->percent[k];
        if (bucket < upto) {
            return (int)k;
        }
    }
    return -1; /* not reached: the percents add up to 100 */
}

uint64_t revsplit_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    /* FNV's low bits mix poorly for short keys; fold the high half in. */
    return h ^ (h >> 32);
}

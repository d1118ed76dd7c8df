/* A model's traffic split over its revisions (pure: no clock, no I/O).
 *
 * Weights are whole percents that add up to 100. revsplit_pick is smooth
 * weighted round robin (as nginx does for upstream weights): every pick adds
 * each revision's weight to its running score, takes the highest score and
 * subtracts the total from it. Over any 100 consecutive picks each revision
 * gets exactly its percent, and the picks of a small revision are spread out
 * rather than bunched. revsplit_pick_sticky maps a client key to a revision
 * by a stable hash instead, so a client keeps its revision across requests
 * (and activators and restarts) while the split stays the same. */
#ifndef THAW_REVSPLIT_H
#define THAW_REVSPLIT_H

#include <stddef.h>
#include <stdint.h>

#define REVSPLIT_MAX 8

struct revsplit {
    size_t n;
    uint32_t percent[REVSPLIT_MAX];
    int64_t score[REVSPLIT_MAX];
};

void revsplit_init(struct revsplit *s);
/* Sets the percents (n of them, each 0..100, adding up to 100). The running
 * scores restart, so the new split is exact from the next pick. 0, or
 * -EINVAL (and s unchanged) when they do not add up or n is out of range. */
int revsplit_set(struct revsplit *s, const uint32_t *percent, size_t n);
/* The next revision by smooth weighted round robin; -1 when s has none. */
int revsplit_pick(struct revsplit *s);
/* The revision a client key's hash falls on. Buckets are laid out from the
 * last revision to the first, so when the last one (a canary) grows, only
 * clients of the others move to it and none move back. -1 when s has none. */
int revsplit_pick_sticky(const struct revsplit *s, uint64_t key_hash);
/* FNV-1a of a key (a header value, a tenant name). */
uint64_t revsplit_hash(const char *key, size_t len);

#endif

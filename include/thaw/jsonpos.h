/* Source positions for a cJSON tree. cJSON keeps no line numbers, so this
 * walks the original text alongside the parsed tree (cJSON keeps members in
 * text order) and records the line on which each item (its key, for object
 * members) starts. Used only to name lines in configuration errors. */
#ifndef THAW_JSONPOS_H
#define THAW_JSONPOS_H

#include <stddef.h>
#include <cjson/cJSON.h>

struct jsonpos_entry {
    const cJSON *item;
    int line;
    size_t offset; /* byte where it starts (its key, for an object member) */
};

struct jsonpos {
    struct jsonpos_entry *entries; /* sorted by item address once built */
    size_t n, cap;
};

/* text must be the exact buffer root was parsed from. 0 or -ENOMEM. */
int jsonpos_build(struct jsonpos *jp, const char *text, size_t len, const cJSON *root);
/* Line (1-based) of item, or 0 when unknown. O(log n). */
int jsonpos_line(const struct jsonpos *jp, const cJSON *item);
/* The item whose text starts last at or before byte off: the innermost
 * item whose text holds that byte (a string, or the member whose key or
 * value holds it), when off is inside a key or a scalar. O(n): errors only. */
const cJSON *jsonpos_item_at(const struct jsonpos *jp, size_t off);
/* 1-based line of a byte offset in text. */
int jsonpos_line_of_offset(const char *text, size_t len, size_t off);
void jsonpos_dispose(struct jsonpos *jp);

#endif

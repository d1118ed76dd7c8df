/* A string-keyed hash map (open addressing, linear probing) to void *.
 * Keys are copied; values are borrowed. Used by the router, where lookups
 * happen on every request and the map may hold thousands of names. */
#ifndef THAW_STRMAP_H
#define THAW_STRMAP_H

#include <stddef.h>

struct strmap_slot {
    char *key; /* NULL: empty; STRMAP_TOMBSTONE: deleted */
    size_t klen;
    size_t hash;
    void *value;
};

struct strmap {
    struct strmap_slot *slots;
    size_t cap;   /* power of two */
    size_t used;  /* live + tombstones */
    size_t count; /* live */
};

void strmap_init(struct strmap *m);
void strmap_dispose(struct strmap *m);
/* Inserts or replaces. 0, or -ENOMEM. */
int strmap_put(struct strmap *m, const char *key, size_t klen, void *value);
void *strmap_get(const struct strmap *m, const char *key, size_t klen);
/* Removes key; returns its value or NULL. */
void *strmap_del(struct strmap *m, const char *key, size_t klen);
/* Removes every entry whose value is `value`; returns how many. */
size_t strmap_del_value(struct strmap *m, const void *value);
/* Calls fn for every live entry (in no particular order). */
void strmap_each(const struct strmap *m, void (*fn)(void *ud, const char *key, void *value),
                 void *ud);

#endif

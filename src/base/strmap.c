#include "thaw/strmap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char tombstone_mark;
#define TOMBSTONE (&tombstone_mark)

static size_t hash_bytes(const char *s, size_t n)
{
    /* FNV-1a, 64-bit. */
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return (size_t)h;
}

void strmap_init(struct strmap *m)
{
    m->slots = NULL;
    m->cap = m->used = m->count = 0;
}

void strmap_dispose(struct strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key && m->slots[i].key != TOMBSTONE) {
            free(m->slots[i].key);
        }
    }
    free(m->slots);
    strmap_init(m);
}

static struct strmap_slot *find(const struct strmap *m, const char *key, size_t klen, size_t h)
{
    if (m->cap == 0) {
        return NULL;
    }
    size_t mask = m->cap - 1;
    for (size_t i = h & mask, probes = 0; probes < m->cap; i = (i + 1) & mask, probes++) {
        struct strmap_slot *s = &m->slots[i];
        if (!s->key) {
            return NULL;
        }
        if (s->key != TOMBSTONE && s->hash == h && s->klen == klen &&
            memcmp(s->key, key, klen) == 0) {
            return s;
        }
    }
    return NULL;
}

static int grow(struct strmap *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    struct strmap_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        struct strmap_slot *s = &m->slots[i];
        if (!s->key || s->key == TOMBSTONE) {
            continue;
        }
        size_t j = s->hash & (ncap - 1);
        while (ns[j].key) {
            j = (j + 1) & (ncap - 1);
        }
        ns[j] = *s;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    m->used = m->count;
    return 0;
}

int strmap_put(struct strmap *m, const char *key, size_t klen, void *value)
{
    size_t h = hash_bytes(key, klen);
    struct strmap_slot *s = find(m, key, klen, h);
    if (s) {
        s->value = value;
        return 0;
    }
    if ((m->used + 1) * 4 >= m->cap * 3) {
        int rc = grow(m);
        if (rc) {
            return rc;
        }
    }
    char *k = malloc(klen + 1);
    if (!k) {
        return -ENOMEM;
    }
    memcpy(k, key, klen);
    k[klen] = '\0';
    size_t mask = m->cap - 1;
    size_t i = h & mask;
    while (m->slots[i].key && m->slots[i].key != TOMBSTONE) {
        i = (i + 1) & mask;
    }
    if (!m->slots[i].key) {
        m->used++;
    }
    m->slots[i] = (struct strmap_slot){k, klen, h, value};
    m->count++;
    return 0;
}

void *strmap_get(const struct strmap *m, const char *key, size_t klen)
{
    struct strmap_slot *s = find(m, key, klen, hash_bytes(key, klen));
    return s ? s->value : NULL;
}

void *strmap_del(struct strmap *m, const char *key, size_t klen)
{
    struct strmap_slot *s = find(m, key, klen, hash_bytes(key, klen));
    if (!s) {
        return NULL;
    }
    void *v = s->value;
    free(s->key);
    s->key = TOMBSTONE;
    s->value = NULL;
    m->count--;
    return v;
}

void strmap_each(const struct strmap *m, void (*fn)(void *ud, const char *key, void *value),
                 void *ud)
{
    for (size_t i = 0; i < m->cap; i++) {
        struct strmap_slot *s = &m->slots[i];
        if (s->key && s->key != TOMBSTONE) {
            fn(ud, s->key, s->value);
        }
    }
}

size_t strmap_del_value(struct strmap *m, const void *value)
{
    size_t n = 0;
    for (size_t i = 0; i < m->cap; i++) {
        struct strmap_slot *s = &m->slots[i];
        if (s->key && s->key != TOMBSTONE && s->value == value) {
            free(s->key);
            s->key = TOMBSTONE;
            s->value = NULL;
            m->count--;
            n++;
        }
    }
    return n;
}

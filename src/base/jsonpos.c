#include "thaw/jsonpos.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct walker {
    const char *begin, *p, *end;
    int line;
    int depth;
    struct jsonpos *jp;
};

static int record(struct jsonpos *jp, const cJSON *item, int line, size_t offset)
{
    if (jp->n == jp->cap) {
        size_t ncap = jp->cap ? jp->cap * 2 : 64;
        struct jsonpos_entry *ne = realloc(jp->entries, ncap * sizeof *ne);
        if (!ne) {
            return -ENOMEM;
        }
        jp->entries = ne;
        jp->cap = ncap;
    }
    jp->entries[jp->n].item = item;
    jp->entries[jp->n].line = line;
    jp->entries[jp->n].offset = offset;
    jp->n++;
    return 0;
}

static int by_item(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct jsonpos_entry *)a)->item;
    uintptr_t y = (uintptr_t)((const struct jsonpos_entry *)b)->item;
    return (x > y) - (x < y);
}

/* Whitespace as cJSON skips it: every byte up to and including the space
 * (a NUL or another control byte too), so the walk stays in step with
 * what cJSON parsed. */
static bool is_ws(char c)
{
    return (unsigned char)c <= ' ';
}

static void skip_ws(struct walker *w)
{
    while (w->p < w->end) {
        char c = *w->p;
        if (!is_ws(c)) {
            return;
        }
        if (c == '\n') {
            w->line++;
        }
        w->p++;
    }
}

static void skip_string(struct walker *w)
{
    w->p++; /* opening quote */
    while (w->p < w->end && *w->p != '"') {
        if (*w->p == '\\' && w->p + 1 < w->end) {
            w->p++;
        }
        w->p++;
    }
    if (w->p < w->end) {
        w->p++;
    }
}

/* key_line, key_off: where an object member's key starts (0, 0 for an
 * array element or the root: where the value starts). */
static int walk_value(struct walker *w, const cJSON *item, int key_line, size_t key_off);

static int walk_container(struct walker *w, const cJSON *item, char close)
{
    w->p++; /* '{' or '[' */
    const cJSON *child = item ? item->child : NULL;
    for (;;) {
        skip_ws(w);
        if (w->p >= w->end) {
            return 0;
        }
        if (*w->p == close) {
            w->p++;
            return 0;
        }
        if (*w->p == ',') {
            w->p++;
            continue;
        }
        int key_line = 0;
        size_t key_off = 0;
        if (close == '}') {
            key_line = w->line;
            key_off = (size_t)(w->p - w->begin);
            skip_string(w);
            skip_ws(w);
            if (w->p < w->end && *w->p == ':') {
                w->p++;
            }
        }
        int rc = walk_value(w, child, key_line, key_off);
        if (rc) {
            return rc;
        }
        if (child) {
            child = child->next;
        }
    }
}

static int walk_value(struct walker *w, const cJSON *item, int key_line, size_t key_off)
{
    skip_ws(w);
    if (w->p >= w->end) {
        return 0;
    }
    if (item) {
        int rc = record(w->jp, item, key_line ? key_line : w->line,
                        key_line ? key_off : (size_t)(w->p - w->begin));
        if (rc) {
            return rc;
        }
    }
    /* Past cJSON's own nesting limit the walk has lost step: brackets are
     * then stepped over like any byte, so the stack stays shallow. */
    bool may_nest = w->depth < CJSON_NESTING_LIMIT;
    switch (may_nest ? *w->p : '\0') {
    case '{':
    case '[': {
        w->depth++;
        int rc = walk_container(w, item, *w->p == '{' ? '}' : ']');
        w->depth--;
        return rc;
    }
    case '"':
        skip_string(w);
        return 0;
    default: {
        const char *start = w->p;
        while (w->p < w->end && *w->p != ',' && *w->p != '}' && *w->p != ']' && !is_ws(*w->p)) {
            w->p++;
        }
        if (w->p == start) {
            /* A stray bracket (the walk lost step): step over it so the
             * walk always ends; only line numbers can suffer. */
            w->p++;
        }
        return 0;
    }
    }
}

int jsonpos_build(struct jsonpos *jp, const char *text, size_t len, const cJSON *root)
{
    jp->entries = NULL;
    jp->n = jp->cap = 0;
    struct walker w = {text, text, text + len, 1, 0, jp};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        w.p += 3; /* a UTF-8 byte order mark, which cJSON skips too */
    }
    int rc = walk_value(&w, root, 0, 0);
    if (rc == 0 && jp->n > 1) {
        /* Looked up by address: one lookup per model and per error would
         * be quadratic on a large file with a linear scan. */
        qsort(jp->entries, jp->n, sizeof *jp->entries, by_item);
    }
    return rc;
}

int jsonpos_line(const struct jsonpos *jp, const cJSON *item)
{
    struct jsonpos_entry key = {.item = item};
    const struct jsonpos_entry *e =
        jp->n ? bsearch(&key, jp->entries, jp->n, sizeof key, by_item) : NULL;
    return e ? e->line : 0;
}

const cJSON *jsonpos_item_at(const struct jsonpos *jp, size_t off)
{
    const struct jsonpos_entry *best = NULL;
    for (size_t i = 0; i < jp->n; i++) {
        const struct jsonpos_entry *e = &jp->entries[i];
        if (e->offset <= off && (!best || e->offset > best->offset)) {
            best = e;
        }
    }
    return best ? best->item : NULL;
}

int jsonpos_line_of_offset(const char *text, size_t len, size_t off)
{
    int line = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (text[i] == '\n') {
            line++;
        }
    }
    return line;
}

void jsonpos_dispose(struct jsonpos *jp)
{
    free(jp->entries);
    jp->entries = NULL;
    jp->n = jp->cap = 0;
}

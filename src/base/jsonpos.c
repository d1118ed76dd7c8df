#include "thaw/jsonpos.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct walker {
    const char *p, *end;
    int line;
    int depth;
    struct jsonpos *jp;
};

static int record(struct jsonpos *jp, const cJSON *item, int line)
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

static int walk_value(struct walker *w, const cJSON *item, int line_override);

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
        if (close == '}') {
            key_line = w->line;
            skip_string(w);
            skip_ws(w);
            if (w->p < w->end && *w->p == ':') {
                w->p++;
            }
        }
        int rc = walk_value(w, child, key_line);
        if (rc) {
            return rc;
        }
        if (child) {
            child = child->next;
        }
    }
}

static int walk_value(struct walker *w, const cJSON *item, int line_override)
{
    skip_ws(w);
    if (w->p >= w->end) {
        return 0;
    }
    if (item) {
        int rc = record(w->jp, item, line_override ? line_override : w->line);
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
    struct walker w = {text, text + len, 1, 0, jp};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        w.p += 3; /* a UTF-8 byte order mark, which cJSON skips too */
    }
    int rc = walk_value(&w, root, 0);
    if (rc == 0 && jp->n > 1) {
        /* Looked up by address: one lookup per model and per error would
         * be quadratic on a large file with a linear scan. */
        qsort(jp->entries, jp->n, sizeof *jp->entries, by_item);
    }
    return rc;
}

int jsonpos_line(const struct jsonpos *jp, const cJSON *item)
{
    struct jsonpos_entry key = {item, 0};
    const struct jsonpos_entry *e =
        jp->n ? bsearch(&key, jp->entries, jp->n, sizeof key, by_item) : NULL;
    return e ? e->line : 0;
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

#include "thaw/jsonpos.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct walker {
    const char *p, *end;
    int line;
    struct jsonpos *jp;
};

static int record(struct jsonpos *jp, const cJSON *item, int line)
{
    if (jp->n == jp->cap) {
        size_t ncap = jp->cap ? jp->cap * 2 : 64;
        const cJSON **ni = realloc(jp->items, ncap * sizeof *ni);
        if (!ni) {
            return -ENOMEM;
        }
        jp->items = ni;
        int *nl = realloc(jp->lines, ncap * sizeof *nl);
        if (!nl) {
            return -ENOMEM;
        }
        jp->lines = nl;
        jp->cap = ncap;
    }
    jp->items[jp->n] = item;
    jp->lines[jp->n] = line;
    jp->n++;
    return 0;
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
    switch (*w->p) {
    case '{':
        return walk_container(w, item, '}');
    case '[':
        return walk_container(w, item, ']');
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
    jp->items = NULL;
    jp->lines = NULL;
    jp->n = jp->cap = 0;
    struct walker w = {text, text + len, 1, jp};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        w.p += 3; /* a UTF-8 byte order mark, which cJSON skips too */
    }
    return walk_value(&w, root, 0);
}

int jsonpos_line(const struct jsonpos *jp, const cJSON *item)
{
    for (size_t i = 0; i < jp->n; i++) {
        if (jp->items[i] == item) {
            return jp->lines[i];
        }
    }
    return 0;
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
    free(jp->items);
    free(jp->lines);
    jp->items = NULL;
    jp->lines = NULL;
    jp->n = jp->cap = 0;
}

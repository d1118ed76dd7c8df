/* Finds the top-level "model" string of a JSON request body without parsing
 * it into a tree. A small state machine is fed the body in whatever pieces
 * it arrives in; it keeps no copy of the input, only its current state (a
 * bounded nesting stack and a bounded model name), skips nested values
 * without building anything, and stops as soon as the top-level "model"
 * string is complete. Keys and values are compared after JSON unescaping
 * ("mo\u0064el" is "model"). "model" keys inside nested objects or arrays
 * do not count.
 *
 * Everything before the answer is checked as JSON (RFC 8259) in UTF-8, with
 * what Python's json (the servers') also takes: a leading byte order mark,
 * NaN, Infinity and -Infinity, lone surrogates (escaped, or encoded as
 * surrogatepass decodes them; in a model name they match no configured
 * one). A scan
 * started with jsonscan_init_whole goes on to the end of the body, checking
 * the rest too and refusing a second top-level "model" key: model servers
 * read the last one (Python's json), so a body naming two models would be
 * routed as one and run as the other. Other scans stop at the answer, and of
 * duplicate keys the first decides. Pure: no I/O, no allocation. */
#ifndef THAW_JSONSCAN_H
#define THAW_JSONSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest model name accepted (bytes after unescaping). */
#define JSONSCAN_MODEL_MAX 256
/* Deepest nesting accepted (the top-level object is depth 1). */
#define JSONSCAN_DEPTH_MAX 1024

enum jsonscan_status {
    JSONSCAN_MORE = 0,   /* no answer yet: feed more, or call jsonscan_finish at the end */
    JSONSCAN_MODEL,      /* the top-level "model" string is known: jsonscan_model() */
    JSONSCAN_NO_MODEL,   /* a complete JSON object without a string "model" (finish only) */
    JSONSCAN_MODEL_TOO_LONG, /* "model" is a string longer than JSONSCAN_MODEL_MAX */
    JSONSCAN_INVALID,    /* not a JSON object: jsonscan_error() says where and why */
    JSONSCAN_DUPLICATE_MODEL, /* a second top-level "model" key (whole scans only) */
};

struct jsonscan {
    uint64_t offset; /* bytes consumed so far */
    uint8_t state;
    uint8_t str_kind;     /* what the current string is: skipped, a top-level key, the model */
    uint8_t lit_pos;      /* position inside true/false/null */
    uint8_t hex_left;     /* hex digits of a \u escape still to come (of four) */
    uint8_t utf8_more;    /* continuation bytes of a raw UTF-8 character still to come */
    uint8_t utf8_lo, utf8_hi; /* the range the next of them must lie in */
    uint8_t key_pos;      /* how much of "model" the current top-level key matched */
    bool key_mismatch;
    bool key_is_model;    /* the value being read belongs to the first top-level "model" */
    bool model_seen;      /* a top-level "model" key was seen (its value decides) */
    bool model_not_string;
    uint8_t stream_pos;   /* whole scans: how much of "stream" the current top-level key matched */
    bool stream_mismatch;
    bool key_is_stream;   /* the value being read belongs to a top-level "stream" */
    bool literal_for_stream; /* the literal being matched is that value (true) */
    bool stream;          /* whole scans: the last top-level "stream" is the literal true
                           * (the last, as Python's json and the model servers read it) */
    bool whole;           /* read to the end of the body (jsonscan_init_whole) */
    bool model_known;     /* whole scans: the model string is complete, the rest still read */
    bool bom;             /* the body opened with a UTF-8 byte order mark */
    bool strict;          /* RFC 8259 only (jsonscan_init_strict) */
    const char *key;      /* the top-level key looked for: "model" unless told */
    uint8_t key_len;
    const char *literal;  /* the literal being matched */
    uint32_t code;        /* the \u escape being read */
    uint32_t high_surrogate;
    uint32_t depth;
    uint64_t kinds[JSONSCAN_DEPTH_MAX / 64]; /* bit set: object at that depth, else array */
    enum jsonscan_status status;
    const char *error;    /* static text, for JSONSCAN_INVALID */
    uint64_t error_offset;
    size_t model_len;
    char model[JSONSCAN_MODEL_MAX + 1];
};

void jsonscan_init(struct jsonscan *s);
/* The same, reading the whole body: jsonscan_feed reports JSONSCAN_MODEL as
 * soon as the model is known and keeps reading; JSONSCAN_INVALID or
 * JSONSCAN_DUPLICATE_MODEL may still follow, and jsonscan_finish says
 * JSONSCAN_MODEL only for a complete object. */
void jsonscan_init_whole(struct jsonscan *s);
/* A whole scan of RFC 8259 alone, for a file thaw reads (its configuration):
 * none of what Python's json also takes (NaN, Infinity, lone surrogates,
 * escaped or encoded) is valid; a leading byte order mark is skipped, as
 * RFC 8259 allows (editors write one). */
void jsonscan_init_strict(struct jsonscan *s);
/* Feeds the next piece of the body. Returns JSONSCAN_MORE until an answer
 * is known, then that answer (further calls change nothing, but for a
 * whole scan's JSONSCAN_MODEL: see above). */
enum jsonscan_status jsonscan_feed(struct jsonscan *s, const char *data, size_t len);
/* The body ended. Returns the final answer: never JSONSCAN_MORE. */
enum jsonscan_status jsonscan_finish(struct jsonscan *s);
/* The model name (NUL-terminated; *len excludes the NUL) after JSONSCAN_MODEL. */
const char *jsonscan_model(const struct jsonscan *s, size_t *len);
/* Writes "<what> at byte <n>" for JSONSCAN_INVALID into out. */
void jsonscan_error(const struct jsonscan *s, char *out, size_t outlen);

#endif

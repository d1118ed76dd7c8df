/* Finds the "model" field of a multipart/form-data request body (RFC 7578)
 * without holding the body: an incremental scan fed the body in whatever
 * pieces it arrives in, the way jsonscan reads JSON bodies. It keeps only
 * its state: the delimiter being searched for (with its KMP failure table, so
 * a delimiter split across pieces is found and a false start never makes it
 * look back), the current part-header line (bounded), and the model's value
 * (bounded). Parts other than the first one named "model" are skipped,
 * however large (an audio file, say; between CRs at memchr speed); the scan stops at the end of the
 * model field's value and looks at nothing after it, unless started with
 * formscan_init_whole: then it reads on to the closing delimiter and refuses a
 * second field named "model" (servers' form parsers keep the last one).
 *
 * Pure: no I/O, no allocation. */
#ifndef THAW_FORMSCAN_H
#define THAW_FORMSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/jsonscan.h"

/* RFC 2046: a boundary is 1 to 70 characters. */
#define FORMSCAN_BOUNDARY_MAX 70
/* "\r\n--" + boundary */
#define FORMSCAN_DELIM_MAX (FORMSCAN_BOUNDARY_MAX + 4)
/* Longest part-header line, and all header bytes of one part. */
#define FORMSCAN_LINE_MAX 1024
#define FORMSCAN_HEADERS_MAX 8192
/* Longest model name (the same bound as JSON bodies). */
#define FORMSCAN_MODEL_MAX JSONSCAN_MODEL_MAX

enum formscan_status {
    FORMSCAN_MORE = 0,        /* feed more, or formscan_finish at the end */
    FORMSCAN_MODEL,           /* the model field's value is known: formscan_model() */
    FORMSCAN_NO_MODEL,        /* the form ended (or the body did) without a model field */
    FORMSCAN_MODEL_TOO_LONG,  /* the model field is longer than FORMSCAN_MODEL_MAX */
    FORMSCAN_INVALID,         /* not multipart/form-data: formscan_error() says why */
    FORMSCAN_DUPLICATE_MODEL, /* a second field named "model" (whole scans only) */
};

struct formscan {
    uint64_t offset; /* bytes consumed so far */
    uint8_t state;
    uint8_t delim_len;
    uint8_t matched; /* delimiter bytes matched so far */
    bool part_is_model;
    bool disposition_seen; /* the current part's Content-Disposition was read */
    bool whole;            /* read to the closing delimiter (formscan_init_whole) */
    bool model_known;      /* whole scans: the model field is complete, the rest still read */
    enum formscan_status status;
    const char *error; /* static text, for FORMSCAN_INVALID */
    uint64_t error_offset;
    uint32_t header_bytes; /* of the current part */
    size_t line_len;
    size_t value_len;
    char delim[FORMSCAN_DELIM_MAX];
    uint8_t fail[FORMSCAN_DELIM_MAX]; /* KMP failure function of delim */
    char line[FORMSCAN_LINE_MAX];
    char value[FORMSCAN_MODEL_MAX + FORMSCAN_DELIM_MAX + 1];
};

/* The boundary parameter of a Content-Type value, unquoted, into out (at
 * least FORMSCAN_BOUNDARY_MAX + 1 bytes, NUL-terminated). Returns its length,
 * or 0 when the type is not multipart/form-data or has no valid boundary. */
size_t formscan_boundary(const char *content_type, size_t len, char *out);
/* Starts a scan for a body with this boundary (1..FORMSCAN_BOUNDARY_MAX bytes). */
void formscan_init(struct formscan *s, const char *boundary, size_t len);
/* The same, reading the whole form: formscan_feed reports FORMSCAN_MODEL as
 * soon as the model is known and keeps reading; FORMSCAN_INVALID or
 * FORMSCAN_DUPLICATE_MODEL may still follow, and formscan_finish says
 * FORMSCAN_MODEL only for a form that closed. */
void formscan_init_whole(struct formscan *s, const char *boundary, size_t len);
/* Feeds the next piece. Returns FORMSCAN_MORE until the answer is known,
 * then that answer (later calls change nothing, but for a whole scan's
 * FORMSCAN_MODEL: see above). */
enum formscan_status formscan_feed(struct formscan *s, const char *data, size_t len);
/* The body ended: the final answer, never FORMSCAN_MORE. */
enum formscan_status formscan_finish(struct formscan *s);
/* The model name (NUL-terminated; *len excludes the NUL) after FORMSCAN_MODEL. */
const char *formscan_model(const struct formscan *s, size_t *len);
/* Writes "<what> at byte <n>" for FORMSCAN_INVALID into out. */
void formscan_error(const struct formscan *s, char *out, size_t outlen);

#endif

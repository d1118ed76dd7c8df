#include "thaw/jsonscan.h"
#include "thaw/utf8.h"

#include <stdio.h>
#include <string.h>

enum scan_state {
    S_START,     /* before the top-level value: it must be an object */
    S_OBJ_FIRST, /* after '{': a key or '}' */
    S_OBJ_KEY,   /* after ',' in an object: a key */
    S_COLON,     /* after a key */
    S_VALUE,     /* after ':' or ',' in an array */
    S_ARR_FIRST, /* after '[': a value or ']' */
    S_AFTER,     /* after a value: ',' or the container's closing bracket */
    S_DONE,      /* the top-level object closed: only whitespace may follow */
    S_STR,
    S_STR_ESC,
    S_STR_HEX,
    S_NUM_MINUS, /* '-' read: a digit must follow */
    S_NUM_ZERO,  /* a leading 0: '.', an exponent or the end */
    S_NUM_INT,
    S_NUM_FRAC0, /* '.' read: a digit must follow */
    S_NUM_FRAC,
    S_NUM_EXP0,  /* 'e' read: a sign or digit */
    S_NUM_EXPSIGN,
    S_NUM_EXP,
    S_LITERAL,
};

enum str_kind {
    STR_VALUE,   /* skipped */
    STR_KEY,     /* a key of a nested object: skipped */
    STR_TOP_KEY, /* a key of the top-level object: compared with "model" */
    STR_MODEL,   /* the value of the first top-level "model": kept */
};

static void init_key(struct jsonscan *s, const char *key)
{
    memset(s, 0, offsetof(struct jsonscan, model));
    s->key = key;
    s->key_len = (uint8_t)strlen(key);
    s->state = S_START;
    s->status = JSONSCAN_MORE;
    s->model[0] = '\0';
}

void jsonscan_init(struct jsonscan *s)
{
    init_key(s, "model");
}

void jsonscan_init_whole(struct jsonscan *s)
{
    jsonscan_init(s);
    s->whole = true;
}

void jsonscan_init_strict(struct jsonscan *s)
{
    jsonscan_init_whole(s);
    s->strict = true;
}

static enum jsonscan_status fail(struct jsonscan *s, const char *why)
{
    s->status = JSONSCAN_INVALID;
    s->error = why;
    s->error_offset = s->offset;
    return s->status;
}

static bool is_ws(unsigned char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static bool in_object(const struct jsonscan *s)
{
    uint32_t d = s->depth - 1;
    return (s->kinds[d / 64] >> (d % 64)) & 1u;
}

static enum jsonscan_status push(struct jsonscan *s, bool object)
{
    if (s->depth == JSONSCAN_DEPTH_MAX) {
        return fail(s, "nesting too deep");
    }
    uint32_t d = s->depth++;
    uint64_t bit = (uint64_t)1 << (d % 64);
    if (object) {
        s->kinds[d / 64] |= bit;
    } else {
        s->kinds[d / 64] &= ~bit;
    }
    s->state = object ? S_OBJ_FIRST : S_ARR_FIRST;
    return JSONSCAN_MORE;
}

static void pop(struct jsonscan *s)
{
    s->depth--;
    s->state = s->depth == 0 ? S_DONE : S_AFTER;
}

static void begin_string(struct jsonscan *s, enum str_kind kind)
{
    s->state = S_STR;
    s->str_kind = (uint8_t)kind;
    s->key_pos = 0;
    s->key_mismatch = false;
    s->stream_pos = 0;
    s->stream_mismatch = false;
    s->high_surrogate = 0;
}

/* One decoded character of the current string (a code point, or a raw
 * byte of UTF-8 that arrived unescaped). */
static enum jsonscan_status emit(struct jsonscan *s, uint32_t cp, bool raw_byte)
{
    if (s->str_kind == STR_TOP_KEY) {
        if (!s->key_mismatch && s->key_pos < s->key_len &&
            cp == (unsigned char)s->key[s->key_pos]) {
            s->key_pos++;
        } else {
            s->key_mismatch = true;
        }
        static const char stream[] = "stream";
        if (!s->stream_mismatch && s->stream_pos < sizeof stream - 1 &&
            cp == (unsigned char)stream[s->stream_pos]) {
            s->stream_pos++;
        } else {
            s->stream_mismatch = true;
        }
        return JSONSCAN_MORE;
    }
    if (s->str_kind != STR_MODEL) {
        return JSONSCAN_MORE;
    }
    char u[4];
    size_t n;
    if (raw_byte || cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (s->model_len + n > JSONSCAN_MODEL_MAX) {
        s->status = JSONSCAN_MODEL_TOO_LONG;
        return s->status;
    }
    memcpy(s->model + s->model_len, u, n);
    s->model_len += n;
    s->model[s->model_len] = '\0';
    return JSONSCAN_MORE;
}

/* A high surrogate not followed by a low one stands alone: as Python's json
 * keeps it (JavaScript's JSON.stringify writes one for a string cut inside
 * a character), in the 3-byte form no UTF-8 name can equal. */
static enum jsonscan_status flush_high_surrogate(struct jsonscan *s)
{
    uint32_t high = s->high_surrogate;
    s->high_surrogate = 0;
    if (high && s->strict) {
        return fail(s, "a lone surrogate in a string");
    }
    return high ? emit(s, high, false) : JSONSCAN_MORE;
}

static enum jsonscan_status end_string(struct jsonscan *s)
{
    if (flush_high_surrogate(s) != JSONSCAN_MORE) {
        return s->status;
    }
    switch (s->str_kind) {
    case STR_TOP_KEY: {
        bool is_key = !s->key_mismatch && s->key_pos == s->key_len;
        if (is_key && s->model_seen && s->whole) {
            s->status = JSONSCAN_DUPLICATE_MODEL;
            s->error_offset = s->offset;
            return s->status;
        }
        s->key_is_model = is_key && !s->model_seen;
        s->key_is_stream = s->whole && !s->stream_mismatch && s->stream_pos == 6;
        if (s->key_is_model) {
            s->model_seen = true;
        }
        s->state = S_COLON;
        break;
    }
    case STR_KEY:
        s->state = S_COLON;
        break;
    case STR_MODEL:
        if (s->whole) {
            s->model_known = true;
            s->state = S_AFTER;
            break;
        }
        s->status = JSONSCAN_MODEL;
        return s->status;
    default:
        s->state = S_AFTER;
        break;
    }
    return JSONSCAN_MORE;
}

static enum jsonscan_status begin_value(struct jsonscan *s, unsigned char ch)
{
    bool for_model = s->key_is_model;
    s->key_is_model = false;
    if (for_model && ch != '"') {
        s->model_not_string = true;
    }
    if (s->key_is_stream) {
        s->key_is_stream = false;
        s->stream = false; /* a later "stream" decides again */
        s->literal_for_stream = ch == 't';
    }
    switch (ch) {
    case '{':
        return push(s, true);
    case '[':
        return push(s, false);
    case '"':
        begin_string(s, for_model ? STR_MODEL : STR_VALUE);
        return JSONSCAN_MORE;
    case '-':
        s->state = S_NUM_MINUS;
        return JSONSCAN_MORE;
    case '0':
        s->state = S_NUM_ZERO;
        return JSONSCAN_MORE;
    case 't':
        s->literal = "true";
        break;
    case 'f':
        s->literal = "false";
        break;
    case 'n':
        s->literal = "null";
        break;
    case 'N': /* NaN and Infinity: Python's json takes them */
        s->literal = "NaN";
        if (s->strict) {
            return fail(s, "expected a JSON value");
        }
        break;
    case 'I':
        s->literal = "Infinity";
        if (s->strict) {
            return fail(s, "expected a JSON value");
        }
        break;
    default:
        if (ch >= '1' && ch <= '9') {
            s->state = S_NUM_INT;
            return JSONSCAN_MORE;
        }
        return fail(s, "expected a JSON value");
    }
    s->state = S_LITERAL;
    s->lit_pos = 1;
    return JSONSCAN_MORE;
}

static int hex_value(unsigned char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    if (ch >= 'A' && ch <= 'F') {
        return ch - 'A' + 10;
    }
    return -1;
}

static enum jsonscan_status end_unicode_escape(struct jsonscan *s)
{
    uint32_t code = s->code;
    s->state = S_STR;
    if (s->high_surrogate && code >= 0xDC00 && code <= 0xDFFF) {
        uint32_t cp = 0x10000 + ((s->high_surrogate - 0xD800) << 10) + (code - 0xDC00);
        s->high_surrogate = 0;
        return emit(s, cp, false);
    }
    if (flush_high_surrogate(s) != JSONSCAN_MORE) {
        return s->status;
    }
    if (code >= 0xD800 && code <= 0xDBFF) {
        s->high_surrogate = code;
        return JSONSCAN_MORE;
    }
    if (s->strict && code >= 0xDC00 && code <= 0xDFFF) {
        return fail(s, "a lone surrogate in a string");
    }
    return emit(s, code, false); /* a lone low surrogate too */
}

static enum jsonscan_status string_escape(struct jsonscan *s, unsigned char ch)
{
    static const char from[] = "\"\\/bfnrt";
    static const char to[] = "\"\\/\b\f\n\r\t";
    if (ch == 'u') {
        s->state = S_STR_HEX;
        s->hex_left = 4;
        s->code = 0;
        return JSONSCAN_MORE;
    }
    const char *p = ch ? strchr(from, ch) : NULL;
    if (!p) {
        return fail(s, "invalid escape in a string");
    }
    if (flush_high_surrogate(s) != JSONSCAN_MORE) {
        return s->status;
    }
    s->state = S_STR;
    return emit(s, (unsigned char)to[p - from], false);
}

static enum jsonscan_status string_char(struct jsonscan *s, unsigned char ch)
{
    if (s->utf8_more) {
        if (ch < s->utf8_lo || ch > s->utf8_hi) {
            return fail(s, "invalid UTF-8 in a string");
        }
        s->utf8_more--;
        s->utf8_lo = 0x80;
        s->utf8_hi = 0xbf;
        return emit(s, ch, true);
    }
    if (ch == '"') {
        return end_string(s);
    }
    if (ch == '\\') {
        s->state = S_STR_ESC;
        return JSONSCAN_MORE;
    }
    if (ch < 0x20) {
        return fail(s, "control character in a string");
    }
    if (flush_high_surrogate(s) != JSONSCAN_MORE) {
        return s->status;
    }
    if (ch >= 0x80 && !utf8_lead(ch, &s->utf8_more, &s->utf8_lo, &s->utf8_hi)) {
        return fail(s, "invalid UTF-8 in a string");
    }
    if (ch == 0xed && !s->strict) {
        s->utf8_hi = 0xbf; /* an encoded surrogate: Python decodes with surrogatepass */
    }
    return emit(s, ch, true);
}

/* Number grammar; returns true when ch belongs to the number. A character
 * that ends a complete number is handed back to the structural states. */
static bool number_char(struct jsonscan *s, unsigned char ch, bool *bad)
{
    bool digit = ch >= '0' && ch <= '9';
    *bad = false;
    switch (s->state) {
    case S_NUM_MINUS:
        if (digit) {
            s->state = ch == '0' ? S_NUM_ZERO : S_NUM_INT;
            return true;
        }
        *bad = true;
        return false;
    case S_NUM_INT:
        if (digit) {
            return true;
        }
        /* fall through */
    case S_NUM_ZERO:
        if (ch == '.') {
            s->state = S_NUM_FRAC0;
            return true;
        }
        if (ch == 'e' || ch == 'E') {
            s->state = S_NUM_EXP0;
            return true;
        }
        return false;
    case S_NUM_FRAC0:
        if (digit) {
            s->state = S_NUM_FRAC;
            return true;
        }
        *bad = true;
        return false;
    case S_NUM_FRAC:
        if (digit) {
            return true;
        }
        if (ch == 'e' || ch == 'E') {
            s->state = S_NUM_EXP0;
            return true;
        }
        return false;
    case S_NUM_EXP0:
        if (ch == '+' || ch == '-') {
            s->state = S_NUM_EXPSIGN;
            return true;
        }
        /* fall through */
    case S_NUM_EXPSIGN:
        if (digit) {
            s->state = S_NUM_EXP;
            return true;
        }
        *bad = true;
        return false;
    default: /* S_NUM_EXP */
        return digit;
    }
}

/* One byte outside the fast paths. */
static enum jsonscan_status step(struct jsonscan *s, unsigned char ch)
{
    if (s->state == S_NUM_MINUS && ch == 'I' && !s->strict) {
        s->state = S_LITERAL; /* -Infinity */
        s->literal = "Infinity";
        s->lit_pos = 1;
        return JSONSCAN_MORE;
    }
    if (s->state == S_START && s->offset < 3 && ch == (unsigned char)"\xef\xbb\xbf"[s->offset] &&
        (s->offset == 0 || s->bom)) {
        s->bom = true; /* a UTF-8 byte order mark, which Python's json skips */
        return JSONSCAN_MORE;
    }
    if (s->state == S_START && s->bom && s->offset < 3) {
        return fail(s, "the body is not a JSON object");
    }
    switch (s->state) {
    case S_STR:
        return string_char(s, ch);
    case S_STR_ESC:
        return string_escape(s, ch);
    case S_STR_HEX: {
        int v = hex_value(ch);
        if (v < 0) {
            return fail(s, "invalid \\u escape in a string");
        }
        s->code = (s->code << 4) | (uint32_t)v;
        return --s->hex_left == 0 ? end_unicode_escape(s) : JSONSCAN_MORE;
    }
    case S_LITERAL:
        if (ch != (unsigned char)s->literal[s->lit_pos]) {
            return fail(s, "invalid literal (true, false or null expected)");
        }
        if (s->literal[++s->lit_pos] == '\0') {
            s->state = S_AFTER;
            s->stream = s->stream || s->literal_for_stream;
            s->literal_for_stream = false;
        }
        return JSONSCAN_MORE;
    case S_NUM_MINUS:
    case S_NUM_ZERO:
    case S_NUM_INT:
    case S_NUM_FRAC0:
    case S_NUM_FRAC:
    case S_NUM_EXP0:
    case S_NUM_EXPSIGN:
    case S_NUM_EXP: {
        bool bad;
        if (number_char(s, ch, &bad)) {
            return JSONSCAN_MORE;
        }
        if (bad) {
            return fail(s, "invalid number");
        }
        s->state = S_AFTER; /* the number ended: ch is structural */
        return step(s, ch);
    }
    default:
        break;
    }
    if (is_ws(ch)) {
        return JSONSCAN_MORE;
    }
    switch (s->state) {
    case S_START:
        if (ch != '{') {
            return fail(s, "the body is not a JSON object");
        }
        return push(s, true);
    case S_OBJ_FIRST:
        if (ch == '}') {
            pop(s);
            return JSONSCAN_MORE;
        }
        /* fall through */
    case S_OBJ_KEY:
        if (ch != '"') {
            return fail(s, "expected a string key");
        }
        begin_string(s, s->depth == 1 ? STR_TOP_KEY : STR_KEY);
        return JSONSCAN_MORE;
    case S_COLON:
        if (ch != ':') {
            return fail(s, "expected ':' after a key");
        }
        s->state = S_VALUE;
        return JSONSCAN_MORE;
    case S_ARR_FIRST:
        if (ch == ']') {
            pop(s);
            return JSONSCAN_MORE;
        }
        /* fall through */
    case S_VALUE:
        return begin_value(s, ch);
    case S_AFTER:
        if (ch == ',') {
            s->state = in_object(s) ? S_OBJ_KEY : S_VALUE;
            return JSONSCAN_MORE;
        }
        if (ch == (in_object(s) ? '}' : ']')) {
            pop(s);
            return JSONSCAN_MORE;
        }
        return fail(s, in_object(s) ? "expected ',' or '}'" : "expected ',' or ']'");
    default: /* S_DONE */
        return fail(s, "unexpected data after the JSON object");
    }
}

/* Skipped string content: everything up to a quote, a backslash, a control
 * character, or bytes that are not whole UTF-8 characters (invalid, or cut
 * by the piece's end: step() reads those), in one go. */
static size_t skip_plain(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char ch = p[i];
        if (ch < 0x80) {
            if (ch < 0x20 || ch == '"' || ch == '\\') {
                break;
            }
            i++;
            continue;
        }
        size_t len = utf8_sequence(p + i, n - i);
        if (len == 0) {
            break;
        }
        i += len;
    }
    return i;
}

enum jsonscan_status jsonscan_feed(struct jsonscan *s, const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i = 0;
    while (i < len && s->status == JSONSCAN_MORE) {
        if (s->state == S_STR && s->str_kind <= STR_KEY && !s->high_surrogate &&
            !s->utf8_more) {
            size_t k = skip_plain(p + i, len - i);
            i += k;
            s->offset += k;
            if (i == len) {
                break;
            }
        }
        enum jsonscan_status st = step(s, p[i]);
        if (st != JSONSCAN_INVALID) {
            s->offset++;
        }
        i++;
    }
    return s->status == JSONSCAN_MORE && s->model_known ? JSONSCAN_MODEL : s->status;
}

enum jsonscan_status jsonscan_finish(struct jsonscan *s)
{
    if (s->status != JSONSCAN_MORE) {
        return s->status;
    }
    if (s->state == S_DONE) {
        s->status = s->model_known ? JSONSCAN_MODEL : JSONSCAN_NO_MODEL;
        return s->status;
    }
    return fail(s, s->offset == 0 ? "the body is empty" : "the body ends before the JSON does");
}

const char *jsonscan_model(const struct jsonscan *s, size_t *len)
{
    *len = s->model_len;
    return s->model;
}

void jsonscan_error(const struct jsonscan *s, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s at byte %llu", s->error ? s->error : "invalid JSON",
             (unsigned long long)s->error_offset);
}

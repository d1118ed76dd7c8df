#include "thaw/formscan.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

enum form_state {
    F_PREAMBLE,    /* before the first delimiter */
    F_AFTER_DELIM, /* after a delimiter: "--" (the form ends) or CRLF */
    F_CLOSE,       /* one '-' of the closing "--" read */
    F_DELIM_CR,    /* the CR ending a delimiter line read */
    F_HEADERS,     /* a part's header lines */
    F_DATA,        /* a part's data, up to the next delimiter */
    F_DONE,
};

static bool is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* Case-insensitive: does [p, p+n) start with lit? */
static bool starts_with(const char *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n >= l && strncasecmp(p, lit, l) == 0;
}

/* RFC 9110's tchar: what a parameter's key or unquoted value may hold. Any
 * other byte outside a quoted string is refused: Python strips \xa0, \x85
 * and \x1c-\x1f from keys and values as whitespace, so "\xa0name=model"
 * is its name parameter and not one here. */
static bool is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

#define PARAM_BAD ((size_t)-1)

/* One parameter value at p (a token, or a quoted-string), into out (cap
 * bytes with the NUL). Returns the bytes consumed, or PARAM_BAD when
 * malformed or longer than cap - 1; *outlen gets the value's length.
 * Parsers differ on quoted-pairs (python-multipart's quote counting takes
 * the quote of \\" as escaped; RFC 9110 reads \\m as m) and on a value in
 * <...> (older ones strip the brackets). So a backslash before a quote is
 * malformed in any value, and any backslash in the value looked for (a
 * filename keeps its Windows path's backslashes); so are bytes after the
 * closing quote and a bracketed value. */
static size_t param_value(const char *p, size_t n, bool wanted, char *out, size_t cap,
                          size_t *outlen)
{
    size_t i = 0, o = 0;
    if (n > 0 && p[0] == '"') {
        for (i = 1; i < n && p[i] != '"'; i++) {
            if ((p[i] == '\\' && (wanted || (i + 1 < n && p[i + 1] == '"'))) || o + 1 >= cap) {
                return PARAM_BAD;
            }
            out[o++] = p[i];
        }
        if (i >= n) {
            return PARAM_BAD; /* unterminated */
        }
        i++;
    } else {
        for (; i < n && p[i] != ';' && !is_ows(p[i]); i++) {
            if (!is_tchar(p[i]) || o + 1 >= cap) {
                return PARAM_BAD; /* a quote here opens a string for some parsers */
            }
            out[o++] = p[i];
        }
    }
    size_t j = i;
    while (j < n && is_ows(p[j])) {
        j++;
    }
    if (j < n && p[j] != ';') {
        return PARAM_BAD; /* name="model"x, name=model x */
    }
    out[o] = '\0';
    *outlen = o;
    if (o >= 2 && out[0] == '<' && out[o - 1] == '>') {
        return PARAM_BAD;
    }
    return i;
}

enum param_found { PARAM_ABSENT, PARAM_FOUND, PARAM_MALFORMED };

/* Walks "; key=value" parameters from p for the one named key (case-
 * insensitive): its value into out (cap bytes with the NUL). A key given
 * twice (a bare "key" too: Python reads it as key=""), or also in RFC
 * 2231's extended forms (key*=, key*0=), is PARAM_MALFORMED: parsers differ
 * on which one counts (python-multipart's dict keeps the last). So is a key
 * that is not a token. */
static enum param_found find_param(const char *p, size_t n, const char *key, char *out, size_t cap,
                                   size_t *outlen)
{
    size_t i = 0, klen = strlen(key);
    enum param_found found = PARAM_ABSENT;
    while (i < n) {
        while (i < n && (is_ows(p[i]) || p[i] == ';')) {
            i++;
        }
        size_t k = i;
        while (i < n && p[i] != '=' && p[i] != ';') {
            i++;
        }
        size_t kend = i;
        while (kend > k && is_ows(p[kend - 1])) {
            kend--;
        }
        for (size_t c = k; c < kend; c++) {
            if (!is_tchar(p[c])) {
                return PARAM_MALFORMED; /* x"="abc; name=model; y=" reads two ways */
            }
        }
        bool same = kend - k >= klen && strncasecmp(p + k, key, klen) == 0;
        if (same && kend - k > klen && p[k + klen] == '*') {
            return PARAM_MALFORMED; /* name*=, name*0=, and a bare name* (Python: name="") */
        }
        if (i >= n || p[i] != '=') {
            if (same && kend - k == klen) {
                return PARAM_MALFORMED; /* a bare "name" */
            }
            continue; /* another parameter without a value */
        }
        if (kend == k) {
            return PARAM_MALFORMED; /* "=model": no key */
        }
        i++;
        while (i < n && is_ows(p[i])) {
            i++;
        }
        bool wanted = same && kend - k == klen;
        if (wanted && found == PARAM_FOUND) {
            return PARAM_MALFORMED;
        }
        char scratch[FORMSCAN_LINE_MAX];
        size_t vlen = 0;
        size_t used = param_value(p + i, n - i, wanted, wanted ? out : scratch,
                                  wanted ? cap : sizeof scratch, &vlen);
        if (used == PARAM_BAD) {
            return PARAM_MALFORMED; /* where the next parameter starts is in doubt */
        }
        if (wanted) {
            *outlen = vlen;
            found = PARAM_FOUND;
        }
        i += used;
        while (i < n && p[i] != ';') {
            i++;
        }
    }
    return found;
}

size_t formscan_boundary(const char *ct, size_t len, char *out)
{
    static const char type[] = "multipart/form-data";
    while (len > 0 && is_ows(*ct)) {
        ct++, len--;
    }
    /* In lower case, as clients write it (Starlette compares it as such and
     * reads no form otherwise). */
    if (len < sizeof type - 1 || memcmp(ct, type, sizeof type - 1) != 0) {
        return 0;
    }
    size_t i = sizeof type - 1;
    while (i < len && is_ows(ct[i])) {
        i++;
    }
    if (i < len && ct[i] != ';') {
        return 0; /* "multipart/form-datax" */
    }
    size_t blen = 0;
    if (find_param(ct + i, len - i, "boundary", out, FORMSCAN_BOUNDARY_MAX + 1, &blen) !=
            PARAM_FOUND ||
        blen == 0 || out[blen - 1] == ' ') {
        return 0;
    }
    /* A charset decodes the field names for some parsers (Starlette): one
     * other than UTF-8 could make another field "model". */
    char charset[32];
    size_t clen = 0;
    enum param_found cs = find_param(ct + i, len - i, "charset", charset, sizeof charset, &clen);
    if (cs == PARAM_MALFORMED || (cs == PARAM_FOUND && strcasecmp(charset, "utf-8") != 0 &&
                                  strcasecmp(charset, "utf8") != 0)) {
        return 0;
    }
    for (size_t j = 0; j < blen; j++) {
        unsigned char ch = (unsigned char)out[j];
        if (ch < 0x20 || ch > 0x7e) {
            return 0;
        }
    }
    return blen;
}

void formscan_init(struct formscan *s, const char *boundary, size_t len)
{
    memset(s, 0, offsetof(struct formscan, delim));
    if (len > FORMSCAN_BOUNDARY_MAX) {
        len = FORMSCAN_BOUNDARY_MAX;
    }
    memcpy(s->delim, "\r\n--", 4);
    memcpy(s->delim + 4, boundary, len);
    s->delim_len = (uint8_t)(len + 4);
    /* KMP failure function: fail[i] is the longest proper prefix of
     * delim[0..i] that is also its suffix. */
    s->fail[0] = 0;
    for (size_t i = 1, k = 0; i < s->delim_len; i++) {
        while (k > 0 && s->delim[i] != s->delim[k]) {
            k = s->fail[k - 1];
        }
        if (s->delim[i] == s->delim[k]) {
            k++;
        }
        s->fail[i] = (uint8_t)k;
    }
    s->state = F_PREAMBLE;
    /* The first delimiter may open the body: as if a CRLF came before it. */
    s->matched = 2;
    s->status = len ? FORMSCAN_MORE : FORMSCAN_INVALID;
    s->error = len ? NULL : "empty boundary";
}

void formscan_init_whole(struct formscan *s, const char *boundary, size_t len)
{
    formscan_init(s, boundary, len);
    s->whole = true;
}

static enum formscan_status fail(struct formscan *s, const char *why)
{
    s->status = FORMSCAN_INVALID;
    s->error = why;
    s->error_offset = s->offset;
    s->state = F_DONE;
    return s->status;
}

static enum formscan_status answer(struct formscan *s, enum formscan_status st)
{
    s->status = st;
    s->state = F_DONE;
    return st;
}

/* One byte against the delimiter; true when it completes it. */
static bool delim_step(struct formscan *s, char ch)
{
    size_t k = s->matched;
    while (k > 0 && ch != s->delim[k]) {
        k = s->fail[k - 1];
    }
    if (ch == s->delim[k]) {
        k++;
    }
    if (k == s->delim_len) {
        s->matched = 0;
        return true;
    }
    s->matched = (uint8_t)k;
    return false;
}

/* A complete part-header line (CR stripped): notes whether the part is the
 * form field named "model". Returns why the line makes the part's name
 * ambiguous, or NULL. */
static const char *header_line(struct formscan *s, const char *line, size_t n)
{
    static const char cd[] = "content-disposition:";
    if (is_ows(line[0])) {
        return "folded part header line"; /* obs-fold: parsers differ */
    }
    if (!starts_with(line, n, cd)) {
        return NULL;
    }
    if (s->disposition_seen) {
        return "two Content-Disposition headers in a part";
    }
    s->disposition_seen = true;
    size_t i = sizeof cd - 1;
    while (i < n && is_ows(line[i])) {
        i++;
    }
    /* RFC 7578 4.2: form-data, always. Some parsers (python-multipart) read
     * the name of any disposition, others none but form-data's. */
    size_t t = sizeof "form-data" - 1;
    if (!starts_with(line + i, n - i, "form-data")) {
        return "a part's Content-Disposition is not form-data";
    }
    i += t;
    size_t after = i;
    while (after < n && is_ows(line[after])) {
        after++;
    }
    if (after < n && line[after] != ';') {
        /* "form-datax", or "form-data name=model" (no ';': Python reads
         * it all as the disposition's type, with no name) */
        return "a part's Content-Disposition is not form-data";
    }
    char name[FORMSCAN_LINE_MAX]; /* any value the line can hold */
    size_t nlen = 0;
    enum param_found f = find_param(line + i, n - i, "name", name, sizeof name, &nlen);
    if (f == PARAM_MALFORMED) {
        return "ambiguous name parameter in a part's Content-Disposition";
    }
    s->part_is_model = f == PARAM_FOUND && nlen == 5 && memcmp(name, "model", 5) == 0;
    /* A form parser hands the server a file there, not the model's name. */
    if (s->part_is_model &&
        find_param(line + i, n - i, "filename", name, sizeof name, &nlen) != PARAM_ABSENT) {
        return "the model field is a file (it has a filename)";
    }
    return NULL;
}

static enum formscan_status headers_byte(struct formscan *s, char ch)
{
    if (++s->header_bytes > FORMSCAN_HEADERS_MAX) {
        return fail(s, "part headers too long");
    }
    bool after_cr = s->line_len > 0 && s->line[s->line_len - 1] == '\r';
    if (ch != '\n') {
        if (after_cr) {
            return fail(s, "a CR without LF in part headers");
        }
        if (s->line_len == FORMSCAN_LINE_MAX) {
            return fail(s, "part header line too long");
        }
        s->line[s->line_len++] = ch;
        return FORMSCAN_MORE;
    }
    /* CRLF only: python-multipart ends a line at CR, others at LF. */
    if (!after_cr) {
        return fail(s, "part header line not ended by CRLF");
    }
    size_t n = s->line_len - 1;
    s->line_len = 0;
    if (n > 0) {
        const char *why = header_line(s, s->line, n);
        return why ? fail(s, why) : FORMSCAN_MORE;
    }
    if (s->part_is_model && s->model_known) {
        return answer(s, FORMSCAN_DUPLICATE_MODEL);
    }
    s->state = F_DATA; /* the empty line: the data follows */
    s->matched = 0;
    if (!s->model_known) {
        s->value_len = 0;
    }
    return FORMSCAN_MORE;
}

static enum formscan_status data_byte(struct formscan *s, char ch)
{
    if (s->part_is_model) {
        if (s->value_len == sizeof s->value - 1) {
            return answer(s, FORMSCAN_MODEL_TOO_LONG);
        }
        s->value[s->value_len++] = ch;
    }
    if (!delim_step(s, ch)) {
        return FORMSCAN_MORE;
    }
    if (s->part_is_model) {
        s->value_len -= s->delim_len;
        s->value[s->value_len] = '\0';
        if (s->value_len > FORMSCAN_MODEL_MAX || !s->whole) {
            return answer(s, s->value_len > FORMSCAN_MODEL_MAX ? FORMSCAN_MODEL_TOO_LONG
                                                               : FORMSCAN_MODEL);
        }
        s->model_known = true;
        s->part_is_model = false;
    }
    s->state = F_AFTER_DELIM;
    return FORMSCAN_MORE;
}

static enum formscan_status step(struct formscan *s, char ch)
{
    switch (s->state) {
    case F_PREAMBLE:
        if (delim_step(s, ch)) {
            s->state = F_AFTER_DELIM;
        }
        return FORMSCAN_MORE;
    case F_AFTER_DELIM:
        /* No transport padding (RFC 2046 allows it; python-multipart takes
         * a padded delimiter line for data, so the parts would differ). */
        if (ch == '-') {
            s->state = F_CLOSE;
        } else if (ch == '\r') {
            s->state = F_DELIM_CR;
        } else {
            return fail(s, "unexpected byte after a boundary");
        }
        return FORMSCAN_MORE;
    case F_CLOSE:
        if (ch != '-') {
            return fail(s, "unexpected byte after a boundary");
        }
        /* the closing delimiter */
        return answer(s, s->model_known ? FORMSCAN_MODEL : FORMSCAN_NO_MODEL);
    case F_DELIM_CR:
        if (ch != '\n') {
            return fail(s, "boundary line not ended by CRLF");
        }
        s->state = F_HEADERS;
        s->line_len = 0;
        s->header_bytes = 0;
        s->part_is_model = false;
        s->disposition_seen = false;
        return FORMSCAN_MORE;
    case F_HEADERS:
        return headers_byte(s, ch);
    case F_DATA:
        return data_byte(s, ch);
    default:
        return s->status;
    }
}

/* Bytes before the next CR, in a state where nothing but a delimiter
 * matters and none is partly matched: they cannot start one ("\r\n--"). */
static size_t skippable(const struct formscan *s, const char *p, size_t n)
{
    bool skipping = s->state == F_PREAMBLE || (s->state == F_DATA && !s->part_is_model);
    if (!skipping || s->matched != 0) {
        return 0;
    }
    const char *cr = memchr(p, '\r', n);
    return cr ? (size_t)(cr - p) : n;
}

enum formscan_status formscan_feed(struct formscan *s, const char *data, size_t len)
{
    size_t i = 0;
    while (i < len && s->status == FORMSCAN_MORE) {
        size_t skip = skippable(s, data + i, len - i);
        i += skip;
        s->offset += skip;
        if (i == len) {
            break;
        }
        step(s, data[i]);
        s->offset++;
        i++;
    }
    return s->status == FORMSCAN_MORE && s->model_known ? FORMSCAN_MODEL : s->status;
}

enum formscan_status formscan_finish(struct formscan *s)
{
    if (s->status != FORMSCAN_MORE) {
        return s->status;
    }
    return fail(s, s->state == F_PREAMBLE ? "no boundary line in the body"
                                          : "the body ends inside the form");
}

const char *formscan_model(const struct formscan *s, size_t *len)
{
    *len = s->value_len;
    return s->value;
}

void formscan_error(const struct formscan *s, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s at byte %llu", s->error ? s->error : "invalid form",
             (unsigned long long)s->error_offset);
}

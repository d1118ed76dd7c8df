/* libFuzzer target: the multipart/form-data model scan (formscan).
 * The first input byte picks the piece size, the next one the boundary's
 * length (its bytes follow); the rest is the body. The answer must not depend
 * on how the body is cut, must never be "more" after finish, and a model
 * found must lie within the bound; the same for a whole scan, which must
 * agree with the plain one up to the model. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/formscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static enum formscan_status run(const char *boundary, size_t blen, const char *body, size_t len,
                                size_t step, bool whole, struct formscan *s)
{
    if (whole) {
        formscan_init_whole(s, boundary, blen);
    } else {
        formscan_init(s, boundary, blen);
    }
    enum formscan_status st = FORMSCAN_MORE;
    bool more = true;
    for (size_t at = 0; at < len && more; at += step) {
        st = formscan_feed(s, body + at, len - at < step ? len - at : step);
        more = st == FORMSCAN_MORE || (whole && st == FORMSCAN_MODEL);
    }
    return more ? formscan_finish(s) : st;
}

static void check_model(const struct formscan *a, const struct formscan *b)
{
    size_t na, nb;
    const char *ma = formscan_model(a, &na);
    const char *mb = formscan_model(b, &nb);
    if (na > FORMSCAN_MODEL_MAX || na != nb || memcmp(ma, mb, na) != 0 || ma[na] != '\0') {
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    size_t step = (size_t)(data[0] % 64) + 1;
    size_t blen = (size_t)(data[1] % FORMSCAN_BOUNDARY_MAX) + 1;
    if (size < 2 + blen) {
        return 0;
    }
    const char *boundary = (const char *)data + 2;
    const char *body = boundary + blen;
    size_t len = size - 2 - blen;
    static struct formscan a, b, wa, wb;
    enum formscan_status sa = run(boundary, blen, body, len, step, false, &a);
    enum formscan_status sb = run(boundary, blen, body, len, len ? len : 1, false, &b);
    if (sa == FORMSCAN_MORE || sa != sb || a.offset != b.offset) {
        __builtin_trap();
    }
    if (sa == FORMSCAN_MODEL) {
        check_model(&a, &b);
    }
    enum formscan_status wsa = run(boundary, blen, body, len, step, true, &wa);
    enum formscan_status wsb = run(boundary, blen, body, len, len ? len : 1, true, &wb);
    if (wsa == FORMSCAN_MORE || wsa != wsb || wa.offset != wb.offset) {
        __builtin_trap();
    }
    /* A whole scan that kept a model found the plain scan's. */
    if (wsa == FORMSCAN_MODEL) {
        check_model(&wa, &wb);
        if (sa != FORMSCAN_MODEL) {
            __builtin_trap();
        }
        check_model(&wa, &a);
    }
    /* The Content-Type parser on the same bytes. */
    char out[FORMSCAN_BOUNDARY_MAX + 1];
    size_t n = formscan_boundary((const char *)data, size, out);
    if (n > FORMSCAN_BOUNDARY_MAX || (n && out[n] != '\0')) {
        __builtin_trap();
    }
    return 0;
}

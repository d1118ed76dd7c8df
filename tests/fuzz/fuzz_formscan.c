/* libFuzzer target: the multipart/form-data model scan (formscan).
 * The first input byte picks the piece size, the next one the boundary's
 * length (its bytes follow); the rest is the body. The answer must not depend
 * on how the body is cut, must never be "more" after finish, and a model
 * found must lie within the bound. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/formscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static enum formscan_status run(const char *boundary, size_t blen, const char *body, size_t len,
                                size_t step, struct formscan *s)
{
    formscan_init(s, boundary, blen);
    enum formscan_status st = FORMSCAN_MORE;
    for (size_t at = 0; at < len && st == FORMSCAN_MORE; at += step) {
        st = formscan_feed(s, body + at, len - at < step ? len - at : step);
    }
    return st == FORMSCAN_MORE ? formscan_finish(s) : st;
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
    static struct formscan a, b;
    enum formscan_status sa = run(boundary, blen, body, len, step, &a);
    enum formscan_status sb = run(boundary, blen, body, len, len ? len : 1, &b);
    if (sa == FORMSCAN_MORE || sa != sb || a.offset != b.offset) {
        __builtin_trap();
    }
    if (sa == FORMSCAN_MODEL) {
        size_t na, nb;
        const char *ma = formscan_model(&a, &na);
        const char *mb = formscan_model(&b, &nb);
        if (na > FORMSCAN_MODEL_MAX || na != nb || memcmp(ma, mb, na) != 0 || ma[na] != '\0') {
            __builtin_trap();
        }
    }
    /* The Content-Type parser on the same bytes. */
    char out[FORMSCAN_BOUNDARY_MAX + 1];
    size_t n = formscan_boundary((const char *)data, size, out);
    if (n > FORMSCAN_BOUNDARY_MAX || (n && out[n] != '\0')) {
        __builtin_trap();
    }
    return 0;
}

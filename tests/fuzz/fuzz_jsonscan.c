/* libFuzzer target: the JSON body scan (jsonscan), plain and whole.
 * The first input byte picks the piece size; the rest is the body. The
 * answer must not depend on how the body is cut, must never be "more" after
 * finish, and a model found must lie within the bound; a whole scan must
 * agree with the plain one about the model, and differ only by reading on
 * (a second "model", or the rest not being JSON). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/jsonscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static enum jsonscan_status run(const char *body, size_t len, size_t step, bool whole,
                                struct jsonscan *s)
{
    if (whole) {
        jsonscan_init_whole(s);
    } else {
        jsonscan_init(s);
    }
    enum jsonscan_status st = JSONSCAN_MORE;
    bool more = true;
    for (size_t at = 0; at < len && more; at += step) {
        st = jsonscan_feed(s, body + at, len - at < step ? len - at : step);
        more = st == JSONSCAN_MORE || (whole && st == JSONSCAN_MODEL);
    }
    return more ? jsonscan_finish(s) : st;
}

static void same_model(const struct jsonscan *a, const struct jsonscan *b)
{
    size_t na, nb;
    const char *ma = jsonscan_model(a, &na);
    const char *mb = jsonscan_model(b, &nb);
    if (na > JSONSCAN_MODEL_MAX || na != nb || memcmp(ma, mb, na) != 0 || ma[na] != '\0') {
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    size_t step = (size_t)(data[0] % 64) + 1;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    static struct jsonscan a, b, wa, wb;
    enum jsonscan_status sa = run(body, len, step, false, &a);
    enum jsonscan_status sb = run(body, len, len ? len : 1, false, &b);
    if (sa == JSONSCAN_MORE || sa != sb || a.offset != b.offset) {
        __builtin_trap();
    }
    if (sa == JSONSCAN_MODEL) {
        same_model(&a, &b);
    }
    enum jsonscan_status wsa = run(body, len, step, true, &wa);
    enum jsonscan_status wsb = run(body, len, len ? len : 1, true, &wb);
    if (wsa == JSONSCAN_MORE || wsa != wsb || wa.offset != wb.offset) {
        __builtin_trap();
    }
    if (wsa == JSONSCAN_MODEL) {
        /* Kept to the end: the plain scan found the same model. */
        same_model(&wa, &wb);
        if (sa != JSONSCAN_MODEL) {
            __builtin_trap();
        }
        same_model(&wa, &a);
    }
    /* A complete object without a string model reads the same whole, but
     * for a second "model" key after a first that was not a string. */
    if (sa == JSONSCAN_NO_MODEL && wsa != JSONSCAN_NO_MODEL && wsa != JSONSCAN_DUPLICATE_MODEL) {
        __builtin_trap();
    }
    return 0;
}

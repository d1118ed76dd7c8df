/* libFuzzer target: the request parser and the router.
 * The first input byte picks the read size the bytes arrive in, the rest is
 * the stream: every complete head is routed (and its path checked as a
 * /v1/models request), and bodies on body-routed paths go through the JSON
 * model lookup, or the multipart one on upload paths, as in the proxy. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "thaw/formscan.h"
#include "thaw/http.h"
#include "thaw/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct router router;
static int model_a, model_b;
static int ready;

static void setup(void)
{
    router_init(&router);
    const char *hosts[] = {"llm.example.com"};
    const char *aliases[] = {"meta-llama/Llama-3-8B"};
    struct route_names a = {"llama", "models", hosts, 1, aliases, 1};
    struct route_names b = {"mistral", "default", NULL, 0, NULL, 0};
    router_add(&router, &model_a, &a, NULL);
    router_add(&router, &model_b, &b, NULL);
    ready = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready) {
        setup();
    }
    if (size < 1) {
        return 0;
    }
    size_t step = (size_t)(data[0] % 64) + 1;
    const char *p = (const char *)data + 1;
    size_t left = size - 1;
    static const struct http_limits lim = {4096, 32, 8192};
    struct http_parser parser;
    struct http_head head;
    struct buf body;
    http_parser_init(&parser, HTTP_REQUEST, &lim);
    http_head_init(&head);
    buf_init(&body);
    http_parser_next(&parser, &head, &body);
    int messages = 0;
    size_t off = 0;
    int again = 0; /* a head or message just ended: run once more on no input */
    while (messages < 64) {
        size_t n = left - off < step ? left - off : step;
        if (n == 0 && !again) {
            break;
        }
        again = 0;
        size_t used = 0;
        enum http_event ev = http_parser_execute(&parser, p + off, n, &used);
        off += used;
        if (ev == HTTP_EV_ERROR) {
            break;
        }
        if (ev == HTTP_EV_HEAD) {
            struct route rt;
            enum route_status st = router_resolve_head(&router, &head, &rt);
            if (st == ROUTE_FOUND && rt.path_off + rt.path_len > head.target_len) {
                __builtin_trap(); /* the upstream path must lie inside the target */
            }
            if (rt.asked_off + rt.asked_len > head.target_len) {
                __builtin_trap();
            }
            char id[JSONSCAN_MODEL_MAX + 1];
            size_t idlen = 0;
            if (router_models_path(http_target(&head) + rt.path_off, rt.path_len, id, sizeof id,
                                   &idlen) == ROUTE_MODELS_ONE &&
                (idlen >= sizeof id || id[idlen] != '\0')) {
                __builtin_trap();
            }
            again = 1;
        } else if (ev == HTTP_EV_DONE) {
            struct route rt;
            if (router_resolve_head(&router, &head, &rt) == ROUTE_NEED_BODY) {
                const char *path = http_target(&head) + rt.path_off;
                const struct http_header *ct = http_head_find(&head, "content-type");
                char boundary[FORMSCAN_BOUNDARY_MAX + 1];
                size_t blen = 0;
                if (router_body_kind(path, rt.path_len) == ROUTE_BODY_FORM && ct &&
                    (blen = formscan_boundary(http_hvalue(&head, ct), ct->value_len, boundary))) {
                    static struct formscan form;
                    formscan_init_whole(&form, boundary, blen);
                    enum formscan_status fs =
                        formscan_feed(&form, body.data ? body.data : "", body.len);
                    if (fs == FORMSCAN_MORE || fs == FORMSCAN_MODEL) {
                        formscan_finish(&form);
                    }
                } else {
                    router_resolve_body(&router, body.data ? body.data : "", body.len, &rt);
                }
            }
            if (body.len > lim.max_body_bytes) {
                __builtin_trap();
            }
            messages++;
            buf_reset(&body);
            http_parser_next(&parser, &head, &body);
            again = 1;
        }
    }
    http_head_dispose(&head);
    buf_dispose(&body);
    return 0;
}

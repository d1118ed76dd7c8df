#include "thaw/metrics.h"

#include <stdbool.h>
#include <stdio.h>

static const struct reject_info reject_table[REJECT_COUNT] = {
    [REJECT_BAD_REQUEST] = {"bad_request", 400, false, "the request is not valid HTTP/1.1"},
    [REJECT_BAD_LENGTH] = {"bad_length", 400, false,
                           "conflicting or invalid Content-Length / Transfer-Encoding"},
    [REJECT_BAD_CHUNK] = {"bad_chunk", 400, false, "invalid chunked body"},
    [REJECT_HEADER_TOO_LARGE] = {"header_too_large", 431, false,
                                 "the request header block is over the limit"},
    [REJECT_TOO_MANY_HEADERS] = {"too_many_headers", 431, false,
                                 "the request has more header fields than allowed"},
    [REJECT_BODY_TOO_LARGE] = {"body_too_large", 413, false, "the request body is over the limit"},
    [REJECT_HEADER_TIMEOUT] = {"header_timeout", 408, false,
                               "the request header was not received in time"},
    [REJECT_BODY_TIMEOUT] = {"body_timeout", 408, false, "the request body was not received in time"},
    [REJECT_TOO_MANY_CONNECTIONS] = {"too_many_connections", 503, true,
                                     "thaw is at its connection limit"},
    [REJECT_UNKNOWN_MODEL] = {"model_not_found", 404, false,
                              "no model matches this request: name one in the body's "
                              "\"model\" field, the Host header or a /models/<name>/ path "
                              "prefix (GET /v1/models lists them)"},
    [REJECT_BAD_JSON] = {"bad_json", 400, false, "the request body is not a JSON object"},
    [REJECT_NO_MODEL_FIELD] = {"missing_model", 400, false,
                               "the request body has no string \"model\" field naming the "
                               "model to use"},
    [REJECT_BAD_PRIORITY] = {"bad_priority", 400, false,
                             "thaw-priority must be critical, standard or batch"},
    [REJECT_METHOD_NOT_ALLOWED] = {"method_not_allowed", 405, false,
                                   "this method is not supported"},
    [REJECT_EXPECTATION_FAILED] = {"expectation_failed", 417, false,
                                   "only Expect: 100-continue is supported"},
    [REJECT_QUEUE_FULL] = {"queue_full", 503, true,
                           "the model's queue is full; retry after Retry-After seconds"},
    [REJECT_QUEUE_DISPLACED] = {"queue_displaced", 503, true,
                                "displaced from a full queue by a critical request"},
    [REJECT_QUEUE_TIMEOUT] = {"queue_timeout", 504, false,
                              "no replica became free before the request's deadline"},
    [REJECT_NO_REPLICAS] = {"no_replicas", 503, true, "the model has no replica to serve it"},
    [REJECT_START_FAILED] = {"start_failed", 503, true,
                             "the model's server failed to start"},
    [REJECT_UPSTREAM_CONNECT] = {"upstream_connect_failed", 502, false,
                                 "could not connect to any replica of the model"},
    [REJECT_UPSTREAM_TIMEOUT] = {"upstream_timeout", 504, false,
                                 "the replica did not answer in time"},
    [REJECT_UPSTREAM_ERROR] = {"upstream_error", 502, false,
                               "the replica's response was invalid or cut off"},
    [REJECT_SHUTTING_DOWN] = {"shutting_down", 503, true, "thaw is shutting down"},
    [REJECT_BODY_BUFFER_FULL] = {"body_buffer_full", 503, true,
                                 "thaw holds as many request body bytes as it may "
                                 "(limits.max_buffered_body_bytes)"},
    [REJECT_INTERNAL] = {"internal_error", 500, false, "thaw ran out of resources"},
    [REJECT_VERSION_NOT_SUPPORTED] = {"http_version_not_supported", 505, false,
                                      "thaw speaks HTTP/1.0 and HTTP/1.1 only"},
    [REJECT_MODEL_REMOVED] = {"model_removed", 503, false,
                              "the model was removed (from the configuration, or from the cluster)"},
    [REJECT_AMBIGUOUS_MODEL] = {"ambiguous_model", 409, false,
                                "models in several namespaces have this name; name one as "
                                "namespace/name (path or body) or name.namespace (Host)"},
    [REJECT_INVALID_API_KEY] = {"invalid_api_key", 401, false,
                                "no valid API key was given (Authorization: Bearer KEY, or "
                                "api-key: KEY)"},
    [REJECT_TENANT_QUEUE_FULL] = {"tenant_queue_full", 429, true,
                                  "too many of this tenant's requests are waiting for the model"},
    [REJECT_BAD_FORM] = {"bad_form", 400, false,
                         "the request body is not a multipart/form-data form with the "
                         "Content-Type's boundary"},
    [REJECT_UNKNOWN_REVISION] = {"revision_not_found", 404, false,
                                 "the model has no revision of that name (the thaw-revision "
                                 "header, or <model>@<revision>)"},
    [REJECT_TENANTS_NOT_LOADED] = {"tenants_not_loaded", 503, true,
                                   "thaw has not loaded its tenants yet (tenants.source), so "
                                   "it cannot check API keys; retry after Retry-After seconds"},
    [REJECT_TRANSFER_CODING] = {"transfer_coding_not_implemented", 501, false,
                                "the request's Transfer-Encoding names a coding besides "
                                "chunked, which thaw does not decode (compress with "
                                "Content-Encoding instead, naming the model in the path or "
                                "Host)"},
    [REJECT_DUPLICATE_MODEL] = {"duplicate_model", 400, false,
                                "the request body names \"model\" twice (two top-level keys "
                                "or two form fields); name the model once"},
    [REJECT_ENCODED_BODY] = {"encoded_body", 415, false,
                             "the request body is compressed (Content-Encoding), so thaw cannot "
                             "read the model it names: send it uncompressed, or name the model in "
                             "a /models/<name>/ path prefix or the Host header"},
};

const struct reject_info *reject_info(enum reject_reason r)
{
    return &reject_table[r < REJECT_COUNT ? r : REJECT_INTERNAL];
}

static const char *const abort_names[ABORT_COUNT] = {
    "client_closed", "upstream_closed", "upstream_timeout", "send_timeout", "shutdown",
    "body_timeout",
};

const char *abort_reason_name(enum abort_reason r)
{
    return r < ABORT_COUNT ? abort_names[r] : "unknown";
}

const double hist_bounds[HIST_NBUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                           0.1,   0.25,   0.5,   1,    2.5,   5,
                                           10,    30,     60,    120,  300};

void histogram_observe_in(struct histogram *h, const double *bounds, double seconds)
{
    for (int i = 0; i < HIST_NBUCKETS; i++) {
        if (seconds <= bounds[i]) {
            h->buckets[i]++;
            break;
        }
    }
    h->count++;
    h->sum += seconds;
}

void histogram_observe(struct histogram *h, double seconds)
{
    histogram_observe_in(h, hist_bounds, seconds);
}

void histogram_render_in(const struct histogram *h, const double *bounds, struct buf *out,
                         const char *name, const char *labels)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < HIST_NBUCKETS; i++) {
        cum += h->buckets[i];
        buf_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i],
                   (unsigned long long)cum);
    }
    buf_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
               (unsigned long long)h->count);
    if (labels[0]) {
        buf_printf(out, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
                   (unsigned long long)h->count);
    } else {
        buf_printf(out, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name,
                   (unsigned long long)h->count);
    }
}

void histogram_render(const struct histogram *h, struct buf *out, const char *name,
                      const char *labels)
{
    histogram_render_in(h, hist_bounds, out, name, labels);
}

void code_counts_add(struct code_counts *c, int code)
{
    for (int i = 0; i < CODE_SLOTS; i++) {
        if (c->code[i] == code) {
            c->n[i]++;
            return;
        }
        if (c->code[i] == 0) {
            c->code[i] = (uint16_t)code;
            c->n[i] = 1;
            return;
        }
    }
    c->other++;
}

void metrics_help_type(struct buf *o, const char *name, const char *type, const char *help)
{
    buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void metrics_single(struct buf *o, const char *name, const char *type, const char *help,
                    unsigned long long value)
{
    metrics_help_type(o, name, type, help);
    buf_printf(o, "%s %llu\n", name, value);
}

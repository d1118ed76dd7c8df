/* Counters, gauges and histograms, and the table of reasons thaw answers a
 * request itself. Rendering to the Prometheus text format is in admin.c.
 * Invariant (checked by tests): once nothing is in flight,
 *   requests_accepted == proxied + rejected + aborted. */
#ifndef THAW_METRICS_H
#define THAW_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "thaw/buf.h"

/* Why thaw answered a request itself. Order matters: it indexes tables. */
enum reject_reason {
    REJECT_BAD_REQUEST,
    REJECT_BAD_LENGTH,
    REJECT_BAD_CHUNK,
    REJECT_HEADER_TOO_LARGE,
    REJECT_TOO_MANY_HEADERS,
    REJECT_BODY_TOO_LARGE,
    REJECT_HEADER_TIMEOUT,
    REJECT_BODY_TIMEOUT,
    REJECT_TOO_MANY_CONNECTIONS,
    REJECT_UNKNOWN_MODEL,
    REJECT_BAD_JSON,
    REJECT_NO_MODEL_FIELD,
    REJECT_BAD_PRIORITY,
    REJECT_METHOD_NOT_ALLOWED,
    REJECT_EXPECTATION_FAILED,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_DISPLACED,
    REJECT_QUEUE_TIMEOUT,
    REJECT_NO_REPLICAS,
    REJECT_START_FAILED,
    REJECT_UPSTREAM_CONNECT,
    REJECT_UPSTREAM_TIMEOUT,
    REJECT_UPSTREAM_ERROR,
    REJECT_SHUTTING_DOWN,
    REJECT_BODY_BUFFER_FULL,
    REJECT_INTERNAL,
    REJECT_VERSION_NOT_SUPPORTED,
    REJECT_MODEL_REMOVED,
    REJECT_AMBIGUOUS_MODEL,
    REJECT_INVALID_API_KEY,   /* tenants.required and no tenant claims the request */
    REJECT_TENANT_QUEUE_FULL, /* the tenant's max_queue at this model */
    REJECT_BAD_FORM, /* a multipart/form-data body that is not one */
    REJECT_UNKNOWN_REVISION, /* a thaw-revision header naming no revision of the model */
    REJECT_TENANTS_NOT_LOADED, /* tenants.required, from a source not loaded yet */
    REJECT_TRANSFER_CODING,    /* a request body in a transfer coding besides chunked */
    REJECT_DUPLICATE_MODEL,    /* a body naming "model" twice (JSON key or form field) */
    REJECT_ENCODED_BODY,       /* a body that decides the route, sent with a Content-Encoding */
    REJECT_COUNT
};

struct reject_info {
    const char *name; /* metric label and the error body's "code" */
    int status;
    bool retry_after;
    const char *message;
};

const struct reject_info *reject_info(enum reject_reason r);

/* Why a request ended without a complete response. */
enum abort_reason {
    ABORT_CLIENT_CLOSED,   /* client went away before the response ended */
    ABORT_UPSTREAM_CLOSED, /* upstream broke off a response already started */
    ABORT_UPSTREAM_TIMEOUT,/* upstream went silent mid-response */
    ABORT_SEND_TIMEOUT,    /* client stopped reading */
    ABORT_SHUTDOWN,        /* drain timeout passed */
    ABORT_BODY_TIMEOUT,    /* limits.body_total_timeout_ms passed after the request left */
    ABORT_COUNT
};
const char *abort_reason_name(enum abort_reason r);

#define HIST_NBUCKETS 17
extern const double hist_bounds[HIST_NBUCKETS];

struct histogram {
    uint64_t buckets[HIST_NBUCKETS]; /* not cumulative */
    uint64_t count;
    double sum;
};

void histogram_observe(struct histogram *h, double seconds);
/* Appends name_bucket/_sum/_count lines; labels like `model="x"` (may be ""). */
void histogram_render(const struct histogram *h, struct buf *out, const char *name,
                      const char *labels);
/* The same with other bucket bounds (HIST_NBUCKETS of them, ascending): a
 * histogram is observed and rendered with the same bounds. */
void histogram_observe_in(struct histogram *h, const double *bounds, double seconds);
void histogram_render_in(const struct histogram *h, const double *bounds, struct buf *out,
                         const char *name, const char *labels);

#define CODE_SLOTS 24
struct code_counts {
    uint16_t code[CODE_SLOTS];
    uint64_t n[CODE_SLOTS];
    uint64_t other;
};

void code_counts_add(struct code_counts *c, int code);

struct server_metrics {
    uint64_t requests_accepted;
    uint64_t requests_proxied;
    uint64_t requests_rejected;
    uint64_t requests_aborted;
    uint64_t rejections[REJECT_COUNT];
    uint64_t aborts[ABORT_COUNT];
    uint64_t connections_accepted;
    uint64_t connections_rejected;
    uint64_t upstream_connects;
    uint64_t upstream_connect_failures;
    uint64_t upstream_reused;
    uint64_t upstream_stale_retries;
    uint64_t upstream_stale_closed;
    uint64_t upstream_accept_checks;
    uint64_t upstream_break_holds; /* replicas held back after a connection broke */
    uint64_t upstream_connect_stalls; /* connects made again after a stall */
    uint64_t upstream_budget_closed;  /* pooled connections closed for a new one (fd budget) */
    struct code_counts unrouted_codes; /* responses to requests no model took */
    uint64_t accept_paused; /* listeners paused for want of file descriptors */
};

/* A metric family's # HELP and # TYPE lines. */
void metrics_help_type(struct buf *o, const char *name, const char *type, const char *help);
/* A family of one unlabelled sample: HELP, TYPE and its value. */
void metrics_single(struct buf *o, const char *name, const char *type, const char *help,
                    unsigned long long value);

#endif

/* Leader election on a coordination.k8s.io/v1 Lease, as client-go does it:
 * try to acquire or renew every renew_interval; the holder renews
 * renewTime; a Lease whose (holder, renewTime) has not changed for
 * leaseDuration, as observed on the local clock, may be taken over (with
 * leaseTransitions + 1). Writes carry the resourceVersion read, so of two
 * candidates one gets 409 and stays a follower. A leader that cannot renew
 * for renew_deadline stops leading before anyone else may start. */
#ifndef THAW_K8S_LEASE_H
#define THAW_K8S_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <event2/event_struct.h>

#include "thaw/k8s/client.h"

struct k8s_lease;
typedef void (*k8s_lease_cb)(void *ud, bool leading);

struct k8s_lease {
    struct k8s_client *client;
    char name[254], namespace_[254], identity[254];
    uint64_t duration_ms, renew_interval_ms, renew_deadline_ms;
    k8s_lease_cb changed;
    void *ud;
    struct event timer;
    /* Fires renew_deadline_ms after the last renewal: a leader whose
     * renewal hangs stops leading then, not when the call ends. */
    struct event deadline;
    struct k8s_call *call;
    bool leading;
    uint64_t last_renew_ms; /* when the last successful renew was sent (leading) */
    uint64_t write_sent_ms; /* when the write under way was sent */
    char holder[254];       /* as last seen */
    char observed_renew[64];
    uint64_t observed_ms;   /* local time the holder/renewTime last changed */
    uint64_t transitions, acquisitions, renew_failures;
};

void k8s_lease_init(struct k8s_lease *l, struct k8s_client *c, struct event_base *base,
                    const char *name, const char *namespace_, const char *identity,
                    uint64_t duration_ms, uint64_t renew_interval_ms, uint64_t renew_deadline_ms,
                    k8s_lease_cb changed, void *ud);
/* What a read of the Lease (cur: the API server's object, may be NULL or
 * malformed) says: records its holder, renewTime and transitions in l, and
 * whether it is held by this identity or has expired at now. */
void k8s_lease_observe(struct k8s_lease *l, const cJSON *cur, uint64_t now, bool *mine,
                       bool *expired);
/* The Lease to write: cur (or a new one) held by this identity from now;
 * take_over starts a new term. malloc'd JSON text. */
char *k8s_lease_body(struct k8s_lease *l, const cJSON *cur, bool take_over);
void k8s_lease_start(struct k8s_lease *l);
void k8s_lease_dispose(struct k8s_lease *l);

#endif

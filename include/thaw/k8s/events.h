/* Kubernetes Events with aggregation, as client-go's recorder does it: an
 * Event that repeats (same object, type, reason and message) within the
 * aggregation window is not created again; the one already created gets
 * its count raised and lastTimestamp moved by a merge PATCH. A model that
 * wakes and sleeps all day thus leaves one ScaledFromZero Event with a
 * count, not hundreds. Repeats that arrive while a write is out are folded
 * into the next write. An Event the API server has since dropped (Events
 * expire, by default after an hour) is created afresh.
 *
 * The cache is bounded: at max_entries, entries past the window are
 * dropped; if none are, the Event is created without aggregation. */
#ifndef THAW_K8S_EVENTS_H
#define THAW_K8S_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "thaw/k8s/client.h"
#include "thaw/strmap.h"

/* uid: the object's metadata.uid, or NULL/"" when not known (a deleted
 * object). `kubectl describe` finds an object's Events by its uid, so an
 * Event without one shows only in `kubectl get events`. */
struct k8s_event_ref {
    const char *namespace_, *api_version, *kind, *name, *uid;
};

struct k8s_events_stats {
    uint64_t created, aggregated, errors, unaggregated;
};

struct k8s_events {
    struct k8s_client *client;
    char component[64];
    uint64_t window_ms;
    size_t max_entries;
    struct strmap entries; /* key -> struct k8s_event_entry */
    struct k8s_events_stats stats;
};

void k8s_events_init(struct k8s_events *e, struct k8s_client *c, const char *component,
                     uint64_t window_ms, size_t max_entries);
/* Cancels writes still out (their results are not awaited). */
void k8s_events_dispose(struct k8s_events *e);

/* type: "Normal" or "Warning". now_ms: the monotonic clock. */
void k8s_events_record(struct k8s_events *e, const struct k8s_event_ref *obj, const char *type,
                       const char *reason, const char *message, uint64_t now_ms);

#endif

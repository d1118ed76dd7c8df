/* A cold start split into phases, and a model's cold-start history.
 *
 * A replica's way from "asked for" to "answers its health check" is a
 * sequence of phases; the backend that watches it says when it enters each
 * one (cs_timeline_enter), and the time spent in each is summed (a phase may
 * be entered again, e.g. a pod that goes back to Unschedulable). A model
 * keeps the cold start clients are waiting for (from zero ready replicas to
 * the first one ready): its current phase, for /status, the SSE heartbeat
 * and Retry-After, and the totals of its recent cold starts, whose median
 * less the time already spent is the expected remaining time.
 * Pure: every time is an argument (monotonic ms). */
#ifndef THAW_COLDSTART_H
#define THAW_COLDSTART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/metrics.h"

/* In the order a replica goes through them; names are metric labels. */
enum cs_phase {
    CS_SCALE,           /* Kubernetes: the scale write landed -> the pod exists */
    CS_SCHEDULE,        /* the pod exists -> bound to a node (PodScheduled) */
    CS_CAPACITY,        /* Unschedulable: no node has room (a node pool growing) */
    CS_IMAGE_PULL,      /* the kubelet's Pulling -> Pulled */
    CS_CONTAINER_START, /* bound (or image pulled) -> container running */
    CS_LOAD,            /* process spawned / container started -> server listening */
    CS_HEALTH,          /* listening -> the health check answers 2xx */
    CS_PHASES
};

const char *cs_phase_name(enum cs_phase p);

struct cs_timeline {
    uint64_t begun_ms; /* 0: not tracked */
    enum cs_phase phase;
    uint64_t phase_since_ms;
    uint64_t spent_ms[CS_PHASES]; /* closed time in each phase */
    uint32_t entered;             /* bit per phase entered */
};

void cs_timeline_begin(struct cs_timeline *t, enum cs_phase first, uint64_t now_ms);
/* Closes the current phase at now_ms and enters p (nothing when p is current). */
void cs_timeline_enter(struct cs_timeline *t, enum cs_phase p, uint64_t now_ms);
/* Moves ms of the time spent so far from phase `from` to phase `to` (at most
 * what `from` has): a duration a component reported more exactly than the
 * moments thaw saw (the kubelet's image pull time). */
void cs_timeline_move(struct cs_timeline *t, enum cs_phase from, enum cs_phase to, uint64_t ms,
                      uint64_t now_ms);
/* Time spent in p, the current phase's running time included. */
uint64_t cs_timeline_phase_ms(const struct cs_timeline *t, enum cs_phase p, uint64_t now_ms);
bool cs_timeline_entered(const struct cs_timeline *t, enum cs_phase p);
/* The phase with the most time spent (CS_PHASES when nothing was tracked). */
enum cs_phase cs_timeline_slowest(const struct cs_timeline *t, uint64_t now_ms);
/* "scale 0.1s, schedule 2.0s, ..." for the phases entered. */
void cs_timeline_summary(const struct cs_timeline *t, uint64_t now_ms, char *out, size_t len);

/* Cold-start bucket bounds: 0.1 s to 30 minutes. */
extern const double cs_hist_bounds[HIST_NBUCKETS];

#define CS_HISTORY 9

struct coldstart {
    uint64_t started_ms; /* the cold start clients wait for; 0: none */
    enum cs_phase phase; /* its most advanced replica's phase */
    uint64_t phase_since_ms;
    uint64_t recent_ms[CS_HISTORY]; /* totals of the last cold starts, a ring */
    size_t n_recent, next;
};

/* A cold start begins (nothing when one is in progress). */
void coldstart_begin(struct coldstart *c, enum cs_phase first, uint64_t now_ms);
/* The cold start's most advanced replica is in phase p since since_ms. */
void coldstart_phase(struct coldstart *c, enum cs_phase p, uint64_t since_ms);
/* The in-progress cold start ended without a replica (nothing recorded). */
void coldstart_cancel(struct coldstart *c);
/* A replica became ready after the phases of t: each phase it entered is
 * observed in hist (per phase, cs_hist_bounds; NULL: none). Returns true
 * when it ended the cold start in progress: its total joins the history. */
bool coldstart_replica_ready(struct coldstart *c, const struct cs_timeline *t, uint64_t now_ms,
                             struct histogram hist[CS_PHASES]);
/* Adds a total to the history (a cold start measured without phases). */
void coldstart_record(struct coldstart *c, uint64_t total_ms);
/* The median of the recent totals; 0: no history. */
uint64_t coldstart_expected_ms(const struct coldstart *c);
/* Expected time left of the cold start in progress (0 when past the
 * expected time); false when none is in progress or there is no history. */
bool coldstart_remaining_ms(const struct coldstart *c, uint64_t now_ms, uint64_t *out);
/* The SSE comment for a held stream: ": loading phase=load elapsed=12s
 * expected_remaining=40s\n\n" (or expected_remaining=unknown). Returns its
 * length (< len). */
size_t coldstart_heartbeat(const struct coldstart *c, uint64_t now_ms, char *out, size_t len);

#endif

/* A model's demand profile, for warming it ahead of demand.
 *
 * Arrivals are counted per 5-minute slot of wall-clock time (UTC). When a
 * slot ends its count is folded into two profiles: the slot of the day (288
 * slots, every day alike) and the slot of the week (2016 slots, weekdays
 * apart), each an exponentially weighted mean over the days (weeks) seen, so
 * a pattern that moves is followed within a few days and a one-off burst
 * fades. A forecast sums the expected arrivals of the slots a horizon
 * covers: the week's slot once that slot has been seen, blended with the
 * day's until it has been seen twice (a new deployment learns a daily
 * rhythm in a day and its weekly shape in a week).
 *
 * Pure: time comes in as wall-clock milliseconds. The profile lives in
 * memory (about 11 KB per model); a restart learns again. */
#ifndef THAW_FORECAST_H
#define THAW_FORECAST_H

#include <stdbool.h>
#include <stdint.h>

#define FC_SLOT_MS 300000ULL
#define FC_DAY_SLOTS 288
#define FC_WEEK_SLOTS 2016

struct forecast {
    float day[FC_DAY_SLOTS];
    float week[FC_WEEK_SLOTS];
    uint8_t day_seen[FC_DAY_SLOTS]; /* times the slot was folded (capped at 255) */
    uint8_t week_seen[FC_WEEK_SLOTS];
    int64_t slot;   /* the slot being counted (wall ms / FC_SLOT_MS); -1: none yet */
    uint64_t count; /* arrivals in it so far */
};

void forecast_init(struct forecast *f);
/* n arrivals (0: none, only time passing) at wall_ms. Slots that ended
 * since the last call are folded, those without a call as 0 arrivals; a
 * clock that jumps back, or forward by more than a week, starts counting
 * afresh without folding. */
void forecast_record(struct forecast *f, uint64_t wall_ms, uint64_t n);
/* Arrivals expected in [wall_ms, wall_ms + horizon_ms), horizon capped at
 * one day. */
double forecast_expected(const struct forecast *f, uint64_t wall_ms, uint64_t horizon_ms);
/* Has every slot of [wall_ms, wall_ms + horizon_ms) been seen on an earlier
 * day? Only then does a forecast of nothing mean quiet rather than unknown. */
bool forecast_known(const struct forecast *f, uint64_t wall_ms, uint64_t horizon_ms);

#endif

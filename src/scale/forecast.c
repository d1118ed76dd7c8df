#include "thaw/forecast.h"

#include <string.h>

/* Weight of the newest day (week) in a slot's mean: a changed pattern is
 * followed within three to four days (two to three weeks). */
#define DAY_ALPHA 0.3f
#define WEEK_ALPHA 0.5f

void forecast_init(struct forecast *f)
{
    memset(f, 0, sizeof *f);
    f->slot = -1;
}

static void fold_into(float *mean, uint8_t *seen, float count, float alpha)
{
    *mean = *seen ? *mean + alpha * (count - *mean) : count;
    if (*seen < 255) {
        (*seen)++;
    }
}

static void fold(struct forecast *f, int64_t slot, uint64_t count)
{
    size_t d = (size_t)(slot % FC_DAY_SLOTS), w = (size_t)(slot % FC_WEEK_SLOTS);
    fold_into(&f->day[d], &f->day_seen[d], (float)count, DAY_ALPHA);
    fold_into(&f->week[w], &f->week_seen[w], (float)count, WEEK_ALPHA);
}

void forecast_record(struct forecast *f, uint64_t wall_ms, uint64_t n)
{
    int64_t now = (int64_t)(wall_ms / FC_SLOT_MS);
    if (f->slot < 0 || now < f->slot || now - f->slot > FC_WEEK_SLOTS) {
        f->slot = now;
        f->count = 0;
    }
    if (now > f->slot) {
        fold(f, f->slot, f->count);
        for (int64_t s = f->slot + 1; s < now; s++) {
            fold(f, s, 0);
        }
        f->slot = now;
        f->count = 0;
    }
    f->count += n;
}

/* Expected arrivals in one whole slot. */
static double slot_rate(const struct forecast *f, int64_t slot)
{
    size_t d = (size_t)(slot % FC_DAY_SLOTS), w = (size_t)(slot % FC_WEEK_SLOTS);
    if (f->week_seen[w] >= 2) {
        return f->week[w];
    }
    if (f->week_seen[w]) {
        return 0.5 * f->week[w] + 0.5 * f->day[d];
    }
    return f->day_seen[d] ? f->day[d] : 0.0;
}

static uint64_t horizon_end(uint64_t wall_ms, uint64_t horizon_ms)
{
    uint64_t day_ms = FC_DAY_SLOTS * FC_SLOT_MS;
    return wall_ms + (horizon_ms < day_ms ? horizon_ms : day_ms);
}

bool forecast_known(const struct forecast *f, uint64_t wall_ms, uint64_t horizon_ms)
{
    uint64_t end = horizon_end(wall_ms, horizon_ms);
    for (uint64_t slot = wall_ms / FC_SLOT_MS; slot * FC_SLOT_MS < end; slot++) {
        if (!f->day_seen[slot % FC_DAY_SLOTS]) {
            return false;
        }
    }
    return true;
}

double forecast_expected(const struct forecast *f, uint64_t wall_ms, uint64_t horizon_ms)
{
    uint64_t end = horizon_end(wall_ms, horizon_ms);
    double sum = 0;
    for (uint64_t t = wall_ms; t < end;) {
        uint64_t slot = t / FC_SLOT_MS, slot_end = (slot + 1) * FC_SLOT_MS;
        uint64_t upto = slot_end < end ? slot_end : end;
        sum += slot_rate(f, (int64_t)slot) * (double)(upto - t) / (double)FC_SLOT_MS;
        t = upto;
    }
    return sum;
}

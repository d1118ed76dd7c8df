#include "thaw/coldstart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const phase_names[CS_PHASES] = {
    [CS_SCALE] = "scale",
    [CS_SCHEDULE] = "schedule",
    [CS_CAPACITY] = "capacity",
    [CS_IMAGE_PULL] = "image_pull",
    [CS_CONTAINER_START] = "container_start",
    [CS_LOAD] = "load",
    [CS_HEALTH] = "health",
};

const char *cs_phase_name(enum cs_phase p)
{
    return p < CS_PHASES ? phase_names[p] : "none";
}

/* A model server can take half an hour to come up (a large image on a new
 * node, weights over the network): the buckets reach that far. */
const double cs_hist_bounds[HIST_NBUCKETS] = {0.1, 0.25, 0.5, 1,   2.5, 5,   10,   20,  30,
                                              60,  120,  180, 300, 600, 900, 1200, 1800};

void cs_timeline_begin(struct cs_timeline *t, enum cs_phase first, uint64_t now_ms)
{
    memset(t, 0, sizeof *t);
    t->begun_ms = now_ms ? now_ms : 1;
    t->phase = first;
    t->phase_since_ms = now_ms;
    t->entered = 1u << first;
}

static uint64_t since(uint64_t from, uint64_t now)
{
    return now > from ? now - from : 0;
}

void cs_timeline_enter(struct cs_timeline *t, enum cs_phase p, uint64_t now_ms)
{
    if (!t->begun_ms || p >= CS_PHASES || p == t->phase) {
        return;
    }
    t->spent_ms[t->phase] += since(t->phase_since_ms, now_ms);
    t->phase = p;
    t->phase_since_ms = now_ms;
    t->entered |= 1u << p;
}

uint64_t cs_timeline_phase_ms(const struct cs_timeline *t, enum cs_phase p, uint64_t now_ms)
{
    if (!t->begun_ms || p >= CS_PHASES) {
        return 0;
    }
    uint64_t ms = t->spent_ms[p];
    return p == t->phase ? ms + since(t->phase_since_ms, now_ms) : ms;
}

void cs_timeline_move(struct cs_timeline *t, enum cs_phase from, enum cs_phase to, uint64_t ms,
                      uint64_t now_ms)
{
    if (!t->begun_ms || from >= CS_PHASES || to >= CS_PHASES || from == to) {
        return;
    }
    /* Close the running phase first so its time can be moved too. */
    enum cs_phase cur = t->phase;
    t->spent_ms[cur] += since(t->phase_since_ms, now_ms);
    t->phase_since_ms = now_ms > t->phase_since_ms ? now_ms : t->phase_since_ms;
    uint64_t have = t->spent_ms[from];
    uint64_t moved = ms < have ? ms : have;
    t->spent_ms[from] -= moved;
    t->spent_ms[to] += moved;
    t->entered |= 1u << to;
}

bool cs_timeline_entered(const struct cs_timeline *t, enum cs_phase p)
{
    return t->begun_ms && p < CS_PHASES && (t->entered & (1u << p));
}

enum cs_phase cs_timeline_slowest(const struct cs_timeline *t, uint64_t now_ms)
{
    enum cs_phase best = CS_PHASES;
    uint64_t best_ms = 0;
    for (int p = 0; p < CS_PHASES; p++) {
        uint64_t ms = cs_timeline_phase_ms(t, (enum cs_phase)p, now_ms);
        if (cs_timeline_entered(t, (enum cs_phase)p) && (best == CS_PHASES || ms > best_ms)) {
            best = (enum cs_phase)p;
            best_ms = ms;
        }
    }
    return best;
}

void cs_timeline_summary(const struct cs_timeline *t, uint64_t now_ms, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int p = 0; p < CS_PHASES && used < len; p++) {
        if (!cs_timeline_entered(t, (enum cs_phase)p)) {
            continue;
        }
        int n = snprintf(out + used, len - used, "%s%s %.1fs", used ? ", " : "",
                         phase_names[p],
                         (double)cs_timeline_phase_ms(t, (enum cs_phase)p, now_ms) / 1000.0);
        if (n < 0) {
            break;
        }
        used += (size_t)n;
    }
}

void coldstart_begin(struct coldstart *c, enum cs_phase first, uint64_t now_ms)
{
    if (c->started_ms) {
        return;
    }
    c->started_ms = now_ms ? now_ms : 1;
    c->phase = first;
    c->phase_since_ms = now_ms;
}

void coldstart_phase(struct coldstart *c, enum cs_phase p, uint64_t since_ms)
{
    if (c->started_ms && p < CS_PHASES) {
        c->phase = p;
        c->phase_since_ms = since_ms;
    }
}

void coldstart_cancel(struct coldstart *c)
{
    c->started_ms = 0;
}

void coldstart_record(struct coldstart *c, uint64_t total_ms)
{
    c->recent_ms[c->next] = total_ms;
    c->next = (c->next + 1) % CS_HISTORY;
    if (c->n_recent < CS_HISTORY) {
        c->n_recent++;
    }
}

bool coldstart_replica_ready(struct coldstart *c, const struct cs_timeline *t, uint64_t now_ms,
                             struct histogram hist[CS_PHASES])
{
    if (hist && t && t->begun_ms) {
        for (int p = 0; p < CS_PHASES; p++) {
            if (cs_timeline_entered(t, (enum cs_phase)p)) {
                double s = (double)cs_timeline_phase_ms(t, (enum cs_phase)p, now_ms) / 1000.0;
                histogram_observe_in(&hist[p], cs_hist_bounds, s);
            }
        }
    }
    if (!c->started_ms) {
        return false;
    }
    coldstart_record(c, since(c->started_ms, now_ms));
    c->started_ms = 0;
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t coldstart_expected_ms(const struct coldstart *c)
{
    if (!c->n_recent) {
        return 0;
    }
    uint64_t v[CS_HISTORY];
    memcpy(v, c->recent_ms, c->n_recent * sizeof v[0]);
    qsort(v, c->n_recent, sizeof v[0], cmp_u64);
    /* The median: one slow start (a new node, an image not cached) does not
     * move it, while a model that got slower for good moves it within a few. */
    size_t n = c->n_recent;
    uint64_t med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return med ? med : 1;
}

bool coldstart_remaining_ms(const struct coldstart *c, uint64_t now_ms, uint64_t *out)
{
    uint64_t expected = coldstart_expected_ms(c);
    if (!c->started_ms || !expected) {
        return false;
    }
    uint64_t elapsed = since(c->started_ms, now_ms);
    *out = expected > elapsed ? expected - elapsed : 0;
    return true;
}

size_t coldstart_heartbeat(const struct coldstart *c, uint64_t now_ms, char *out, size_t len)
{
    if (!c->started_ms) {
        int n = snprintf(out, len, ": loading\n\n");
        return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
    }
    uint64_t elapsed_s = since(c->started_ms, now_ms) / 1000;
    uint64_t rem = 0;
    char remaining[32];
    if (coldstart_remaining_ms(c, now_ms, &rem)) {
        snprintf(remaining, sizeof remaining, "%llus", (unsigned long long)((rem + 999) / 1000));
    } else {
        snprintf(remaining, sizeof remaining, "unknown");
    }
    int n = snprintf(out, len, ": loading phase=%s elapsed=%llus expected_remaining=%s\n\n",
                     cs_phase_name(c->phase), (unsigned long long)elapsed_s, remaining);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

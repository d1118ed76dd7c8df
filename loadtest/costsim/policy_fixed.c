/* Always-on baselines: nothing scales, nothing cold starts during the day.
 *
 * dedicated: every model on its own whole GPUs, as many replicas as its
 *   peak minute needs (in-flight requests over CS_SLOTS), outside the box
 *   (no capacity limit), each replica billed as whole GPUs. For reference.
 * static:   one replica of every model always on, packed on the trace's
 *   time-sliced box, critical models first; a model that does not fit stays
 *   Pending all day (its requests wait and give up). What teams do first. */
#include "costsim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void start_warm(struct cs_sim *s, size_t i, unsigned replicas)
{
    struct cs_msim *m = &s->m[i];
    for (unsigned k = 0; k < replicas && k < CS_MAX_REPLICAS; k++) {
        m->r[k].st = R_READY;
        s->held += cs_slices_of(s, i);
    }
    m->started_before = true;
}

/* Requests in flight in the model's busiest minute, served at once. */
static double peak_concurrency(const struct cs_trace *tr, size_t model)
{
    size_t minutes = (size_t)tr->horizon / 60 + 1;
    double *work = calloc(minutes, sizeof *work);
    for (size_t k = 0; k < tr->n_reqs; k++) {
        if (tr->reqs[k].model == model) {
            work[tr->reqs[k].t / 60] += cs_service_s(tr->reqs[k].tokens);
        }
    }
    double peak = 0;
    for (size_t k = 0; k < minutes; k++) {
        peak = work[k] / 60 > peak ? work[k] / 60 : peak;
    }
    free(work);
    return peak;
}

static void dedicated_init(struct cs_sim *s)
{
    for (size_t i = 0; i < s->n; i++) {
        unsigned need = (unsigned)ceil(peak_concurrency(s->tr, i) / CS_SLOTS);
        start_warm(s, i, need < 1 ? 1 : need > CS_MAX_REPLICAS ? CS_MAX_REPLICAS : need);
    }
}

static unsigned whole_gpus(const struct cs_sim *s, size_t i)
{
    unsigned per_gpu = s->tr->slices_per_gpu;
    return (s->m[i].spec->slices + per_gpu - 1) / per_gpu * per_gpu;
}

static void static_init(struct cs_sim *s)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        for (size_t i = 0; i < s->n; i++) {
            if (s->m[i].spec->tier != (enum tier)t) {
                continue;
            }
            if (cs_slices_of(s, i) <= cs_free_slices(s)) {
                start_warm(s, i, 1);
            } else {
                s->m[i].r[0].st = R_PENDING;
            }
        }
    }
}

const struct cs_policy cs_dedicated = {
    .name = "dedicated",
    .models = "whole GPUs per model sized for its peak, always on, no sharing",
    .init = dedicated_init,
    .held_slices = whole_gpus,
    .unlimited = true,
};

const struct cs_policy cs_static = {
    .name = "static",
    .models = "one replica of every model always on, packed on the time-sliced box",
    .init = static_init,
};

/* Knative Serving (KServe's serverless mode) as it behaves by default, with
 * what an operator would add for GPU models:
 *  - one KPA per model on concurrency: containerConcurrency 8 (the server's
 *    slots), target utilization 70%, stable window 60 s, panic window 10% of
 *    it (6 s), panic threshold 200%, pod retention 0 (thaw's autoscaler
 *    module implements these rules). The KPA decides zero once its stable
 *    window has seen no demand (60 s after the last request); the 30 s
 *    scale-to-zero grace only bounds how long removing the last pod may
 *    wait for the activator, so it adds nothing here;
 *  - min-scale 1 on critical models (always one replica);
 *  - no cross-model eviction: a pod that does not fit stays Pending until
 *    slices free up, as a pod would;
 *  - PriorityClasses as thaw's chart defines them: a Pending critical or
 *    standard pod makes kube-scheduler preempt pods of lower priority
 *    (batch never preempts); a preempted pod's in-flight requests fail and
 *    its ReplicaSet creates a new, Pending pod;
 *  - requests for a model at zero wait in the activator; no tiers in its
 *    queue (FIFO per model). */
#include "costsim.h"

#include <string.h>

static void knative_init(struct cs_sim *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct cs_msim *m = &s->m[i];
        as_config_defaults(&m->asc, CS_SLOTS * 0.7);
        m->asc.scale_to_zero_grace_ms = m->asc.stable_window_ms;
        m->asc.max_scale = CS_MAX_REPLICAS;
        m->asc.min_scale = m->spec->tier == TIER_CRITICAL ? 1 : 0;
        as_init(&m->ass, &m->asc);
        if (m->asc.min_scale && m->spec->slices <= cs_free_slices(s)) {
            m->r[0].st = R_READY; /* up since before the day */
            m->started_before = true;
            s->held += m->spec->slices;
        }
    }
}

static bool may_preempt(enum tier t)
{
    return t != TIER_BATCH; /* the chart: batch's PriorityClass is preemptionPolicy Never */
}

/* kube-scheduler's victims for a pending replica of model i: pods of
 * strictly lower priority, lowest priority first and then the most recently
 * started, only as many as make it fit, and none when even all would not. */
static void preempt_for(struct cs_sim *s, size_t i)
{
    enum tier t = s->m[i].spec->tier;
    unsigned need = s->m[i].spec->slices;
    unsigned could = cs_free_slices(s);
    for (size_t j = 0; j < s->n; j++) {
        if (s->m[j].spec->tier > t) {
            could +=
                cs_count(&s->m[j], (1u << R_STARTING) | (1u << R_READY)) * s->m[j].spec->slices;
        }
    }
    if (could < need) {
        return;
    }
    while (cs_free_slices(s) < need) {
        size_t vj = 0;
        int vk = -1;
        for (size_t j = 0; j < s->n; j++) {
            const struct cs_msim *v = &s->m[j];
            for (int k = 0; v->spec->tier > t && k < CS_MAX_REPLICAS; k++) {
                if (v->r[k].st != R_STARTING && v->r[k].st != R_READY) {
                    continue;
                }
                const struct cs_msim *b = &s->m[vj];
                if (vk < 0 || v->spec->tier > b->spec->tier ||
                    (v->spec->tier == b->spec->tier && v->r[k].since > b->r[vk].since)) {
                    vj = j;
                    vk = k;
                }
            }
        }
        if (vk < 0) {
            return;
        }
        cs_preempt(s, vj, (size_t)vk);
    }
}

static void knative_plan(struct cs_sim *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct cs_msim *m = &s->m[i];
        struct as_decision d;
        unsigned ready = cs_count(m, 1u << R_READY);
        as_decide(&m->ass, &m->asc, (uint64_t)s->t * 1000, ready, ready, &d);
        cs_scale_to(s, i, d.desired);
    }
    cs_schedule(s);
    /* Pending pods that still do not fit, highest priority first. */
    for (int t = TIER_CRITICAL; t < TIER_BATCH; t++) {
        for (size_t i = 0; i < s->n; i++) {
            struct cs_msim *m = &s->m[i];
            if (m->spec->tier != (enum tier)t || !may_preempt(m->spec->tier)) {
                continue;
            }
            for (unsigned p = cs_count(m, 1u << R_PENDING); p > 0; p--) {
                preempt_for(s, i);
                cs_schedule(s);
            }
        }
    }
}

const struct cs_policy cs_knative = {
    .name = "knative",
    .models = "per-model KPA with scale to zero, min-scale 1 on critical, Pending when full, "
              "PriorityClass preemption",
    .init = knative_init,
    .plan = knative_plan,
};

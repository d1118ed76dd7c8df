#include "thaw/warmpool.h"

#include <string.h>

static const char *const action_names[] = {"keep_warm", "to_zero", "admit",
                                           "deny",      "evict",   "preempt"};

const char *wp_action_name(enum wp_action a)
{
    return action_names[a];
}

static void record(struct wp_plan *p, size_t model, enum wp_action a, unsigned replicas,
                   size_t by)
{
    if (p->n < sizeof p->d / sizeof p->d[0]) {
        p->d[p->n++] = (struct wp_decision){model, a, replicas, by};
    } else {
        p->dropped++;
    }
}

/* a goes before b: higher priority (lower tier index), then higher value. */
static bool before(const struct wp_model *a, const struct wp_model *b)
{
    if (a->tier != b->tier) {
        return a->tier < b->tier;
    }
    return a->value > b->value;
}

static void order(const struct wp_model *m, size_t n, size_t *idx)
{
    for (size_t i = 0; i < n; i++) {
        idx[i] = i;
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort: n is small */
        size_t v = idx[i], j = i;
        while (j > 0 && before(&m[v], &m[idx[j - 1]])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

void warmpool_plan(struct wp_model *m, size_t n, unsigned capacity, unsigned warm_budget,
                   struct wp_plan *out)
{
    memset(out, 0, sizeof *out);
    out->capacity = capacity;
    out->warm_budget = warm_budget;
    size_t idx[1024];
    if (n > 1024) {
        n = 1024;
    }
    order(m, n, idx);

    /* 1. Scale-downs and the warm pool, best models first. */
    unsigned warm_used = 0;
    for (size_t k = 0; k < n; k++) {
        struct wp_model *x = &m[idx[k]];
        x->warm = 0;
        unsigned want = x->desired > x->min_replicas ? x->desired : x->min_replicas;
        if (want >= x->current) {
            x->target = x->current; /* scale-ups are decided below */
            continue;
        }
        x->target = want;
        if (x->idle && want == 0 && x->current > 0 && x->slices > 0) {
            if (warm_used + x->slices <= warm_budget) {
                warm_used += x->slices;
                x->target = 1;
                x->warm = 1;
                record(out, idx[k], WP_KEEP_WARM, 1, idx[k]);
            } else {
                record(out, idx[k], WP_TO_ZERO, x->current, idx[k]);
            }
        }
    }
    unsigned used = 0;
    for (size_t i = 0; i < n; i++) {
        used += m[i].target * m[i].slices;
    }

    /* 2. Scale-ups in priority order, making room from below. */
    for (size_t k = 0; k < n; k++) {
        size_t xi = idx[k];
        struct wp_model *x = &m[xi];
        unsigned want = x->desired > x->min_replicas ? x->desired : x->min_replicas;
        if (want <= x->target) {
            continue;
        }
        unsigned more = want - x->target;
        if (x->slices == 0 || capacity == 0) {
            x->target = want;
            used += more * x->slices;
            record(out, xi, WP_ADMIT, more, xi);
            continue;
        }
        while (used + more * x->slices > capacity) {
            /* a. idle warm replicas: lowest priority, then lowest value */
            size_t victim = (size_t)-1;
            for (size_t j = n; j-- > 0;) {
                struct wp_model *v = &m[idx[j]];
                if (v == x || v->warm == 0) {
                    continue;
                }
                if (v->tier > x->tier || (v->tier == x->tier && v->value < x->value)) {
                    victim = idx[j];
                    break;
                }
            }
            if (victim != (size_t)-1) {
                m[victim].warm--;
                m[victim].target--;
                used -= m[victim].slices;
                warm_used -= m[victim].slices;
                record(out, victim, WP_EVICT, 1, xi);
                continue;
            }
            /* b. running models of strictly lower priority, toward their min */
            for (size_t j = n; j-- > 0;) {
                struct wp_model *v = &m[idx[j]];
                if (v->tier > x->tier && v->target > v->min_replicas && v->slices > 0) {
                    victim = idx[j];
                    break;
                }
            }
            if (victim == (size_t)-1) {
                break;
            }
            m[victim].target--;
            used -= m[victim].slices;
            record(out, victim, WP_PREEMPT, 1, xi);
        }
        unsigned fit = used >= capacity ? 0 : (capacity - used) / x->slices;
        unsigned admit = more < fit ? more : fit;
        if (admit) {
            x->target += admit;
            used += admit * x->slices;
            record(out, xi, WP_ADMIT, admit, xi);
        }
        if (admit < more) {
            record(out, xi, WP_DENY, more - admit, xi);
        }
    }
    out->used_slices = used;
    out->warm_slices = warm_used;
}

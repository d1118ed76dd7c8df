#include "thaw/warmpool.h"

#include <stdlib.h>
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

/* Service order: higher priority (lower tier index) first, then higher value. */
struct sort_key {
    size_t idx;
    enum tier tier;
    double value;
};

static int cmp(const void *a, const void *b)
{
    const struct sort_key *x = a, *y = b;
    if (x->tier != y->tier) {
        return x->tier < y->tier ? -1 : 1;
    }
    if (x->value != y->value) {
        return x->value > y->value ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx; /* stable: input order breaks ties */
}

/* idx gets model indexes in service order (see before()). */
static int order(const struct wp_model *m, size_t n, size_t *idx)
{
    struct sort_key *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        k[i] = (struct sort_key){i, m[i].tier, m[i].value};
    }
    qsort(k, n, sizeof *k, cmp);
    for (size_t i = 0; i < n; i++) {
        idx[i] = k[i].idx;
    }
    free(k);
    return 0;
}

void warmpool_plan(struct wp_model *m, size_t n, unsigned capacity, unsigned warm_budget,
                   struct wp_plan *out)
{
    memset(out, 0, sizeof *out);
    out->capacity = capacity;
    out->warm_budget = warm_budget;
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx || order(m, n, idx)) {
        free(idx);
        for (size_t i = 0; i < n; i++) {
            m[i].target = m[i].current; /* no plan: change nothing */
        }
        return;
    }

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
    free(idx);
}

#include "thaw/revisions.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t finished(const struct model *m)
{
    return m->stats.proxied + m->stats.rejected + m->stats.aborted;
}

static void take_baseline(struct model_revisions *rv, size_t i)
{
    struct revision_baseline *b = &rv->base[i];
    const struct model *m = rv->rev[i];
    memset(b, 0, sizeof *b);
    if (m) {
        b->requests = finished(m);
        b->errors = m->stats.failed;
        b->ttfb = m->stats.upstream_ttfb;
    }
}

/* A rollout step begins: what the revisions do from now on is its window. */
static void new_window(struct model_revisions *rv, uint64_t now_ms)
{
    rv->state.step_started_ms = now_ms;
    for (size_t i = 0; i < 2 && i < rv->n; i++) {
        take_baseline(rv, i);
    }
}

static struct rollout_window window_of(const struct model_revisions *rv, size_t i)
{
    struct rollout_window w = {0};
    const struct model *m = rv->rev[i];
    if (!m) {
        return w;
    }
    const struct revision_baseline *b = &rv->base[i];
    w.requests = finished(m) - b->requests;
    w.errors = m->stats.failed - b->errors;
    w.ttfb_p99_s = rollout_quantile(&m->stats.upstream_ttfb, &b->ttfb, 0.99);
    return w;
}

/* The split a rollout's state means for a stable/canary pair. */
static void apply_state(struct model_revisions *rv)
{
    uint32_t pct[2];
    switch (rv->state.stage) {
    case ROLLOUT_PROMOTED:
        pct[0] = 0;
        pct[1] = 100;
        rv->stable = 1;
        break;
    case ROLLOUT_ROLLED_BACK:
        pct[0] = 100;
        pct[1] = 0;
        rv->stable = 0;
        break;
    default:
        pct[1] = rv->state.canary_percent > 100 ? 100 : rv->state.canary_percent;
        pct[0] = 100 - pct[1];
        rv->stable = 0;
        break;
    }
    revsplit_set(&rv->split, pct, 2);
}

static bool same_split(const struct model_revisions *rv, char *const *names,
                       const uint32_t *percent, size_t n)
{
    if (rv->n != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rv->names[i], names[i]) != 0 || rv->configured[i] != percent[i]) {
            return false;
        }
    }
    return true;
}

static void take_options(struct model_revisions *rv, const struct config_model *o)
{
    rv->fallback = o->fallback_to_warm_revision;
    rv->sticky_tenant = o->sticky_tenant;
    free(rv->sticky_header);
    rv->sticky_header = o->sticky_header ? strdup(o->sticky_header) : NULL;
    rv->rollout = o->rollout.enabled && rv->n == 2;
    rv->policy = (struct rollout_policy){
        .step_percent = (uint32_t)o->rollout.step_percent,
        .step_interval_ms = o->rollout.step_interval_ms,
        .min_requests = o->rollout.min_requests,
        .max_error_rate_increase_pct = (uint32_t)o->rollout.max_error_rate_increase_pct,
        .max_ttfb_p99_ratio_pct = (uint32_t)o->rollout.max_ttfb_p99_ratio_pct,
        .ttfb_p99_tolerance_ms = o->rollout.ttfb_p99_tolerance_ms,
    };
}

int model_revisions_set(struct model *parent, char *const *names, const uint32_t *percent, size_t n,
                        const struct config_model *opts, uint64_t now_ms)
{
    struct revsplit check;
    revsplit_init(&check);
    if (revsplit_set(&check, percent, n)) {
        return -EINVAL;
    }
    struct model_revisions *rv = parent->revs;
    if (!rv) {
        rv = calloc(1, sizeof *rv);
        if (!rv) {
            return -ENOMEM;
        }
        parent->revs = rv;
    }
    bool rollout_was = rv->rollout;
    if (!same_split(rv, names, percent, n)) {
        struct model *keep[REVSPLIT_MAX] = {0};
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < rv->n; j++) {
                if (rv->rev[j] && strcmp(rv->names[j], names[i]) == 0) {
                    keep[i] = rv->rev[j];
                }
            }
        }
        for (size_t j = 0; j < rv->n; j++) {
            if (rv->rev[j]) {
                rv->rev[j]->parent = NULL;
            }
        }
        model_revisions_free_names(rv);
        for (size_t i = 0; i < n; i++) {
            rv->names[i] = strdup(names[i]);
            if (!rv->names[i]) {
                rv->n = i;
                return -ENOMEM;
            }
            rv->configured[i] = percent[i];
            rv->rev[i] = keep[i];
            if (keep[i]) {
                keep[i]->parent = parent;
            }
        }
        for (size_t i = n; i < REVSPLIT_MAX; i++) {
            rv->rev[i] = NULL;
        }
        rv->n = n;
        rv->split = check;
        rv->stable = 0;
        rollout_was = false;
    }
    take_options(rv, opts);
    if (!rv->rollout && rollout_was) {
        /* The rollout was turned off: the split is the one set again. */
        revsplit_set(&rv->split, rv->configured, rv->n);
        rv->stable = 0;
    }
    if (rv->rollout && !rollout_was) {
        rv->state = (struct rollout_state){ROLLOUT_PROGRESSING, percent[1], now_ms};
        apply_state(rv);
        new_window(rv, now_ms);
    }
    return 0;
}

int model_revisions_start(struct model *parent)
{
    if (!parent->revs && !(parent->revs = calloc(1, sizeof *parent->revs))) {
        return -ENOMEM;
    }
    return 0;
}

void model_revisions_link(struct model *parent, const char *name, struct model *rev)
{
    struct model_revisions *rv = parent->revs;
    for (size_t i = 0; rv && i < rv->n; i++) {
        if (strcmp(rv->names[i], name) != 0) {
            continue;
        }
        if (rv->rev[i] && rv->rev[i] != rev) {
            rv->rev[i]->parent = NULL;
        }
        bool fresh = rv->rev[i] != rev;
        rv->rev[i] = rev;
        if (!rev) {
            return;
        }
        rev->parent = parent;
        if (!rev->revision) {
            rev->revision = strdup(name);
        }
        if (fresh && i < 2) {
            take_baseline(rv, i);
        }
        return;
    }
}

static bool has_revisions_in(const struct config *cfg, const struct model *m)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *cm = &cfg->models[i];
        if (cm->n_revisions && strcmp(cm->name, m->name) == 0 &&
            strcmp(cm->namespace_, m->namespace_) == 0) {
            return true;
        }
    }
    return false;
}

int fleet_link_revisions(struct fleet *f, const struct config *cfg, uint64_t now_ms)
{
    /* A file model that no longer lists revisions routes to itself again. */
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &f->models)
    {
        struct model *m = container_of(pos, struct model, node);
        if (m->revs && !m->namespaced && !has_revisions_in(cfg, m)) {
            model_revisions_unlink(m);
        }
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        const struct config_model *cm = &cfg->models[i];
        struct model *parent = cm->n_revisions ? fleet_find(f, cm->namespace_, cm->name) : NULL;
        if (!parent) {
            continue;
        }
        char *names[REVSPLIT_MAX];
        uint32_t pct[REVSPLIT_MAX];
        size_t n = cm->n_revisions < REVSPLIT_MAX ? cm->n_revisions : REVSPLIT_MAX;
        for (size_t j = 0; j < n; j++) {
            names[j] = cm->revisions[j].name;
            pct[j] = (uint32_t)cm->revisions[j].percent;
        }
        int rc = model_revisions_set(parent, names, pct, n, cm, now_ms);
        if (rc) {
            return rc;
        }
        for (size_t j = 0; j < n; j++) {
            char full[600];
            snprintf(full, sizeof full, "%s@%s", cm->name, names[j]);
            model_revisions_link(parent, names[j], fleet_find(f, cm->namespace_, full));
        }
    }
    return 0;
}

static int by_name(const struct model_revisions *rv, const char *v, size_t len)
{
    for (size_t i = 0; i < rv->n; i++) {
        if (strlen(rv->names[i]) == len && memcmp(rv->names[i], v, len) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* The split's pick, or the sticky key's when the request has one. */
static int pick_index(struct model_revisions *rv, const struct http_head *h, const char *tenant)
{
    if (rv->sticky_header) {
        const struct http_header *sh = http_head_find(h, rv->sticky_header);
        if (sh && sh->value_len) {
            return revsplit_pick_sticky(&rv->split,
                                        revsplit_hash(http_hvalue(h, sh), sh->value_len));
        }
    }
    if (rv->sticky_tenant && tenant) {
        return revsplit_pick_sticky(&rv->split, revsplit_hash(tenant, strlen(tenant)));
    }
    return revsplit_pick(&rv->split);
}

/* A warm revision with traffic (the largest share) for a cold pick. One at
 * 0% (a rolled-back canary kept warm) takes no split traffic, cold or not. */
static struct model *warm_instead(const struct model_revisions *rv)
{
    struct model *best = NULL;
    uint32_t best_pct = 0;
    for (size_t i = 0; i < rv->n; i++) {
        struct model *m = rv->rev[i];
        if (m && m->n_endpoints > 0 && rv->split.percent[i] > best_pct) {
            best = m;
            best_pct = rv->split.percent[i];
        }
    }
    return best;
}

struct model *model_pick_revision(struct model *parent, const struct http_head *h,
                                  const char *tenant, struct model **wake, enum reject_reason *why)
{
    struct model_revisions *rv = parent->revs;
    *wake = NULL;
    const struct http_header *tag = h ? http_head_find(h, REVISION_HEADER) : NULL;
    int i;
    if (tag) {
        i = by_name(rv, http_hvalue(h, tag), tag->value_len);
        if (i < 0) {
            *why = REJECT_UNKNOWN_REVISION;
            return NULL;
        }
        if (!rv->rev[i]) {
            *why = REJECT_NO_REPLICAS;
        }
        return rv->rev[i];
    }
    i = pick_index(rv, h, tenant);
    struct model *m = i >= 0 ? rv->rev[i] : NULL;
    if (!m) {
        *why = REJECT_NO_REPLICAS;
        return NULL;
    }
    if (rv->fallback && m->n_endpoints == 0) {
        struct model *warm = warm_instead(rv);
        if (warm) {
            *wake = m;
            return warm;
        }
    }
    return m;
}

struct rollout_decision model_rollout_tick(struct model *parent, uint64_t now_ms)
{
    struct model_revisions *rv = parent->revs;
    struct rollout_decision d = {.action = ROLLOUT_HOLD};
    if (!rv || !rv->rollout || rv->n != 2) {
        return d;
    }
    struct rollout_window stable = window_of(rv, 0), canary = window_of(rv, 1);
    d = rollout_decide(&rv->policy, &rv->state, &stable, &canary, now_ms);
    switch (d.action) {
    case ROLLOUT_STEP:
        rv->state.canary_percent = d.canary_percent;
        rv->steps++;
        new_window(rv, now_ms);
        break;
    case ROLLOUT_PROMOTE:
        rv->state.stage = ROLLOUT_PROMOTED;
        rv->state.canary_percent = 100;
        rv->promotions++;
        break;
    case ROLLOUT_ROLLBACK:
        rv->state.stage = ROLLOUT_ROLLED_BACK;
        rv->state.canary_percent = 0;
        rv->rollbacks++;
        break;
    default:
        return d;
    }
    apply_state(rv);
    rv->last = d;
    return d;
}

void model_revisions_restore(struct model *parent, const struct rollout_state *s, uint64_t now_ms)
{
    struct model_revisions *rv = parent->revs;
    if (!rv || rv->n != 2) {
        return;
    }
    rv->state = *s;
    apply_state(rv);
    new_window(rv, now_ms);
    rv->state.step_started_ms = s->step_started_ms;
}

uint32_t model_revision_percent(const struct model *parent, size_t i)
{
    return parent->revs && i < parent->revs->n ? parent->revs->split.percent[i] : 0;
}

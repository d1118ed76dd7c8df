/* Kubernetes backend, revisions: several Deployments labelled with the same
 * model name and each with a revision name (thaw.dev/revision) are that
 * model's revisions. Each is a model of its own ("<model>@<revision>", with
 * its own pods, scaling and warm-pool place); the model itself is a routing
 * entry (struct kgroup) that splits requests by each Deployment's
 * thaw.dev/traffic-percent (or KServe's serving.kserve.io/canaryTrafficPercent,
 * the canary's share, the other revision taking the rest). Percents that do
 * not add up to 100 are an error: logged, a Warning Event on each
 * Deployment, and the split in force (none at first) is kept.
 *
 * A rollout (thaw.dev/rollout: "true" on the canary's Deployment, with one
 * other revision, the stable one) is decided by the leader (revisions.h);
 * each step, promotion or rollback is written back as annotations
 * (traffic-percent on both, rollout-stage and rollout-step-started-at on
 * the canary) with an Event, so a restarted or new leader continues from
 * the cluster, not from memory. */
#include "internal.h"
#include "thaw/clock.h"
#include "thaw/k8s/json.h"
#include "thaw/log.h"
#include "thaw/revisions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t wall_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kube_revision_names(const struct k8s_model_spec *sp, char *const *group_hosts,
                         size_t n_group_hosts, struct config_model *cm, char *name,
                         size_t name_len, char *hosts_buf, size_t hosts_len, char **hosts,
                         size_t max_hosts)
{
    snprintf(name, name_len, "%s@%s", sp->name, sp->revision);
    cm->name = name;
    /* As Knative's tags: "<revision>-<model>", with the namespace forms a
     * model's own name has (".ns", ".ns.svc", ".ns.svc.cluster.local"), and
     * "<revision>-<host>" for each of the model's hosts (every revision's). */
    static const char *const ns_forms[] = {"", ".%s", ".%s.svc", ".%s.svc.cluster.local"};
    size_t used = 0, n = 0;
    for (size_t f = 0; f < 4 + n_group_hosts && n < max_hosts; f++) {
        char suffix[300] = "";
        if (f > 0 && f < 4) {
            snprintf(suffix, sizeof suffix, ns_forms[f], sp->namespace_);
        }
        const char *base = f < 4 ? sp->name : group_hosts[f - 4];
        int w = snprintf(hosts_buf + used, hosts_len - used, "%s-%s%s", sp->revision, base, suffix);
        if (w < 0 || (size_t)w >= hosts_len - used) {
            break;
        }
        hosts[n++] = hosts_buf + used;
        used += (size_t)w + 1;
    }
    cm->hosts = hosts;
    cm->n_hosts = n;
    cm->aliases = NULL;
    cm->n_aliases = 0;
}

struct members {
    struct kmodel *km[REVSPLIT_MAX];
    size_t n;
    bool too_many;
    const char *ns, *name;
};

static void collect_cb(void *ud, const char *key, void *value)
{
    struct members *ms = ud;
    struct kmodel *km = value;
    if (!km->spec.revision[0] || strcmp(km->spec.namespace_, ms->ns) != 0 ||
        strcmp(km->spec.name, ms->name) != 0) {
        return;
    }
    if (ms->n == REVSPLIT_MAX) {
        ms->too_many = true;
        return;
    }
    ms->km[ms->n++] = km;
}

/* The canary (the one with a rollout) last, the others by revision name. */
static int member_order(const void *a, const void *b)
{
    const struct kmodel *x = *(struct kmodel *const *)a, *y = *(struct kmodel *const *)b;
    if (x->spec.rollout != y->spec.rollout) {
        return x->spec.rollout ? 1 : -1;
    }
    return strcmp(x->spec.revision, y->spec.revision);
}

/* Adds the comma- or space-separated names of list to out (n of them, at
 * most max, each once), copying them into buf. */
static void add_names(const char *list, char *buf, size_t buflen, size_t *used, char **out,
                      size_t *n, size_t max)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ", ", &save); tok && *n < max;
         tok = strtok_r(NULL, ", ", &save)) {
        bool seen = false;
        for (size_t i = 0; i < *n && !seen; i++) {
            seen = strcmp(out[i], tok) == 0;
        }
        size_t len = strlen(tok) + 1;
        if (seen || *used + len > buflen) {
            continue;
        }
        memcpy(buf + *used, tok, len);
        out[(*n)++] = buf + *used;
        *used += len;
    }
}

size_t kube_group_hosts(struct kube_backend *kb, const struct k8s_model_spec *sp, char *buf,
                        size_t buflen, char **out, size_t max)
{
    struct members ms = {.ns = sp->namespace_, .name = sp->name};
    strmap_each(&kb->models, collect_cb, &ms);
    qsort(ms.km, ms.n, sizeof ms.km[0], member_order);
    size_t used = 0, n = 0;
    add_names(sp->hosts, buf, buflen, &used, out, &n, max);
    for (size_t i = 0; i < ms.n; i++) {
        if (strcmp(ms.km[i]->spec.deployment, sp->deployment) != 0) {
            add_names(ms.km[i]->spec.hosts, buf, buflen, &used, out, &n, max);
        }
    }
    return n;
}

/* The routing entry's names: the model's, and every revision's
 * thaw.dev/hosts and thaw.dev/aliases (the union). */
struct group_names {
    char buf[4096];
    char *hosts[32], *aliases[32];
    char joined[2048]; /* to tell a change */
};

static void group_names_of(const struct members *ms, struct config_model *cm,
                           struct group_names *gn)
{
    size_t used = 0;
    cm->n_hosts = cm->n_aliases = 0;
    for (size_t i = 0; i < ms->n; i++) {
        add_names(ms->km[i]->spec.hosts, gn->buf, sizeof gn->buf, &used, gn->hosts, &cm->n_hosts,
                  32);
    }
    for (size_t i = 0; i < ms->n; i++) {
        add_names(ms->km[i]->spec.aliases, gn->buf, sizeof gn->buf, &used, gn->aliases,
                  &cm->n_aliases, 32);
    }
    cm->hosts = gn->hosts;
    cm->aliases = gn->aliases;
    size_t w = 0;
    gn->joined[0] = '\0';
    for (size_t i = 0; i < cm->n_hosts + cm->n_aliases; i++) {
        const char *x = i < cm->n_hosts ? cm->hosts[i] : cm->aliases[i - cm->n_hosts];
        int k = snprintf(gn->joined + w, sizeof gn->joined - w, "%s%s",
                         i == cm->n_hosts ? "|" : ",", x);
        if (k < 0 || (size_t)k >= sizeof gn->joined - w) {
            break;
        }
        w += (size_t)k;
    }
}

static struct kgroup *group_new(struct kube_backend *kb, const char *key, const struct members *ms)
{
    struct kgroup *g = calloc(1, sizeof *g);
    if (!g) {
        return NULL;
    }
    g->kb = kb;
    snprintf(g->key, sizeof g->key, "%s", key);
    snprintf(g->namespace_, sizeof g->namespace_, "%s", ms->km[0]->spec.namespace_);
    snprintf(g->name, sizeof g->name, "%s", ms->km[0]->spec.name);
    struct config_model cm;
    config_model_defaults(&cm, &kb->cfg->limits);
    cm.name = g->name;
    cm.namespace_ = g->namespace_;
    struct group_names gn;
    group_names_of(ms, &cm, &gn);
    snprintf(g->names, sizeof g->names, "%s", gn.joined);
    g->m = fleet_add_model(kb->base.fleet, &cm);
    if (!g->m) {
        free(g);
        return NULL;
    }
    if (model_revisions_start(g->m)) {
        fleet_remove_model(kb->base.fleet, g->m, "out of memory");
        free(g);
        return NULL;
    }
    g->m->backend = &kb->base;
    g->m->backend_data = g;
    g->m->namespaced = true;
    strmap_put(&kb->groups, g->key, strlen(g->key), g);
    LOGI("model with revisions discovered", "model=%s namespace=%s", g->name, g->namespace_);
    return g;
}

/* The revisions' hosts or aliases changed: the model's routes follow, and
 * so do its revisions' tags, made of every revision's hosts. */
static void group_reroute(struct kgroup *g, const struct members *ms)
{
    struct config_model cm;
    config_model_defaults(&cm, &g->kb->cfg->limits);
    cm.name = g->name;
    cm.namespace_ = g->namespace_;
    struct group_names gn;
    group_names_of(ms, &cm, &gn);
    if (strcmp(gn.joined, g->names) == 0) {
        return;
    }
    snprintf(g->names, sizeof g->names, "%s", gn.joined);
    fleet_reroute_model(g->kb->base.fleet, g->m, &cm);
    for (size_t i = 0; i < ms->n; i++) {
        struct kmodel *km = ms->km[i];
        struct config_model rcm;
        config_model_defaults(&rcm, &g->kb->cfg->limits);
        rcm.namespace_ = km->spec.namespace_;
        char name[600], buf[4096];
        char *hosts[36];
        kube_revision_names(&km->spec, cm.hosts, cm.n_hosts, &rcm, name, sizeof name, buf,
                            sizeof buf, hosts, 36);
        fleet_reroute_model(g->kb->base.fleet, km->m, &rcm);
    }
}

static void group_remove(struct kube_backend *kb, struct kgroup *g, const char *why)
{
    strmap_del(&kb->groups, g->key, strlen(g->key));
    fleet_remove_model(kb->base.fleet, g->m, why);
    free(g);
}

/* The split the Deployments ask for, into pct; 0, or -1 with why set. */
static int split_of(const struct members *ms, bool rollout, uint32_t *pct, char *why, size_t whylen)
{
    if (rollout) {
        const struct k8s_model_spec *c = &ms->km[1]->spec;
        pct[1] = c->traffic_percent_set ? (uint32_t)c->traffic_percent : 0;
        pct[0] = 100 - pct[1];
        return 0;
    }
    if (ms->n == 1) {
        pct[0] = 100; /* a model's only revision: all of it, whatever its percent */
        return 0;
    }
    /* KServe's canaryTrafficPercent is the canary's share; the revision that
     * has been serving takes the rest. */
    if (ms->n == 2 && ms->km[0]->spec.traffic_percent_set != ms->km[1]->spec.traffic_percent_set) {
        size_t c = ms->km[0]->spec.traffic_percent_set ? 0 : 1;
        if (ms->km[c]->spec.traffic_from_kserve) {
            pct[c] = (uint32_t)ms->km[c]->spec.traffic_percent;
            pct[1 - c] = 100 - pct[c];
            return 0;
        }
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < ms->n; i++) {
        const struct k8s_model_spec *sp = &ms->km[i]->spec;
        if (!sp->traffic_percent_set) {
            snprintf(why, whylen, "revision %s (Deployment %s) has no thaw.dev/traffic-percent",
                     sp->revision, sp->deployment);
            return -1;
        }
        pct[i] = (uint32_t)sp->traffic_percent;
        sum += sp->traffic_percent;
    }
    if (sum != 100) {
        snprintf(why, whylen, "the revisions' thaw.dev/traffic-percent add up to %llu, not 100",
                 (unsigned long long)sum);
        return -1;
    }
    return 0;
}

static void report_split_error(struct kgroup *g, const struct members *ms, const char *why)
{
    if (strcmp(g->error, why) == 0 && g->error_reported) {
        return;
    }
    snprintf(g->error, sizeof g->error, "%s", why);
    g->error_reported = g->kb->deployments_synced >= g->kb->n_ns;
    if (!g->error_reported) {
        return; /* its other revisions may not be listed yet */
    }
    LOGW("invalid traffic split: keeping the split in force", "model=%s namespace=%s why=\"%s\"",
         g->name, g->namespace_, why);
    for (size_t i = 0; i < ms->n; i++) {
        kube_post_event(ms->km[i], "Warning", "InvalidTrafficSplit", why);
    }
}

/* The options of the model with revisions, from its Deployments. */
static void group_options(const struct members *ms, bool rollout, struct config_model *o)
{
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < ms->n; i++) {
        const struct k8s_model_spec *sp = &ms->km[i]->spec;
        o->fallback_to_warm_revision |= sp->fallback_to_warm_revision;
        if (sp->sticky_header[0] && !o->sticky_header) {
            o->sticky_header = (char *)sp->sticky_header;
        }
    }
    if (!rollout) {
        return;
    }
    const struct k8s_model_spec *c = &ms->km[1]->spec;
    o->rollout = (struct config_rollout){
        .enabled = true,
        .step_percent = c->rollout_step_percent,
        .step_interval_ms = c->rollout_step_interval_ms,
        .min_requests = c->rollout_min_requests,
        .max_error_rate_increase_pct = c->rollout_max_error_rate_increase_pct,
        .max_ttfb_p99_ratio_pct = c->rollout_max_ttfb_p99_ratio_pct,
        .ttfb_p99_tolerance_ms = c->rollout_ttfb_p99_tolerance_ms,
    };
}

/* The rollout's state as the canary's annotations keep it (a restart, or
 * another leader's write), when it differs from the one in force. */
static void restore_rollout(struct kgroup *g, const struct k8s_model_spec *c)
{
    struct model_revisions *rv = g->m->revs;
    if (!rv || !rv->rollout || c->rollout_stage < 0) {
        return;
    }
    uint32_t pct = c->traffic_percent_set ? (uint32_t)c->traffic_percent : 0;
    if ((int)rv->state.stage == c->rollout_stage && rv->state.canary_percent == pct) {
        return;
    }
    uint64_t now = clock_now_ms();
    int64_t age = c->rollout_step_started ? wall_now_ms() - c->rollout_step_started : 0;
    if (age < 0) {
        age = 0; /* clock skew: the step starts now */
    }
    struct rollout_state s = {(enum rollout_stage)c->rollout_stage, pct,
                              (uint64_t)age < now ? now - (uint64_t)age : 0};
    model_revisions_restore(g->m, &s, now);
    LOGI("rollout state read from the cluster", "model=%s namespace=%s stage=%s percent=%u",
         g->name, g->namespace_, rollout_stage_name(s.stage), pct);
}

/* How long a written rollout state is held against the cluster's older one
 * while its echo has not come (a write lost without an error answer). */
#define ROLLOUT_ECHO_WAIT_MS 30000

/* True while the canary's annotations are older than the state this
 * activator wrote: its write has not come back through the watch yet. */
static bool cluster_behind_write(struct kgroup *g, const struct kmodel *canary)
{
    if (!g->rollout_written) {
        return false;
    }
    const struct k8s_model_spec *c = &canary->spec;
    uint32_t pct = c->traffic_percent_set ? (uint32_t)c->traffic_percent : 0;
    if (strcmp(canary->key, g->written_canary) != 0 ||
        (c->rollout_stage == g->written_stage && pct == g->written_percent) ||
        clock_now_ms() - g->written_ms > ROLLOUT_ECHO_WAIT_MS || !kube_rollout_leads(&g->kb->base)) {
        g->rollout_written = false; /* the cluster has it, or it is not ours to hold */
        return false;
    }
    return true;
}

/* Groups whose held write is overdue (or no longer this activator's to
 * hold), a few a tick: syncing may remove a group, so not while iterating. */
struct overdue {
    struct kgroup *g[8];
    size_t n;
};

static void find_overdue(void *ud, const char *key, void *value)
{
    struct overdue *o = ud;
    struct kgroup *g = value;
    if (o->n < sizeof o->g / sizeof o->g[0] && g->rollout_written &&
        (clock_now_ms() - g->written_ms > ROLLOUT_ECHO_WAIT_MS ||
         !kube_rollout_leads(&g->kb->base))) {
        o->g[o->n++] = g;
    }
}

void kube_rollout_writes_tick(struct kube_backend *kb)
{
    struct overdue o = {.n = 0};
    strmap_each(&kb->groups, find_overdue, &o);
    for (size_t i = 0; i < o.n; i++) {
        struct kgroup *g = o.g[i];
        char ns[sizeof g->namespace_], name[sizeof g->name];
        snprintf(ns, sizeof ns, "%s", g->namespace_);
        snprintf(name, sizeof name, "%s", g->name);
        g->rollout_written = false;
        LOGW("a rollout write was not seen back through the watch: the cluster's state holds",
             "model=%s namespace=%s", name, ns);
        kube_revisions_sync(kb, ns, name); /* may free g */
    }
}

/* Two Deployments with one revision name: the first of the pair (the
 * second in *other), or -1. */
static int duplicate_revision(const struct members *ms, size_t *other)
{
    for (size_t i = 0; i < ms->n; i++) {
        for (size_t j = i + 1; j < ms->n; j++) {
            if (strcmp(ms->km[i]->spec.revision, ms->km[j]->spec.revision) == 0) {
                *other = j;
                return (int)i;
            }
        }
    }
    return -1;
}

/* Whether revision `name` is served now by one of the Deployments naming
 * it: a second Deployment naming a revision (a copied manifest) takes none
 * of its traffic while the split is invalid, whichever sorts first. */
static bool linked_to_one_of(const struct model *parent, const struct members *ms,
                             const char *name)
{
    const struct model_revisions *rv = parent->revs;
    for (size_t r = 0; r < rv->n; r++) {
        if (strcmp(rv->names[r], name) != 0 || !rv->rev[r]) {
            continue;
        }
        for (size_t i = 0; i < ms->n; i++) {
            if (ms->km[i]->m == rv->rev[r] && strcmp(ms->km[i]->spec.revision, name) == 0) {
                return true;
            }
        }
    }
    return false;
}

/* The split in force is kept while the Deployments' is invalid, less the
 * revisions whose Deployments are gone: their shares go to the others in
 * proportion (equal shares when those left had none), so no request is
 * split to a revision that is not there. */
static void drop_gone_revisions(struct kgroup *g, const struct members *ms)
{
    struct model_revisions *rv = g->m->revs;
    char keep[REVSPLIT_MAX][254];
    char *names[REVSPLIT_MAX];
    uint32_t pct[REVSPLIT_MAX];
    size_t n = 0;
    uint64_t sum = 0;
    for (size_t i = 0; rv && i < rv->n; i++) {
        bool here = false;
        for (size_t j = 0; j < ms->n && !here; j++) {
            here = strcmp(ms->km[j]->spec.revision, rv->names[i]) == 0;
        }
        if (here) {
            snprintf(keep[n], sizeof keep[n], "%s", rv->names[i]);
            names[n] = keep[n];
            pct[n] = rv->split.percent[i];
            sum += pct[n++];
        }
    }
    if (!rv || n == rv->n || n == 0) {
        return;
    }
    uint32_t given = 0;
    size_t largest = 0;
    for (size_t i = 0; i < n; i++) {
        pct[i] = sum ? (uint32_t)(pct[i] * 100 / sum) : (uint32_t)(100 / n);
        given += pct[i];
        largest = pct[i] > pct[largest] ? i : largest;
    }
    pct[largest] += 100 - given;
    struct config_model opts;
    group_options(ms, false, &opts);
    if (model_revisions_set(g->m, names, pct, n, &opts, clock_now_ms())) {
        LOGE("out of memory setting a model's revisions", "model=%s", g->key);
    }
    LOGI("revisions whose Deployments are gone left the split in force", "model=%s namespace=%s",
         g->name, g->namespace_);
}

void kube_revisions_sync(struct kube_backend *kb, const char *ns, const char *name)
{
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    struct kgroup *g = strmap_get(&kb->groups, key, strlen(key));
    struct members ms = {.ns = ns, .name = name};
    strmap_each(&kb->models, collect_cb, &ms);
    if (ms.n == 0) {
        if (g) {
            group_remove(kb, g, "the Deployments of its revisions were deleted");
        }
        return;
    }
    qsort(ms.km, ms.n, sizeof ms.km[0], member_order);
    if (!g && !(g = group_new(kb, key, &ms))) {
        LOGE("out of memory adding a model with revisions", "model=%s", key);
        return;
    }
    group_reroute(g, &ms);
    if (kb->deployments_synced < kb->n_ns) {
        return; /* judged once every Deployment is listed: kube_revisions_listed */
    }
    char why[400] = "";
    size_t canaries = 0;
    for (size_t i = 0; i < ms.n; i++) {
        canaries += ms.km[i]->spec.rollout;
    }
    bool rollout = canaries == 1 && ms.n == 2;
    uint32_t pct[REVSPLIT_MAX];
    size_t dup_other = 0;
    int dup = duplicate_revision(&ms, &dup_other);
    if (ms.too_many) {
        snprintf(why, sizeof why, "more than %d revisions", REVSPLIT_MAX);
    } else if (dup >= 0) {
        snprintf(why, sizeof why,
                 "revision %.63s is named by two Deployments (%.100s and %.100s); each "
                 "revision needs its own thaw.dev/revision",
                 ms.km[dup]->spec.revision, ms.km[dup]->spec.deployment,
                 ms.km[dup_other]->spec.deployment);
        rollout = false;
    } else if (canaries > 1 || (canaries == 1 && ms.n != 2)) {
        snprintf(why, sizeof why,
                 "thaw.dev/rollout needs exactly two revisions, one of them "
                 "the canary with the annotation (have %zu revisions, %zu "
                 "canaries)",
                 ms.n, canaries);
    } else {
        split_of(&ms, rollout, pct, why, sizeof why);
    }
    bool behind = rollout && !why[0] && cluster_behind_write(g, ms.km[1]);
    if (!rollout) {
        g->rollout_written = false; /* no rollout (any more): nothing held */
    }
    if (behind) {
        pct[1] = g->written_percent;
        pct[0] = 100 - pct[1];
    }
    if (why[0]) {
        report_split_error(g, &ms, why);
        if (g->m->revs && g->m->revs->rollout) {
            /* No rollout steps on a split that is not the Deployments': it
             * starts again from their annotations once they are valid. */
            g->m->revs->rollout = false;
            LOGW("rollout paused: the traffic split is invalid", "model=%s namespace=%s",
                 g->name, g->namespace_);
        }
        drop_gone_revisions(g, &ms);
    } else {
        g->error[0] = '\0';
        g->error_reported = false;
        char *names[REVSPLIT_MAX];
        for (size_t i = 0; i < ms.n; i++) {
            names[i] = ms.km[i]->spec.revision;
        }
        struct config_model opts;
        group_options(&ms, rollout, &opts);
        if (model_revisions_set(g->m, names, pct, ms.n, &opts, clock_now_ms())) {
            LOGE("out of memory setting a model's revisions", "model=%s", key);
        }
    }
    for (size_t i = 0; i < ms.n && g->m->revs; i++) {
        bool duplicated = dup >= 0 && strcmp(ms.km[i]->spec.revision, ms.km[dup]->spec.revision) == 0;
        if (!duplicated || ((int)i == dup && !linked_to_one_of(g->m, &ms, ms.km[i]->spec.revision))) {
            model_revisions_link(g->m, ms.km[i]->spec.revision, ms.km[i]->m);
        }
    }
    if (rollout && !why[0] && !behind) {
        restore_rollout(g, &ms.km[1]->spec);
    }
    fleet_revisions_changed(kb->base.fleet, g->m);
}

struct group_keys {
    char (*key)[2][254]; /* namespace, name */
    size_t n;
};

static void note_group(void *ud, const char *key, void *value)
{
    struct group_keys *gk = ud;
    struct kgroup *g = value;
    snprintf(gk->key[gk->n][0], sizeof gk->key[gk->n][0], "%s", g->namespace_);
    snprintf(gk->key[gk->n][1], sizeof gk->key[gk->n][1], "%s", g->name);
    gk->n++;
}

/* Every Deployment is listed: each model's revisions are judged now, from
 * all of them (before, a split would depend on the order they came in). */
void kube_revisions_listed(struct kube_backend *kb)
{
    struct group_keys gk = {calloc(kb->groups.count + 1, sizeof *gk.key), 0};
    if (!gk.key) {
        LOGE("out of memory judging models' revisions", NULL);
        return;
    }
    strmap_each(&kb->groups, note_group, &gk);
    for (size_t i = 0; i < gk.n; i++) {
        kube_revisions_sync(kb, gk.key[i][0], gk.key[i][1]); /* may remove a group */
    }
    free(gk.key);
}

/* ---- the rollout's writes ------------------------------------------------- */

static struct kmodel *member_named(struct kgroup *g, const char *revision)
{
    struct model_revisions *rv = g->m->revs;
    for (size_t i = 0; rv && i < rv->n; i++) {
        if (rv->rev[i] && strcmp(rv->names[i], revision) == 0 && rv->rev[i]->backend_data) {
            return rv->rev[i]->backend_data;
        }
    }
    return NULL;
}

static void on_rollout_written(void *ud, long status, const char *body, size_t len, const char *err)
{
    struct kmodel *km = ud;
    km->rollout_call = NULL;
    if (status == 200) {
        km->kb->rollout_writes++;
        return;
    }
    km->kb->rollout_write_errors++;
    struct kgroup *g = km->m->parent ? km->m->parent->backend_data : NULL;
    if (g && strcmp(g->written_canary, km->key) == 0) {
        g->rollout_written = false; /* the step is not in the cluster: its state holds again */
    }
    LOGW("writing a rollout's state to its Deployment failed",
         "deployment=%s status=%ld error=%s", km->key, status, LOG_Q(err ? err : ""));
}

static void patch_annotations(struct kmodel *km, const char *annotations)
{
    char body[600], path[700];
    snprintf(body, sizeof body, "{\"metadata\":{\"annotations\":{%s}}}", annotations);
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s", km->spec.namespace_,
             km->spec.deployment);
    k8s_call_cancel(km->rollout_call); /* this write carries all of it */
    km->rollout_call = k8s_request(km->kb->client, "PATCH", path, "application/merge-patch+json",
                                   body, strlen(body), 15000, on_rollout_written, km);
}

void kube_rollout_decided(struct backend *b, struct model *parent, const struct rollout_decision *d)
{
    struct kgroup *g = parent->backend_data;
    struct model_revisions *rv = parent->revs;
    if (!g || !rv || rv->n != 2) {
        return;
    }
    struct kmodel *stable = member_named(g, rv->names[0]), *canary = member_named(g, rv->names[1]);
    if (!canary) {
        return;
    }
    char when[40], anns[400];
    k8s_time_format_ms(wall_now_ms() - (int64_t)(clock_now_ms() - rv->state.step_started_ms), when,
                       sizeof when);
    snprintf(anns, sizeof anns,
             "\"thaw.dev/traffic-percent\":\"%u\",\"thaw.dev/rollout-stage\":\"%s\","
             "\"thaw.dev/rollout-step-started-at\":\"%s\"",
             rv->split.percent[1], rollout_stage_name(rv->state.stage), when);
    patch_annotations(canary, anns);
    g->rollout_written = true;
    snprintf(g->written_canary, sizeof g->written_canary, "%s", canary->key);
    g->written_stage = (int)rv->state.stage;
    g->written_percent = rv->split.percent[1];
    g->written_ms = clock_now_ms();
    if (stable) {
        snprintf(anns, sizeof anns, "\"thaw.dev/traffic-percent\":\"%u\"", rv->split.percent[0]);
        patch_annotations(stable, anns);
    }
    switch (d->action) {
    case ROLLOUT_ROLLBACK:
        kube_post_event(canary, "Warning", "CanaryRolledBack", d->why);
        break;
    case ROLLOUT_PROMOTE:
        kube_post_event(canary, "Normal", "CanaryPromoted", d->why);
        break;
    default:
        kube_post_event(canary, "Normal", "CanaryStepped", d->why);
        break;
    }
}

bool kube_rollout_leads(struct backend *b)
{
    struct kube_backend *kb = KB(b);
    return !kb->elect || kb->leading;
}

void kube_describe_group(struct kgroup *g, cJSON *out)
{
    cJSON_AddStringToObject(out, "backend", "kubernetes");
    cJSON_AddStringToObject(out, "state", "revisions");
    if (g->error[0]) {
        cJSON_AddStringToObject(out, "split_error", g->error);
    }
}

static void free_group_cb(void *ud, const char *key, void *value)
{
    free(value);
}

void kube_groups_free(struct kube_backend *kb)
{
    strmap_each(&kb->groups, free_group_cb, NULL);
    strmap_dispose(&kb->groups);
}

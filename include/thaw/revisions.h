/* Models with revisions.
 *
 * A model with revisions is a routing entry: it owns no replicas; each
 * request routed to it is given to one of its revisions, which are models
 * of their own (own queue, replicas, autoscaler, warm-pool place, metrics),
 * before it is queued. The pick, in order: the thaw-revision header (the
 * revision by name, for testing a canary directly), a sticky key (a
 * configured header's value, or the tenant) hashed onto the split, else the
 * split's smooth weighted round robin (revsplit.h). With fallback on, a pick
 * whose revision has no ready replica goes to a warm revision instead while
 * the cold one is woken.
 *
 * The rollout (rollout.h) moves the split of a two-revision model: the first
 * revision is the stable one, the second the canary. model_rollout_tick
 * compares what each did since the step began and applies the decision; the
 * caller logs it and, in a cluster, writes it where a restarted activator
 * reads it back (model_revisions_restore). */
#ifndef THAW_REVISIONS_H
#define THAW_REVISIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "thaw/http.h"
#include "thaw/model.h"
#include "thaw/revsplit.h"
#include "thaw/rollout.h"

#define REVISION_HEADER "thaw-revision"

/* Sets parent's revisions (names and percents as configured or annotated)
 * and links the revisions' models (NULL entries allowed: linked later by
 * model_revisions_link). A split and rollout already running with the same
 * names, percents and policy are kept. 0, -EINVAL (percents), -ENOMEM. */
int model_revisions_set(struct model *parent, char *const *names, const uint32_t *percent, size_t n,
                        const struct config_model *opts, uint64_t now_ms);
/* Makes parent a model with revisions before it has a valid split (it
 * routes nowhere until model_revisions_set). 0 or -ENOMEM. */
int model_revisions_start(struct model *parent);
/* Links (or, with NULL, unlinks) revision `name` of parent to its model. */
void model_revisions_link(struct model *parent, const char *name, struct model *rev);
/* Config models: links every model with revisions in cfg to its revisions'
 * models in f. 0 or -ENOMEM. */
int fleet_link_revisions(struct fleet *f, const struct config *cfg, uint64_t now_ms);

/* The revision a request goes to. tenant: the tenant's name, NULL for the
 * default one. *wake: a cold revision to wake (fallback only), else NULL.
 * NULL with *why set: REJECT_UNKNOWN_REVISION, or REJECT_NO_REPLICAS when
 * no revision is there. */
struct model *model_pick_revision(struct model *parent, const struct http_head *h,
                                  const char *tenant, struct model **wake, enum reject_reason *why);

/* One rollout step for parent at now_ms: decides and applies (the split,
 * the state, a new window on a step). Returns the decision (HOLD when
 * nothing changed or parent has no rollout). */
struct rollout_decision model_rollout_tick(struct model *parent, uint64_t now_ms);
/* Takes a rollout state read back from where it was kept (a restart). */
void model_revisions_restore(struct model *parent, const struct rollout_state *s, uint64_t now_ms);
/* The percent revision i has now. */
uint32_t model_revision_percent(const struct model *parent, size_t i);

#endif

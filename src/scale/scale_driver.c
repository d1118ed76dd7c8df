#include "thaw/scale_driver.h"
#include "thaw/clock.h"

#include <stdlib.h>

void scale_driver_init(struct scale_driver *d, const struct scale_driver_ops *ops, void *ud)
{
    d->ops = ops;
    d->ud = ud;
    d->next_plan_ms = 0;
}

unsigned scale_driver_capacity(unsigned gpu_slices, const struct config_warm_pool *wp)
{
    unsigned total = gpu_slices;
    if (wp->capacity_slices && (total == 0 || wp->capacity_slices < total)) {
        total = (unsigned)wp->capacity_slices;
    }
    return total;
}

bool scale_driver_due(const struct scale_driver *d, uint64_t now_ms)
{
    return now_ms >= d->next_plan_ms;
}

/* The autoscaler's wish per model, then the warm pool and admission across
 * the nodes (or one capacity of slices), then the backend applies each
 * target. */
void scale_driver_plan(struct scale_driver *d, const struct config *cfg)
{
    size_t cap = d->ops->count(d->ud);
    struct scaler_model **sms = calloc(cap ? cap : 1, sizeof *sms);
    if (!sms) {
        return;
    }
    uint64_t now = clock_now_ms();
    size_t n = d->ops->collect(d->ud, now, sms, cap);
    struct wp_cluster c = {0};
    if (d->ops->nodes && d->ops->nodes(d->ud, sms, n, &c)) {
        c.cap_slices = (unsigned)cfg->warm_pool.capacity_slices;
    } else {
        c = (struct wp_cluster){0};
        c.cap_slices = scale_driver_capacity(d->ops->gpu_slices(d->ud), &cfg->warm_pool);
    }
    scaler_forecast(sms, n, clock_wall_ms(), &cfg->autoscaler);
    scaler_plan(sms, n, &c, (unsigned)cfg->warm_pool.budget_slices, now);
    d->ops->apply(d->ud, sms, n, now);
    free(sms);
    d->next_plan_ms = now + cfg->autoscaler.tick_ms;
}

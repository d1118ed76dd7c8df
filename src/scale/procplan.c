#include "thaw/procplan.h"

int procplan_gpu_pick(const struct gpu_slot *gpus, size_t n, unsigned need)
{
    int best = -1;
    unsigned best_free = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned free_slices = gpus[i].slices - gpus[i].used;
        if (free_slices < need) {
            continue;
        }
        if (best < 0 || free_slices < best_free) {
            best = (int)i;
            best_free = free_slices;
        }
    }
    return best;
}

uint64_t procplan_restart_backoff_ms(unsigned failures)
{
    if (failures == 0) {
        return 0;
    }
    uint64_t d = 1000;
    for (unsigned i = 1; i < failures && d < 60000; i++) {
        d *= 2;
    }
    return d > 60000 ? 60000 : d;
}

unsigned procplan_mps_percentage(unsigned slices, unsigned total)
{
    if (total == 0) {
        return 100;
    }
    unsigned pct = (100 * slices + total - 1) / total;
    return pct > 100 ? 100 : pct < 1 ? 1 : pct;
}

#include "thaw/fdbudget.h"

void fdbudget_derive(struct fdbudget *b, uint64_t limit, uint64_t in_use)
{
    b->limit = limit;
    b->in_use = in_use;
    uint64_t share = limit / FDBUDGET_RESERVE_SHARE;
    b->reserve = in_use + FDBUDGET_RESERVE_FIXED + share;
    if (b->reserve < in_use) {
        b->reserve = UINT64_MAX; /* an absurd in_use: nothing left */
    }
    uint64_t left = limit > b->reserve ? limit - b->reserve : 0;
    /* Even a limit with no room gets one: thaw still serves, slowly. */
    b->max_connections = left / 2 ? left / 2 : 1;
    uint64_t refused = FDBUDGET_REFUSED_FIXED + limit / FDBUDGET_REFUSED_SHARE;
    b->max_refused = refused < FDBUDGET_REFUSED_MAX ? refused : FDBUDGET_REFUSED_MAX;
}

uint64_t fdbudget_connections(const struct fdbudget *b, uint64_t configured)
{
    if (!b->limit || configured <= b->max_connections) {
        return configured;
    }
    return b->max_connections;
}

uint64_t fdbudget_limit_for(const struct fdbudget *b, uint64_t connections)
{
    /* The budget grows with the limit: the least limit that allows them,
     * between the descriptors needed without the proportional reserve and
     * twice that. */
    uint64_t lo = 2 * connections + b->in_use + FDBUDGET_RESERVE_FIXED, hi = 2 * lo;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        struct fdbudget t;
        fdbudget_derive(&t, mid, b->in_use);
        if (t.max_connections >= connections) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

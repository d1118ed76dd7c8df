/* The one clock: monotonic milliseconds, and the timeval libevent wants.
 * A leaf: includes nothing of thaw's. Pure modules take time as arguments
 * instead of calling this. */
#ifndef THAW_CLOCK_H
#define THAW_CLOCK_H

#include <stdint.h>
#include <sys/time.h>

/* Milliseconds on CLOCK_MONOTONIC (arbitrary origin, never goes back). */
uint64_t clock_now_ms(void);
/* Milliseconds since the Unix epoch (UTC): for what follows the time of day. */
uint64_t clock_wall_ms(void);

/* ms as a relative timeout for event_add. */
static inline struct timeval clock_timeval(uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

#endif

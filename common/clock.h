/* The library's clocks, one inline function per clock id, so that every layer
 * reads time the same way and a call's timestamps cost no call.
 *
 * CLOCK_MONOTONIC: every deadline, timeout, timer and latency. It never steps
 * back when the wall clock is set, and it is the clock of the condition
 * variables the library waits on (pthread_condattr_setclock) and of
 * FUTEX_WAIT_BITSET's absolute deadlines, so a deadline computed here can be
 * handed to them unchanged. Not _COARSE: latencies are measured in
 * microseconds and the coarse clock ticks every few milliseconds.
 *
 * CLOCK_REALTIME: only where the wall clock is the point or the API leaves no
 * choice: log timestamps (UTC), and pthread_cond_timedwait on a condition
 * variable created with the default clock attribute. */
#ifndef VRPC_COMMON_CLOCK_H
#define VRPC_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC as a timespec. */
static inline void vrpc_clock_mono_ts(struct timespec *ts) { clock_gettime(CLOCK_MONOTONIC, ts); }

/* CLOCK_MONOTONIC in nanoseconds (vrpc_now_ns in rpc.h is this clock). */
static inline int64_t vrpc_clock_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_REALTIME as a timespec (wall clock: log stamps, default-clock waits). */
static inline void vrpc_clock_real_ts(struct timespec *ts) { clock_gettime(CLOCK_REALTIME, ts); }

#endif

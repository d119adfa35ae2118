/* The adaptive busy-wait window shared by the latency modes (private
 * header): how long a thread that waits for something that usually comes
 * soon (a poller for its next completion, a caller for its response) keeps
 * looking before it sleeps.
 *
 * Spinning pays when what we wait for comes sooner than a sleep and wake-up
 * would take (an epoll or futex wake-up, and on an idle CPU of a VM a wake
 * from idle: tens of microseconds); it is wasted CPU when it does not come
 * at all. So the window follows what the waits recently took: twice an EWMA
 * (weight 1/8) of recent waits, never below `floor` (the old fixed window,
 * so a fast path never gets a shorter spin than before) and never above
 * `cap` (the CPU bound: at most cap of spinning per wait). A wait longer
 * than the cap is not a sample but counted as "slow": once the recent waits
 * are mostly slow (the peer is idle, or its answers take long), the window
 * falls back to the floor, so a thread that waits for something that rarely
 * comes soon spends no more than the floor per wait, as with the fixed
 * window. Nobody spins without waiting for something: an idle poller or
 * caller sleeps once its window has passed.
 *
 * Thread contract: one estimator may be updated and read by several threads
 * at once (the callers of one channel): its state is one 64-bit word read
 * and written with relaxed atomics, so a lost update costs one sample,
 * never a torn value. */
#ifndef VRPC_COMMON_SPIN_H
#define VRPC_COMMON_SPIN_H

#include <stdint.h>

struct vrpc_spin_est {
    /* low 32 bits: EWMA of fast waits in ns (at most cap); high 32: EWMA of
     * the share of slow waits, in 1/65536 */
    uint64_t word;
};

#define VRPC_SPIN_SLOW_ONE 65536u
/* At or above this share of slow waits (1/2) the window is the floor. */
#define VRPC_SPIN_SLOW_MAX (VRPC_SPIN_SLOW_ONE / 2)

/* Records one wait of ns nanoseconds; cap_ns as in vrpc_spin_window_ns. */
static inline void vrpc_spin_est_add(struct vrpc_spin_est *e, uint64_t ns, uint64_t cap_ns)
{
    uint64_t w = __atomic_load_n(&e->word, __ATOMIC_RELAXED);
    uint32_t avg = (uint32_t)w, slow = (uint32_t)(w >> 32);

    if (ns > cap_ns) {
        slow += (VRPC_SPIN_SLOW_ONE - slow) / 8;
    } else {
        slow -= slow / 8;
        if (avg == 0)
            avg = (uint32_t)ns; /* the first sample, not an eighth of it */
        else
            avg = (uint32_t)((int64_t)avg + ((int64_t)ns - (int64_t)avg) / 8);
    }
    __atomic_store_n(&e->word, ((uint64_t)slow << 32) | avg, __ATOMIC_RELAXED);
}

/* The window in ns: floor_ns when most recent waits were slower than cap_ns,
 * else twice the recent fast waits, clamped to [floor_ns, cap_ns]. */
static inline uint64_t vrpc_spin_window_ns(const struct vrpc_spin_est *e, uint64_t floor_ns, uint64_t cap_ns)
{
    uint64_t w = __atomic_load_n(&e->word, __ATOMIC_RELAXED);
    uint64_t win = 2 * (uint64_t)(uint32_t)w;

    if ((uint32_t)(w >> 32) >= VRPC_SPIN_SLOW_MAX || win < floor_ns)
        win = floor_ns;
    return win < cap_ns ? win : cap_ns;
}

#endif

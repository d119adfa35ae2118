/* Hashed timing wheel for call deadlines: arm and cancel are O(1) under one
 * mutex, and one thread per wheel (not one per call) advances it, sleeping
 * while nothing is armed. Resolution is one tick (a timer fires up to one
 * tick late, never early).
 *
 * Thread contract: arm/cancel from any thread; a timer is armed at most once
 * at a time. fn runs on the wheel's thread without the lock held, possibly
 * after a cancel that returned false: fn must check, with arg, that its event
 * is still current (the RPC core passes the call id and lets the pending
 * table's generation check decide). */
#ifndef VRPC_RPC_TIMER_H
#define VRPC_RPC_TIMER_H

#include <stdbool.h>
#include <stdint.h>

struct vrpc_timer;
typedef void (*vrpc_timer_fn)(void *ctx, uint64_t arg);

struct vrpc_timer {
    struct vrpc_timer *next, *prev; /* bucket list, under the wheel lock */
    uint64_t tick;                  /* absolute tick at which it fires */
    vrpc_timer_fn fn;
    void *ctx;
    uint64_t arg;
    bool armed;
};

struct vrpc_timer_wheel;

/* tick_us: resolution (0: 1000). Starts the wheel's thread. */
int vrpc_timer_wheel_create(uint32_t tick_us, struct vrpc_timer_wheel **out);
/* Stop the thread; timers still armed are dropped without firing. Safe on NULL. */
void vrpc_timer_wheel_destroy(struct vrpc_timer_wheel *w);

/* Arm t to call fn(ctx, arg) once expires_ns (CLOCK_MONOTONIC) has passed. */
void vrpc_timer_arm(struct vrpc_timer_wheel *w, struct vrpc_timer *t, int64_t expires_ns, vrpc_timer_fn fn, void *ctx,
                    uint64_t arg);
/* True if t was armed and is now disarmed without firing; false if it was not
 * armed or has already been taken for firing. */
bool vrpc_timer_cancel(struct vrpc_timer_wheel *w, struct vrpc_timer *t);

/* Armed timers (for tests). */
uint32_t vrpc_timer_wheel_count(struct vrpc_timer_wheel *w);

#endif

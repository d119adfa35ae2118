/* Hashed timing wheel, see timer.h. 1024 buckets of one tick each; a timer
 * more than one revolution ahead waits in its bucket until its round. */
#include "rpc/timer.h"
#include "common/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <verbrpc/rpc.h>

#define WHEEL_SIZE 1024u
#define FIRE_BATCH 64

struct vrpc_timer_wheel {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    bool thread_started;
    bool stop;
    uint64_t tick_ns;
    uint64_t cur_tick; /* next tick to process */
    uint32_t count;
    struct vrpc_timer buckets[WHEEL_SIZE]; /* list heads (sentinels) */
};

int64_t vrpc_now_ns(void) { return vrpc_clock_mono_ns(); }

static uint64_t now_tick(const struct vrpc_timer_wheel *w) { return (uint64_t)vrpc_now_ns() / w->tick_ns; }

static void unlink_timer(struct vrpc_timer *t)
{
    t->prev->next = t->next;
    t->next->prev = t->prev;
    t->next = t->prev = NULL;
    t->armed = false;
}

static void *wheel_main(void *arg)
{
    struct vrpc_timer_wheel *w = arg;
    struct {
        vrpc_timer_fn fn;
        void *ctx;
        uint64_t arg;
    } batch[FIRE_BATCH];

    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        if (w->count == 0) {
            pthread_cond_wait(&w->cond, &w->lock);
            continue;
        }
        uint64_t limit = now_tick(w);
        int nb = 0;
        while (w->cur_tick < limit && nb < FIRE_BATCH) {
            struct vrpc_timer *head = &w->buckets[w->cur_tick % WHEEL_SIZE];
            for (struct vrpc_timer *t = head->next, *nx; t != head && nb < FIRE_BATCH; t = nx) {
                nx = t->next;
                if (t->tick <= w->cur_tick) {
                    unlink_timer(t);
                    w->count--;
                    batch[nb].fn = t->fn;
                    batch[nb].ctx = t->ctx;
                    batch[nb].arg = t->arg;
                    nb++;
                }
            }
            if (nb == FIRE_BATCH)
                break; /* rescan this bucket after firing */
            w->cur_tick++;
        }
        if (nb) {
            pthread_mutex_unlock(&w->lock);
            for (int i = 0; i < nb; i++)
                batch[i].fn(batch[i].ctx, batch[i].arg);
            pthread_mutex_lock(&w->lock);
            continue;
        }
        uint64_t wake = (w->cur_tick + 1) * w->tick_ns;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000), .tv_nsec = (long)(wake % 1000000000)};
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

int vrpc_timer_wheel_create(uint32_t tick_us, struct vrpc_timer_wheel **out)
{
    struct vrpc_timer_wheel *w = calloc(1, sizeof(*w));
    pthread_condattr_t ca;
    int rc;

    if (!w)
        return -ENOMEM;
    w->tick_ns = (uint64_t)(tick_us ? tick_us : 1000) * 1000;
    for (unsigned i = 0; i < WHEEL_SIZE; i++)
        w->buckets[i].next = w->buckets[i].prev = &w->buckets[i];
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    w->cur_tick = now_tick(w);
    rc = pthread_create(&w->thread, NULL, wheel_main, w);
    if (rc) {
        vrpc_timer_wheel_destroy(w);
        return -rc;
    }
    w->thread_started = true;
    *out = w;
    return 0;
}

void vrpc_timer_wheel_destroy(struct vrpc_timer_wheel *w)
{
    if (!w)
        return;
    if (w->thread_started) {
        pthread_mutex_lock(&w->lock);
        w->stop = true;
        pthread_cond_signal(&w->cond);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
    }
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

void vrpc_timer_arm(struct vrpc_timer_wheel *w, struct vrpc_timer *t, int64_t expires_ns, vrpc_timer_fn fn, void *ctx,
                    uint64_t arg)
{
    uint64_t tick = expires_ns <= 0 ? 0 : (uint64_t)expires_ns / w->tick_ns;

    t->fn = fn;
    t->ctx = ctx;
    t->arg = arg;
    pthread_mutex_lock(&w->lock);
    if (w->count == 0)
        w->cur_tick = now_tick(w); /* the wheel idled: do not replay empty ticks */
    if (tick < w->cur_tick)
        tick = w->cur_tick;
    t->tick = tick;
    struct vrpc_timer *head = &w->buckets[tick % WHEEL_SIZE];
    t->next = head->next;
    t->prev = head;
    head->next->prev = t;
    head->next = t;
    t->armed = true;
    if (w->count++ == 0)
        pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

bool vrpc_timer_cancel(struct vrpc_timer_wheel *w, struct vrpc_timer *t)
{
    bool was = false;

    pthread_mutex_lock(&w->lock);
    if (t->armed) {
        unlink_timer(t);
        w->count--;
        was = true;
    }
    pthread_mutex_unlock(&w->lock);
    return was;
}

uint32_t vrpc_timer_wheel_count(struct vrpc_timer_wheel *w)
{
    pthread_mutex_lock(&w->lock);
    uint32_t n = w->count;
    pthread_mutex_unlock(&w->lock);
    return n;
}

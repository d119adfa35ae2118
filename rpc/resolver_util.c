/* Shared pieces of the resolvers (rpc/resolver_internal.h): URI sets,
 * change-only delivery, the resolver thread's sleep, target options. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <verbrpc/transport.h>
#include "common/clock.h"
#include "common/log_internal.h"
#include "rpc/resolver_internal.h"

int vrpc_uri_set_add(struct vrpc_uri_set *s, const char *uri, char *why, size_t why_len)
{
    char **nv;
    int rc;

    if (strlen(uri) >= VRPC_RESOLVER_MAX_URI) {
        snprintf(why, why_len, "longer than %d bytes", VRPC_RESOLVER_MAX_URI - 1);
        return -EINVAL;
    }
    if ((rc = vrpc_uri_check(uri, why, why_len)))
        return rc;
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], uri))
            return 0;
    if (s->n == VRPC_RESOLVER_MAX_ADDRS) {
        snprintf(why, why_len, "more than %d addresses", VRPC_RESOLVER_MAX_ADDRS);
        return -E2BIG;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        if (!(nv = realloc(s->v, cap * sizeof *nv)))
            return -ENOMEM;
        s->v = nv;
        s->cap = cap;
    }
    if (!(s->v[s->n] = strdup(uri)))
        return -ENOMEM;
    s->n++;
    return 0;
}

void vrpc_uri_set_clear(struct vrpc_uri_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static bool contains(const struct vrpc_uri_set *s, const char *uri)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], uri))
            return true;
    return false;
}

bool vrpc_uri_set_equal(const struct vrpc_uri_set *a, const struct vrpc_uri_set *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) /* both hold distinct strings */
        if (!contains(b, a->v[i]))
            return false;
    return true;
}

void vrpc_rslv_deliver(struct vrpc_rslv_out *o, struct vrpc_uri_set *next)
{
    if (o->delivered && vrpc_uri_set_equal(&o->last, next)) {
        vrpc_uri_set_clear(next);
        return;
    }
    vrpc_uri_set_clear(&o->last);
    o->last = *next;
    *next = (struct vrpc_uri_set){0};
    o->delivered = true;
    o->fn(o->arg, (const char *const *)o->last.v, o->last.n);
}

void vrpc_rslv_out_fini(struct vrpc_rslv_out *o) { vrpc_uri_set_clear(&o->last); }

static void *loop_main(void *p)
{
    struct vrpc_rslv_loop *l = p;
    l->body(l->arg);
    return NULL;
}

int vrpc_rslv_loop_start(struct vrpc_rslv_loop *l, void (*body)(void *), void *arg, uint32_t min_gap_ms)
{
    pthread_condattr_t ca;
    int rc;

    *l = (struct vrpc_rslv_loop){.body = body, .arg = arg, .min_gap_ns = (int64_t)min_gap_ms * 1000000};
    l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* -1: wait_fd falls back to short polls */
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_create(&l->th, NULL, loop_main, l))) {
        if (l->efd >= 0)
            close(l->efd);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        return -rc;
    }
    l->started = true;
    return 0;
}

static void ns_to_ts(int64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

/* Under l->mu: true and the kick consumed if a refresh is due now; else
 * *until lowered to when a deferred one will be. */
static bool kick_due_locked(struct vrpc_rslv_loop *l, int64_t now, int64_t *until)
{
    int64_t kick_at;
    if (!l->kick)
        return false;
    kick_at = l->last_kick_ns ? l->last_kick_ns + l->min_gap_ns : now;
    if (now >= kick_at) {
        l->kick = false;
        l->last_kick_ns = now;
        return true;
    }
    if (kick_at < *until)
        *until = kick_at;
    return false;
}

/* A refresh ends the wait at once, or at last_kick + min_gap if that is
 * later (the refresh is deferred, never lost). */
bool vrpc_rslv_loop_wait(struct vrpc_rslv_loop *l, uint64_t timeout_ms)
{
    int64_t now = vrpc_clock_mono_ns();
    int64_t deadline = timeout_ms > (uint64_t)INT64_MAX / 2000000 ? INT64_MAX / 2 : now + (int64_t)timeout_ms * 1000000;
    struct timespec ts;
    bool stop;

    pthread_mutex_lock(&l->mu);
    while (!l->stop && now < deadline) {
        int64_t until = deadline;
        if (kick_due_locked(l, now, &until))
            break;
        ns_to_ts(until, &ts);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        now = vrpc_clock_mono_ns();
    }
    stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    return stop;
}

bool vrpc_rslv_loop_wait_fd(struct vrpc_rslv_loop *l, int fd, uint64_t timeout_ms, bool *ready)
{
    int64_t now = vrpc_clock_mono_ns();
    int64_t deadline = timeout_ms > (uint64_t)INT64_MAX / 2000000 ? INT64_MAX / 2 : now + (int64_t)timeout_ms * 1000000;

    *ready = false;
    for (;;) {
        int64_t until = deadline;
        bool stop, due;
        pthread_mutex_lock(&l->mu);
        stop = l->stop;
        due = !stop && kick_due_locked(l, now, &until);
        pthread_mutex_unlock(&l->mu);
        if (stop || due || now >= deadline)
            return stop;
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = l->efd, .events = POLLIN}};
        int64_t ms = (until - now + 999999) / 1000000;
        if (l->efd < 0 && ms > 100)
            ms = 100; /* no eventfd: see stop and refresh at least every 100 ms */
        if (poll(p, l->efd >= 0 ? 2 : 1, ms > INT32_MAX ? INT32_MAX : (int)ms) > 0) {
            uint64_t v;
            if (p[1].revents & POLLIN && read(l->efd, &v, sizeof v) < 0)
                v = 0; /* drained (EAGAIN: another wake took it) */
            if (p[0].revents & (POLLIN | POLLERR | POLLHUP)) {
                *ready = true;
                return vrpc_rslv_loop_stopping(l);
            }
        }
        now = vrpc_clock_mono_ns();
    }
}

/* Wake a poll in vrpc_rslv_loop_wait_fd. */
static void wake_fd(struct vrpc_rslv_loop *l)
{
    uint64_t one = 1;
    if (l->efd >= 0 && write(l->efd, &one, sizeof one) < 0)
        one = 0; /* the counter is full: a wake is pending anyway */
}

bool vrpc_rslv_loop_stopping(struct vrpc_rslv_loop *l)
{
    bool stop;
    pthread_mutex_lock(&l->mu);
    stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    return stop;
}

void vrpc_rslv_loop_refresh(struct vrpc_rslv_loop *l)
{
    pthread_mutex_lock(&l->mu);
    l->kick = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    wake_fd(l);
}

void vrpc_rslv_loop_stop(struct vrpc_rslv_loop *l)
{
    if (!l->started)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    wake_fd(l);
    pthread_join(l->th, NULL);
    if (l->efd >= 0)
        close(l->efd);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    l->started = false;
}

const char *vrpc_rslv_prefix_scheme(const char *rest, char *scheme, size_t cap)
{
    size_t n = 0;

    while ((rest[n] >= 'a' && rest[n] <= 'z') || rest[n] == '+')
        n++;
    scheme[0] = '\0';
    if (n == 0 || rest[n] != '/' || !strncmp(rest + n, "://", 3) || n >= cap)
        return rest;
    memcpy(scheme, rest, n);
    scheme[n] = '\0';
    return rest + n + 1;
}

int vrpc_rslv_split_opts(const char *scheme, const char *rest, char **body_out,
                         int (*opt)(void *ctx, const char *key, const char *val), void *ctx)
{
    const char *q = strchr(rest, '?');
    char *body, *opts, *save = NULL;
    int rc = 0;

    if (!(body = strndup(rest, q ? (size_t)(q - rest) : strlen(rest))))
        return -ENOMEM;
    if (!q) {
        *body_out = body;
        return 0;
    }
    if (!(opts = strdup(q + 1))) {
        free(body);
        return -ENOMEM;
    }
    for (char *kv = strtok_r(opts, "&", &save); kv && !rc; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            vrpc_rpc_log("resolver: '%s://%s': option '%s' has no '=value'", scheme, rest, kv);
            rc = -EINVAL;
            break;
        }
        *eq = '\0';
        if ((rc = opt(ctx, kv, eq + 1)))
            vrpc_rpc_log("resolver: '%s://%s': bad option %s=%s", scheme, rest, kv, eq + 1);
    }
    free(opts);
    if (rc) {
        free(body);
        return rc;
    }
    *body_out = body;
    return 0;
}

int vrpc_rslv_parse_u32(const char *val, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    unsigned long x;

    if (!*val || *val < '0' || *val > '9')
        return -EINVAL;
    errno = 0;
    x = strtoul(val, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return -EINVAL;
    *out = (uint32_t)x;
    return 0;
}

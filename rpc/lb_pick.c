/* The policies of a channel over many servers (round robin, pick first,
 * least outstanding, ring hash), the hash ring, and outlier ejection. Runs
 * on the calling thread under the set's read lock; no allocation. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/channel_internal.h"
#include "rpc/lb.h"

__thread uint64_t vrpc_lb_rand_x __attribute__((tls_model("initial-exec")));

uint64_t vrpc_lb_rand_seed(void)
{
    vrpc_lb_rand_x = (uint64_t)(uintptr_t)&vrpc_lb_rand_x ^ (uint64_t)vrpc_now_ns() ^ 0x9e3779b97f4a7c15ull;
    if (!vrpc_lb_rand_x)
        vrpc_lb_rand_x = 0x9e3779b97f4a7c15ull;
    return vrpc_lb_rand_x;
}

/* FNV-1a 64, then a mixer (splitmix64's finaliser) so that nearby keys
 * spread over the ring. */
uint64_t vrpc_lb_hash(const void *p, size_t len)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static int point_cmp(const void *a, const void *b)
{
    const struct lb_point *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h;
}

int vrpc_lb_ring_build(struct lb_set *set)
{
    set->nring = set->n * VRPC_LB_RING_POINTS;
    if (!set->nring)
        return 0;
    unsigned bits = 1;
    while (bits < 16 && (1ull << bits) < 2 * set->nring)
        bits++;
    size_t nb = (size_t)1 << bits;
    if (!(set->ring = malloc((set->nring + 1) * sizeof(*set->ring) + nb * sizeof(*set->bucket))))
        return -ENOMEM;
    set->bucket = (uint32_t *)(set->ring + set->nring + 1);
    set->bucket_shift = 64 - bits;
    for (size_t i = 0; i < set->n; i++) {
        for (unsigned k = 0; k < VRPC_LB_RING_POINTS; k++) {
            char key[VRPC_LB_URI_MAX + 16];
            int n = snprintf(key, sizeof key, "%s#%u", set->subs[i]->uri, k);
            set->ring[i * VRPC_LB_RING_POINTS + k] = (struct lb_point){vrpc_lb_hash(key, (size_t)n), (uint32_t)i};
        }
    }
    qsort(set->ring, set->nring, sizeof(*set->ring), point_cmp);
    /* the sentinel: every scan stops there, and it owns what wraps round */
    set->ring[set->nring] = (struct lb_point){UINT64_MAX, set->ring[0].sub};
    size_t j = 0;
    for (size_t b = 0; b < nb; b++) {
        uint64_t lo = (uint64_t)b << set->bucket_shift;
        while (j < set->nring && set->ring[j].h < lo)
            j++;
        set->bucket[b] = (uint32_t)j;
    }
    return 0;
}

/* Nothing usable: the first from start that is healthy and not ejected,
 * preferring one not in back-off (trying it connects it), else subs[start]. */
static struct vrpc_subch *fallback(const struct lb_set *set, size_t start)
{
    int64_t now = vrpc_now_ns();
    struct vrpc_subch *second = NULL;
    for (size_t i = 0; i < set->n; i++) {
        struct vrpc_subch *s = set->subs[(start + i) % set->n];
        if (__atomic_load_n(&s->health, __ATOMIC_RELAXED) == LB_HEALTH_NOT_SERVING ||
            now < __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED))
            continue;
        if (vrpc_lb_sub_state(s) != VRPC_CHANNEL_TRANSIENT_FAILURE)
            return s;
        if (!second)
            second = s;
    }
    return second ? second : set->subs[start % set->n];
}

static struct vrpc_subch *pick_scan(const struct lb_set *set, size_t start)
{
    for (size_t i = 0; i < set->n; i++) {
        struct vrpc_subch *s = set->subs[(start + i) % set->n];
        if (vrpc_lb_usable(s))
            return s;
    }
    return fallback(set, start);
}

/* Round robin: the next one, or if it is not usable the next of those
 * that are (the one after an unusable server must not take its share). */
struct vrpc_subch *vrpc_lb_pick_rr(const struct lb_set *set, uint32_t turn)
{
    struct vrpc_subch *s = set->subs[turn % set->n];
    if (vrpc_lb_usable(s))
        return s;
    size_t nu = 0;
    for (size_t i = 0; i < set->n; i++)
        nu += vrpc_lb_usable(set->subs[i]);
    if (!nu)
        return fallback(set, turn % set->n);
    size_t k = turn % nu;
    for (size_t i = 0; i < set->n; i++)
        if (vrpc_lb_usable(set->subs[i]) && k-- == 0)
            return set->subs[i];
    return pick_scan(set, turn % set->n); /* the states changed meanwhile */
}

/* Power of two choices on outstanding calls: a and b (!= a unless n is 1)
 * drawn; the one with fewer attempts in flight if both are usable, else the
 * usable one, else a scan from a. */
static struct vrpc_subch *pick_least_rest(const struct lb_set *set, size_t a, size_t b)
{
    if (set->n == 1)
        return pick_scan(set, 0);
    struct vrpc_subch *x = set->subs[a], *y = set->subs[b];
    bool ux = vrpc_lb_usable(x), uy = vrpc_lb_usable(y);
    if (ux && uy)
        return __atomic_load_n(&x->outstanding, __ATOMIC_RELAXED) <= __atomic_load_n(&y->outstanding, __ATOMIC_RELAXED)
                   ? x
                   : y;
    if (ux)
        return x;
    if (uy)
        return y;
    return pick_scan(set, a);
}

/* Ring hash from the first point at or after the key's (lo): the key's
 * owner, or past it only while it is down (back-off, ejected, NOT_SERVING):
 * one still connecting gets the call, which waits for the connect, so that
 * keys do not move while a channel starts up. */
static struct vrpc_subch *pick_ring_from(const struct lb_set *set, size_t lo)
{
    for (size_t i = 0; i < set->nring; i++) {
        struct vrpc_subch *s = set->subs[set->ring[(lo + i) % set->nring].sub];
        if (vrpc_lb_usable(s))
            return s;
        enum vrpc_channel_state st = vrpc_lb_sub_state(s);
        if ((st == VRPC_CHANNEL_IDLE || st == VRPC_CHANNEL_CONNECTING) &&
            __atomic_load_n(&s->health, __ATOMIC_RELAXED) != LB_HEALTH_NOT_SERVING &&
            vrpc_now_ns() >= __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED))
            return s;
    }
    return fallback(set, set->ring[lo % set->nring].sub);
}

/* Least outstanding (power of two choices). */
static struct vrpc_subch *pick_least(const struct lb_set *set)
{
    size_t a, b;
    vrpc_lb_least_draw(set->n, vrpc_lb_rand(), &a, &b);
    return pick_least_rest(set, a, b);
}

/* Ring hash: the owner of the first point at or after the key's hash (a
 * random one without a key), or the next ones round the ring (see
 * pick_ring_from). */
static struct vrpc_subch *pick_ring(const struct lb_set *set, bool has_key, uint64_t key)
{
    return pick_ring_from(set, vrpc_lb_ring_find(set, has_key ? key : vrpc_lb_rand()));
}

struct vrpc_subch *vrpc_lb_pick(struct vrpc_lb *lb, const struct lb_set *set, bool has_key, uint64_t key)
{
    if (!set || !set->n)
        return NULL;
    if (set->n == 1 && vrpc_lb_usable(set->subs[0]))
        return set->subs[0]; /* every policy's choice */
    switch (lb->o.lb_policy) {
    case VRPC_LB_PICK_FIRST:
        return pick_scan(set, 0);
    case VRPC_LB_LEAST_OUTSTANDING:
        return pick_least(set);
    case VRPC_LB_RING_HASH:
        return pick_ring(set, has_key, key);
    default:
        return vrpc_lb_pick_rr(set, __atomic_fetch_add(&lb->rr, 1, __ATOMIC_RELAXED));
    }
}

/* ---- an attempt's pick: the slow paths of vrpc_lb_attempt_pick (rpc/lb.h) ---------- */

struct vrpc_subch *vrpc_lb_attempt_any(struct vrpc_lb *lb, const struct lb_set *set, bool has_key, uint64_t key)
{
    return vrpc_lb_attempt_counted(lb, vrpc_lb_pick(lb, set, has_key, key));
}

struct vrpc_subch *vrpc_lb_attempt_rr(struct vrpc_lb *lb, const struct lb_set *set, uint32_t turn)
{
    return vrpc_lb_attempt_counted(lb, vrpc_lb_pick_rr(set, turn));
}

struct vrpc_subch *vrpc_lb_attempt_least(struct vrpc_lb *lb, const struct lb_set *set, size_t a, size_t b)
{
    return vrpc_lb_attempt_counted(lb, pick_least_rest(set, a, b));
}

struct vrpc_subch *vrpc_lb_attempt_ring(struct vrpc_lb *lb, const struct lb_set *set, size_t lo)
{
    return vrpc_lb_attempt_counted(lb, pick_ring_from(set, lo));
}

struct vrpc_subch *vrpc_lb_attempt_get(struct vrpc_lb *lb, bool has_key, uint64_t key)
{
    return vrpc_lb_attempt_pick(lb, has_key, key);
}

/* ---- outlier ejection ----------------------------------------------------------- */

static bool is_failure(int code)
{
    return code == VRPC_UNAVAILABLE || code == VRPC_INTERNAL || code == VRPC_UNKNOWN || code == VRPC_DEADLINE_EXCEEDED;
}

void vrpc_lb_outcome_slow(struct vrpc_lb *lb, struct vrpc_subch *s, int code)
{
    if (!is_failure(code)) {
        if (__atomic_load_n(&s->consec_fail, __ATOMIC_RELAXED))
            __atomic_store_n(&s->consec_fail, 0, __ATOMIC_RELAXED);
        int64_t until = __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED);
        /* served well for 10x the base time since its ejection ended */
        if (until && vrpc_now_ns() >= until + (int64_t)lb->o.outlier_eject_ms * 10000000) {
            __atomic_store_n(&s->eject_level, 0, __ATOMIC_RELAXED);
            __atomic_compare_exchange_n(&s->ejected_until, &until, 0, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
        return;
    }
    __atomic_add_fetch(&s->failures, 1, __ATOMIC_RELAXED);
    if (__atomic_add_fetch(&s->consec_fail, 1, __ATOMIC_RELAXED) < lb->o.outlier_failures)
        return;
    int64_t now = vrpc_now_ns(), until = __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED);
    if (until && now < until)
        return; /* already out */
    __atomic_store_n(&s->consec_fail, 0, __ATOMIC_RELAXED);
    uint32_t lvl = __atomic_fetch_add(&s->eject_level, 1, __ATOMIC_RELAXED);
    uint64_t ms = (uint64_t)lb->o.outlier_eject_ms << (lvl < 4 ? lvl : 4);
    if (ms > (uint64_t)lb->o.outlier_eject_ms * 10)
        ms = (uint64_t)lb->o.outlier_eject_ms * 10;
    /* the ejection ends by itself; a server failing again soon after it
     * (before serving well for 10x the base time) stays out twice as long */
    if (__atomic_compare_exchange_n(&s->ejected_until, &until, now + (int64_t)ms * 1000000, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&s->ejections, 1, __ATOMIC_RELAXED);
        vrpc_rpc_log("channel %s: server %s ejected for %llu ms after %u consecutive failures", lb->target, s->uri,
                     (unsigned long long)ms, lb->o.outlier_failures);
    }
}

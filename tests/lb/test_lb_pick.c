/* The policies' lookups of rpc/lb_pick.c without servers: subchannels whose
 * single channel is a zeroed struct vrpc_channel in the READY state (or not).
 *  - the hash ring's bucket table finds, for every hash, the same point as a
 *    binary search over the sorted ring (1 to 40 servers; random hashes,
 *    every point's own hash and its neighbours, 0 and UINT64_MAX);
 *  - ring hash with a key picks the owner of the key's point, and the next
 *    owner round the ring when that one is not READY;
 *  - round robin visits every server in turn, skips one that is not READY,
 *    and the others share its turns equally;
 *  - least outstanding never picks the busier of two READY servers when the
 *    other is idle, and never one that is not READY. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/lb.h"

struct fake {
    struct lb_set set;
    struct vrpc_subch *subs[64];
    struct vrpc_channel *chs[64];
};

static void fake_make(struct fake *f, size_t n)
{
    memset(f, 0, sizeof *f);
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        f->subs[i] = calloc(1, sizeof *f->subs[i]);
        f->chs[i] = calloc(1, sizeof *f->chs[i]);
        assert_non_null(f->subs[i]);
        assert_non_null(f->chs[i]);
        snprintf(f->subs[i]->uri, sizeof f->subs[i]->uri, "tcp://10.0.%zu.%zu:7000", i / 250, i % 250 + 1);
        f->subs[i]->ch[0] = f->chs[i];
        f->subs[i]->nch = 1;
        f->chs[i]->state = VRPC_CHANNEL_READY;
    }
    f->set.n = n;
    f->set.subs = f->subs;
    assert_int_equal(vrpc_lb_ring_build(&f->set), 0);
}

static void fake_free(struct fake *f)
{
    for (size_t i = 0; i < f->set.n; i++) {
        free(f->subs[i]);
        free(f->chs[i]);
    }
    free(f->set.ring);
}

static size_t bsearch_first(const struct lb_set *set, uint64_t h)
{
    size_t lo = 0, hi = set->nring;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set->ring[mid].h < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545f4914f6cdd1dull;
}

static void test_ring_find_matches_binary_search(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    size_t checked = 0;
    for (size_t n = 1; n <= 40; n += (n < 5 ? 1 : 7)) {
        struct fake f;
        fake_make(&f, n);
        assert_int_equal(f.set.nring, n * VRPC_LB_RING_POINTS);
        for (size_t i = 1; i < f.set.nring; i++)
            assert_true(f.set.ring[i - 1].h <= f.set.ring[i].h);
        for (int i = 0; i < 20000; i++) {
            uint64_t h = rnd(&x);
            assert_int_equal(vrpc_lb_ring_find(&f.set, h), bsearch_first(&f.set, h));
            checked++;
        }
        for (size_t i = 0; i < f.set.nring; i++) {
            uint64_t h = f.set.ring[i].h;
            assert_int_equal(vrpc_lb_ring_find(&f.set, h), bsearch_first(&f.set, h));
            assert_int_equal(vrpc_lb_ring_find(&f.set, h - 1), bsearch_first(&f.set, h - 1));
            assert_int_equal(vrpc_lb_ring_find(&f.set, h + 1), bsearch_first(&f.set, h + 1));
            checked += 3;
        }
        assert_int_equal(vrpc_lb_ring_find(&f.set, 0), 0);
        assert_int_equal(vrpc_lb_ring_find(&f.set, UINT64_MAX), bsearch_first(&f.set, UINT64_MAX));
        fake_free(&f);
    }
    print_message("# %zu lookups agree with the binary search\n", checked);
}

static void test_ring_hash_owner_and_next(void **state)
{
    (void)state;
    struct fake f;
    fake_make(&f, 5);
    struct vrpc_lb lb;
    memset(&lb, 0, sizeof lb);
    lb.o.lb_policy = VRPC_LB_RING_HASH;
    int moved = 0;
    for (int k = 0; k < 2000; k++) {
        char key[32];
        int len = snprintf(key, sizeof key, "user-%d", k);
        uint64_t h = vrpc_lb_hash(key, (size_t)len);
        size_t p = bsearch_first(&f.set, h) % f.set.nring;
        struct vrpc_subch *owner = f.subs[f.set.ring[p].sub];
        assert_ptr_equal(vrpc_lb_pick(&lb, &f.set, true, h), owner);
        /* the owner goes down: the key moves to the next other owner round the ring */
        f.chs[f.set.ring[p].sub]->state = VRPC_CHANNEL_TRANSIENT_FAILURE;
        struct vrpc_subch *next = NULL;
        for (size_t i = 1; i < f.set.nring && !next; i++) {
            struct vrpc_subch *s = f.subs[f.set.ring[(p + i) % f.set.nring].sub];
            if (s != owner)
                next = s;
        }
        struct vrpc_subch *got = vrpc_lb_pick(&lb, &f.set, true, h);
        assert_ptr_equal(got, next);
        moved += got != owner;
        f.chs[f.set.ring[p].sub]->state = VRPC_CHANNEL_READY;
    }
    assert_int_equal(moved, 2000);
    fake_free(&f);
}

static void test_round_robin_turns(void **state)
{
    (void)state;
    struct fake f;
    fake_make(&f, 4);
    size_t count[4] = {0};
    for (uint32_t t = 0; t < 400; t++) {
        struct vrpc_subch *s = vrpc_lb_pick_rr(&f.set, t);
        assert_ptr_equal(s, f.subs[t % 4]);
    }
    f.chs[2]->state = VRPC_CHANNEL_CONNECTING;
    for (uint32_t t = 0; t < 3000; t++) {
        struct vrpc_subch *s = vrpc_lb_pick_rr(&f.set, t);
        assert_ptr_not_equal(s, f.subs[2]);
        for (size_t i = 0; i < 4; i++)
            count[i] += s == f.subs[i];
    }
    assert_int_equal(count[2], 0);
    /* 3000 turns over 3 servers: 750 each of their own, the 750 of the
     * skipped one spread over them (250 each) */
    for (size_t i = 0; i < 4; i++)
        if (i != 2)
            assert_int_equal(count[i], 1000);
    fake_free(&f);
}

static void test_least_outstanding(void **state)
{
    (void)state;
    struct fake f;
    fake_make(&f, 2);
    struct vrpc_lb lb;
    memset(&lb, 0, sizeof lb);
    lb.o.lb_policy = VRPC_LB_LEAST_OUTSTANDING;
    f.subs[0]->outstanding = 5;
    for (int i = 0; i < 1000; i++)
        assert_ptr_equal(vrpc_lb_pick(&lb, &f.set, false, 0), f.subs[1]);
    f.chs[1]->state = VRPC_CHANNEL_TRANSIENT_FAILURE;
    for (int i = 0; i < 1000; i++)
        assert_ptr_equal(vrpc_lb_pick(&lb, &f.set, false, 0), f.subs[0]);
    fake_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_find_matches_binary_search),
        cmocka_unit_test(test_ring_hash_owner_and_next),
        cmocka_unit_test(test_round_robin_turns),
        cmocka_unit_test(test_least_outstanding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

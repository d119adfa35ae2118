/* Unit tests of the large-buffer cache (transport/lbuf.c) on the TCP backend
 * (plain MRs; the cache itself is backend-neutral): size classes and slack,
 * reuse without re-registration, the max_pinned bound with LRU eviction and
 * -ENOBUFS, tail zeroing, statistics back to their baseline, and concurrent
 * get/put from several threads. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <verbrpc/transport.h>
#include "transport/lbuf.h"
#include "transport/transport_ops.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static struct vrpc_transport *tp_with_bound(uint64_t max_pinned)
{
    struct vrpc_transport_attr a;
    struct vrpc_transport *tp;
    vrpc_transport_attr_init(&a);
    a.max_pinned = max_pinned;
    assert_int_equal(vrpc_transport_create("tcp", &a, &tp), 0);
    return tp;
}

static void assert_stats(struct vrpc_transport *tp, size_t pinned, size_t in_use)
{
    size_t p, u;
    vrpc_lbuf_stats(tp, &p, &u);
    assert_int_equal(p, pinned);
    assert_int_equal(u, in_use);
}

/* Every len is served by a class of at most 25 % slack (64 KiB minimum),
 * classes grow monotonically, and the edges are exact. */
static void t_classes(void **state)
{
    size_t len, prev = 0;
    assert_int_equal(vrpc_lbuf_class_size(1), 64 * KiB);
    assert_int_equal(vrpc_lbuf_class_size(64 * KiB), 64 * KiB);
    assert_int_equal(vrpc_lbuf_class_size(64 * KiB + 1), 80 * KiB);
    assert_int_equal(vrpc_lbuf_class_size(MiB), MiB);
    assert_int_equal(vrpc_lbuf_class_size(MiB + 1), MiB + 256 * KiB);
    assert_int_equal(vrpc_lbuf_class_size(3 * MiB / 2), 3 * MiB / 2);
    assert_int_equal(vrpc_lbuf_class_size(VRPC_LBUF_MAX), VRPC_LBUF_MAX);
    assert_int_equal(vrpc_lbuf_class_size(VRPC_LBUF_MAX + 1), 0);
    for (len = 1; len <= VRPC_LBUF_MAX; len += len / 7 + 1) {
        size_t s = vrpc_lbuf_class_size(len);
        assert_true(s >= len);
        assert_true(s >= prev);
        assert_true(s % 4096 == 0);
        if (len > 64 * KiB)
            assert_true(s - len <= len / 4);
        prev = s;
    }
}

static void t_bad_args(void **state)
{
    struct vrpc_transport *tp = tp_with_bound(0);
    struct vrpc_buf *b = NULL;
    assert_int_equal(vrpc_lbuf_get(tp, 0, &b), -EINVAL);
    assert_int_equal(vrpc_lbuf_get(tp, VRPC_LBUF_MAX + 1, &b), -EINVAL);
    assert_null(b);
    vrpc_lbuf_put(NULL);
    assert_stats(tp, 0, 0);
    vrpc_transport_destroy(tp);
}

/* A buffer put back is reused for the next get of its class without another
 * registration, most recently put first; a fresh buffer is zeroed memory,
 * page aligned, with an MR covering exactly it. */
static void t_reuse(void **state)
{
    struct vrpc_transport *tp = tp_with_bound(0);
    struct vrpc_lbuf_counters k;
    struct vrpc_buf *a, *b, *c;
    size_t i;

    assert_int_equal(vrpc_lbuf_get(tp, MiB, &a), 0);
    assert_int_equal(a->cap, MiB);
    assert_null(a->pool);
    assert_non_null(a->mr);
    assert_ptr_equal(a->mr->addr, a->data);
    assert_int_equal(a->mr->len, a->cap);
    assert_true(a->mr->access & VRPC_ACCESS_GRANT);
    assert_int_equal((uintptr_t)a->data % 4096, 0);
    for (i = 0; i < a->cap; i += 4093)
        assert_int_equal(((unsigned char *)a->data)[i], 0);
    assert_stats(tp, MiB, MiB);
    assert_int_equal(vrpc_lbuf_get(tp, MiB - 100, &b), 0); /* same class, second buffer */
    assert_ptr_not_equal(a, b);
    assert_stats(tp, 2 * MiB, 2 * MiB);
    vrpc_lbuf_put(a);
    vrpc_lbuf_put(b);
    assert_stats(tp, 2 * MiB, 0);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.registered, 2);
    assert_int_equal(k.idle, 2);
    /* LIFO: b was put last */
    assert_int_equal(vrpc_lbuf_get(tp, 900 * KiB, &c), 0);
    assert_ptr_equal(c, b);
    vrpc_lbuf_put(c);
    for (i = 0; i < 100; i++) {
        assert_int_equal(vrpc_lbuf_get(tp, MiB, &c), 0);
        vrpc_lbuf_put(c);
    }
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.registered, 2);
    assert_int_equal(k.reused, 101);
    assert_int_equal(k.evicted, 0);
    /* a different class registers a new buffer */
    assert_int_equal(vrpc_lbuf_get(tp, 3 * MiB, &c), 0);
    assert_int_equal(c->cap, 3 * MiB);
    assert_int_equal((uintptr_t)c->data % (2 * MiB), 0); /* huge-page aligned from 2 MiB */
    vrpc_lbuf_put(c);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.registered, 3);
    assert_stats(tp, 5 * MiB, 0);
    vrpc_transport_destroy(tp);
}

/* pinned never exceeds max_pinned: idle buffers are evicted least recently
 * used first; when even evicting every idle buffer is not enough, -ENOBUFS
 * at once and nothing is evicted. */
static void t_bound(void **state)
{
    struct vrpc_transport *tp = tp_with_bound(MiB);
    struct vrpc_lbuf_counters k;
    struct vrpc_buf *a, *b, *c, *d, *x = NULL;

    assert_int_equal(vrpc_lbuf_get(tp, 512 * KiB, &a), 0);
    assert_int_equal(vrpc_lbuf_get(tp, 512 * KiB, &b), 0);
    assert_stats(tp, MiB, MiB);
    assert_int_equal(vrpc_lbuf_get(tp, 1, &x), -ENOBUFS); /* nothing idle */
    assert_null(x);
    assert_int_equal(vrpc_lbuf_get(tp, MiB + 1, &x), -ENOBUFS);
    vrpc_lbuf_put(a);
    assert_stats(tp, MiB, 512 * KiB);
    /* 768 KiB would need more than the idle 512 KiB: refused, a kept */
    assert_int_equal(vrpc_lbuf_get(tp, 768 * KiB, &x), -ENOBUFS);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.evicted, 0);
    assert_int_equal(k.idle, 1);
    /* 256 KiB fits once a is evicted */
    assert_int_equal(vrpc_lbuf_get(tp, 256 * KiB, &c), 0);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.evicted, 1);
    assert_stats(tp, 768 * KiB, 768 * KiB);
    /* LRU order: put c then b; a get needing one eviction takes c (older) */
    vrpc_lbuf_put(c);
    vrpc_lbuf_put(b);
    assert_int_equal(vrpc_lbuf_get(tp, 320 * KiB, &d), 0); /* class 320 KiB: 768 + 320 > 1024 */
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.evicted, 2);
    assert_int_equal(k.idle, 1);
    assert_stats(tp, 832 * KiB, 320 * KiB);
    assert_int_equal(vrpc_lbuf_get(tp, 512 * KiB, &x), 0); /* b, still idle */
    assert_ptr_equal(x, b);
    vrpc_lbuf_put(x);
    vrpc_lbuf_put(d);
    assert_stats(tp, 832 * KiB, 0);
    vrpc_transport_destroy(tp);
}

/* A reused buffer's stale bytes beyond the new length are zero at get: a
 * peer granted any range of it sees the new payload or zeros. */
static void t_tail_zeroing(void **state)
{
    struct vrpc_transport *tp = tp_with_bound(0);
    struct vrpc_lbuf_counters k;
    struct vrpc_buf *a, *b;
    size_t old = 1200 * KiB, nlen = 1050 * KiB, i;
    unsigned char *p;

    assert_int_equal(vrpc_lbuf_get(tp, old, &a), 0); /* class 1.25 MiB */
    memset(a->data, 0xaa, old);
    vrpc_lbuf_put(a);
    assert_int_equal(vrpc_lbuf_get(tp, nlen, &b), 0); /* same class, same buffer */
    assert_ptr_equal(a, b);
    p = b->data;
    for (i = 0; i < nlen; i++)
        if (p[i] != 0xaa)
            fail_msg("byte %zu below the new length changed", i);
    for (i = nlen; i < b->cap; i++)
        if (p[i] != 0)
            fail_msg("stale byte at %zu (new length %zu)", i, nlen);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.zeroed_bytes, old - nlen);
    /* the user writes only what it asked for: the next smaller get zeroes
     * only [len, nlen) */
    vrpc_lbuf_put(b);
    assert_int_equal(vrpc_lbuf_get(tp, 1025 * KiB, &b), 0);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.zeroed_bytes, old - 1025 * KiB);
    for (i = 1025 * KiB; i < b->cap; i++)
        if (p[i] != 0)
            fail_msg("stale byte at %zu", i);
    /* a larger get zeroes nothing */
    vrpc_lbuf_put(b);
    assert_int_equal(vrpc_lbuf_get(tp, 1100 * KiB, &b), 0);
    vrpc_lbuf_counters(tp, &k);
    assert_int_equal(k.zeroed_bytes, old - 1025 * KiB);
    vrpc_lbuf_put(b);
    vrpc_transport_destroy(tp);
}

/* ---- concurrent get/put ---- */

struct worker {
    struct vrpc_transport *tp;
    unsigned seed, rounds;
    unsigned long ok, nobufs;
    int other;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    unsigned i, x = w->seed;
    for (i = 0; i < w->rounds; i++) {
        struct vrpc_buf *b;
        size_t len;
        int rc;
        x = x * 1103515245u + 12345u;
        len = 1 + (x >> 8) % (600 * KiB);
        rc = vrpc_lbuf_get(w->tp, len, &b);
        if (rc == -ENOBUFS) {
            w->nobufs++;
            continue;
        }
        if (rc) {
            w->other = rc;
            return NULL;
        }
        ((unsigned char *)b->data)[len - 1] = (unsigned char)i;
        w->ok++;
        vrpc_lbuf_put(b);
    }
    return NULL;
}

/* Four threads get and put random sizes under a tight bound: only 0 or
 * -ENOBUFS, never more pinned than the bound, in-use back to 0. */
static void t_threads(void **state)
{
    struct vrpc_transport *tp = tp_with_bound(2 * MiB);
    struct worker w[4];
    pthread_t th[4];
    size_t pinned, in_use;
    unsigned long ok = 0;
    int i;

    for (i = 0; i < 4; i++) {
        w[i] = (struct worker){.tp = tp, .seed = (unsigned)i + 1, .rounds = 300};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].other, 0);
        ok += w[i].ok;
    }
    assert_true(ok > 0);
    vrpc_lbuf_stats(tp, &pinned, &in_use);
    assert_int_equal(in_use, 0);
    assert_true(pinned <= 2 * MiB);
    vrpc_transport_destroy(tp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_classes), cmocka_unit_test(t_bad_args),     cmocka_unit_test(t_reuse),
        cmocka_unit_test(t_bound),   cmocka_unit_test(t_tail_zeroing), cmocka_unit_test(t_threads),
    };
    return cmocka_run_group_tests_name("large-buffer cache", tests, NULL, NULL);
}

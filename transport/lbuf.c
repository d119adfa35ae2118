/* The large-buffer cache: buffers for messages above the eager size, each its
 * own mapping with its own MR (registered VRPC_ACCESS_GRANT through the
 * backend), kept when put back so repeated large messages pay no
 * registration. Backend-neutral; one per transport. Design:
 * docs/design/large-messages.md, section 2 "The large-buffer cache".
 *
 * - Size classes: 64 KiB, then 4 per power of two (1.25, 1.5, 1.75, 2 x 2^k)
 *   up to 1 GiB: at most 25 % slack. Free buffers are LIFO per class (the hot
 *   one is reused) and on one LRU list over all idle buffers (eviction).
 * - Bound: pinned (in use + idle) <= max_pinned. A get that would pass it
 *   evicts idle buffers, least recently used first, and fails with -ENOBUFS
 *   when that is not enough (checked before anything is evicted). No waiting.
 * - Tail zeroing, done at get: each buffer remembers `dirty`, the highest
 *   offset its users may have written since it was last clean. A get of len
 *   bytes zeroes [len, dirty) and sets dirty = len: the new user writes (packs,
 *   or reads into) at most the len bytes it asked for, so whatever range of
 *   the buffer it grants, a peer sees its bytes or zeros, never an earlier
 *   message (this matters where the MR, not the window, is the bound: rxe).
 *   A user writing beyond len voids this; cap is only the class size.
 * - One mutex; mmap, registration, deregistration and munmap run outside it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/lbuf.h"
#include "transport/transport_ops.h"

#define NCLASS 57 /* 64 KiB, then (30 - 16) powers x 4 */
#define HUGE_FROM ((size_t)2 << 20)

struct lbuf {
    struct vrpc_buf buf; /* what the user holds */
    struct vrpc_lbuf_cache *c;
    size_t size;  /* class size = mapping length = buf.cap */
    size_t dirty; /* [dirty, size) is known to be zero */
    unsigned cls;
    bool in_use;
    struct lbuf *cprev, *cnext; /* class free list, head = most recently put */
    struct lbuf *lprev, *lnext; /* LRU over all idle buffers, head = newest */
};

struct vrpc_lbuf_cache {
    struct vrpc_transport *tp;
    pthread_mutex_t mu;
    size_t max_pinned;
    size_t pinned, idle_bytes, in_use; /* bytes */
    size_t nidle, nused;               /* buffers */
    struct lbuf *free[NCLASS];
    struct lbuf *lru_head, *lru_tail;
    uint64_t registered, evicted, reused;
    _Atomic uint64_t zeroed;
};

size_t vrpc_lbuf_class_size(size_t len)
{
    unsigned k;
    size_t p, q, i;
    if (len <= VRPC_LBUF_MIN)
        return VRPC_LBUF_MIN;
    if (len > VRPC_LBUF_MAX)
        return 0;
    k = 63u - (unsigned)__builtin_clzll((unsigned long long)(len - 1)); /* 2^k < len <= 2^(k+1) */
    p = (size_t)1 << k;
    q = p / 4;
    i = (len - p + q - 1) / q; /* 1..4 */
    return p + i * q;
}

static unsigned class_of(size_t size)
{
    unsigned k;
    size_t p;
    if (size <= VRPC_LBUF_MIN)
        return 0;
    k = 63u - (unsigned)__builtin_clzll((unsigned long long)(size - 1));
    p = (size_t)1 << k;
    return (k - 16) * 4 + (unsigned)((size - p) / (p / 4));
}

/* ---- lists (mu held) ---- */

static void idle_unlink(struct vrpc_lbuf_cache *c, struct lbuf *b)
{
    if (b->cprev)
        b->cprev->cnext = b->cnext;
    else
        c->free[b->cls] = b->cnext;
    if (b->cnext)
        b->cnext->cprev = b->cprev;
    if (b->lprev)
        b->lprev->lnext = b->lnext;
    else
        c->lru_head = b->lnext;
    if (b->lnext)
        b->lnext->lprev = b->lprev;
    else
        c->lru_tail = b->lprev;
    b->cprev = b->cnext = b->lprev = b->lnext = NULL;
    c->idle_bytes -= b->size;
    c->nidle--;
}

static void idle_push(struct vrpc_lbuf_cache *c, struct lbuf *b)
{
    b->cprev = NULL;
    b->cnext = c->free[b->cls];
    if (b->cnext)
        b->cnext->cprev = b;
    c->free[b->cls] = b;
    b->lprev = NULL;
    b->lnext = c->lru_head;
    if (b->lnext)
        b->lnext->lprev = b;
    else
        c->lru_tail = b;
    c->lru_head = b;
    c->idle_bytes += b->size;
    c->nidle++;
}

/* ---- mappings ---- */

static void lbuf_free(struct lbuf *b)
{
    vrpc_mr_dereg(b->buf.mr);
    munmap(b->buf.data, b->size);
    free(b);
}

/* A fresh mapping of size bytes, faulted in; 2 MiB aligned with transparent
 * huge pages from 2 MiB up (fewer pages to pin and to translate). */
static void *map_buffer(size_t size)
{
    char *m, *a;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), i;
    if (size < HUGE_FROM) {
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        return m == MAP_FAILED ? NULL : m;
    }
    m = mmap(NULL, size + HUGE_FROM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    a = (char *)(((uintptr_t)m + HUGE_FROM - 1) & ~(uintptr_t)(HUGE_FROM - 1));
    if (a > m)
        munmap(m, (size_t)(a - m));
    if (a + size < m + size + HUGE_FROM)
        munmap(a + size, (size_t)(m + size + HUGE_FROM - (a + size)));
    madvise(a, size, MADV_HUGEPAGE); /* advice only: fine if THP is off */
#ifdef MADV_POPULATE_WRITE
    if (madvise(a, size, MADV_POPULATE_WRITE) == 0)
        return a;
#endif
    for (i = 0; i < size; i += pg) /* kernels before 5.14: fault in by hand */
        ((volatile char *)a)[i] = 0;
    return a;
}

static int lbuf_alloc(struct vrpc_lbuf_cache *c, size_t size, struct lbuf **out)
{
    struct lbuf *b = calloc(1, sizeof *b);
    void *m;
    int rc;
    if (!b)
        return -ENOMEM;
    m = map_buffer(size);
    if (!m) {
        free(b);
        return -ENOMEM;
    }
    rc = vrpc_mr_reg(c->tp, m, size, VRPC_ACCESS_GRANT, &b->buf.mr);
    if (rc) {
        munmap(m, size);
        free(b);
        return rc;
    }
    b->c = c;
    b->size = size;
    b->cls = class_of(size);
    b->buf.data = m;
    b->buf.cap = (uint32_t)size;
    *out = b;
    return 0;
}

/* ---- public ---- */

int vrpc_lbuf_get(struct vrpc_transport *tp, size_t len, struct vrpc_buf **out)
{
    struct vrpc_lbuf_cache *c;
    struct lbuf *b, *victims = NULL, *v;
    size_t size;
    int rc;

    if (!tp || !out || !len || len > VRPC_LBUF_MAX || !tp->lbuf)
        return -EINVAL;
    c = tp->lbuf;
    size = vrpc_lbuf_class_size(len);
    pthread_mutex_lock(&c->mu);
    b = c->free[class_of(size)];
    if (b) {
        idle_unlink(c, b);
        c->reused++;
    } else {
        /* Fail before evicting anything when even evicting every idle
         * buffer would not make room. */
        if (c->pinned - c->idle_bytes + size > c->max_pinned) {
            pthread_mutex_unlock(&c->mu);
            return -ENOBUFS;
        }
        while (c->pinned + size > c->max_pinned) {
            v = c->lru_tail;
            idle_unlink(c, v);
            c->pinned -= v->size;
            c->evicted++;
            v->cnext = victims;
            victims = v;
        }
        c->pinned += size; /* reserved: concurrent gets see the bound */
    }
    if (b)
        b->in_use = true;
    c->in_use += size;
    c->nused++;
    pthread_mutex_unlock(&c->mu);

    while ((v = victims)) {
        victims = v->cnext;
        lbuf_free(v);
    }
    if (!b) {
        rc = lbuf_alloc(c, size, &b);
        pthread_mutex_lock(&c->mu);
        if (rc) {
            c->pinned -= size;
            c->in_use -= size;
            c->nused--;
        } else {
            c->registered++;
            b->in_use = true;
        }
        pthread_mutex_unlock(&c->mu);
        if (rc)
            return rc;
    }
    if (b->dirty > len) {
        memset((char *)b->buf.data + len, 0, b->dirty - len);
        atomic_fetch_add_explicit(&c->zeroed, b->dirty - len, memory_order_relaxed);
    }
    b->dirty = len;
    b->buf.len = 0;
    b->buf.next = NULL;
    b->buf.pool = NULL;
    *out = &b->buf;
    return 0;
}

void vrpc_lbuf_put(struct vrpc_buf *buf)
{
    struct lbuf *b;
    struct vrpc_lbuf_cache *c;
    if (!buf)
        return;
    b = container_of(buf, struct lbuf, buf);
    c = b->c;
    pthread_mutex_lock(&c->mu);
    if (!b->in_use) {
        pthread_mutex_unlock(&c->mu);
        vrpc_tp_log("lbuf: buffer %p put back twice (ignored)", buf->data);
        return;
    }
    b->in_use = false;
    c->in_use -= b->size;
    c->nused--;
    idle_push(c, b);
    pthread_mutex_unlock(&c->mu);
}

void vrpc_lbuf_stats(const struct vrpc_transport *tp, size_t *pinned, size_t *in_use)
{
    struct vrpc_lbuf_cache *c = tp->lbuf;
    size_t p = 0, u = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        p = c->pinned;
        u = c->in_use;
        pthread_mutex_unlock(&c->mu);
    }
    if (pinned)
        *pinned = p;
    if (in_use)
        *in_use = u;
}

void vrpc_lbuf_counters(const struct vrpc_transport *tp, struct vrpc_lbuf_counters *out)
{
    struct vrpc_lbuf_cache *c = tp->lbuf;
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    out->registered = c->registered;
    out->evicted = c->evicted;
    out->reused = c->reused;
    out->idle = c->nidle;
    pthread_mutex_unlock(&c->mu);
    out->zeroed_bytes = atomic_load_explicit(&c->zeroed, memory_order_relaxed);
}

int vrpc_lbuf_cache_create(struct vrpc_transport *tp, struct vrpc_lbuf_cache **out)
{
    struct vrpc_lbuf_cache *c = calloc(1, sizeof *c);
    struct rlimit rl;
    if (!c)
        return -ENOMEM;
    c->tp = tp;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->zeroed, 0);
    /* Registration locks memory (verbs): a bound above RLIMIT_MEMLOCK would
     * turn into registration failures instead of a clean -ENOBUFS (a layer
     * has the caps of the backend below it). */
    if ((tp->caps & VRPC_TP_CAP_PINS_MEMORY) && !getrlimit(RLIMIT_MEMLOCK, &rl) && rl.rlim_cur != RLIM_INFINITY &&
        tp->attr.max_pinned > rl.rlim_cur) {
        vrpc_tp_log("lbuf: max_pinned lowered from %llu to RLIMIT_MEMLOCK, %llu bytes (raise `ulimit -l`)",
                    (unsigned long long)tp->attr.max_pinned, (unsigned long long)rl.rlim_cur);
        tp->attr.max_pinned = rl.rlim_cur;
    }
    c->max_pinned = (size_t)tp->attr.max_pinned;
    *out = c;
    return 0;
}

void vrpc_lbuf_cache_destroy(struct vrpc_lbuf_cache *c)
{
    struct lbuf *b;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    while ((b = c->lru_head)) {
        idle_unlink(c, b);
        c->pinned -= b->size;
        lbuf_free(b);
    }
    if (c->nused)
        vrpc_tp_log("lbuf: transport destroyed with %zu large buffers (%zu bytes) still in use: leaked", c->nused,
                    c->in_use);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

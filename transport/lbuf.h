/* The large-buffer cache (transport/lbuf.c), private side: creation and
 * destruction by the transport core, and counters for tests. The public
 * functions (vrpc_lbuf_get/put/stats) are declared in <verbrpc/transport.h>. */
#ifndef VRPC_TRANSPORT_LBUF_H
#define VRPC_TRANSPORT_LBUF_H

#include <stddef.h>
#include <stdint.h>

struct vrpc_transport;
struct vrpc_lbuf_cache;

/* Smallest and largest size class (bytes). */
#define VRPC_LBUF_MIN ((size_t)64 << 10)
#define VRPC_LBUF_MAX ((size_t)1 << 30)

/* Called by vrpc_transport_create once tp->ops and tp->attr are set: the
 * cache bound is tp->attr.max_pinned; on verbs it is lowered to
 * RLIMIT_MEMLOCK (tp->attr.max_pinned is updated, one log line). */
int vrpc_lbuf_cache_create(struct vrpc_transport *tp, struct vrpc_lbuf_cache **out);
/* Unregister and unmap every idle buffer. Buffers still in use are logged
 * and left alone (the caller broke the contract; they leak). Safe on NULL. */
void vrpc_lbuf_cache_destroy(struct vrpc_lbuf_cache *c);

/* The size class serving len bytes (its capacity), 0 when len > VRPC_LBUF_MAX. */
size_t vrpc_lbuf_class_size(size_t len);

/* Monotonic counters, for tests. */
struct vrpc_lbuf_counters {
    uint64_t registered;   /* buffers mapped and registered */
    uint64_t evicted;      /* idle buffers unregistered to stay under the bound */
    uint64_t reused;       /* gets served by an idle buffer */
    uint64_t zeroed_bytes; /* bytes of stale tails zeroed at get */
    size_t idle;           /* idle buffers now */
};
void vrpc_lbuf_counters(const struct vrpc_transport *tp, struct vrpc_lbuf_counters *out);

#endif

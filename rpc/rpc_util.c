/* Shared plumbing of the RPC core: per-thread arena, logging, URI split,
 * send-buffer handling. */
#include "rpc/internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "rpc/futex.h"

static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static __thread struct vrpc_arena *tls_arena;

static void arena_free(void *p)
{
    struct vrpc_arena *a = p;
    vrpc_arena_fini(a);
    free(a);
}

static void arena_key_init(void) { pthread_key_create(&arena_key, arena_free); }

struct vrpc_arena *vrpc_rpc_tls_arena(void)
{
    if (tls_arena)
        return tls_arena;
    pthread_once(&arena_once, arena_key_init);
    struct vrpc_arena *a = malloc(sizeof(*a));
    if (!a)
        return NULL;
    vrpc_arena_init(a, 16384, 0);
    pthread_setspecific(arena_key, a);
    tls_arena = a;
    return a;
}

void vrpc_thread_release(void)
{
    if (!tls_arena)
        return;
    pthread_setspecific(arena_key, NULL);
    arena_free(tls_arena);
    tls_arena = NULL;
}

void vrpc_rpc_log(const char *fmt, ...)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("VRPC_LOG");
        enabled = !(e && strcmp(e, "0") == 0);
    }
    if (!enabled)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "verbrpc: %s\n", line);
}

int vrpc_rpc_parse_uri(const char *uri, char *name, size_t name_len, char *turi, size_t turi_len)
{
    const char *sep;
    int n;

    if (!uri || !*uri)
        return -EINVAL;
    sep = strstr(uri, "://");
    if (!sep) {
        if ((size_t)snprintf(name, name_len, "auto") >= name_len)
            return -EINVAL;
        n = snprintf(turi, turi_len, "auto://%s", uri);
    } else {
        size_t sl = (size_t)(sep - uri);
        if (sl == 0 || sl >= name_len)
            return -EINVAL;
        memcpy(name, uri, sl);
        name[sl] = 0;
        /* "fault+tcp" etc.: the fault-injecting layer (test machinery) */
        const char *b = strncmp(name, "fault+", 6) ? name : name + 6;
        if (strcmp(b, "tcp") && strcmp(b, "verbs") && strcmp(b, "auto"))
            return -EINVAL;
        n = snprintf(turi, turi_len, "%s", uri);
    }
    return n < 0 || (size_t)n >= turi_len ? -EINVAL : 0;
}

struct vrpc_buf *vrpc_rpc_buf_get(struct vrpc_pool *pool, bool wait)
{
    struct vrpc_buf *b;
    while (!(b = vrpc_pool_get(pool)) && wait)
        sched_yield();
    return b;
}

int vrpc_rpc_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, bool wait)
{
    int rc;
    while ((rc = vrpc_ep_send(ep, buf, len, 0, 0, 0)) == -EAGAIN && wait)
        sched_yield();
    if (rc)
        vrpc_pool_put(buf);
    return rc;
}

int vrpc_rpc_send_simple(struct vrpc_ep *ep, struct vrpc_pool *pool, const struct vrpc_wire_hdr *h,
                         const void *payload, uint32_t payload_len, bool wait)
{
    struct vrpc_buf *b = vrpc_rpc_buf_get(pool, wait);
    if (!b)
        return -ENOBUFS;
    struct vrpc_wire_hdr hh = *h;
    if (payload_len > b->cap - VRPC_WIRE_HDR_LEN)
        payload_len = b->cap - VRPC_WIRE_HDR_LEN;
    hh.payload_len = payload_len;
    vrpc_wire_hdr_encode(b->data, &hh);
    if (payload_len)
        memcpy((uint8_t *)b->data + VRPC_WIRE_HDR_LEN, payload, payload_len);
    return vrpc_rpc_send(ep, b, VRPC_WIRE_HDR_LEN + payload_len, wait);
}

void vrpc_rpc_futex_wait_ns(uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
    if (timeout_ns <= 0)
        return;
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

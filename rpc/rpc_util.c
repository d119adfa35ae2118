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
#include "common/clock.h"
#include "common/log_internal.h"
#include "rpc/futex.h"

bool vrpc_rpc_watch(const uint32_t *word, uint32_t seen, uint64_t window_ns)
{
    int64_t t0 = vrpc_clock_mono_ns();
    for (uint32_t i = 1;; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen)
            return true;
        __builtin_ia32_pause();
        if (i % 64 == 0) {
            if ((uint64_t)(vrpc_clock_mono_ns() - t0) >= window_ns)
                return false;
            sched_yield();
        }
    }
}

/* Two arenas per thread: one for synchronous calls' responses, one for async
 * callbacks' (on workers). A vrpc_call made inside a callback unpacks into
 * the first and so leaves the callback's resp alone. Both are created once
 * per thread and reused: no allocation per call in steady state. */
struct tls_arenas {
    struct vrpc_arena a[VRPC_ARENA_KINDS];
};

static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static __thread struct tls_arenas *tls_arenas;
__thread bool vrpc_rpc_on_poller __attribute__((tls_model("initial-exec")));

static void arenas_free(void *p)
{
    struct tls_arenas *t = p;
    for (int i = 0; i < VRPC_ARENA_KINDS; i++)
        vrpc_arena_fini(&t->a[i]);
    free(t);
}

static void arena_key_init(void) { pthread_key_create(&arena_key, arenas_free); }

struct vrpc_arena *vrpc_rpc_tls_arena_of(enum vrpc_arena_kind kind)
{
    if (tls_arenas)
        return &tls_arenas->a[kind];
    pthread_once(&arena_once, arena_key_init);
    struct tls_arenas *t = malloc(sizeof(*t));
    if (!t)
        return NULL;
    for (int i = 0; i < VRPC_ARENA_KINDS; i++)
        vrpc_arena_init(&t->a[i], 16384, 0);
    pthread_setspecific(arena_key, t);
    tls_arenas = t;
    return &t->a[kind];
}

void vrpc_rpc_worker_start(unsigned worker, void *arg)
{
    (void)worker;
    (void)arg;
    for (int i = 0; i < VRPC_ARENA_KINDS; i++) {
        struct vrpc_arena *a = vrpc_rpc_tls_arena_of((enum vrpc_arena_kind)i);
        if (a)
            (void)vrpc_arena_warm(a);
    }
}

void vrpc_rpc_spin_mode(bool no_spin, uint32_t spin_us, struct vrpc_rpc_spin *out)
{
    memset(out, 0, sizeof *out);
    if (no_spin) {
        out->sched_spin_us = 1; /* the scheduler's minimum: 0 means its default */
        return;
    }
    out->wait = true;
    if (spin_us == VRPC_SPIN_ALWAYS) {
        out->poll_us = VRPC_BUSY_POLL_ALWAYS;
        out->sched_spin_us = VRPC_SCHED_SPIN_ALWAYS;
        out->wait_ns = UINT64_MAX;
    } else if (spin_us == VRPC_SPIN_ADAPTIVE) {
        out->poll_us = VRPC_RPC_BUSY_POLL_US;
        out->poll_max_us = VRPC_SPIN_ADAPTIVE_MAX_US;
        out->sched_spin_us = 0; /* its own adaptive default */
        out->wait_ns = (uint64_t)VRPC_RPC_BUSY_POLL_US * 1000u;
        out->wait_cap_ns = (uint64_t)VRPC_SPIN_ADAPTIVE_MAX_US * 1000u;
    } else {
        out->poll_us = spin_us;
        out->sched_spin_us = spin_us;
        out->wait_ns = (uint64_t)spin_us * 1000u;
    }
}

void vrpc_thread_release(void)
{
    if (!tls_arenas)
        return;
    pthread_setspecific(arena_key, NULL);
    arenas_free(tls_arenas);
    tls_arenas = NULL;
}

uint64_t vrpc_rpc_pool_bytes(bool server, uint32_t eager)
{
    /* as vrpc_pool_create: cache-line strides of buffer + headroom (<= 64) */
    uint64_t stride = ((uint64_t)eager + 64 + 63) & ~(uint64_t)63;
    /* vrpc_channel_opts defaults (rpc.h): max_outstanding 256, max_queued as many */
    uint64_t n = server ? VRPC_SERVER_SEND_BUFS + VRPC_SERVER_RECV_BUFS : 256 + 256 + 64 + VRPC_CHANNEL_RECV_BUFS;
    return stride * n;
}

int vrpc_rpc_parse_uri(const char *uri, char *name, size_t name_len, char *turi, size_t turi_len)
{
    char why[160];
    const char *sep;
    int n;

    if (!uri || vrpc_uri_check(uri, why, sizeof why)) {
        vrpc_rpc_log("bad URI '%s': %s", uri ? uri : "(null)", uri ? why : "NULL");
        return -EINVAL;
    }
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
        /* a backend, "auto", or layer+backend ("fault+tcp": test machinery) */
        if (vrpc_transport_scheme_check(name)) {
            vrpc_rpc_log("bad URI '%s': unknown scheme '%s' (no backend of that name)", uri, name);
            return -EINVAL;
        }
        n = snprintf(turi, turi_len, "%s", uri);
    }
    if (n < 0 || (size_t)n >= turi_len) {
        vrpc_rpc_log("bad URI '%s': too long", uri);
        return -EINVAL;
    }
    return 0;
}

/* The end of a bounded wait that starts now (read only once the first try
 * failed: the common case reads no clock). */
static int64_t wait_end(void) { return vrpc_now_ns() + (int64_t)VRPC_RPC_SEND_WAIT_MS * 1000000; }

struct vrpc_buf *vrpc_rpc_buf_get(struct vrpc_pool *pool, bool wait)
{
    struct vrpc_buf *b = vrpc_pool_get(pool);
    if (b || !wait)
        return b;
    for (int64_t end = wait_end(); !(b = vrpc_pool_get(pool)) && vrpc_now_ns() < end;)
        sched_yield();
    return b;
}

int vrpc_rpc_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, bool wait)
{
    int rc = vrpc_ep_send(ep, buf, len, 0, 0, 0);
    if (rc == -EAGAIN && wait) {
        for (int64_t end = wait_end(); rc == -EAGAIN && vrpc_now_ns() < end;) {
            sched_yield();
            rc = vrpc_ep_send(ep, buf, len, 0, 0, 0);
        }
    }
    if (rc)
        vrpc_pool_put(buf);
    return rc;
}

uint32_t vrpc_rpc_frame_fill(struct vrpc_buf *b, const struct vrpc_wire_hdr *h, const void *payload,
                             uint32_t payload_len)
{
    struct vrpc_wire_hdr hh = *h;
    if (payload_len > b->cap - VRPC_WIRE_HDR_LEN)
        payload_len = b->cap - VRPC_WIRE_HDR_LEN;
    hh.payload_len = payload_len;
    vrpc_wire_hdr_encode(b->data, &hh);
    if (payload_len)
        memcpy((uint8_t *)b->data + VRPC_WIRE_HDR_LEN, payload, payload_len);
    return VRPC_WIRE_HDR_LEN + payload_len;
}

int vrpc_rpc_send_simple(struct vrpc_ep *ep, struct vrpc_pool *pool, const struct vrpc_wire_hdr *h, const void *payload,
                         uint32_t payload_len, bool wait)
{
    struct vrpc_buf *b = vrpc_rpc_buf_get(pool, wait);
    if (!b)
        return -ENOBUFS;
    return vrpc_rpc_send(ep, b, vrpc_rpc_frame_fill(b, h, payload, payload_len), wait);
}

void vrpc_rpc_futex_wait_ns(uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
    if (timeout_ns <= 0)
        return;
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

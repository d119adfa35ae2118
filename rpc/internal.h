/* Private plumbing shared by the channel and the server: per-thread unpack
 * arena, protocol-error logging, and building/sending frames in transport
 * pool buffers. */
#ifndef VRPC_RPC_INTERNAL_H
#define VRPC_RPC_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc/arena.h"
#include "rpc/wire.h"
#include "common/container_of.h"
#include "common/env.h"
#include "common/log_internal.h"

/* Receive buffers (and their pool) a channel/server CQ keeps posted. */
#define VRPC_RPC_DEFAULT_EAGER 8192u

/* How long a channel's or server's poller busy-polls after its last
 * completion before it sleeps, at least, in the adaptive latency mode (the
 * default, see VRPC_SPIN_ADAPTIVE in rpc.h; the window grows with slower
 * round trips up to VRPC_SPIN_ADAPTIVE_MAX_US). It must outlast a round trip
 * counted from the send completion that opens it (about 17-25 us on TCP over
 * loopback in a VM): a response that finds the poller asleep pays an epoll
 * wake-up, and if its CPU went idle meanwhile a wake from idle (~100 us on a
 * VM). Also the floor of a synchronous caller's window, and an idle
 * worker's spin (vrpc_sched_config.spin_us default). */
#define VRPC_RPC_BUSY_POLL_US 50u

/* What a latency mode (no_spin, spin_us: VRPC_SPIN_* in rpc.h) means for
 * each kind of waiting thread of a channel or server. */
struct vrpc_rpc_spin {
    uint32_t poll_us, poll_max_us; /* vrpc_cq_attr.busy_poll_us, busy_poll_max_us */
    unsigned sched_spin_us;        /* vrpc_sched_config.spin_us of an own scheduler */
    bool wait;                     /* synchronous callers spin at all */
    uint64_t wait_ns, wait_cap_ns; /* vrpc_pending.spin_ns, spin_cap_ns */
};
void vrpc_rpc_spin_mode(bool no_spin, uint32_t spin_us, struct vrpc_rpc_spin *out);
/* Watch *word (acquire loads, pause between looks) for up to window_ns until
 * it is no longer seen; about every 64 looks the clock is read and the CPU
 * yielded (the thread that will change the word may need it). True if it
 * changed in time. Any thread. */
bool vrpc_rpc_watch(const uint32_t *word, uint32_t seen, uint64_t window_ns);

/* The calling thread's arenas for unpacking responses (created on first use,
 * freed at thread exit or vrpc_thread_release). NULL if out of memory.
 * Synchronous calls and async callbacks use separate ones, so a vrpc_call
 * inside a callback does not overwrite the callback's resp. */
enum vrpc_arena_kind {
    VRPC_ARENA_SYNC = 0, /* vrpc_call's *resp */
    VRPC_ARENA_CB = 1,   /* an async callback's resp (on a worker) */
    VRPC_ARENA_KINDS = 2,
};
struct vrpc_arena *vrpc_rpc_tls_arena_of(enum vrpc_arena_kind kind);
/* Creates the calling thread's arenas and their first blocks now, so that its
 * first response (an async callback's, or a vrpc_call's made from a handler
 * or a callback) allocates nothing. The worker_start hook of the schedulers
 * channels and servers create (vrpc_sched_config.worker_start; worker and arg
 * unused). Out of memory is not an error here: the arenas are then created
 * on first use, as on any other thread. */
void vrpc_rpc_worker_start(unsigned worker, void *arg);
/* Set while user code runs on a poller thread (a handler of a method the
 * server runs on the poller, vrpc_server_run_on_poller; a callback of an
 * async call made with VRPC_CALL_CB_ON_POLLER): whatever it sends never
 * waits for a send buffer (the poller is what returns them), and a
 * synchronous call from it is refused (it would block the poller, or wait
 * for itself). */
extern __thread bool vrpc_rpc_on_poller __attribute__((tls_model("initial-exec")));

static inline struct vrpc_arena *vrpc_rpc_tls_arena(void) { return vrpc_rpc_tls_arena_of(VRPC_ARENA_SYNC); }

/* Message-buffer pools the RPC layer registers (eager-size buffers): a
 * channel's receive pool, a server's send pool and its receive pool per
 * poller. A channel's send pool holds max_outstanding + max_queued + 64. */
#define VRPC_CHANNEL_RECV_BUFS 128
#define VRPC_SERVER_RECV_BUFS 512
#define VRPC_SERVER_SEND_BUFS 1024

/* Bytes of message pools a channel (server false) or a one-poller server
 * (server true) with default options registers, for eager-size buffers and a
 * transport headroom of at most 64 bytes (what `verbrpc doctor` compares
 * with RLIMIT_MEMLOCK; large-message buffers come on top, up to max_pinned). */
uint64_t vrpc_rpc_pool_bytes(bool server, uint32_t eager);

/* vrpc_rpc_log (common/log_internal.h): a line at VRPC_LOG_WARN, subsystem
 * "rpc". Protocol errors and other events the peer caused go here. */

/* Transport name and URI for it from a user URI: "tcp://h:p", "verbs://h:p",
 * "auto://h:p" or bare "h:p" (= auto), each also as "fault+tcp://h:p" etc.
 * (the fault-injecting layer over that backend). 0 or -EINVAL, logged with
 * the reason (vrpc_uri_check's syntax, or a scheme that names no backend). */
int vrpc_rpc_parse_uri(const char *uri, char *name, size_t name_len, char *turi, size_t turi_len);

/* The longest vrpc_rpc_buf_get / vrpc_rpc_send wait (with `wait`): a thread
 * never waits without bound on a pool that others fill or on a connection
 * whose peer returns no credits. What cannot go within it fails (NULL,
 * -EAGAIN) and the caller decides: drop and log, fail the call, or fail the
 * connection. */
#define VRPC_RPC_SEND_WAIT_MS 20

/* A free send buffer from pool; with wait, yields until one returns (send
 * completions put buffers back), at most VRPC_RPC_SEND_WAIT_MS; NULL when
 * none came (at once without wait). */
struct vrpc_buf *vrpc_rpc_buf_get(struct vrpc_pool *pool, bool wait);

/* Send len bytes of buf on ep. With wait, retries while the transport's
 * credit queue is full (-EAGAIN), at most VRPC_RPC_SEND_WAIT_MS. On error the
 * buffer goes back to its pool. 0 or the transport's negative errno
 * (-EAGAIN: the queue stayed full). Ownership of buf passes to the transport
 * on 0 (the SEND completion puts it back into its pool). */
int vrpc_rpc_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, bool wait);

/* Write header h with payload[0..payload_len) (cut to what b holds; the
 * header's payload_len is set to match) into b; returns the frame length.
 * b stays the caller's. */
uint32_t vrpc_rpc_frame_fill(struct vrpc_buf *b, const struct vrpc_wire_hdr *h, const void *payload,
                             uint32_t payload_len);

/* Send a header-only frame (plus an optional small payload), e.g. CANCEL,
 * GOAWAY, an error RESPONSE, HELLO. 0, -ENOBUFS (no buffer without waiting)
 * or the send error. */
int vrpc_rpc_send_simple(struct vrpc_ep *ep, struct vrpc_pool *pool, const struct vrpc_wire_hdr *h, const void *payload,
                         uint32_t payload_len, bool wait);

/* Futex wait on *addr == val with a timeout in ns (<= 0 returns at once). */
void vrpc_rpc_futex_wait_ns(uint32_t *addr, uint32_t val, int64_t timeout_ns);

#endif

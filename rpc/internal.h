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

#ifndef container_of
#define container_of(p, T, m) ((T *)((char *)(p) - __builtin_offsetof(T, m)))
#endif

/* Receive buffers (and their pool) a channel/server CQ keeps posted. */
#define VRPC_RPC_DEFAULT_EAGER 8192u

/* How long a channel's or server's poller busy-polls after its last
 * completion before it sleeps (unless no_spin). It must outlast a round trip
 * counted from the send completion that opens it (about 17-25 us on TCP over
 * loopback in a VM): a response that finds the poller asleep pays an epoll
 * wake-up, and if its CPU went idle meanwhile a wake from idle (~100 us on a
 * VM). As long as a synchronous caller's and an idle worker's spin. */
#define VRPC_RPC_BUSY_POLL_US 50u

/* The calling thread's arena for unpacking responses (created on first use,
 * freed at thread exit or vrpc_thread_release). NULL if out of memory. */
struct vrpc_arena *vrpc_rpc_tls_arena(void);

/* Log a line to stderr prefixed with "verbrpc: ". Protocol errors and other
 * events the peer caused go here; VRPC_LOG=0 in the environment silences it. */
void vrpc_rpc_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Transport name and URI for it from a user URI: "tcp://h:p", "verbs://h:p",
 * "auto://h:p" or bare "h:p" (= auto), each also as "fault+tcp://h:p" etc.
 * (the fault-injecting layer over that backend). 0 or -EINVAL. */
int vrpc_rpc_parse_uri(const char *uri, char *name, size_t name_len, char *turi, size_t turi_len);

/* A free send buffer from pool; with wait, yields until one returns (send
 * completions put buffers back), else NULL at once when empty. */
struct vrpc_buf *vrpc_rpc_buf_get(struct vrpc_pool *pool, bool wait);

/* Send len bytes of buf on ep. With wait, retries while the transport's
 * credit queue is full (-EAGAIN). On error the buffer goes back to its pool.
 * 0 or the transport's negative errno. Ownership of buf passes to the
 * transport on 0 (the SEND completion puts it back into its pool). */
int vrpc_rpc_send(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, bool wait);

/* Send a header-only frame (plus an optional small payload), e.g. CANCEL,
 * GOAWAY, an error RESPONSE, HELLO. 0, -ENOBUFS (no buffer without waiting)
 * or the send error. */
int vrpc_rpc_send_simple(struct vrpc_ep *ep, struct vrpc_pool *pool, const struct vrpc_wire_hdr *h,
                         const void *payload, uint32_t payload_len, bool wait);

/* Futex wait on *addr == val with a timeout in ns (<= 0 returns at once). */
void vrpc_rpc_futex_wait_ns(uint32_t *addr, uint32_t val, int64_t timeout_ns);

#endif

/* Per-connection pending-call table of the client: a fixed array of slots, a
 * request id = slot index + the slot's generation (rpc/wire.h), and the state
 * word that makes response, deadline, cancel and connection loss race to
 * exactly one winner.
 *
 * Slot life (one 64-bit atomic word per slot: generation << 32 | flags):
 *   FREE --alloc(owner)--> RESERVED (flags still 0: only the owner knows it)
 *   RESERVED --open(owner, release)--> INUSE
 *   INUSE --decide(any thread; CAS, exactly one winner)--> INUSE|DECIDED
 *   ... |WIRE_DONE  set once the server can no longer send for this id
 *                   (its response arrived, or the connection died)
 *   ... |OWNER_DONE set once the caller/callback no longer looks at the slot
 *   when both WIRE_DONE and OWNER_DONE are set the slot returns to FREE with
 *   generation + 1 (skipping 0), by whichever of the two came second.
 * So a cancelled or timed-out call keeps its slot (and the server's credit)
 * until the server answers; a response for a generation that is not the
 * slot's current one, or for a slot already WIRE_DONE, is a protocol error.
 *
 * Thread contract: alloc/lookup/decide/wire_done/owner_done may be called
 * from any thread.
 * Publication of a call (the start_call race): alloc hands the owner a
 * RESERVED slot that no other thread looks at, because every other thread
 * (the connection-loss scan, cancel, a deadline, a response) acts only on a
 * word with INUSE set. The owner writes every call field (conn, xfer, method,
 * cb, cb_arg, cb_ch, qent, deadline_ns) and only then calls vrpc_pending_open,
 * a release store of INUSE. Every other thread reads the word with acquire
 * (vrpc_pending_lookup, decide's CAS, the scan's load) before it reads a call
 * field, so it sees that call's fields, never the previous occupant's.
 * The outcome fields are written by the decide winner before it publishes
 * them with vrpc_pending_publish (release) and read by the owner after
 * vrpc_pending_wait returns (acquire). */
#ifndef VRPC_RPC_PENDING_H
#define VRPC_RPC_PENDING_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/sched.h>
#include "common/spin.h"
#include "rpc/rndv.h"
#include "rpc/timer.h"

#define VRPC_PEND_INUSE 0x1u
#define VRPC_PEND_DECIDED 0x2u
#define VRPC_PEND_WIRE_DONE 0x4u
#define VRPC_PEND_OWNER_DONE 0x8u

struct vrpc_pending;

struct vrpc_pending_slot {
    uint64_t word;     /* atomic: gen << 32 | VRPC_PEND_* */
    uint32_t done;     /* futex word: generation whose outcome is published */
    uint32_t sleeping; /* the synchronous owner sleeps (or is about to) on done */
    uint32_t index;
    struct vrpc_pending *table;
    /* The call, written by its owner before vrpc_pending_open. */
    void *conn; /* connection the request goes out on (atomic: read by the loss scan) */
    const struct vrpc_method_desc *method;
    vrpc_call_cb cb;   /* NULL for a synchronous call */
    bool cb_on_poller; /* VRPC_CALL_CB_ON_POLLER: cb runs on the poller that completes it */
    void *cb_arg;
    void *cb_ch; /* the channel, for the async completion task */
    void *qent;  /* the channel's queue entry the call was queued in
                             (its id lives there until the call completes); NULL: none */
    int64_t deadline_ns;
    int64_t start_ns; /* when the call took the slot (metrics) */
    struct vrpc_timer timer;
    struct vrpc_task task; /* async completion runs as this task */
    /* The outcome, written by the decide winner before publish. */
    struct vrpc_status st;
    uint8_t *resp; /* response payload copy (grown on demand, kept) */
    uint32_t resp_len, resp_cap;
    struct vrpc_buf *resp_lb; /* instead of resp: a large response read into a
                                 large buffer; the owner unpacks it and puts it back */
    /* Large messages (rpc/call_large.c). The wire side of a call ends (WIRE_DONE)
     * only when the server can send nothing more for it AND none of its
     * transfers is active: xfer = VRPC_PEND_XFER_SEEN (response arrived or
     * connection died) | count of holds (the owner's while it sets the call
     * up, one per grant or read in progress). Reset to 1 (the owner's hold)
     * by vrpc_pending_alloc. */
    uint64_t xfer;            /* gen << 32 | the above: a late slot_seen for an earlier
                             generation (the loss scan racing the response) then
                             fails instead of marking the slot's next call */
    struct vrpc_rndv_out out; /* the request payload, granted to the server */
    struct vrpc_rndv_in in;   /* the response payload, being read */
    /* The read's time limit (rpc/call_large.c, response_xfer_expired): rd_xfer
     * is gen << 32 | VRPC_RD_READING from the announcement until the read is
     * over (poller: CAS to VRPC_RD_NONE) or the limit passed (the wheel's
     * thread: CAS to VRPC_RD_EXPIRING, then VRPC_RD_EXPIRED once it has
     * decided the call and aborted the connection). */
    uint64_t rd_xfer; /* atomic */
    int64_t rd_start_ns;
    struct vrpc_timer rd_timer;
    /* Response metadata of a unary call that asked for it (resp_md, set at
     * open; rpc/call.c): the poller copies HEADERS' block, then the
     * RESPONSE's, into md (grown on demand, kept), imd_len bytes of it
     * initial; md_final (atomic, release after md) says the RESPONSE came, so
     * md is complete and the poller done with it: only then does the owner
     * read md. hdrs: a HEADERS came for this call (any call; poller). */
    struct vrpc_resp_md *resp_md;
    uint8_t *md;
    uint32_t md_len, md_cap, imd_len;
    bool md_final, hdrs;
};
enum { VRPC_RD_NONE = 0, VRPC_RD_READING = 1, VRPC_RD_EXPIRING = 2, VRPC_RD_EXPIRED = 3 };
#define VRPC_PEND_XFER_SEEN 0x80000000u

struct vrpc_pending {
    uint32_t n;     /* slots */
    uint32_t limit; /* at most this many in use (credits); <= n */
    uint32_t in_use;
    uint32_t freeing; /* threads in on_free after freeing a slot: the destroyer
                         waits for in_use == 0 and freeing == 0 (under lock) */
    uint32_t nfree;
    uint32_t *free; /* LIFO stack of free indices, lowest on top initially */
    bool closed;
    bool spin;      /* false: vrpc_pending_wait sleeps at once (no_spin) */
    int poller_cpu; /* the CPU the answering poller is pinned to, -1: none;
                             a waiter running there sleeps at once (pending.c) */
    /* Called, with no lock held, on whichever thread freed a slot (set once
     * before the table is used; NULL: none); not once the table is closed. */
    void (*on_free)(void *arg);
    void *on_free_arg;
    pthread_mutex_t lock; /* free stack, in_use, limit, closed */
    pthread_cond_t cond;  /* signalled when a slot frees or the table closes */
    struct vrpc_pending_slot *slots;
    /* How long a waiter spins: spin_ns fixed (UINT64_MAX: until answered),
     * or, if spin_cap_ns > spin_ns, adaptive between the two (common/spin.h:
     * twice the recent waits, in spin_est). */
    uint64_t spin_ns;
    uint64_t spin_cap_ns;
    _Alignas(64) struct vrpc_spin_est spin_est; /* adaptive: the recent waits (any waiter, relaxed) */
};

int vrpc_pending_create(uint32_t n, struct vrpc_pending **out);
/* Slots must all be FREE (or the caller accepts losing them). Safe on NULL. */
void vrpc_pending_destroy(struct vrpc_pending *p);

/* Lower/raise the number of slots usable at once (clamped to 1..n). The LIFO
 * free stack guarantees the indices handed out stay below the limit. */
void vrpc_pending_set_limit(struct vrpc_pending *p, uint32_t limit);

/* Reserve a free slot for a call on connection conn (stored in slot->conn),
 * waiting while limit slots are in use, at most until deadline_ns
 * (CLOCK_MONOTONIC; VRPC_NO_DEADLINE: forever). The slot is RESERVED: the
 * owner fills the call fields, then publishes it with vrpc_pending_open.
 * 0, -ETIMEDOUT or -ESHUTDOWN (table closed). */
int vrpc_pending_alloc(struct vrpc_pending *p, int64_t deadline_ns, void *conn, struct vrpc_pending_slot **out);
/* As alloc, never waiting: -EAGAIN when limit slots are in use. */
int vrpc_pending_try_alloc(struct vrpc_pending *p, void *conn, struct vrpc_pending_slot **out);
/* Publish a RESERVED slot INUSE (release: the call fields written before are
 * visible to whoever acquires INUSE). Owner only, once per allocation, before
 * anything else may act on the call (send, timer, call id). */
void vrpc_pending_open(struct vrpc_pending_slot *s);
/* Wake every waiter of alloc and make later allocs fail with -ESHUTDOWN. */
void vrpc_pending_close(struct vrpc_pending *p);

static inline uint32_t vrpc_pending_gen(const struct vrpc_pending_slot *s)
{
    return (uint32_t)(__atomic_load_n(&s->word, __ATOMIC_ACQUIRE) >> 32);
}
uint64_t vrpc_pending_id(const struct vrpc_pending_slot *s);

/* The slot that id names if it is in use and still expects the wire (not
 * WIRE_DONE), else NULL. The answer can change right after; decide and
 * wire_done re-check. */
struct vrpc_pending_slot *vrpc_pending_lookup(struct vrpc_pending *p, uint64_t id);

/* Try to decide the outcome of generation gen. True for exactly one caller per
 * call. The winner fills st/resp and then calls vrpc_pending_publish. */
bool vrpc_pending_decide(struct vrpc_pending_slot *s, uint32_t gen);
/* Publish the winner's outcome (release) and wake a synchronous waiter. */
void vrpc_pending_publish(struct vrpc_pending_slot *s, uint32_t gen);
/* Wait (spinning briefly, then on the slot's futex) until gen is published. */
void vrpc_pending_wait(struct vrpc_pending_slot *s, uint32_t gen);

/* Mark that the wire is done with gen. True if this call set the bit (false:
 * already set, or gen is not current). Frees the slot if the owner is done. */
bool vrpc_pending_wire_done(struct vrpc_pending_slot *s, uint32_t gen);
/* Mark that the owner is done with gen. Frees the slot if the wire is done. */
void vrpc_pending_owner_done(struct vrpc_pending_slot *s, uint32_t gen);

#endif

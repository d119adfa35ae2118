/* Large messages (rendezvous, docs/PROTOCOL.md "Large messages"): message
 * size limits agreed at connect time, and the helpers the channel and the
 * server share to move a payload that does not fit the eager size: the
 * sender packs it into a large buffer of the transport's cache and grants the
 * peer a one-shot key; the receiver reads it into its own large buffer and
 * answers DONE; the sender then revokes the key and puts the buffer back. */
#ifndef VRPC_RPC_RNDV_H
#define VRPC_RPC_RNDV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc/timer.h"

#define VRPC_HOLD_TIMEOUT_DEFAULT_MS 60000u
/* The transfer limit of a large payload's read, from its announcement:
 * transfer_floor_ms + size / min_transfer_rate (server and channel options). */
#define VRPC_TRANSFER_RATE_DEFAULT (1u << 20)
#define VRPC_TRANSFER_FLOOR_DEFAULT_MS 10000u

/* The transport of a channel / a started server (NULL before start), for
 * tests and statistics (vrpc_lbuf_stats). Not public API. */
struct vrpc_transport *vrpc_channel_transport(const struct vrpc_channel *ch);
struct vrpc_transport *vrpc_server_transport(const struct vrpc_server *s);

/* Feature bits this build offers in HELLO/HELLO_ACK. */
extern const uint32_t vrpc_rndv_features;

/* Defaults and bounds for one side's options: *max_msg 0 -> 16 MiB, above
 * VRPC_MSG_SIZE_MAX -> -EINVAL; *max_pinned 0 -> 256 MiB, below *max_msg ->
 * -EINVAL; *hold_ms 0 -> 60 s. who names the side in the log line of an
 * -EINVAL ("channel", "server"). */
int vrpc_rndv_limits(const char *who, uint32_t *max_msg, uint64_t *max_pinned, uint32_t *hold_ms);

/* Largest payload (metadata + message) this side may send on a connection:
 * the peer's limit when both sides offer VRPC_FEAT_LARGE, else what fits one
 * eager frame. */
uint32_t vrpc_rndv_send_limit(uint32_t peer_max, uint32_t peer_features, uint32_t eager);

/* ---- the sender's side: a payload granted to the peer ----------------------
 * state (atomic), and who moves it:
 *   IDLE -> GRANTED    the thread that packed the payload, before it sends the
 *                      descriptor (vrpc_rndv_grant)
 *   GRANTED -> REVOKING  the poller, on DONE (or the RESPONSE of a request)
 *   REVOKING -> IDLE   the poller, on the REVOKE completion (buffer put back)
 *   GRANTED -> IDLE    the poller, on the endpoint's DISCONNECTED (the key died
 *                      with the connection; buffer put back)
 * The REVOKE completion carries the record's address as wr_id. */
enum { VRPC_RNDV_IDLE = 0, VRPC_RNDV_GRANTED = 1, VRPC_RNDV_REVOKING = 2 };

struct vrpc_rndv_out {
    uint32_t state;
    uint32_t rkey, len;
    uint64_t raddr;      /* the window's address for the peer (descriptor) */
    uint64_t id;         /* request id of the call */
    int64_t sent_ns;     /* when granted (hold timeout) */
    struct vrpc_buf *lb; /* the packed payload */
    struct vrpc_ep *ep;
    struct vrpc_rndv_out *next;   /* the poller's list of revokes to retry */
    struct vrpc_timer hold_timer; /* the owner's hold timeout */
    /* An offer for this record (the machine is rpc/offer.h), parked while it
     * waits for its grant: vrpc_ep_grant
     * said -ENOSPC (no send-queue slot or grant left), or (server) the
     * record is still revoking its previous payload. Nobody spins: the
     * offer waits on its owner's list (under the owner's lock) and is tried
     * again after each completion batch of the poller, and once by the
     * parker right after parking. No wake-up is lost: whatever frees a
     * grant is followed by a completion of that endpoint (the REVOKE, or the
     * SEND of the descriptor that follows each grant). p_* are written by
     * the parker before it takes the lock, and read by whoever takes the
     * offer off the list. */
    struct vrpc_buf *p_lb;    /* the packed payload */
    struct vrpc_buf *p_frame; /* its descriptor frame, header written; the
                                 descriptor goes in its last 16 bytes */
    uint32_t p_len, p_frame_len;
    /* A gathered offer (TCP; rpc/call_large.c): p_nsegs > 0 and the window is
     * p_segs (pieces copied into p_lb, and the caller's own big values),
     * granted with vrpc_ep_grant_segs. */
    struct vrpc_seg p_segs[VRPC_GRANT_SEGS_MAX];
    uint32_t p_nsegs;
    /* The caller's memory is in the window: VRPC_ZC_* bits (atomic),
     * see rpc/channel_internal.h "zero-copy requests". 0 when not. */
    uint32_t zc;
    uint64_t p_id;
    void *p_conn;    /* the owner's connection (holds a reference) */
    int p_rc;        /* the grant's outcome once taken off the list */
    uint32_t parked; /* atomic 0/1: on the owner's list */
    struct vrpc_rndv_out *p_next;
};

/* ---- the reader's side: a payload being read ------------------------------
 * Posted and completed on the poller only; the READ completion carries the
 * record's address as wr_id. */
struct vrpc_rndv_in {
    struct vrpc_buf *lb; /* our large buffer, NULL when idle */
    struct vrpc_ep *ep;
    uint64_t addr;
    uint32_t rkey, len;
    uint64_t id;
    struct vrpc_rndv_in *next; /* the poller's list of reads to retry */
};

/* A large buffer of len bytes. On failure (no completion, nothing held):
 * -ENOBUFS (max_pinned reached) or -ENOMEM with a status message in why:
 * "large-message memory limit reached: ... (raise max_pinned)". */
int vrpc_rndv_buf(struct vrpc_transport *tp, uint64_t max_pinned, size_t len, struct vrpc_buf **out, char *why,
                  size_t whylen);

/* Grant the peer of ep the first len bytes of lb for call id: IDLE -> GRANTED.
 * One attempt: -ENOSPC means retry after a completion of ep (park the
 * offer, see p_* above); other errors: the endpoint is unusable. On error
 * the record stays IDLE and lb stays the caller's. Any thread. */
int vrpc_rndv_grant(struct vrpc_rndv_out *o, struct vrpc_ep *ep, struct vrpc_buf *lb, uint32_t len, uint64_t id);
/* The same for a gathered window segs[0..n) of len bytes (lb: the buffer
 * holding its copied pieces, put back at revoke). -ENOSYS: the backend
 * cannot gather. */
int vrpc_rndv_grant_segs(struct vrpc_rndv_out *o, struct vrpc_ep *ep, struct vrpc_buf *lb, const struct vrpc_seg *segs,
                         unsigned n, uint32_t len, uint64_t id);
/* Append o to a list of parked offers (FIFO; under the owner's lock). */
void vrpc_rndv_park(struct vrpc_rndv_out **list, struct vrpc_rndv_out *o);
/* The parked offer's descriptor, once granted: into the frame's last 16 bytes. */
void vrpc_rndv_offer_desc(struct vrpc_rndv_out *o);

/* Poller (the channel also, under its conn_lock, for a grant whose
 * descriptor could not be sent): GRANTED -> REVOKING and post the revoke. 0 posted; -EALREADY the
 * record was not GRANTED; -ENOSPC: stays GRANTED, retry after a completion
 * (vrpc_rndv_revoke_later); other errors: stays GRANTED (the endpoint is
 * dying; its DISCONNECTED releases it). */
int vrpc_rndv_revoke(struct vrpc_rndv_out *o);
/* Poller: the REVOKE completion of o: the buffer goes back, IDLE. */
void vrpc_rndv_revoked(struct vrpc_rndv_out *o);
/* Poller, at ep's DISCONNECTED: if o is GRANTED on ep, put its buffer back and
 * return true (IDLE). */
bool vrpc_rndv_drop(struct vrpc_rndv_out *o, const struct vrpc_ep *ep);

/* Poller: start reading in->len bytes into in->lb. 0 (one READ completion
 * follows), -ENOSPC (retry later), or another error (no completion). */
int vrpc_rndv_read(struct vrpc_rndv_in *in);

/* Poller-owned lists of operations to retry after -ENOSPC. */
struct vrpc_rndv_retry {
    struct vrpc_rndv_in *reads;
    struct vrpc_rndv_out *revokes;
};
void vrpc_rndv_read_later(struct vrpc_rndv_retry *r, struct vrpc_rndv_in *in);
void vrpc_rndv_revoke_later(struct vrpc_rndv_retry *r, struct vrpc_rndv_out *o);
/* Retry everything queued. A read that fails for good is handed to
 * read_failed(in, rc, arg) as if its completion had failed; a revoke that
 * fails for good stays GRANTED for the endpoint's DISCONNECTED. */
void vrpc_rndv_retry_run(struct vrpc_rndv_retry *r, void (*read_failed)(struct vrpc_rndv_in *, int, void *), void *arg);
/* Fail every queued read of ep (-ECANCELED through read_failed) and forget
 * its queued revokes (the caller drops them): at ep's DISCONNECTED. */
void vrpc_rndv_retry_forget(struct vrpc_rndv_retry *r, const struct vrpc_ep *ep,
                            void (*read_failed)(struct vrpc_rndv_in *, int, void *), void *arg);

#endif

/* The grant table: a transport core service for byte-stream backends, whose
 * peers read granted memory through the owner's transport (a read request
 * served from this table) instead of through a NIC key. A grant is a window
 * of up to VRPC_GRANT_SEGS_MAX segments; its key is index << 8 | generation
 * (never 0), valid on the one endpoint it was made on, and a read must lie
 * inside the window. Entries never move, so a read job holding a reference
 * may use an entry's segments without the lock. The backend streams the
 * bytes and delivers the REVOKE completion (the table's complete hook).
 *
 * Locking: one mutex per table (mu), taken after an endpoint lock, never
 * before one. Functions ending in _locked want it held; the others take it.
 * Threads: any, unless a function says otherwise. */
#ifndef VRPC_TRANSPORT_GRANT_H
#define VRPC_TRANSPORT_GRANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <verbrpc/transport.h>

/* VRPC_GRANT_ORPHAN: its endpoint died while a job still streamed from it;
 * freed when the last job lets go (never reused while a reference may read
 * segs). */
enum { VRPC_GRANT_FREE, VRPC_GRANT_LIVE, VRPC_GRANT_REVOKING, VRPC_GRANT_DONE, VRPC_GRANT_ORPHAN };

/* The per-endpoint part, embedded in the backend's endpoint (under mu). */
struct vrpc_grant_ep {
    bool granted_any; /* ever granted: teardown scans the table only then */
    uint32_t ngrants; /* grants not freed yet */
};

/* Grant table entry (transport-wide, under the table's mu). */
struct vrpc_grant {
    struct vrpc_buf cpl;      /* carries the REVOKE completion (the backend fills it) */
    struct vrpc_grant_ep *ep; /* the only endpoint whose peer may use the key */
    const char *addr;         /* where the window starts for the peer (segs[0]) */
    uint32_t len;             /* window length: the sum of the segments */
    uint32_t nsegs;
    struct vrpc_seg segs[VRPC_GRANT_SEGS_MAX]; /* set at grant, read by jobs holding a reference */
    uint32_t refs;                             /* read jobs streaming from it */
    uint32_t idx;                              /* its own index */
    uint32_t next_free;                        /* index + 1 of the next free entry, 0: none */
    uint8_t gen;                               /* key = index << 8 | gen, gen never 0 */
    uint8_t state;
    int status; /* of the REVOKE completion, once revoked */
    uint64_t wr_id;
};

#define VRPC_GRANT_BLOCK 1024u
#define VRPC_GRANT_MAX_BLOCKS 1024u /* at most 1 Mi grants alive per transport */

struct vrpc_grant_table {
    pthread_mutex_t mu;
    struct vrpc_grant *blocks[VRPC_GRANT_MAX_BLOCKS];
    uint32_t nblocks, hw; /* hw: entries ever used */
    uint32_t free_head;   /* index + 1, 0: none */
    uint32_t ep_grants;   /* most live grants per endpoint, 0: no limit (test
                             only, forces -ENOSPC; TCP: VRPC_TCP_TEST_EP_GRANTS) */
    /* mu held, g->state already VRPC_GRANT_DONE: hand g's REVOKE completion
     * (g->wr_id, status) to the poller of g's endpoint. */
    void (*complete)(struct vrpc_grant *g, int status);
};

/* The owner's rule for a read of length bytes at raddr against a window of
 * glen bytes that starts at base: length >= 1 and the range inside the
 * window, with no overflow. Pure (tests/fuzz/fuzz_rndv.c, through
 * vrpc_tcp_read_in_grant). */
static inline bool vrpc_grant_read_in(uint64_t base, uint32_t glen, uint64_t raddr, uint32_t length)
{
    return length && raddr >= base && length <= glen && raddr - base <= glen - length;
}

/* t zeroed (it lives in the backend's calloc'd transport). */
void vrpc_grant_table_init(struct vrpc_grant_table *t, uint32_t ep_grants,
                           void (*complete)(struct vrpc_grant *g, int status));
/* Frees the entries; no grant may be in use any more. */
void vrpc_grant_table_destroy(struct vrpc_grant_table *t);

/* mu held, the endpoint checked alive under it (so that a teardown marking
 * its grants dead either comes after and sees this one, or was seen): a grant
 * of the window segs[0..n) (len bytes in all; checked by the core) on ep.
 * 0 and *rkey, -ENOSPC (the table or ep's limit is full) or -ENOMEM. */
int vrpc_grant_new_locked(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, const struct vrpc_seg *segs, unsigned n,
                          uint32_t len, uint32_t *rkey);
/* mu held, the endpoint checked not dead under it: revoke ep's live grant
 * rkey; its completion comes once no job streams from it. 0 or -EINVAL. */
int vrpc_grant_revoke_locked(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, uint32_t rkey, uint64_t wr_id);
/* Validate a peer's read of length bytes at raddr under key, arriving on ep,
 * and take a reference on its grant (*out). NULL, or the reason it is bad. */
const char *vrpc_grant_ref(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, uint64_t raddr, uint32_t key,
                           uint32_t length, struct vrpc_grant **out);
/* A read job lets go of g: a pending revoke completes, an orphan is freed. */
void vrpc_grant_unref(struct vrpc_grant_table *t, struct vrpc_grant *g);
/* Whether g is still live (not revoked): a job stops streaming when not. */
bool vrpc_grant_live(struct vrpc_grant_table *t, struct vrpc_grant *g);
/* The poller, when g's REVOKE completion has been taken: g is free. */
void vrpc_grant_release(struct vrpc_grant_table *t, struct vrpc_grant *g);
/* At ep's teardown (ep already dead for new grants and revokes): its grants
 * die and are freed; one a job still streams from waits for the job; a
 * revoke waiting for a job will complete -ECANCELED. */
void vrpc_grant_ep_dead(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep);

#endif

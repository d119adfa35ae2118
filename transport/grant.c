/* The grant table (grant.h): keys, per-endpoint validity, range checks and
 * the life of an entry (live, revoking, done, orphan, free). Moved from the
 * TCP backend, which keeps the streaming of the granted bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport/grant.h"

void vrpc_grant_table_init(struct vrpc_grant_table *t, uint32_t ep_grants,
                           void (*complete)(struct vrpc_grant *g, int status))
{
    pthread_mutex_init(&t->mu, NULL);
    t->ep_grants = ep_grants;
    t->complete = complete;
}

void vrpc_grant_table_destroy(struct vrpc_grant_table *t)
{
    uint32_t i;
    for (i = 0; i < t->nblocks; i++)
        free(t->blocks[i]);
    pthread_mutex_destroy(&t->mu);
}

static struct vrpc_grant *grant_at(struct vrpc_grant_table *t, uint32_t idx)
{
    return &t->blocks[idx / VRPC_GRANT_BLOCK][idx % VRPC_GRANT_BLOCK];
}

/* The live-or-not entry a key names, or NULL when the key names nothing. */
static struct vrpc_grant *grant_lookup(struct vrpc_grant_table *t, uint32_t key)
{
    uint32_t idx = key >> 8;
    struct vrpc_grant *g;
    if (!key || idx >= t->hw)
        return NULL;
    g = grant_at(t, idx);
    return g->gen == (uint8_t)key ? g : NULL;
}

/* mu held: hand the REVOKE completion to the endpoint's poller. */
static void grant_complete(struct vrpc_grant_table *t, struct vrpc_grant *g, int status)
{
    g->state = VRPC_GRANT_DONE;
    t->complete(g, status);
}

/* mu held: the entry is free; its key names nothing any more. */
static void grant_free_locked(struct vrpc_grant_table *t, struct vrpc_grant *g)
{
    if (g->ep)
        g->ep->ngrants--;
    g->state = VRPC_GRANT_FREE;
    g->ep = NULL;
    g->addr = NULL;
    if (++g->gen == 0)
        g->gen = 1;
    g->next_free = t->free_head;
    t->free_head = g->idx + 1;
}

void vrpc_grant_unref(struct vrpc_grant_table *t, struct vrpc_grant *g)
{
    pthread_mutex_lock(&t->mu);
    if (--g->refs == 0) {
        if (g->state == VRPC_GRANT_REVOKING)
            grant_complete(t, g, g->status);
        else if (g->state == VRPC_GRANT_ORPHAN)
            grant_free_locked(t, g);
    }
    pthread_mutex_unlock(&t->mu);
}

bool vrpc_grant_live(struct vrpc_grant_table *t, struct vrpc_grant *g)
{
    bool live;
    pthread_mutex_lock(&t->mu);
    live = g->state == VRPC_GRANT_LIVE;
    pthread_mutex_unlock(&t->mu);
    return live;
}

void vrpc_grant_release(struct vrpc_grant_table *t, struct vrpc_grant *g)
{
    pthread_mutex_lock(&t->mu);
    grant_free_locked(t, g);
    pthread_mutex_unlock(&t->mu);
}

int vrpc_grant_new_locked(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, const struct vrpc_seg *segs, unsigned n,
                          uint32_t len, uint32_t *rkey)
{
    struct vrpc_grant *g;
    uint32_t idx;

    if (t->ep_grants && ep->ngrants >= t->ep_grants)
        return -ENOSPC;
    if (t->free_head) {
        idx = t->free_head - 1;
        g = grant_at(t, idx);
        t->free_head = g->next_free;
    } else {
        if (t->hw == t->nblocks * VRPC_GRANT_BLOCK) {
            if (t->nblocks == VRPC_GRANT_MAX_BLOCKS ||
                !(t->blocks[t->nblocks] = calloc(VRPC_GRANT_BLOCK, sizeof(struct vrpc_grant))))
                return t->nblocks == VRPC_GRANT_MAX_BLOCKS ? -ENOSPC : -ENOMEM;
            t->nblocks++;
        }
        idx = t->hw++;
        g = grant_at(t, idx);
        g->idx = idx;
        g->gen = 1;
    }
    g->ep = ep;
    g->addr = segs[0].addr;
    g->len = len;
    g->nsegs = n;
    memcpy(g->segs, segs, n * sizeof(*segs));
    g->refs = 0;
    g->state = VRPC_GRANT_LIVE;
    g->status = 0;
    ep->granted_any = true;
    ep->ngrants++;
    *rkey = idx << 8 | g->gen;
    return 0;
}

int vrpc_grant_revoke_locked(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, uint32_t rkey, uint64_t wr_id)
{
    struct vrpc_grant *g = grant_lookup(t, rkey);
    if (!g || g->ep != ep || g->state != VRPC_GRANT_LIVE)
        return -EINVAL;
    g->wr_id = wr_id;
    if (!g->refs)
        grant_complete(t, g, 0);
    else
        g->state = VRPC_GRANT_REVOKING; /* completes when the job streaming it stops */
    return 0;
}

void vrpc_grant_ep_dead(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep)
{
    uint32_t i;
    pthread_mutex_lock(&t->mu);
    if (ep->granted_any)
        for (i = 0; i < t->hw; i++) {
            struct vrpc_grant *g = grant_at(t, i);
            if (g->ep != ep)
                continue;
            if (g->state == VRPC_GRANT_LIVE && g->refs)
                g->state = VRPC_GRANT_ORPHAN; /* its job is dropped right after: then freed */
            else if (g->state == VRPC_GRANT_LIVE)
                grant_free_locked(t, g);
            else if (g->state == VRPC_GRANT_REVOKING)
                g->status = -ECANCELED;
        }
    pthread_mutex_unlock(&t->mu);
}

const char *vrpc_grant_ref(struct vrpc_grant_table *t, struct vrpc_grant_ep *ep, uint64_t raddr, uint32_t key,
                           uint32_t length, struct vrpc_grant **out)
{
    const char *why = NULL;
    struct vrpc_grant *g;

    pthread_mutex_lock(&t->mu);
    g = grant_lookup(t, key);
    if (!g || (g->state != VRPC_GRANT_LIVE && g->state != VRPC_GRANT_REVOKING))
        why = "unknown or revoked key";
    else if (g->ep != ep)
        why = "key granted on another connection";
    else if (g->state != VRPC_GRANT_LIVE)
        why = "revoked key";
    else if (!length)
        why = "zero length";
    else if (!vrpc_grant_read_in((uint64_t)(uintptr_t)g->addr, g->len, raddr, length))
        why = "range outside the grant";
    if (!why) {
        g->refs++;
        *out = g;
    }
    pthread_mutex_unlock(&t->mu);
    return why;
}

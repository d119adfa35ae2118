/* Large messages: limits, and the rendezvous helpers shared by the channel
 * and the server (see rndv.h). */
#include "rpc/rndv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "rpc/internal.h"
#include "rpc/wire.h"

const uint32_t vrpc_rndv_features = VRPC_FEAT_LARGE;

int vrpc_rndv_limits(const char *who, uint32_t *max_msg, uint64_t *max_pinned, uint32_t *hold_ms)
{
    if (*max_msg == 0)
        *max_msg = VRPC_MSG_SIZE_DEFAULT;
    if (*max_pinned == 0)
        *max_pinned = (uint64_t)256 << 20;
    if (*hold_ms == 0)
        *hold_ms = VRPC_HOLD_TIMEOUT_DEFAULT_MS;
    if (*max_msg > VRPC_MSG_SIZE_MAX) {
        vrpc_rpc_log("%s: max_msg_size %u is above the largest allowed, %u", who, *max_msg, VRPC_MSG_SIZE_MAX);
        return -EINVAL;
    }
    if (*max_msg > *max_pinned) {
        vrpc_rpc_log("%s: max_msg_size %u is above max_pinned %llu: a message of the largest size "
                     "could never get a buffer",
                     who, *max_msg, (unsigned long long)*max_pinned);
        return -EINVAL;
    }
    return 0;
}

uint32_t vrpc_rndv_send_limit(uint32_t peer_max, uint32_t peer_features, uint32_t eager)
{
    uint32_t fit = eager - VRPC_WIRE_HDR_LEN;
    if ((vrpc_rndv_features & peer_features & VRPC_FEAT_LARGE) || peer_max <= fit)
        return peer_max;
    return fit;
}

int vrpc_rndv_buf(struct vrpc_transport *tp, uint64_t max_pinned, size_t len, struct vrpc_buf **out, char *why,
                  size_t whylen)
{
    int rc = vrpc_lbuf_get(tp, len, out);
    if (rc == -ENOBUFS) {
        size_t pinned = 0, in_use = 0;
        vrpc_lbuf_stats(tp, &pinned, &in_use);
        snprintf(why, whylen,
                 "large-message memory limit reached: %.1f MiB of %.1f MiB registered in use, "
                 "%.1f MiB needed (raise max_pinned)",
                 (double)in_use / (1 << 20), (double)max_pinned / (1 << 20), (double)len / (1 << 20));
    } else if (rc) {
        snprintf(why, whylen, "no memory for a large-message buffer of %zu bytes: %s", len, strerror(-rc));
    }
    return rc;
}

static void granted(struct vrpc_rndv_out *o, struct vrpc_ep *ep, struct vrpc_buf *lb, uint32_t rkey, uint64_t raddr,
                    uint32_t len, uint64_t id)
{
    o->rkey = rkey;
    o->raddr = raddr;
    o->len = len;
    o->id = id;
    o->lb = lb;
    o->ep = ep;
    o->sent_ns = vrpc_now_ns();
    /* release: the fields above are complete for the poller that sees GRANTED */
    __atomic_store_n(&o->state, VRPC_RNDV_GRANTED, __ATOMIC_RELEASE);
}

int vrpc_rndv_grant(struct vrpc_rndv_out *o, struct vrpc_ep *ep, struct vrpc_buf *lb, uint32_t len, uint64_t id)
{
    uint32_t rkey;
    int rc = vrpc_ep_grant(ep, lb->mr, lb->data, len, &rkey);
    if (rc)
        return rc;
    granted(o, ep, lb, rkey, (uint64_t)(uintptr_t)lb->data, len, id);
    return 0;
}

int vrpc_rndv_grant_segs(struct vrpc_rndv_out *o, struct vrpc_ep *ep, struct vrpc_buf *lb, const struct vrpc_seg *segs,
                         unsigned n, uint32_t len, uint64_t id)
{
    uint32_t rkey;
    int rc = vrpc_ep_grant_segs(ep, segs, n, &rkey);
    if (rc)
        return rc;
    granted(o, ep, lb, rkey, (uint64_t)(uintptr_t)segs[0].addr, len, id);
    return 0;
}

void vrpc_rndv_park(struct vrpc_rndv_out **list, struct vrpc_rndv_out *o)
{
    while (*list)
        list = &(*list)->p_next;
    o->p_next = NULL;
    *list = o;
    __atomic_store_n(&o->parked, 1, __ATOMIC_RELEASE);
}

void vrpc_rndv_offer_desc(struct vrpc_rndv_out *o)
{
    struct vrpc_wire_desc d = {.addr = o->raddr, .rkey = o->rkey};
    vrpc_wire_desc_encode((uint8_t *)o->p_frame->data + o->p_frame_len - VRPC_WIRE_DESC_LEN, &d);
}

int vrpc_rndv_revoke(struct vrpc_rndv_out *o)
{
    uint32_t want = VRPC_RNDV_GRANTED;
    if (!__atomic_compare_exchange_n(&o->state, &want, VRPC_RNDV_REVOKING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return -EALREADY;
    int rc = vrpc_ep_revoke(o->ep, o->rkey, (uint64_t)(uintptr_t)o);
    if (rc)
        __atomic_store_n(&o->state, VRPC_RNDV_GRANTED, __ATOMIC_RELEASE);
    return rc;
}

void vrpc_rndv_revoked(struct vrpc_rndv_out *o)
{
    struct vrpc_buf *lb = o->lb;
    o->lb = NULL;
    __atomic_store_n(&o->state, VRPC_RNDV_IDLE, __ATOMIC_RELEASE);
    vrpc_lbuf_put(lb);
}

bool vrpc_rndv_drop(struct vrpc_rndv_out *o, const struct vrpc_ep *ep)
{
    if (__atomic_load_n(&o->state, __ATOMIC_ACQUIRE) != VRPC_RNDV_GRANTED || o->ep != ep)
        return false;
    vrpc_rndv_revoked(o);
    return true;
}

int vrpc_rndv_read(struct vrpc_rndv_in *in)
{
    return vrpc_ep_read(in->ep, in->lb, 0, in->len, in->addr, in->rkey, (uint64_t)(uintptr_t)in);
}

void vrpc_rndv_read_later(struct vrpc_rndv_retry *r, struct vrpc_rndv_in *in)
{
    struct vrpc_rndv_in **pp = &r->reads;
    while (*pp) /* FIFO: reads start in arrival order */
        pp = &(*pp)->next;
    in->next = NULL;
    *pp = in;
}

void vrpc_rndv_revoke_later(struct vrpc_rndv_retry *r, struct vrpc_rndv_out *o)
{
    o->next = r->revokes;
    r->revokes = o;
}

void vrpc_rndv_retry_run(struct vrpc_rndv_retry *r, void (*read_failed)(struct vrpc_rndv_in *, int, void *), void *arg)
{
    struct vrpc_rndv_out *o = r->revokes;
    r->revokes = NULL;
    while (o) {
        struct vrpc_rndv_out *next = o->next;
        if (vrpc_rndv_revoke(o) == -ENOSPC)
            vrpc_rndv_revoke_later(r, o);
        o = next;
    }
    while (r->reads) {
        struct vrpc_rndv_in *in = r->reads;
        int rc = vrpc_rndv_read(in);
        if (rc == -ENOSPC)
            break; /* keep the order: the rest waits behind it */
        r->reads = in->next;
        if (rc)
            read_failed(in, rc, arg);
    }
}

void vrpc_rndv_retry_forget(struct vrpc_rndv_retry *r, const struct vrpc_ep *ep,
                            void (*read_failed)(struct vrpc_rndv_in *, int, void *), void *arg)
{
    for (struct vrpc_rndv_out **pp = &r->revokes; *pp;) {
        if ((*pp)->ep == ep)
            *pp = (*pp)->next;
        else
            pp = &(*pp)->next;
    }
    for (struct vrpc_rndv_in **pp = &r->reads; *pp;) {
        struct vrpc_rndv_in *in = *pp;
        if (in->ep == ep) {
            *pp = in->next;
            read_failed(in, -ECANCELED, arg);
        } else {
            pp = &in->next;
        }
    }
}

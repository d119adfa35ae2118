/* The credit core's out-of-line part (credit.h). */
#include "credit.h"

void vrpc_credit_pool_init(struct vrpc_credit_pool *p, uint32_t min_resv, uint32_t ctl_resv)
{
    atomic_init(&p->avail, 0);
    atomic_init(&p->posted, 0);
    p->min_resv = min_resv;
    p->ctl_resv = ctl_resv;
    p->hungry_head = p->hungry_tail = NULL;
}

void vrpc_credit_ep_init(struct vrpc_credit_ep *e, uint32_t grant, uint32_t target)
{
    atomic_init(&e->credit_ret, 0);
    e->resv = e->granted = grant;
    e->target = e->keep = target;
    e->used = 0;
    e->win_ns = 0;
    e->hungry = false;
    e->hnext = NULL;
}

void vrpc_credit_hungry_remove(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e)
{
    struct vrpc_credit_ep **pp, *prev = NULL;
    if (!e->hungry)
        return;
    for (pp = &p->hungry_head; *pp; prev = *pp, pp = &(*pp)->hnext)
        if (*pp == e) {
            *pp = e->hnext;
            if (p->hungry_tail == e)
                p->hungry_tail = prev;
            break;
        }
    e->hungry = false;
}

uint32_t vrpc_credit_shrink(struct vrpc_credit_pool *p, struct vrpc_credit_ep *e, uint64_t now, uint64_t shrink_ns)
{
    uint32_t n, cut;
    if (!shrink_ns)
        return 0;
    if (!e->win_ns || now < e->win_ns) { /* first look (or a clock taken before it) */
        e->win_ns = now;
        e->used = 0;
        return 0;
    }
    if (now - e->win_ns < shrink_ns)
        return 0;
    n = e->used > p->min_resv ? e->used : p->min_resv;
    e->win_ns = now;
    e->used = 0;
    if (n >= e->resv) {
        e->keep = e->target; /* busy: keeps what it has and may grow */
        return 0;
    }
    /* the debt (consumed, not yet paid back) goes first: nobody holds it */
    cut = e->resv - e->granted;
    if (cut > e->resv - n)
        cut = e->resv - n;
    e->resv -= cut;
    if (e->granted >= e->resv)
        vrpc_credit_hungry_remove(p, e);
    /* the rest of the cut waits for the peer to spend what it holds */
    e->keep = e->resv > n ? n : e->target;
    return cut;
}

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
    e->target = target;
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

/* The TCP backend's memory registration: a plain record (sockets need no
 * pinning); remote read goes through grants (tcp_rma.c), not keys of MRs. */
#define _GNU_SOURCE
#include "transport/tcp/tcp.h"

int vrpc_tcp_mr_reg(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out)
{
    struct vrpc_mr *mr;
    if (access & VRPC_ACCESS_REMOTE_READ)
        return -ENOSYS;
    mr = calloc(1, sizeof *mr);
    if (!mr)
        return -ENOMEM;
    mr->tp = tp;
    mr->addr = addr;
    mr->len = len;
    mr->access = access;
    *out = mr;
    return 0;
}

void vrpc_tcp_mr_dereg(struct vrpc_mr *mr) { free(mr); }

/* What is wrong with a host's RDMA set-up, and the command that fixes it: one
 * sentence per problem, shared by the verbs backend's error logging and
 * `verbrpc doctor` (tools/doctor/), so both say the same thing. No RDMA
 * calls here: callers diagnose, this file only words it. */
#ifndef VRPC_TRANSPORT_VERBS_DIAG_H
#define VRPC_TRANSPORT_VERBS_DIAG_H

#include <stddef.h>
#include <stdint.h>

enum vrpc_verbs_problem {
    VRPC_VP_NO_RDMA,       /* the kernel has no RDMA (err: ibv_get_device_list's errno) */
    VRPC_VP_NO_DEVICE,     /* RDMA in the kernel, but no device */
    VRPC_VP_PORT_DOWN,     /* dev, port, netdev (may be NULL) */
    VRPC_VP_NOT_RDMA_ADDR, /* addr is not on any RDMA device's netdev */
    VRPC_VP_NO_ROCE_V2,    /* dev, port, addr: addr's GID is RoCE v1 only */
    VRPC_VP_MEMLOCK,       /* have: RLIMIT_MEMLOCK bytes, need: bytes verbrpc registers */
    VRPC_VP_MTU,           /* netdev, have: its MTU, need: the MTU the port's active RDMA MTU needs */
    VRPC_VP_NO_ROUTE,      /* addr: rdma_cm finds no address or route to the peer (err) */
};

struct vrpc_verbs_diag {
    const char *dev;
    int port;
    const char *netdev;
    const char *addr;
    uint64_t have, need;
    int err; /* positive errno, 0: none */
};

/* The sentence for problem p (what is wrong, then the fix) into buf,
 * NUL-terminated and cut to len. Returns buf. */
char *vrpc_verbs_advice(enum vrpc_verbs_problem p, const struct vrpc_verbs_diag *d, char *buf, size_t len);

/* Bytes of Ethernet MTU an active RDMA MTU of ib_mtu bytes needs on RoCE
 * (the payload plus the RoCE headers the kernel reserves, iboe_get_mtu). */
uint32_t vrpc_verbs_eth_mtu_for(uint32_t ib_mtu);

#endif

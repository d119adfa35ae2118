/* The sentences of verbs_diag.h: what is wrong with the host's RDMA set-up
 * and the command that fixes it. */
#include "transport/verbs/verbs_diag.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The kernel's iboe_get_mtu() (what rdma_cm's route takes from the netdev):
 * GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4. rdma_rxe reserves
 * 80 (RXE_MAX_HDR_LENGTH); the larger figure is safe for both. */
#define ROCE_HDR_MAX 96u

uint32_t vrpc_verbs_eth_mtu_for(uint32_t ib_mtu) { return ib_mtu + ROCE_HDR_MAX; }

static const char *or_dash(const char *s) { return s && *s ? s : "?"; }

char *vrpc_verbs_advice(enum vrpc_verbs_problem p, const struct vrpc_verbs_diag *d, char *buf, size_t len)
{
    static const struct vrpc_verbs_diag none;
    if (!d)
        d = &none;
    if (!len)
        return buf;
    switch (p) {
    case VRPC_VP_NO_RDMA:
        snprintf(buf, len,
                 "this kernel has no RDMA support (ibv_get_device_list: %s): `modprobe ib_uverbs rdma_ucm`, "
                 "for Soft-RoCE `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0`; or use tcp://",
                 d->err ? strerror(d->err) : "no devices");
        break;
    case VRPC_VP_NO_DEVICE:
        snprintf(buf, len,
                 "no RDMA device: plug in an RDMA NIC, or for Soft-RoCE on eth0: "
                 "`modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0`");
        break;
    case VRPC_VP_PORT_DOWN:
        if (d->netdev && *d->netdev)
            snprintf(buf, len, "port %d of %s is DOWN: `ip link set %s up`, and check the cable", d->port,
                     or_dash(d->dev), d->netdev);
        else
            snprintf(buf, len, "port %d of %s is DOWN: check the cable and the switch port (`rdma link`)", d->port,
                     or_dash(d->dev));
        break;
    case VRPC_VP_NOT_RDMA_ADDR:
        snprintf(buf, len,
                 "no RoCE v2 GID holds %s: the address is not on an RDMA device's netdev; check `rdma link` "
                 "(which netdev each device uses) and `ip addr` (which netdev holds %s)",
                 or_dash(d->addr), or_dash(d->addr));
        break;
    case VRPC_VP_NO_ROCE_V2:
        snprintf(buf, len,
                 "%s port %d has only a RoCE v1 GID for %s: rdma_cm would use RoCE v1; make v2 the default: "
                 "`cma_roce_mode -d %s -p %d -m 2`",
                 or_dash(d->dev), d->port, or_dash(d->addr), or_dash(d->dev), d->port);
        break;
    case VRPC_VP_MEMLOCK:
        snprintf(buf, len,
                 "the locked-memory limit (ulimit -l) is %" PRIu64
                 " KiB, below what verbrpc registers (at least %" PRIu64
                 " KiB): `ulimit -l unlimited`, or `* - memlock unlimited` in "
                 "/etc/security/limits.conf, or LimitMEMLOCK=infinity for a systemd service",
                 d->have / 1024, d->need / 1024);
        break;
    case VRPC_VP_MTU:
        snprintf(buf, len,
                 "%s's MTU is %" PRIu64 ", below the %" PRIu64
                 " the active RDMA MTU needs: `ip link set %s mtu %" PRIu64 "` (on both hosts)",
                 or_dash(d->netdev), d->have, d->need, or_dash(d->netdev), d->need);
        break;
    case VRPC_VP_NO_ROUTE:
        snprintf(buf, len,
                 "rdma_cm finds no RDMA route to %s (%s): the peer must be reachable through an RDMA "
                 "device's netdev; check `ip route get %s` and `rdma link`",
                 or_dash(d->addr), d->err ? strerror(d->err) : "failed", or_dash(d->addr));
        break;
    default:
        snprintf(buf, len, "unknown RDMA problem %d", (int)p);
        break;
    }
    return buf;
}

/* `verbrpc doctor [--peer IP]`: what a host's RDMA set-up looks like to
 * verbrpc, and what is wrong with it. Lists the devices and ports
 * (libibverbs), each port's GID table with RoCE versions, netdevs and
 * addresses (sysfs), the memlock limit against what verbrpc registers, and
 * with --peer the device, port, GID and path MTU rdma_cm picks to reach it.
 * Every problem is one sentence from transport/verbs/verbs_diag.c, the same
 * the verbs backend logs. */
#define _GNU_SOURCE
#include "tools/doctor/doctor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <verbrpc/transport.h>
#include <verbrpc/version.h>

#include "rpc/internal.h"
#include "transport/verbs/verbs_diag.h"

#define MAX_PROBLEMS 32
#define PEER_TIMEOUT_MS 2000

struct report {
    char problem[MAX_PROBLEMS][256];
    unsigned n;
    unsigned devices;
};

static void problem(struct report *r, enum vrpc_verbs_problem p, const struct vrpc_verbs_diag *d)
{
    if (r->n < MAX_PROBLEMS)
        vrpc_verbs_advice(p, d, r->problem[r->n], sizeof r->problem[0]);
    r->n++;
}

/* One line of a sysfs file, without its newline; -errno if unreadable. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    if (!fgets(buf, (int)len, f)) {
        int e = ferror(f) ? -errno : -ENODATA;
        fclose(f);
        return e ? e : -EIO;
    }
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

static int gid_attr(const char *dev, int port, int idx, const char *what, char *buf, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/%s/%d", dev, port, what, idx);
    int rc = read_line(path, buf, len);
    if (rc)
        buf[0] = 0;
    return rc;
}

static long netdev_mtu(const char *netdev)
{
    char path[256], v[32];
    snprintf(path, sizeof path, "/sys/class/net/%s/mtu", netdev);
    return read_line(path, v, sizeof v) ? -1 : strtol(v, NULL, 10);
}

static uint32_t mtu_bytes(enum ibv_mtu m) { return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 0; }

static const char *port_state(enum ibv_port_state st)
{
    switch (st) {
    case IBV_PORT_DOWN:
        return "DOWN";
    case IBV_PORT_INIT:
        return "INIT";
    case IBV_PORT_ARMED:
        return "ARMED";
    case IBV_PORT_ACTIVE:
        return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
        return "ACTIVE_DEFER";
    default:
        return "NOP";
    }
}

static bool gid_zero(const union ibv_gid *g)
{
    static const union ibv_gid z;
    return !memcmp(g, &z, sizeof z);
}

/* The address a RoCE GID stands for: IPv4 for ::ffff:a.b.c.d, else IPv6. */
static void gid_addr(const union ibv_gid *g, char *buf, size_t len)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(g->raw, v4mapped, sizeof v4mapped))
        inet_ntop(AF_INET, g->raw + 12, buf, (socklen_t)len);
    else
        inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len);
}

/* ---- devices, ports, GIDs ------------------------------------------------- */

/* What one address looks like in the GID tables: seen at all, with a v2 GID. */
struct addr_seen {
    char addr[INET6_ADDRSTRLEN];
    char dev[IBV_SYSFS_NAME_MAX];
    int port;
    bool v2;
};

static void note_addr(struct addr_seen *seen, unsigned *n, unsigned cap, const char *addr, const char *dev, int port,
                      bool v2)
{
    for (unsigned i = 0; i < *n; i++)
        if (!strcmp(seen[i].addr, addr) && !strcmp(seen[i].dev, dev) && seen[i].port == port) {
            seen[i].v2 |= v2;
            return;
        }
    if (*n >= cap)
        return;
    snprintf(seen[*n].addr, sizeof seen[*n].addr, "%s", addr);
    snprintf(seen[*n].dev, sizeof seen[*n].dev, "%s", dev);
    seen[*n].port = port;
    seen[*n].v2 = v2;
    (*n)++;
}

static void check_port(struct report *r, struct ibv_context *ctx, const char *dev, int port)
{
    struct ibv_port_attr pa;
    char netdev[64] = "";
    struct addr_seen seen[64];
    unsigned nseen = 0;

    if (ibv_query_port(ctx, (uint8_t)port, &pa)) {
        printf("  port %d: ibv_query_port: %s\n", port, strerror(errno));
        return;
    }
    bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    /* the port's netdev: the one its first GID sits on */
    for (int i = 0; i < pa.gid_tbl_len && !netdev[0]; i++)
        gid_attr(dev, port, i, "ndevs", netdev, sizeof netdev);
    long nmtu = netdev[0] ? netdev_mtu(netdev) : -1;
    printf("  port %d: %s, link layer %s, active MTU %" PRIu32 " (max %" PRIu32 ")", port, port_state(pa.state),
           eth                                          ? "Ethernet"
           : pa.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
                                                        : "unspecified",
           mtu_bytes(pa.active_mtu), mtu_bytes(pa.max_mtu));
    if (netdev[0])
        printf(", netdev %s (MTU %ld)", netdev, nmtu);
    printf("\n");

    if (pa.state != IBV_PORT_ACTIVE) {
        struct vrpc_verbs_diag d = {.dev = dev, .port = port, .netdev = netdev};
        problem(r, VRPC_VP_PORT_DOWN, &d);
    }
    if (eth && nmtu > 0 && (uint64_t)nmtu < vrpc_verbs_eth_mtu_for(mtu_bytes(pa.active_mtu))) {
        struct vrpc_verbs_diag d = {
            .netdev = netdev, .have = (uint64_t)nmtu, .need = vrpc_verbs_eth_mtu_for(mtu_bytes(pa.active_mtu))};
        problem(r, VRPC_VP_MTU, &d);
    }

    unsigned shown = 0;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        union ibv_gid g;
        char type[32], nd[64], addr[INET6_ADDRSTRLEN];
        if (ibv_query_gid(ctx, (uint8_t)port, i, &g) || gid_zero(&g))
            continue;
        gid_attr(dev, port, i, "types", type, sizeof type);
        gid_attr(dev, port, i, "ndevs", nd, sizeof nd);
        gid_addr(&g, addr, sizeof addr);
        printf("    %s port %d GID %d: %s, netdev %s, address %s\n", dev, port, i, type[0] ? type : "?",
               nd[0] ? nd : "-", addr);
        shown++;
        if (eth)
            note_addr(seen, &nseen, sizeof seen / sizeof seen[0], addr, dev, port, !strcmp(type, "RoCE v2"));
    }
    if (!shown)
        printf("    %s port %d: no GIDs (no address on the netdev yet?)\n", dev, port);
    for (unsigned i = 0; i < nseen; i++)
        if (!seen[i].v2) {
            struct vrpc_verbs_diag d = {.dev = seen[i].dev, .port = seen[i].port, .addr = seen[i].addr};
            problem(r, VRPC_VP_NO_ROCE_V2, &d);
        }
}

static void check_devices(struct report *r)
{
    int n = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        struct vrpc_verbs_diag d = {.err = errno ? errno : ENOSYS};
        printf("RDMA: none: ibv_get_device_list fails (%s): this kernel has no RDMA support\n", strerror(d.err));
        problem(r, VRPC_VP_NO_RDMA, &d);
        return;
    }
    printf("RDMA devices: %d\n", n);
    if (n == 0)
        problem(r, VRPC_VP_NO_DEVICE, NULL);
    for (int k = 0; k < n; k++) {
        const char *dev = ibv_get_device_name(list[k]);
        struct ibv_context *ctx = ibv_open_device(list[k]);
        struct ibv_device_attr da;
        if (!ctx) {
            printf("  %s: cannot open: %s\n", dev, strerror(errno));
            continue;
        }
        if (ibv_query_device(ctx, &da)) {
            printf("  %s: ibv_query_device: %s\n", dev, strerror(errno));
            ibv_close_device(ctx);
            continue;
        }
        r->devices++;
        printf("  %s: %s, %d port(s), firmware %s\n", dev, ibv_node_type_str(list[k]->node_type), da.phys_port_cnt,
               da.fw_ver[0] ? da.fw_ver : "-");
        for (int p = 1; p <= da.phys_port_cnt; p++)
            check_port(r, ctx, dev, p);
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
}

/* ---- memlock ---------------------------------------------------------------- */

/* CAP_IPC_LOCK (bit 14) in this process's effective set: the kernel does not
 * hold ibv_reg_mr to RLIMIT_MEMLOCK then (ib_umem_get). */
static bool cap_ipc_lock(void)
{
    char line[256];
    bool yes = false;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return false;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "CapEff:", 7)) {
            yes = (strtoull(line + 7, NULL, 16) >> 14) & 1;
            break;
        }
    fclose(f);
    return yes;
}

static void check_memlock(struct report *r)
{
    struct vrpc_transport_attr ta;
    struct rlimit rl;
    vrpc_transport_attr_init(&ta);
    uint64_t srv = vrpc_rpc_pool_bytes(true, ta.eager_size), ch = vrpc_rpc_pool_bytes(false, ta.eager_size);
    uint64_t need = srv + ta.max_pinned; /* a server, the larger of the two */
    printf("memlock: verbrpc registers with default options %.1f MiB for a server's message pools (one "
           "poller), %.1f MiB for a channel's, and up to %.0f MiB (max_pinned) of large-message buffers each\n",
           srv / 1048576.0, ch / 1048576.0, ta.max_pinned / 1048576.0);
    if (getrlimit(RLIMIT_MEMLOCK, &rl)) {
        printf("memlock: getrlimit: %s\n", strerror(errno));
        return;
    }
    if (rl.rlim_cur == RLIM_INFINITY) {
        printf("memlock: limit unlimited: fine\n");
        return;
    }
    printf("memlock: limit %" PRIu64 " KiB, want at least %" PRIu64 " KiB (a server's pools and max_pinned)%s\n",
           (uint64_t)rl.rlim_cur / 1024, need / 1024,
           rl.rlim_cur >= need ? ": fine"
           : r->devices        ? ""
                               : " (matters only with RDMA)");
    if (rl.rlim_cur < need && cap_ipc_lock()) {
        printf("memlock: not enforced for this process (it has CAP_IPC_LOCK); a service run without it needs "
               "the limit raised\n");
        return;
    }
    if (rl.rlim_cur < need && r->devices) {
        struct vrpc_verbs_diag d = {.have = rl.rlim_cur, .need = need};
        problem(r, VRPC_VP_MEMLOCK, &d);
    }
}

/* ---- the route to a peer ---------------------------------------------------- */

/* The next rdma_cm event on ch within ms; its type and status. -ETIMEDOUT. */
static int next_event(struct rdma_event_channel *ch, int ms, enum rdma_cm_event_type *type, int *status)
{
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev;
    int rc = poll(&pfd, 1, ms);
    if (rc <= 0)
        return rc < 0 ? -errno : -ETIMEDOUT;
    if (rdma_get_cm_event(ch, &ev))
        return -errno;
    *type = ev->event;
    *status = ev->status;
    rdma_ack_cm_event(ev);
    return 0;
}

static int parse_ip(const char *ip, struct sockaddr_storage *ss)
{
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof *ss);
    if (inet_pton(AF_INET, ip, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        return 0;
    }
    if (inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        return 0;
    }
    return -EINVAL;
}

/* The route's GID in the port's table: index and type of the entry of the
 * kernel's default RoCE mode (v2 unless configfs says otherwise). */
static void describe_sgid(struct report *r, struct rdma_cm_id *id, const char *dev, int port, const union ibv_gid *sgid)
{
    struct ibv_port_attr pa;
    char mode[32] = "RoCE v2", path[256], netdev[64] = "", addr[INET6_ADDRSTRLEN];
    int pick = -1, any = -1;

    snprintf(path, sizeof path, "/sys/kernel/config/rdma_cm/%s/ports/%d/default_roce_mode", dev, port);
    read_line(path, mode, sizeof mode); /* configfs is often not mounted: the kernel's default */
    gid_addr(sgid, addr, sizeof addr);
    if (ibv_query_port(id->verbs, (uint8_t)port, &pa))
        return;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        union ibv_gid g;
        char type[32];
        if (ibv_query_gid(id->verbs, (uint8_t)port, i, &g) || memcmp(&g, sgid, sizeof g))
            continue;
        gid_attr(dev, port, i, "types", type, sizeof type);
        if (any < 0)
            any = i;
        if (!strcmp(type, mode) && pick < 0)
            pick = i;
    }
    if (pick < 0 && any < 0) {
        printf("peer: source GID %s is not in %s port %d's table\n", addr, dev, port);
        return;
    }
    int idx = pick >= 0 ? pick : any;
    gid_attr(dev, port, idx, "ndevs", netdev, sizeof netdev);
    printf("peer: source GID %d (%s, %s, netdev %s, address %s)\n", idx, pick >= 0 ? mode : "not the default mode", dev,
           netdev[0] ? netdev : "-", addr);
    if (strcmp(mode, "RoCE v2") || pick < 0) {
        struct vrpc_verbs_diag d = {.dev = dev, .port = port, .addr = addr};
        problem(r, VRPC_VP_NO_ROCE_V2, &d);
    }
    if (netdev[0] && pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
        long nmtu = netdev_mtu(netdev);
        uint32_t act = mtu_bytes(pa.active_mtu);
        printf("peer: netdev %s MTU %ld, active RDMA MTU %" PRIu32 " (needs a netdev MTU of %" PRIu32 ")\n", netdev,
               nmtu, act, vrpc_verbs_eth_mtu_for(act));
        if (nmtu > 0 && (uint64_t)nmtu < vrpc_verbs_eth_mtu_for(act)) {
            struct vrpc_verbs_diag d = {.netdev = netdev, .have = (uint64_t)nmtu, .need = vrpc_verbs_eth_mtu_for(act)};
            problem(r, VRPC_VP_MTU, &d);
        }
    }
}

/* The source address the kernel's routing picks towards dst ("?" if none):
 * a connected UDP socket's local address (no packet is sent). */
static void route_source(const struct sockaddr_storage *dst, char *buf, size_t len)
{
    struct sockaddr_storage d = *dst, l;
    socklen_t ll = sizeof l;
    int fd = socket(d.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    snprintf(buf, len, "?");
    if (fd < 0)
        return;
    ((struct sockaddr_in *)&d)->sin_port = htons(9); /* same offset in sockaddr_in6 */
    if (!connect(fd, (struct sockaddr *)&d,
                 d.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) &&
        !getsockname(fd, (struct sockaddr *)&l, &ll))
        inet_ntop(l.ss_family,
                  l.ss_family == AF_INET ? (void *)&((struct sockaddr_in *)&l)->sin_addr
                                         : (void *)&((struct sockaddr_in6 *)&l)->sin6_addr,
                  buf, (socklen_t)len);
    close(fd);
}

/* rdma_cm's "no device" for a route: the source address the route takes is
 * on a netdev without an RDMA device. */
static void not_rdma_source(struct report *r, const struct sockaddr_storage *dst)
{
    char src[INET6_ADDRSTRLEN];
    route_source(dst, src, sizeof src);
    printf("peer: the route leaves from %s, which is on no RDMA device's netdev\n", src);
    struct vrpc_verbs_diag d = {.addr = src};
    problem(r, VRPC_VP_NOT_RDMA_ADDR, &d);
}

static void check_peer(struct report *r, const char *ip)
{
    struct sockaddr_storage dst;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id = NULL;
    enum rdma_cm_event_type type;
    int status = 0, rc;
    struct vrpc_verbs_diag d = {.addr = ip};

    parse_ip(ip, &dst); /* checked by the caller */
    printf("peer %s:\n", ip);
    if (!(ch = rdma_create_event_channel())) {
        printf("peer: rdma_cm is not available (%s): no route can be resolved\n", strerror(errno));
        if (r->devices) {
            d.err = errno;
            problem(r, VRPC_VP_NO_ROUTE, &d);
        }
        return;
    }
    if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
        printf("peer: rdma_create_id: %s\n", strerror(errno));
        rdma_destroy_event_channel(ch);
        return;
    }
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, PEER_TIMEOUT_MS)) {
        rc = errno;
        printf("peer: rdma_resolve_addr: %s\n", strerror(rc));
        d.err = rc;
        if (rc == ENODEV)
            not_rdma_source(r, &dst);
        else
            problem(r, VRPC_VP_NO_ROUTE, &d);
        goto out;
    }
    rc = next_event(ch, PEER_TIMEOUT_MS + 1000, &type, &status);
    if (rc || type != RDMA_CM_EVENT_ADDR_RESOLVED) {
        d.err = rc ? -rc : status < 0 ? -status : EHOSTUNREACH;
        printf("peer: address not resolved: %s (%s)\n", rc ? strerror(-rc) : rdma_event_str(type), strerror(d.err));
        if (d.err == ENODEV)
            not_rdma_source(r, &dst);
        else
            problem(r, VRPC_VP_NO_ROUTE, &d);
        goto out;
    }
    printf("peer: address resolved\n");
    if (rdma_resolve_route(id, PEER_TIMEOUT_MS))
        rc = -errno;
    else
        rc = next_event(ch, PEER_TIMEOUT_MS + 1000, &type, &status);
    if (rc || type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
        d.err = rc ? -rc : status < 0 ? -status : EHOSTUNREACH;
        printf("peer: route not resolved: %s\n", rc ? strerror(-rc) : rdma_event_str(type));
        problem(r, VRPC_VP_NO_ROUTE, &d);
        goto out;
    }
    char src[INET6_ADDRSTRLEN] = "?";
    struct sockaddr *la = rdma_get_local_addr(id);
    if (la->sa_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)la)->sin_addr, src, sizeof src);
    else if (la->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)la)->sin6_addr, src, sizeof src);
    const char *dev = id->verbs ? ibv_get_device_name(id->verbs->device) : "?";
    printf("peer: route resolved: from %s, device %s port %u\n", src, dev, (unsigned)id->port_num);
    if (id->route.num_paths > 0 && id->route.path_rec) {
        const struct ibv_sa_path_rec *pr = id->route.path_rec;
        printf("peer: path MTU %" PRIu32 " (the peer must have the same: run `verbrpc doctor --peer %s` there)\n",
               mtu_bytes((enum ibv_mtu)pr->mtu), src);
        if (id->verbs)
            describe_sgid(r, id, dev, id->port_num, &pr->sgid);
    }
out:
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
}

/* ---- main ------------------------------------------------------------------- */

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--peer IP]\n"
            "Checks this host's RDMA set-up for verbrpc: devices and ports (state, link layer,\n"
            "active MTU), each port's GIDs (RoCE version, netdev, address), the locked-memory\n"
            "limit against what verbrpc registers, and with --peer IP the device, port, GID and\n"
            "path MTU rdma_cm would use to reach IP. Each problem found is printed with the\n"
            "command that fixes it.\n"
            "  --peer IP   also resolve the RDMA address and route to IP (an IPv4 or IPv6 literal)\n"
            "  --help      this text\n"
            "Exit status: 0 all fine, 1 problems found, 2 usage error.\n",
            argv0);
}

int vrpc_doctor_main(int argc, char **argv)
{
    const char *argv0 = argc > 0 && argv[0] ? argv[0] : "verbrpc doctor", *peer = NULL;
    struct report *r;
    struct sockaddr_storage ss;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv0);
            return 0;
        } else if (!strcmp(argv[i], "--peer") && i + 1 < argc) {
            peer = argv[++i];
        } else if (!strncmp(argv[i], "--peer=", 7)) {
            peer = argv[i] + 7;
        } else {
            fprintf(stderr, "%s: unexpected argument '%s'\n", argv0, argv[i]);
            usage(stderr, argv0);
            return 2;
        }
    }
    if (peer && parse_ip(peer, &ss)) {
        fprintf(stderr, "%s: --peer wants an IP address, not '%s'\n", argv0, peer);
        return 2;
    }
    if (!(r = calloc(1, sizeof *r))) {
        fprintf(stderr, "%s: out of memory\n", argv0);
        return 1;
    }
    printf("verbrpc doctor %s\n", VRPC_VERSION_STRING);
    check_devices(r);
    check_memlock(r);
    if (peer)
        check_peer(r, peer);
    if (!r->n) {
        printf("no problems found\n");
    } else {
        printf("%u problem(s):\n", r->n);
        for (unsigned i = 0; i < r->n && i < MAX_PROBLEMS; i++)
            printf("  - %s\n", r->problem[i]);
    }
    int code = r->n ? 1 : 0;
    free(r);
    return code;
}

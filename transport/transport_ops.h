/* Private interface between the transport core (transport/ top level) and its
 * backends (transport/tcp/, transport/verbs/): the base objects every backend
 * embeds first in its own objects, and the one ops table each backend exports.
 * The core owns: backend selection, URI parsing, pools, the generic poller
 * thread (poll -> arm -> poll -> wait), endpoint reference counting. */
#ifndef VRPC_TRANSPORT_OPS_H
#define VRPC_TRANSPORT_OPS_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <verbrpc/transport.h>
#include "common/clock.h"
#include "common/container_of.h"
#include "common/env.h"
#include "common/log_internal.h"

/* A parsed URI: scheme as written ("tcp", "verbs", "auto", "fault+tcp") and a
 * socket address. */
struct vrpc_addr {
    char scheme[16];
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Parse "scheme://host:port" (host: IPv4, [IPv6] or name; the syntax of
 * vrpc_uri_check). -EINVAL if malformed, -ENXIO if the name does not resolve
 * (logged with the resolver's reason). */
int vrpc_addr_parse(const char *uri, struct vrpc_addr *out);
/* Parse a bare IP literal (v4 or v6, brackets optional) with port 0. */
int vrpc_addr_parse_ip(const char *ip, struct vrpc_addr *out);
/* Format "scheme://host:port" into buf; -ENOSPC if it does not fit. */
int vrpc_addr_format(const char *scheme, const struct sockaddr *sa, char *buf, size_t len);

/* ---- base objects: each backend's object embeds one of these first ----- */

/* Counters a CQ's poller keeps of what it delivers, by enum vrpc_wc_opcode:
 * n[op] completions with status 0 (and n[VRPC_WC_DISCONNECTED] all of them),
 * bytes[op] their byte_len. Written by the poller only, as
 * relaxed atomic loads and stores: no read-modify-write on the completion
 * path; read by any thread with relaxed loads. */
#define VRPC_WC_OPS 8
struct vrpc_cq_counts {
    _Atomic uint64_t n[VRPC_WC_OPS], bytes[VRPC_WC_OPS];
};

struct vrpc_transport {
    const struct vrpc_transport_ops *ops;
    char name[16];                   /* ops->name, or "layer+lower" ("fault+tcp");
                                        also the URI scheme. Set by the core */
    uint32_t caps;                   /* ops->caps; a layer's: & lower->caps.
                                        Set by the core */
    struct vrpc_transport *lower;    /* a layer's transport below it, else NULL */
    struct vrpc_transport_attr attr; /* defaults applied */
    uint32_t headroom;               /* bytes before vrpc_buf.data in pool buffers */
    struct vrpc_lbuf_cache *lbuf;    /* large-buffer cache (lbuf.c), set by the core */
    /* Metrics (set up by the core): the live CQs, whose counters
     * vrpc_transport_counters sums, plus those of CQs already destroyed;
     * and the counters of paths any thread takes (atomic read-modify-write,
     * off the small-message path: queued sends, connects, grants). */
    pthread_mutex_t cq_mu;
    struct vrpc_cq *cqs;           /* under cq_mu, linked through vrpc_cq.next */
    struct vrpc_cq_counts retired; /* under cq_mu */
    _Atomic uint64_t credit_waits, connects, grants;
};

struct vrpc_cq {
    struct vrpc_transport *tp;
    struct vrpc_cq_attr attr; /* defaults applied; attr.name not kept */
    pthread_t thread;
    bool thread_started;
    atomic_bool stopping;         /* set by vrpc_cq_destroy, read by the poller */
    struct vrpc_wc *wc;           /* attr.depth entries, poller only */
    struct vrpc_cq_counts counts; /* see struct vrpc_cq_counts */
    struct vrpc_cq *next;         /* the transport's list (under tp->cq_mu) */
};

struct vrpc_listener {
    struct vrpc_transport *tp;
    char uri[VRPC_URI_MAX]; /* bound address */
};

struct vrpc_ep {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    void *user;
    uint32_t eager;  /* negotiated */
    atomic_int refs; /* user's + transport's; at 0 ops->ep_free */
    char peer_uri[VRPC_URI_MAX];
};

struct vrpc_mr {
    struct vrpc_transport *tp;
    void *addr;
    size_t len;
    unsigned access;
    uint32_t lkey, rkey; /* 0 on TCP */
};

/* ---- the ops table -------------------------------------------------------- */

/* The table's layout version. Raise it when a member changes meaning or
 * moves; a member added at the end does not raise it (see `size`). */
#define VRPC_TP_OPS_ABI 1
/* How each table starts: the layout version and size it was compiled with. */
#define VRPC_TP_OPS_HEAD .abi = VRPC_TP_OPS_ABI, .size = sizeof(struct vrpc_transport_ops)

struct vrpc_transport_ops {
    /* VRPC_TP_OPS_HEAD. The core refuses a table of another abi, or whose
     * size stops before ep_free (the last required member): such a backend
     * cannot be opened and "auto" skips it. Members past ep_free are
     * optional: the core reads one that lies beyond `size` as NULL, so a
     * table compiled before a member was added has it absent. New members
     * go at the end, optional. The members up to ep_free are never NULL
     * (but in the table of a backend left out of the build, see tp_create). */
    uint32_t abi, size;
    const char *name; /* "tcp", "verbs": also the URI scheme. The one place
                         a backend's name is spelled */
    /* What the backend can do, enum vrpc_tp_cap bits (transport.h). A layer:
     * the capabilities it forwards; the transport has those its lower one has
     * (vrpc_transport_caps). An operation a capability covers may be NULL when
     * the capability is absent: the core returns -ENOSYS for it. */
    uint32_t caps;
    /* A layer wraps another backend (libfabric's hooking providers): opened
     * as "name+lower" ("fault+tcp"; "fault" alone is "fault+auto"), never by
     * "auto". The core creates the lower transport first and hands it to the
     * layer's tp_create in *out; the layer owns it from then on (also when
     * tp_create fails) and forwards to it. Plain backends: false. */
    bool layer;
    /* 0 when usable on this machine (for "auto"), else a negative errno. */
    int (*probe)(void);
    /* Allocate the backend's transport (embedding struct vrpc_transport
     * first) and set base.headroom; attr has defaults applied. The core sets
     * base.ops, base.attr, base.name, base.caps and base.lower afterwards. (A
     * layer: see `layer`.) NULL (with every other operation) in the table of
     * a backend this build leaves out (verbs/verbs_absent.c): its name is
     * known, opening it fails with -ENOTSUP. */
    int (*tp_create)(const struct vrpc_transport_attr *attr, struct vrpc_transport **out);
    void (*tp_destroy)(struct vrpc_transport *tp);

    /* access has VRPC_ACCESS_REMOTE_READ only with VRPC_TP_CAP_REMOTE_READ
     * (the core checks). */
    int (*mr_reg)(struct vrpc_transport *tp, void *addr, size_t len, unsigned access, struct vrpc_mr **out);
    void (*mr_dereg)(struct vrpc_mr *mr);

    /* Allocate the backend CQ (base first, base.tp/attr set by the core after).
     * The core then starts the poller thread which calls only cq_poll, cq_arm,
     * cq_wait and, at stop, cq_flush. */
    int (*cq_create)(struct vrpc_transport *tp, const struct vrpc_cq_attr *attr, struct vrpc_cq **out);
    /* Free the CQ; its poller has exited. */
    void (*cq_destroy)(struct vrpc_cq *cq);
    /* Poller thread: up to max completions into wc; returns the count (>= 0). */
    int (*cq_poll)(struct vrpc_cq *cq, struct vrpc_wc *wc, unsigned max);
    /* Poller thread: arm notification; the core polls once more, then waits. */
    void (*cq_arm)(struct vrpc_cq *cq);
    /* Poller thread: sleep until notified (a completion, a kick) or timeout_ms
     * (-1: none) passes. */
    void (*cq_wait)(struct vrpc_cq *cq, int timeout_ms);
    /* Any thread: make the poller's cq_wait return (used to stop it). */
    void (*cq_kick)(struct vrpc_cq *cq);
    /* Poller thread, at stop: fail every endpoint still on the CQ and flush
     * every posted receive (-ECANCELED); subsequent cq_poll calls return those
     * completions until it returns 0. */
    void (*cq_flush)(struct vrpc_cq *cq);
    int (*post_recv)(struct vrpc_cq *cq, struct vrpc_buf *const *bufs, const uint64_t *wr_ids, unsigned n);

    int (*listen)(struct vrpc_transport *tp, const struct vrpc_addr *addr, const struct vrpc_listen_attr *attr,
                  struct vrpc_listener **out);
    void (*listener_destroy)(struct vrpc_listener *l);

    /* src may be NULL. On success the endpoint has refs == 2 (user + transport). */
    int (*connect)(struct vrpc_transport *tp, const struct vrpc_addr *dst, const struct vrpc_addr *src,
                   const struct vrpc_ep_attr *attr, struct vrpc_ep **out);
    int (*send)(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t len, uint32_t imm, uint64_t wr_id, unsigned flags);
    int (*read)(struct vrpc_ep *ep, struct vrpc_buf *buf, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
                uint64_t wr_id);
    /* vrpc_ep_grant / vrpc_ep_revoke (contracts in transport.h). */
    int (*grant)(struct vrpc_ep *ep, struct vrpc_mr *mr, const void *addr, uint32_t len, uint32_t *rkey);
    int (*revoke)(struct vrpc_ep *ep, uint32_t rkey, uint64_t wr_id);
    int (*close)(struct vrpc_ep *ep);
    /* vrpc_ep_abort: status checked by the core (negative). */
    int (*abort)(struct vrpc_ep *ep, int status);
    /* Free the endpoint's memory: both references are gone (the user's, and
     * the transport's, which the core drops after delivering DISCONNECTED). */
    void (*ep_free)(struct vrpc_ep *ep);

    /* ---- optional (absent: NULL, or beyond `size`) ---- */

    /* vrpc_ep_grant_segs, with VRPC_TP_CAP_GATHER: arguments checked by the
     * core (n >= 1). */
    int (*grant_segs)(struct vrpc_ep *ep, const struct vrpc_seg *segs, unsigned n, uint32_t len, uint32_t *rkey);
    /* vrpc_ep_send_list: n >= 1, every len checked by the core (<= cap and
     * the eager size). The contract of transport.h (*sent accepted, the
     * error of the next). Absent: the core loops over send. */
    int (*send_list)(struct vrpc_ep *ep, const struct vrpc_send_wr *wrs, unsigned n, unsigned *sent);
};

/* The table's optional member m, or NULL when absent (beyond ops->size). */
#define VRPC_TP_OP(ops, m) ((ops)->size >= offsetof(struct vrpc_transport_ops, m) + sizeof((ops)->m) ? (ops)->m : NULL)

/* Drop one reference (e.g. the transport's, from a backend error path of an
 * endpoint never handed out); frees through ops->ep_free at zero. */
void vrpc_ep_unref(struct vrpc_ep *ep);
/* Initialise the base of a new endpoint with refs references. */
void vrpc_ep_base_init(struct vrpc_ep *ep, struct vrpc_transport *tp, struct vrpc_cq *cq, void *user, int refs);

/* A backend queued a send for lack of credits (one call per queued send;
 * any thread). Counted in vrpc_transport_counters' credit_waits. */
void vrpc_tp_note_credit_wait(struct vrpc_ep *ep);

/* The transport's name for common/clock.h's CLOCK_MONOTONIC, in nanoseconds. */
static inline uint64_t vrpc_tp_now_ns(void) { return (uint64_t)vrpc_clock_mono_ns(); }

/* vrpc_tp_log (common/log_internal.h): one line at VRPC_LOG_WARN, subsystem
 * "transport". For protocol errors and the like; never on the hot path of
 * healthy traffic. */

/* verbs/verbs_dev.c, or verbs/verbs_absent.c in a build without verbs. */
extern const struct vrpc_transport_ops vrpc_verbs_ops;
extern const struct vrpc_transport_ops vrpc_tcp_ops;
#ifdef VRPC_BACKEND_FAULT
extern const struct vrpc_transport_ops vrpc_fault_ops;
#endif

#endif

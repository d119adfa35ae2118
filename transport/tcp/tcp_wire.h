/* The TCP backend's wire format, shared with the bad-peer tests that forge it.
 * Every frame starts with a 16-byte little-endian header; DATA frames carry len
 * payload bytes after it. A connection starts with HELLO (client) answered by
 * HELLO_ACK (server): imm holds the eager size, credits the initial grant, len
 * is 0 (a server refuses a HELLO that claims a payload).
 * Any frame after the handshake may return credits.
 *
 * Reads (vrpc_ep_read emulation; docs/design/large-messages.md section 7):
 *   READ_REQ   imm = tag chosen by the reader, len = 16, body struct
 *              vrpc_tcp_read_req. Uses no credit (no receive buffer).
 *   READ_RESP  imm = tag, len = bytes of this chunk (>= 1), then the bytes:
 *              the next part of that read, in order, chunks of one read never
 *              interleaved out of order (other reads' chunks may interleave).
 *   READ_ERR   imm = tag, len = 0: the owner refused the read (bad key, range
 *              or a grant revoked while streaming); it then closes. */
#ifndef VRPC_TCP_WIRE_H
#define VRPC_TCP_WIRE_H

#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <verbrpc/transport.h>

#include "transport/grant.h"

#define VRPC_TCP_HDR_LEN 16u
#define VRPC_TCP_MAGIC 0x43505256u /* "VRPC" */
#define VRPC_TCP_VERSION 1u

enum vrpc_tcp_frame {
    VRPC_TCP_DATA = 1,
    VRPC_TCP_CREDIT,
    VRPC_TCP_HELLO,
    VRPC_TCP_HELLO_ACK,
    VRPC_TCP_READ_REQ,
    VRPC_TCP_READ_RESP,
    VRPC_TCP_READ_ERR,
};

/* Most read requests one side may have outstanding at its peer; the owner
 * fails a connection whose peer asks more. */
#define VRPC_TCP_MAX_READS 64u
#define VRPC_TCP_READ_REQ_LEN 16u

struct vrpc_tcp_hdr {
    uint32_t len;     /* bytes after the header (DATA, READ_REQ, READ_RESP); 0 otherwise */
    uint32_t imm;     /* DATA: immediate; HELLO/ACK: eager size; READ_*: tag */
    uint16_t credits; /* credits returned to the receiver of this frame */
    uint8_t type;     /* enum vrpc_tcp_frame */
    uint8_t version;
    uint32_t magic;
};
_Static_assert(sizeof(struct vrpc_tcp_hdr) == VRPC_TCP_HDR_LEN, "frame header is 16 bytes");

/* A frame header in wire byte order, as every sender of this wire writes it
 * (the backend, and the tests' raw peers). */
static inline struct vrpc_tcp_hdr vrpc_tcp_hdr_make(uint8_t type, uint32_t len, uint32_t imm, uint16_t credits)
{
    struct vrpc_tcp_hdr h = {
        .len = htole32(len),
        .imm = htole32(imm),
        .credits = htole16(credits),
        .type = type,
        .version = VRPC_TCP_VERSION,
        .magic = htole32(VRPC_TCP_MAGIC),
    };
    return h;
}

/* READ_REQ body (little-endian): read length bytes at raddr under rkey, the
 * key of a grant the owner made on this connection. */
struct vrpc_tcp_read_req {
    uint64_t raddr;
    uint32_t rkey;
    uint32_t length;
};
_Static_assert(sizeof(struct vrpc_tcp_read_req) == VRPC_TCP_READ_REQ_LEN, "read request body is 16 bytes");

/* The owner's rule for a READ_REQ of length bytes at raddr against a grant
 * whose window of glen bytes starts at base: length >= 1 and the range
 * inside the window, with no overflow. Pure (tests/fuzz/fuzz_rndv.c). */
static inline bool vrpc_tcp_read_in_grant(uint64_t base, uint32_t glen, uint64_t raddr, uint32_t length)
{
    return vrpc_grant_read_in(base, glen, raddr, length); /* the core's rule (grant.h) */
}

/* iovecs for bytes [off, off + len) of the window segs[0..nsegs) (within
 * it): one per segment touched, at most nsegs. Pure. */
static inline size_t vrpc_tcp_segs_iov(const struct vrpc_seg *segs, uint32_t nsegs, uint32_t off, uint32_t len,
                                       struct iovec *iov)
{
    size_t n = 0;
    for (uint32_t i = 0; i < nsegs && len; i++) {
        uint32_t sl = segs[i].len, take;
        if (off >= sl) {
            off -= sl;
            continue;
        }
        take = sl - off < len ? sl - off : len;
        iov[n].iov_base = (char *)(uintptr_t)segs[i].addr + off;
        iov[n].iov_len = take;
        n++;
        len -= take;
        off = 0;
    }
    return n;
}

#endif

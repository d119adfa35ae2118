/* The verbrpc wire format (docs/PROTOCOL.md): the fixed 28-byte frame header,
 * the metadata block and the HELLO settings, with explicit little-endian
 * encode/decode so the format never depends on the host. Pure functions: no
 * I/O, no allocation, any thread. */
#ifndef VRPC_RPC_WIRE_H
#define VRPC_RPC_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <verbrpc/rpc.h>

#define VRPC_WIRE_MAGIC 0x5256u /* bytes 'V' 'R' when stored little-endian */
#define VRPC_WIRE_VERSION 3
#define VRPC_WIRE_HDR_LEN 28
#define VRPC_WIRE_HELLO_LEN 16
#define VRPC_WIRE_DESC_LEN 16                /* rendezvous descriptor after the metadata */
#define VRPC_WIRE_WINDOW_LEN 4               /* WINDOW payload: u32 increment */
#define VRPC_WIRE_WINDOW_SUM_MAX 0x7fffffffu /* a stream window never exceeds 2^31 - 1 */
#define VRPC_WIRE_MD_KEY_MAX 255
#define VRPC_WIRE_MD_VAL_MAX 65535
#define VRPC_WIRE_MD_BLOCK_MAX 65535 /* md_len is 16 bits on the wire */
/* budget on the wire: 31 bits of microseconds, or with this bit of milliseconds */
#define VRPC_WIRE_BUDGET_MS 0x80000000u

enum vrpc_frame_type {
    VRPC_FT_HELLO = 1,      /* client -> server, first frame: client settings */
    VRPC_FT_HELLO_ACK = 2,  /* server -> client, answer to HELLO: server settings */
    VRPC_FT_REQUEST = 3,    /* client -> server: a call */
    VRPC_FT_RESPONSE = 4,   /* server -> client: a call's outcome */
    VRPC_FT_CANCEL = 5,     /* client -> server: stop working on request_id */
    VRPC_FT_GOAWAY = 6,     /* server -> client: no new calls on this connection */
    VRPC_FT_DONE = 7,       /* either way: the reader is finished with a rendezvous payload */
    VRPC_FT_MESSAGE = 8,    /* either way: one message of stream request_id */
    VRPC_FT_HALF_CLOSE = 9, /* client -> server: no more MESSAGEs on request_id */
    VRPC_FT_WINDOW = 10,    /* either way: u32 more MESSAGEs the sender accepts on request_id */
    VRPC_FT_HEADERS = 11,   /* server -> client: initial metadata of call request_id */
};
#define VRPC_FT_MAX VRPC_FT_HEADERS

/* Frame flags. Undefined bits must be zero; a receiver rejects others. */
#define VRPC_FF_DEADLINE 0x0001u /* REQUEST: budget_us is meaningful */
#define VRPC_FF_RNDV                                                                                                   \
    0x0002u                    /* REQUEST, RESPONSE with status OK: the payload stays at
                                    the sender; a descriptor follows the metadata */
#define VRPC_FF_STREAM 0x0004u /* REQUEST: opens a stream; payload_len 0, no RNDV */
#define VRPC_FF_END 0x0008u    /* MESSAGE (client -> server): half-close after this message */
/* RESPONSE with a status other than OK, only to a client that offered
 * VRPC_FEAT_REFUSED: the server refused the request without processing it
 * (GOAWAY, draining, out of memory, over a limit); safe to retry anywhere. */
#define VRPC_FF_REFUSED 0x0010u
#define VRPC_FF_KNOWN (VRPC_FF_DEADLINE | VRPC_FF_RNDV | VRPC_FF_STREAM | VRPC_FF_END | VRPC_FF_REFUSED)

/* HELLO/HELLO_ACK feature bits. */
#define VRPC_FEAT_LARGE 0x1u  /* this side reads and serves rendezvous payloads */
#define VRPC_FEAT_STREAM 0x2u /* this side serves streams (always set by version 3) */
/* HELLO: this client reads VRPC_FF_REFUSED (a peer that does not know it
 * rejects the frame); HELLO_ACK: this server marks its refusals with it. */
#define VRPC_FEAT_REFUSED 0x4u

/* A decoded header. The wire is narrower than some fields here (flags and
 * status 8 bits, md_len 16, budget 32 with a unit bit): encode requires
 * flags within VRPC_FF_KNOWN, status below VRPC_CODE_COUNT and md_len at
 * most VRPC_WIRE_MD_BLOCK_MAX; a budget beyond 2^31 - 1 us goes as whole
 * milliseconds rounded up, at most 2^31 - 1 ms (24.8 days). */
struct vrpc_wire_hdr {
    uint8_t version;
    uint8_t type; /* enum vrpc_frame_type */
    uint16_t flags;
    uint32_t method_id;   /* REQUEST only, else 0 */
    uint32_t status;      /* RESPONSE and DONE only (enum vrpc_code), else 0 */
    uint64_t request_id;  /* every type but HELLO, HELLO_ACK, GOAWAY: nonzero; else 0 */
    uint64_t budget_us;   /* REQUEST with VRPC_FF_DEADLINE: remaining time in us */
    uint32_t payload_len; /* bytes after the metadata */
    uint32_t md_len;      /* bytes of metadata right after the header */
};

/* Server/client settings carried as the payload of HELLO and HELLO_ACK. */
struct vrpc_wire_hello {
    uint32_t max_msg_size;   /* largest payload this side accepts */
    uint32_t max_concurrent; /* HELLO: slots the client uses; HELLO_ACK: credits granted */
    uint32_t features;       /* VRPC_FEAT_*; unknown bits ignored on receipt */
    uint32_t stream_window;  /* MESSAGEs per stream this side accepts before it
                                returns window: 1 .. 2^31 - 1 on the wire (decode
                                refuses others); encode writes 0 as
                                VRPC_STREAM_WINDOW_DEFAULT */
};

/* Rendezvous descriptor: where the payload waits at the sender. */
struct vrpc_wire_desc {
    uint64_t addr; /* address of payload byte 0 at the sender */
    uint32_t rkey; /* one-shot key of the sender's vrpc_ep_grant, never 0 */
};

void vrpc_wire_hdr_encode(uint8_t out[VRPC_WIRE_HDR_LEN], const struct vrpc_wire_hdr *h);

/* Decode and validate a whole frame of frame_len bytes (the transport keeps
 * message boundaries). Checks magic, version, type, flags, per-type field
 * rules (docs/PROTOCOL.md: which fields and flags each type may carry; e.g.
 * REQUEST|STREAM has payload_len 0 and no RNDV, END only on MESSAGE, a
 * WINDOW payload is 4 bytes, HEADERS has payload_len 0) and that header + md_len + payload_len == frame_len exactly (for a
 * RNDV frame: header + md_len + VRPC_WIRE_DESC_LEN; payload_len is then the
 * size of the payload left at the sender). Checks that need the connection
 * (eager size, limits) are the caller's.
 * Returns 0, -EPROTONOSUPPORT (wrong version) or -EPROTO (anything else);
 * *h is written only on success. */
int vrpc_wire_hdr_decode(const uint8_t *frame, size_t frame_len, struct vrpc_wire_hdr *h);

/* Size the metadata block of these entries takes; -EINVAL for an invalid key
 * or value, or more than VRPC_MD_MAX entries. */
long vrpc_wire_md_size(const struct vrpc_metadata *md, size_t n);
/* Encode (validated by vrpc_wire_md_size first) into out, which has room. */
void vrpc_wire_md_encode(uint8_t *out, const struct vrpc_metadata *md, size_t n);
/* Decode and validate a metadata block in place: entries point into buf (keys
 * are NUL-terminated on the wire). Up to cap entries; -EPROTO if malformed or
 * more than cap entries. Returns the entry count. */
int vrpc_wire_md_decode(const uint8_t *buf, size_t len, struct vrpc_metadata *out, size_t cap);

/* The descriptor of a RNDV frame (at frame + header + md_len). Decode checks
 * rkey != 0 and that addr + payload_len does not overflow: -EPROTO. */
void vrpc_wire_desc_encode(uint8_t out[VRPC_WIRE_DESC_LEN], const struct vrpc_wire_desc *d);
int vrpc_wire_desc_decode(const uint8_t *buf, uint32_t payload_len, struct vrpc_wire_desc *d);

/* WINDOW payload: the increment, 1 .. VRPC_WIRE_WINDOW_SUM_MAX (decode: else
 * -EPROTO). Whether the sum overflows is the receiver's check. */
void vrpc_wire_window_encode(uint8_t out[VRPC_WIRE_WINDOW_LEN], uint32_t n);
int vrpc_wire_window_decode(const uint8_t *buf, size_t len, uint32_t *n);

void vrpc_wire_hello_encode(uint8_t out[VRPC_WIRE_HELLO_LEN], const struct vrpc_wire_hello *h);
int vrpc_wire_hello_decode(const uint8_t *buf, size_t len, struct vrpc_wire_hello *h);

/* Request id layout: low 32 bits the slot index, high 32 bits the slot's
 * generation (never 0, so an id is never 0). */
static inline uint64_t vrpc_wire_make_id(uint32_t slot, uint32_t gen) { return ((uint64_t)gen << 32) | slot; }
static inline uint32_t vrpc_wire_id_slot(uint64_t id) { return (uint32_t)id; }
static inline uint32_t vrpc_wire_id_gen(uint64_t id) { return (uint32_t)(id >> 32); }

#endif

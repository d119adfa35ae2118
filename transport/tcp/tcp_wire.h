/* The TCP backend's wire format, shared with the bad-peer tests that forge it.
 * Every frame starts with a 16-byte little-endian header; DATA frames carry len
 * payload bytes after it. A connection starts with HELLO (client) answered by
 * HELLO_ACK (server): imm holds the eager size, credits the initial grant. */
#ifndef VRPC_TCP_WIRE_H
#define VRPC_TCP_WIRE_H

#include <stdint.h>

#define VRPC_TCP_HDR_LEN 16u
#define VRPC_TCP_MAGIC 0x43505256u /* "VRPC" */
#define VRPC_TCP_VERSION 1u

enum vrpc_tcp_frame { VRPC_TCP_DATA = 1, VRPC_TCP_CREDIT, VRPC_TCP_HELLO, VRPC_TCP_HELLO_ACK };

struct vrpc_tcp_hdr {
    uint32_t len;     /* payload bytes (DATA); 0 otherwise */
    uint32_t imm;     /* DATA: immediate; HELLO/ACK: eager size */
    uint16_t credits; /* credits returned to the receiver of this frame */
    uint8_t type;     /* enum vrpc_tcp_frame */
    uint8_t version;
    uint32_t magic;
};
_Static_assert(sizeof(struct vrpc_tcp_hdr) == VRPC_TCP_HDR_LEN, "frame header is 16 bytes");

#endif

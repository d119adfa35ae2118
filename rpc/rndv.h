/* Large messages (rendezvous, docs/PROTOCOL.md "Large messages"): message
 * size limits agreed at connect time, and the helpers the channel and the
 * server share to move a payload that does not fit the eager size: the
 * sender packs it into a large buffer of the transport's cache and grants the
 * peer a one-shot key; the receiver reads it into its own large buffer and
 * answers DONE; the sender then revokes the key and puts the buffer back. */
#ifndef VRPC_RPC_RNDV_H
#define VRPC_RPC_RNDV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>

#define VRPC_HOLD_TIMEOUT_DEFAULT_MS 60000u

/* Feature bits this build offers in HELLO/HELLO_ACK. */
extern const uint32_t vrpc_rndv_features;

/* Defaults and bounds for one side's options: *max_msg 0 -> 16 MiB, above
 * VRPC_MSG_SIZE_MAX -> -EINVAL; *max_pinned 0 -> 256 MiB, below *max_msg ->
 * -EINVAL; *hold_ms 0 -> 60 s. who names the side in the log line of an
 * -EINVAL ("channel", "server"). */
int vrpc_rndv_limits(const char *who, uint32_t *max_msg, uint64_t *max_pinned, uint32_t *hold_ms);

/* Largest payload (metadata + message) this side may send on a connection:
 * the peer's limit when both sides offer VRPC_FEAT_LARGE, else what fits one
 * eager frame. */
uint32_t vrpc_rndv_send_limit(uint32_t peer_max, uint32_t peer_features, uint32_t eager);

#endif

/* Large messages: limits, and the rendezvous helpers shared by the channel
 * and the server (see rndv.h). */
#include "rpc/rndv.h"

#include <errno.h>
#include "rpc/internal.h"
#include "rpc/wire.h"

const uint32_t vrpc_rndv_features = 0;

int vrpc_rndv_limits(const char *who, uint32_t *max_msg, uint64_t *max_pinned, uint32_t *hold_ms)
{
    if (*max_msg == 0)
        *max_msg = VRPC_MSG_SIZE_DEFAULT;
    if (*max_pinned == 0)
        *max_pinned = (uint64_t)256 << 20;
    if (*hold_ms == 0)
        *hold_ms = VRPC_HOLD_TIMEOUT_DEFAULT_MS;
    if (*max_msg > VRPC_MSG_SIZE_MAX) {
        vrpc_rpc_log("%s: max_msg_size %u is above the largest allowed, %u", who, *max_msg,
                     VRPC_MSG_SIZE_MAX);
        return -EINVAL;
    }
    if (*max_msg > *max_pinned) {
        vrpc_rpc_log("%s: max_msg_size %u is above max_pinned %llu: a message of the largest size "
                     "could never get a buffer",
                     who, *max_msg, (unsigned long long)*max_pinned);
        return -EINVAL;
    }
    return 0;
}

uint32_t vrpc_rndv_send_limit(uint32_t peer_max, uint32_t peer_features, uint32_t eager)
{
    uint32_t fit = eager - VRPC_WIRE_HDR_LEN;
    if ((vrpc_rndv_features & peer_features & VRPC_FEAT_LARGE) || peer_max <= fit)
        return peer_max;
    return fit;
}

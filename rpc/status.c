/* Status code names, method ids and small status helpers. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <verbrpc/rpc.h>
#include "rpc/status.h"

static const char *const code_names[VRPC_CODE_COUNT] = {
    "OK",        "CANCELLED",       "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS",  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",    "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED",
};

const char *vrpc_code_name(enum vrpc_code code)
{
    if ((unsigned)code >= VRPC_CODE_COUNT)
        return "UNKNOWN_CODE";
    return code_names[code];
}

uint32_t vrpc_method_id(const char *full_name)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)full_name; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h;
}

const char *vrpc_channel_state_name(enum vrpc_channel_state st)
{
    switch (st) {
    case VRPC_CHANNEL_IDLE:
        return "IDLE";
    case VRPC_CHANNEL_CONNECTING:
        return "CONNECTING";
    case VRPC_CHANNEL_READY:
        return "READY";
    case VRPC_CHANNEL_TRANSIENT_FAILURE:
        return "TRANSIENT_FAILURE";
    case VRPC_CHANNEL_SHUTDOWN:
        return "SHUTDOWN";
    }
    return "UNKNOWN_STATE";
}

static void status_vset(struct vrpc_status *st, enum vrpc_code code, uint32_t flags, const char *fmt, va_list ap)
{
    st->code = code;
    st->flags = flags;
    if (!fmt)
        st->message[0] = 0;
    else
        vsnprintf(st->message, sizeof(st->message), fmt, ap);
}

void vrpc_status_set(struct vrpc_status *st, enum vrpc_code code, const char *fmt, ...)
{
    if (!st)
        return;
    va_list ap;
    va_start(ap, fmt);
    status_vset(st, code, 0, fmt, ap);
    va_end(ap);
}

void vrpc_status_set_unprocessed(struct vrpc_status *st, enum vrpc_code code, const char *fmt, ...)
{
    if (!st)
        return;
    va_list ap;
    va_start(ap, fmt);
    status_vset(st, code, VRPC_STATUS_UNPROCESSED, fmt, ap);
    va_end(ap);
}

void vrpc_status_set_bytes(struct vrpc_status *st, enum vrpc_code code, const void *msg, size_t len)
{
    if (len >= sizeof(st->message))
        len = sizeof(st->message) - 1;
    st->code = code;
    st->flags = 0;
    memcpy(st->message, msg, len);
    st->message[len] = 0;
}

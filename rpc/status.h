/* Private helpers to fill a struct vrpc_status without allocating. */
#ifndef VRPC_RPC_STATUS_H
#define VRPC_RPC_STATUS_H

#include <stddef.h>
#include <verbrpc/rpc.h>

/* st may be NULL (then nothing happens); fmt may be NULL (empty message).
 * Clears st->flags. */
void vrpc_status_set(struct vrpc_status *st, enum vrpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Message from len bytes (not NUL-terminated), cut to fit. Clears st->flags. */
void vrpc_status_set_bytes(struct vrpc_status *st, enum vrpc_code code, const void *msg, size_t len);
/* As vrpc_status_set, and marks st VRPC_STATUS_UNPROCESSED: for failures of
 * requests that never left this client. */
void vrpc_status_set_unprocessed(struct vrpc_status *st, enum vrpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

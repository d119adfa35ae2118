/* rawcall: a unary call whose request and response are wire bytes, for a
 * method known only by name (no protobuf-c generated code for its types).
 * Built on vrpc_call() alone: the bytes travel as the unknown fields of a
 * message type with no fields, which protobuf-c keeps on unpack and writes
 * back, byte for byte, on pack. */
#ifndef VRPC_TOOL_RAWCALL_H
#define VRPC_TOOL_RAWCALL_H

#include <stddef.h>
#include <stdint.h>
#include <verbrpc/verbrpc.h>

/* Calls full_name ("/pkg.Service/Method") with the request req[0..req_len).
 * Returns the status code (as vrpc_call). On VRPC_OK *resp (malloc'd, the
 * caller frees) and *resp_len hold the response's bytes. Malformed request
 * bytes fail with INVALID_ARGUMENT before anything is sent. */
int rawcall(struct vrpc_channel *ch, const char *full_name, const uint8_t *req, size_t req_len,
            const struct vrpc_call_opts *opts, uint8_t **resp, size_t *resp_len, struct vrpc_status *st);

#endif

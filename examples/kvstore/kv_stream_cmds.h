/* kv_stream_cmds: kvstore_client's streaming commands. Each returns the
 * process exit code (0 success, 1 failure) and prints what it did. */
#ifndef VRPC_EXAMPLES_KV_STREAM_CMDS_H
#define VRPC_EXAMPLES_KV_STREAM_CMDS_H

#include <stddef.h>

#include <verbrpc/verbrpc.h>

/* watch PREFIX [COUNT]: prints "watching PREFIX" once the watch is in place,
 * then one line per change under PREFIX ("put KEY VALUE", "delete KEY");
 * after COUNT changes (0: no limit) it cancels the stream and returns 0.
 * Returns 1 if the stream ends otherwise (server shutdown, error). */
int kv_cmd_watch(struct vrpc_channel *ch, const char *prefix, unsigned long long count);

/* bulkput PREFIX COUNT [BYTES]: streams COUNT pairs PREFIX00000000,
 * PREFIX00000001, ... with BYTES-byte values (default 16) on one BulkPut
 * stream, then prints the server's counts and the rate. */
int kv_cmd_bulkput(struct vrpc_channel *ch, const char *prefix, unsigned long long count, size_t bytes);

#endif

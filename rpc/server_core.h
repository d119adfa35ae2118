/* The server core: vrpc_server_create() without the built-in services. The
 * layer above (the built-in services) wraps it; rpc/ never calls up into it.
 * Private to the library. */
#ifndef VRPC_RPC_SERVER_CORE_H
#define VRPC_RPC_SERVER_CORE_H

#include <verbrpc/rpc.h>

/* As vrpc_server_create() (same options, defaults and errors), but the server
 * has no method registered. *out is written only on success; a failure frees
 * everything it made. */
int vrpc_server_core_create(const struct vrpc_server_opts *o, struct vrpc_server **out);

#endif

/* Built-in services (health, stats) that every server serves. Implemented by
 * the generated code in idl/; the server's create path calls this once idl/
 * provides it (see /work/coord/RPC_API.md). Private to the library. */
#ifndef VRPC_RPC_BUILTINS_H
#define VRPC_RPC_BUILTINS_H

#include <verbrpc/rpc.h>

int vrpc_builtins_register(struct vrpc_server *s);

#endif

/* Built-in services (health, stats) that every server serves. Implemented in
 * idl/builtins.c on the generated code; vrpc_server_create() calls it.
 * Private to the library. */
#ifndef VRPC_RPC_BUILTINS_H
#define VRPC_RPC_BUILTINS_H

#include <verbrpc/rpc.h>

int vrpc_builtins_register(struct vrpc_server *s);

#endif

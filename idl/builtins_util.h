/* What the built-in services (idl/builtins.c, idl/reflection.c) share.
 * Private to the library. */
#ifndef VRPC_IDL_BUILTINS_UTIL_H
#define VRPC_IDL_BUILTINS_UTIL_H

#include <stddef.h>
#include <verbrpc/rpc.h>

/* A snapshot of every registered method's statistics (vrpc_server_stats), in
 * the call's arena. 0 or a negative errno. */
int vrpc_builtins_snapshot(struct vrpc_server_call *call, const struct vrpc_server *s,
                           struct vrpc_method_stats **out, size_t *n);

/* Registers the reflection service (idl/reflection.c). */
int vrpc_reflection_register(struct vrpc_server *s);

#endif

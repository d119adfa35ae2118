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

/* The layer above's hooks (the built-in services' state, idl/builtins.c):
 * on_shutdown(arg) runs once, at the start of the first
 * vrpc_server_shutdown(), on its caller's thread, before GOAWAY goes out
 * (answers and stream writes still reach the clients); on_destroy(arg) in
 * vrpc_server_destroy() once every connection, call and task is gone. Set
 * before vrpc_server_start(); h is copied; NULL members are skipped. */
struct vrpc_server_hooks {
    void (*on_shutdown)(void *arg);
    void (*on_destroy)(void *arg);
    void *arg;
};
void vrpc_server_core_set_hooks(struct vrpc_server *s, const struct vrpc_server_hooks *h);
/* The hooks' arg (NULL if none were set). Any thread. */
void *vrpc_server_core_hooks_arg(const struct vrpc_server *s);

#endif

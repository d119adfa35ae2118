/* The built-in services (idl/): what their files share. Private to the
 * library. Each service registers its methods with the server as their user
 * pointer; builtins.c lists the services and wraps the server core. */
#ifndef VRPC_IDL_BUILTINS_H
#define VRPC_IDL_BUILTINS_H

#include <stddef.h>
#include <verbrpc/rpc.h>

/* A snapshot of every registered method's statistics (vrpc_server_stats), in
 * the call's arena (idl/snapshot.c). 0 or a negative errno. */
int vrpc_builtins_snapshot(struct vrpc_server_call *call, const struct vrpc_server *s, struct vrpc_method_stats **out,
                           size_t *n);

/* Register one service's methods on s (before vrpc_server_start); 0 or the
 * first vrpc_server_register error. */
int vrpc_health_register(struct vrpc_server *s);     /* idl/health.c */
int vrpc_stats_register(struct vrpc_server *s);      /* idl/stats.c */
int vrpc_reflection_register(struct vrpc_server *s); /* idl/reflection.c */

/* All of them (idl/builtins.c). */
int vrpc_builtins_register(struct vrpc_server *s);

#endif

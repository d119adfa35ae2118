/* The one hook by which rpc/ asks a server's health: a channel over many
 * servers (rpc/lb_thread.c, health_check_ms) checks each one with the
 * built-in Health service, whose messages and stubs live above rpc/ in
 * idl/. idl/health.c installs the probe when the library loads, so rpc/
 * never names idl/. Until it is installed (a static link that left
 * idl/health.o out) no check runs and every server counts as serving. */
#ifndef VRPC_RPC_HEALTH_HOOK_H
#define VRPC_RPC_HEALTH_HOOK_H

#include <stdint.h>

struct vrpc_channel;

/* One verbrpc.health.v1.Health/Check of service "" over ch, with that
 * deadline: 1 SERVING (also a server without the Health service), 0
 * NOT_SERVING, -1 no answer (the last status stands). Runs on the
 * channel's lb thread. */
typedef int (*vrpc_health_probe_fn)(struct vrpc_channel *ch, int64_t timeout_us);

/* Set once at load (atomic pointer). */
extern vrpc_health_probe_fn vrpc_health_probe;

#endif

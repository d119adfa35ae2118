/* The hooks by which rpc/ asks a server's health: a channel over many
 * servers (rpc/lb_thread.c, health_check_ms) follows each one with the
 * built-in Health service's Watch stream, or polls its Check where Watch is
 * UNIMPLEMENTED; the messages and stubs live above rpc/ in idl/.
 * idl/health.c installs both when the library loads, so rpc/ never names
 * idl/. Until they are installed (a static link that left idl/health.o out)
 * no check runs and every server counts as serving. */
#ifndef VRPC_RPC_HEALTH_HOOK_H
#define VRPC_RPC_HEALTH_HOOK_H

#include <stdint.h>

struct vrpc_channel;

/* One verbrpc.health.v1.Health/Check of service "" over ch, with that
 * deadline: 1 SERVING (also a server without the Health service), 0
 * NOT_SERVING, -1 no answer (the last status stands). Runs on the
 * channel's lb thread. */
typedef int (*vrpc_health_probe_fn)(struct vrpc_channel *ch, int64_t timeout_us);

struct vrpc_stream;

/* Open a verbrpc.health.v1.Health/Watch of service "" over ch, without a
 * deadline: update(arg, serving) on a worker for each status the server
 * sends (1 SERVING, 0 anything else), then done(arg, code) exactly once
 * with the stream's final status code (VRPC_UNIMPLEMENTED: a server
 * without Watch). Neither runs after vrpc_stream_destroy(*out) returns,
 * which the caller owes (never from update or done). 0, or a negative
 * errno when no stream is open (*out not written; done may have run). */
typedef int (*vrpc_health_watch_fn)(struct vrpc_channel *ch, void (*update)(void *arg, int serving),
                                    void (*done)(void *arg, int code), void *arg, struct vrpc_stream **out);

/* Set once at load (atomic pointers). */
extern vrpc_health_probe_fn vrpc_health_probe;
extern vrpc_health_watch_fn vrpc_health_watch;

#endif

/* Service discovery, the server's side: register this server under a key
 * prefix in etcd v3 so that clients whose channel target is
 * "etcd://host:port[,host:port]/prefix" find it, and remove it on shutdown.
 * Needs a build with libcurl and jansson (else -ENOTSUP). */
#ifndef VRPC_DISCOVERY_H
#define VRPC_DISCOVERY_H

#include <stdint.h>
#include <verbrpc/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vrpc_etcd_reg;

/* Grant a lease of ttl_s seconds (1..86400; etcd may raise it to its
 * minimum), put key prefix + server_uri with value server_uri under it, and
 * keep the lease alive from a thread of its own (a keep-alive every third of
 * the TTL; if the lease is lost, e.g. etcd was down longer than the TTL, a
 * new one is granted and the key put again). endpoints: "host:port[,...]"
 * (etcd's client URLs without http://, tried in turn); prefix: e.g.
 * "/services/kv/" (non-empty); server_uri: the URI clients connect to, as
 * vrpc_uri_check accepts it (an address they can reach, not 0.0.0.0). Blocks
 * until the key is in etcd (each endpoint tried once, the lease grant and the
 * put at most 3 s each, connecting included). 0 and *out, -EINVAL (bad
 * argument, logged), -ECONNREFUSED / -ETIMEDOUT (no endpoint answered),
 * -EPROTO (etcd refused: the message is logged), -ENOTSUP (built without
 * libcurl/jansson), -ENOMEM. Any thread. */
VRPC_API int vrpc_etcd_register(const char *endpoints, const char *prefix, const char *server_uri, uint32_t ttl_s,
                                struct vrpc_etcd_reg **out);

/* Stop the keep-alive and revoke the lease, which deletes the key (clients
 * following the prefix drop this server at once). If etcd cannot be reached
 * the key goes when the lease expires. Returns 0 if the revoke succeeded,
 * else its error (the handle is freed either way). Safe on NULL (0). */
VRPC_API int vrpc_etcd_deregister(struct vrpc_etcd_reg *reg);

#ifdef __cplusplus
}
#endif
#endif

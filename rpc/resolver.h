/* Name resolution for channels with many servers (issue 20): a target such
 * as "list://h1:p1,h2:p2", "dns://name:port", "file:///path" or
 * "etcd://host:port[,host:port]/prefix" becomes a set of single-server URIs
 * ("tcp://10.0.0.1:5000", "verbs://[fd00::2]:7000", "auto://h:p"), delivered
 * whole every time it changes. Internal to the library.
 *
 * Threads: create and destroy from any thread, not concurrently for one
 * resolver. The update callback runs on the resolver's own thread (or, for
 * static targets, inside create), never two at once for one resolver, and
 * never after destroy returns. */
#ifndef VRPC_RPC_RESOLVER_H
#define VRPC_RPC_RESOLVER_H

#include <stdbool.h>
#include <stddef.h>

/* The full current set, n >= 0 URIs (each NUL-terminated, valid only during
 * the call: copy what you keep). An empty set means "no server known now";
 * a resolver whose source fails (DNS error, file gone, etcd unreachable)
 * delivers nothing new and the last set stays in use. */
typedef void (*vrpc_resolver_update_fn)(void *arg, const char *const *uris, size_t n);

struct vrpc_resolver;

/* One scheme's implementation. create parses what follows "scheme://"
 * (-EINVAL, logged with the reason, for a malformed target). */
struct vrpc_resolver_ops {
    const char *scheme; /* "list", "dns", "file", "etcd" */
    int (*create)(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out);
    void (*refresh)(struct vrpc_resolver *r); /* re-resolve soon (after failures); may be NULL */
    void (*destroy)(struct vrpc_resolver *r);
};

/* Every resolver starts with this, so the core can find its ops. */
struct vrpc_resolver {
    const struct vrpc_resolver_ops *ops;
};

extern const struct vrpc_resolver_ops vrpc_resolver_list;
extern const struct vrpc_resolver_ops vrpc_resolver_dns;
extern const struct vrpc_resolver_ops vrpc_resolver_file;
extern const struct vrpc_resolver_ops vrpc_resolver_etcd;

/* True if target names a resolver scheme (list, dns, file, etcd) rather
 * than one server. */
bool vrpc_resolver_is_target(const char *target);

/* Create the resolver for target's scheme. -EINVAL (malformed, logged),
 * -ENOTSUP (a scheme this build lacks, e.g. etcd without libcurl). The first
 * update may run before this returns. */
int vrpc_resolver_create(const char *target, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out);
void vrpc_resolver_refresh(struct vrpc_resolver *r);
/* No update runs after this returns. Safe on NULL. */
void vrpc_resolver_destroy(struct vrpc_resolver *r);

#endif

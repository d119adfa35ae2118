/* A build without libcurl or jansson: the etcd:// scheme and the server's
 * registration exist and say -ENOTSUP, so that a target or a call names
 * what the build lacks instead of failing as an unknown scheme. */
#include <errno.h>
#include <verbrpc/discovery.h>
#include "common/log_internal.h"
#include "rpc/resolver.h"

static int etcd_create(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    vrpc_rpc_log("resolver: 'etcd://%s': this build has no etcd support (needs libcurl and jansson)", rest);
    return -ENOTSUP;
}

static void etcd_destroy(struct vrpc_resolver *r) { (void)r; }

const struct vrpc_resolver_ops vrpc_resolver_etcd = {
    .scheme = "etcd",
    .create = etcd_create,
    .refresh = NULL,
    .destroy = etcd_destroy,
};

int vrpc_etcd_register(const char *endpoints, const char *prefix, const char *server_uri, uint32_t ttl_s,
                       struct vrpc_etcd_reg **out)
{
    vrpc_rpc_log("etcd: register: this build has no etcd support (needs libcurl and jansson)");
    return -ENOTSUP;
}

int vrpc_etcd_deregister(struct vrpc_etcd_reg *reg) { return reg ? -ENOTSUP : 0; }

/* The resolver core: one static table of schemes (rpc/resolver.h), the
 * choice between a resolver target and a single-server URI, and the calls
 * that go through a resolver's ops. */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include "common/log_internal.h"
#include "rpc/resolver.h"

/* etcd is in every build; without libcurl/jansson its create says -ENOTSUP
 * (rpc/etcd_none.c). */
static const struct vrpc_resolver_ops *const schemes[] = {
    &vrpc_resolver_list,
    &vrpc_resolver_dns,
    &vrpc_resolver_file,
    &vrpc_resolver_etcd,
};

/* The table entry whose scheme target starts with (followed by "://"). */
static const struct vrpc_resolver_ops *find(const char *target)
{
    if (!target)
        return NULL;
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t len = strlen(schemes[i]->scheme);
        if (!strncmp(target, schemes[i]->scheme, len) && !strncmp(target + len, "://", 3))
            return schemes[i];
    }
    return NULL;
}

bool vrpc_resolver_is_target(const char *target) { return find(target) != NULL; }

int vrpc_resolver_create(const char *target, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    const struct vrpc_resolver_ops *ops = find(target);
    struct vrpc_resolver *r = NULL;
    int rc;

    if (!ops || !fn || !out) {
        vrpc_rpc_log("resolver: '%s' is not a resolver target (list://, dns://, file://, etcd://)",
                     target ? target : "(null)");
        return -EINVAL;
    }
    rc = ops->create(target + strlen(ops->scheme) + 3, fn, arg, &r);
    if (rc)
        return rc;
    r->ops = ops;
    *out = r;
    return 0;
}

void vrpc_resolver_refresh(struct vrpc_resolver *r)
{
    if (r && r->ops->refresh)
        r->ops->refresh(r);
}

void vrpc_resolver_destroy(struct vrpc_resolver *r)
{
    if (r)
        r->ops->destroy(r);
}

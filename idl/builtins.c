/* The services every verbrpc server serves: health (idl/health.c), statistics
 * (idl/stats.c) and reflection (idl/reflection.c), whose stubs are generated
 * from the .proto files in idl/verbrpc/ (committed in idl/gen/). The public
 * vrpc_server_create() lives here, above the core: it makes the core server
 * (rpc/server.c) and registers the built-ins on it. */
#include "builtins.h"

#include <errno.h>

#include "rpc/server_core.h"

int vrpc_builtins_register(struct vrpc_server *s)
{
    int rc = vrpc_health_register(s);

    if (rc == 0)
        rc = vrpc_stats_register(s);
    if (rc == 0)
        rc = vrpc_reflection_register(s);
    return rc;
}

int vrpc_server_create(const struct vrpc_server_opts *o, struct vrpc_server **out)
{
    struct vrpc_server *s;
    int rc;

    if (!out)
        return -EINVAL;
    rc = vrpc_server_core_create(o, &s);
    if (rc)
        return rc;
    rc = vrpc_builtins_register(s);
    if (rc) {
        vrpc_server_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

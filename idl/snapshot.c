/* The statistics snapshot the built-in services answer from (Health's service
 * lookup, Stats, Reflection's list of files and services). */
#include "builtins.h"

#include <errno.h>

/* A snapshot of every registered method's statistics, in the call's arena
 * (no malloc). Methods are registered before the server starts, so their
 * number cannot change between the two vrpc_server_stats() calls. */
int vrpc_builtins_snapshot(struct vrpc_server_call *call, const struct vrpc_server *s, struct vrpc_method_stats **out,
                           size_t *n)
{
    struct vrpc_method_stats one, *v;
    size_t count = 0;
    int rc = vrpc_server_stats(s, &one, 1, &count);

    if (rc != 0)
        return rc;
    v = vrpc_server_call_alloc(call, (count ? count : 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    rc = vrpc_server_stats(s, v, count, &count);
    if (rc != 0)
        return rc;
    *out = v;
    *n = count;
    return 0;
}

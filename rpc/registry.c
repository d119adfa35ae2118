/* The server's method registry: registration before start, and the index by
 * method id built at start (looked up by vrpc_srv_lookup on the poller). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/server_internal.h"

int vrpc_server_register(struct vrpc_server *s, const struct vrpc_method_desc *m, vrpc_handler_fn fn, void *user)
{
    if (!s || !m || !fn || !m->full_name || !m->input || !m->output || m->id != vrpc_method_id(m->full_name))
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    for (size_t i = 0; i < s->nmethods; i++)
        if (s->methods[i].m->id == m->id)
            return -EEXIST;
    if (s->nmethods == s->capmethods) {
        size_t nc = s->capmethods ? s->capmethods * 2 : 8;
        struct method_entry *nm = realloc(s->methods, nc * sizeof(*nm));
        if (!nm)
            return -ENOMEM;
        s->methods = nm;
        s->capmethods = nc;
    }
    struct method_entry *me = &s->methods[s->nmethods++];
    memset(me, 0, sizeof(*me));
    me->m = m;
    me->fn = fn;
    me->user = user;
    return 0;
}

int vrpc_srv_build_index(struct vrpc_server *s)
{
    uint32_t size = 16;
    while (size < s->nmethods * 2)
        size *= 2;
    s->index = calloc(size, sizeof(*s->index));
    if (!s->index)
        return -ENOMEM;
    s->index_mask = size - 1;
    for (size_t i = 0; i < s->nmethods; i++) {
        uint32_t h = s->methods[i].m->id & s->index_mask;
        while (s->index[h])
            h = (h + 1) & s->index_mask;
        s->index[h] = &s->methods[i];
    }
    return 0;
}

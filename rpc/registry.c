/* The server's method registry: registration before start, and the index by
 * method id built at start (looked up by vrpc_srv_lookup on the poller). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/server_internal.h"

static int method_add(struct vrpc_server *s, const struct vrpc_method_desc *m, void *user);

int vrpc_server_register(struct vrpc_server *s, const struct vrpc_method_desc *m, vrpc_handler_fn fn, void *user)
{
    if (!s || !m || !fn || !m->full_name || !m->input || !m->output || m->id != vrpc_method_id(m->full_name) ||
        m->kind != VRPC_METHOD_UNARY)
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    for (size_t i = 0; i < s->nmethods; i++)
        if (s->methods[i].m->id == m->id)
            return -EEXIST;
    int rc = method_add(s, m, user);
    if (rc == 0)
        s->methods[s->nmethods - 1].fn = fn;
    return rc;
}

int vrpc_server_run_on_poller(struct vrpc_server *s, const char *full_name)
{
    if (!s || !full_name)
        return -EINVAL;
    if (s->started)
        return -EBUSY;
    for (size_t i = 0; i < s->nmethods; i++)
        if ((s->methods[i].fn || s->methods[i].sops) && !strcmp(s->methods[i].m->full_name, full_name)) {
            s->methods[i].on_poller = true;
            return 0;
        }
    return -ENOENT;
}

static int method_add(struct vrpc_server *s, const struct vrpc_method_desc *m, void *user)
{
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
    me->user = user;
    return 0;
}

int vrpc_server_register_stream(struct vrpc_server *srv, const struct vrpc_method_desc *m,
                                const struct vrpc_server_stream_ops *ops, void *user)
{
    if (!srv || !m || !ops || !ops->start || m->kind == VRPC_METHOD_UNARY ||
        (unsigned)m->kind > VRPC_METHOD_BIDI_STREAMING || !m->full_name || !m->input || !m->output ||
        m->id != vrpc_method_id(m->full_name))
        return -EINVAL;
    if (srv->started)
        return -EBUSY;
    for (size_t i = 0; i < srv->nmethods; i++)
        if (srv->methods[i].m->id == m->id)
            return -EEXIST;
    int rc = method_add(srv, m, user);
    if (rc == 0)
        srv->methods[srv->nmethods - 1].sops = ops;
    return rc;
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

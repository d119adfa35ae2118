/* The server's statistics: per-method counts and latency quantiles
 * (vrpc_server_stats), and the Prometheus text of them (the metrics endpoint
 * and vrpc_server_metrics_text). Recording is vrpc_srv_record
 * (rpc/server_internal.h), inline on the call path. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/server_internal.h"

int vrpc_server_stats(const struct vrpc_server *s, struct vrpc_method_stats *out, size_t cap, size_t *n)
{
    static const double qs[3] = {0.50, 0.90, 0.99};
    if (!s || (cap && !out) || !n)
        return -EINVAL;
    for (size_t i = 0; i < s->nmethods && i < cap; i++) {
        const struct method_entry *me = &s->methods[i];
        struct vrpc_method_stats *o = &out[i];
        uint64_t q[3];
        memset(o, 0, sizeof(*o));
        o->method = me->m;
        for (int c = 0; c < VRPC_CODE_COUNT; c++)
            o->calls += o->by_code[c] = __atomic_load_n(&me->cm.by_code[c], __ATOMIC_RELAXED);
        o->latency_max_us = vrpc_call_metrics_max_us(&me->cm); /* after by_code: bounds what they counted */
        vrpc_lathist_quantiles(&me->lh, qs, q, 3, o->latency_max_us);
        o->latency_p50_us = q[0];
        o->latency_p90_us = q[1];
        o->latency_p99_us = q[2];
    }
    *n = s->nmethods;
    return 0;
}

/* The server's methods handed to the renderer (rpc/metrics.c reads no server). */
int vrpc_server_metrics_text(const struct vrpc_server *s, char **out, size_t *len)
{
    struct vrpc_prom_method *v;
    int rc;

    if (!s || !out || !len)
        return -EINVAL;
    v = calloc(s->nmethods ? s->nmethods : 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < s->nmethods; i++) {
        v[i].method = s->methods[i].m->full_name;
        v[i].m = &s->methods[i].cm;
        v[i].lh = &s->methods[i].lh;
    }
    rc = vrpc_metrics_text("vrpc_server_", s->tp, NULL, v, s->nmethods, out, len);
    free(v);
    return rc;
}

int vrpc_server_metrics_uri(const struct vrpc_server *s, char *buf, size_t len)
{
    const char *uri = s && s->http ? vrpc_metrics_http_uri(s->http) : NULL;

    if (!uri)
        return -ENOTCONN;
    if (strlen(uri) >= len)
        return -ENOSPC;
    memcpy(buf, uri, strlen(uri) + 1);
    return 0;
}

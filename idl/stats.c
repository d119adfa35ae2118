/* The statistics service (verbrpc.stats.v1.Stats): every registered method's
 * counters and latency percentiles from vrpc_server_stats(), built in the
 * call's arena. */
#include "builtins.h"

#include <string.h>

#include <verbrpc/stats.vrpc.h>

static void stats_get(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Verbrpc__Stats__V1__GetStatsRequest *req = (const Verbrpc__Stats__V1__GetStatsRequest *)msg;
    Verbrpc__Stats__V1__GetStatsResponse resp = VERBRPC__STATS__V1__GET_STATS_RESPONSE__INIT;
    const char *prefix = req->method_prefix ? req->method_prefix : "";
    size_t plen = strlen(prefix), n;
    struct vrpc_method_stats *v;
    Verbrpc__Stats__V1__MethodStats *ms, **msp;

    if (vrpc_builtins_snapshot(call, user, &v, &n) != 0)
        goto oom;
    ms = vrpc_server_call_alloc(call, (n ? n : 1) * sizeof(*ms));
    msp = vrpc_server_call_alloc(call, (n ? n : 1) * sizeof(*msp));
    if (!ms || !msp)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        Verbrpc__Stats__V1__MethodStats *m = &ms[resp.n_methods];
        Verbrpc__Stats__V1__CodeCount *cc, **ccp;
        size_t ncodes = 0;

        if (strncmp(v[i].method->full_name, prefix, plen) != 0)
            continue;
        verbrpc__stats__v1__method_stats__init(m);
        m->method = (char *)v[i].method->full_name;
        m->method_id = v[i].method->id;
        m->calls = v[i].calls;
        m->latency_p50_us = v[i].latency_p50_us;
        m->latency_p90_us = v[i].latency_p90_us;
        m->latency_p99_us = v[i].latency_p99_us;
        m->latency_max_us = v[i].latency_max_us;
        for (int c = 1; c < VRPC_CODE_COUNT; c++)
            ncodes += v[i].by_code[c] != 0;
        cc = vrpc_server_call_alloc(call, (ncodes ? ncodes : 1) * sizeof(*cc));
        ccp = vrpc_server_call_alloc(call, (ncodes ? ncodes : 1) * sizeof(*ccp));
        if (!cc || !ccp)
            goto oom;
        for (int c = 1; c < VRPC_CODE_COUNT; c++) {
            if (!v[i].by_code[c])
                continue;
            verbrpc__stats__v1__code_count__init(&cc[m->n_errors_by_code]);
            cc[m->n_errors_by_code].code = (char *)vrpc_code_name((enum vrpc_code)c);
            cc[m->n_errors_by_code].count = v[i].by_code[c];
            ccp[m->n_errors_by_code] = &cc[m->n_errors_by_code];
            m->n_errors_by_code++;
            m->errors += v[i].by_code[c];
        }
        m->errors_by_code = ccp;
        msp[resp.n_methods++] = m;
    }
    resp.methods = msp;
    verbrpc__stats__v1__stats__get__respond(call, &resp);
    return;
oom:
    vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "stats: out of memory for the snapshot");
}

int vrpc_stats_register(struct vrpc_server *s)
{
    /* As health: the server is the handler's user pointer. */
    return vrpc_server_register(s, &verbrpc__stats__v1__stats__get__method, stats_get, s);
}

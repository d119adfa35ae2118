/* The services every verbrpc server serves: health (verbrpc.health.v1.Health,
 * as gRPC's grpc.health.v1), statistics (verbrpc.stats.v1.Stats, from
 * vrpc_server_stats()) and reflection (idl/reflection.c). Their stubs are
 * generated from the .proto files in idl/verbrpc/; the server's create path calls
 * vrpc_builtins_register(). */
#include "rpc/builtins.h"
#include "builtins_util.h"

#include <errno.h>
#include <string.h>

#include <verbrpc/health.vrpc.h>
#include <verbrpc/stats.vrpc.h>

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

/* True if full_name ("/pkg.Service/Method") is a method of service. */
static bool method_of(const char *full_name, const char *service)
{
    size_t len = strlen(service);

    return full_name[0] == '/' && strncmp(full_name + 1, service, len) == 0 && full_name[1 + len] == '/';
}

static void health_check(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Verbrpc__Health__V1__HealthCheckRequest *req = (const Verbrpc__Health__V1__HealthCheckRequest *)msg;
    Verbrpc__Health__V1__HealthCheckResponse resp = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    const char *service = req->service ? req->service : "";

    if (service[0] != '\0') {
        struct vrpc_method_stats *v;
        size_t n, i;
        int rc = vrpc_builtins_snapshot(call, user, &v, &n);

        if (rc != 0) {
            vrpc_server_call_fail(call, VRPC_INTERNAL, "health: cannot list the server's methods");
            return;
        }
        for (i = 0; i < n && !method_of(v[i].method->full_name, service); i++)
            ;
        if (i == n) {
            vrpc_server_call_fail(call, VRPC_NOT_FOUND, "health: unknown service");
            return;
        }
    }
    resp.status = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    verbrpc__health__v1__health__check__respond(call, &resp);
}

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

int vrpc_builtins_register(struct vrpc_server *s)
{
    /* The handlers need the server, so they are registered with it as their
     * user pointer rather than through a generated (static) impl table. */
    int rc = vrpc_server_register(s, &verbrpc__health__v1__health__check__method, health_check, s);

    if (rc == 0)
        rc = vrpc_server_register(s, &verbrpc__stats__v1__stats__get__method, stats_get, s);
    if (rc == 0)
        rc = vrpc_reflection_register(s);
    return rc;
}

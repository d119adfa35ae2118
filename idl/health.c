/* The health service (verbrpc.health.v1.Health, as gRPC's grpc.health.v1):
 * SERVING for the server, or for one of the services it has methods of
 * (NOT_SERVING after vrpc_server_set_serving(s, false)). */
#include "builtins.h"

#include <string.h>

#include <verbrpc/health.vrpc.h>

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
    resp.status = vrpc_server_serving(user) ? VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                            : VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    verbrpc__health__v1__health__check__respond(call, &resp);
}

int vrpc_health_register(struct vrpc_server *s)
{
    /* The handler needs the server, so it is registered with it as its user
     * pointer rather than through a generated (static) impl table. */
    return vrpc_server_register(s, &verbrpc__health__v1__health__check__method, health_check, s);
}

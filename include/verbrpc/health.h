/* verbrpc serving status: what every server's health service
 * (verbrpc.health.v1.Health, idl/verbrpc/health.proto, gRPC's semantics)
 * answers to Check and streams to Watch.
 *
 * Without a status set, the server ("") and every service it has methods of
 * are SERVING, and a service it has no method of is unknown (Check: NOT_FOUND;
 * Watch: SERVICE_UNKNOWN until it is set). A status set here overrides that,
 * also for a service with no methods. Once vrpc_server_shutdown() starts,
 * everything is NOT_SERVING: open Watch streams get NOT_SERVING and then end
 * UNAVAILABLE, so that they do not hold the drain up. */
#ifndef VERBRPC_HEALTH_H
#define VERBRPC_HEALTH_H

#include <verbrpc/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The values of HealthCheckResponse.ServingStatus. */
enum vrpc_serving_status {
    VRPC_HEALTH_UNKNOWN = 0,
    VRPC_HEALTH_SERVING = 1,
    VRPC_HEALTH_NOT_SERVING = 2,
    VRPC_HEALTH_SERVICE_UNKNOWN = 3, /* Watch only: the service is not known (yet) */
};

/* Set service's status ("pkg.Service", or "" for the server as a whole;
 * copied) to SERVING or NOT_SERVING; every Watch of it gets the new status
 * if it differs from the last one it got (a slow watcher gets the latest,
 * not every step). Any thread, before or after vrpc_server_start(). Returns
 * 0, -EINVAL (NULL argument, another status), -ESHUTDOWN once
 * vrpc_server_shutdown() has started, -ENOMEM. */
VRPC_API int vrpc_server_set_serving_status(struct vrpc_server *s, const char *service,
                                            enum vrpc_serving_status status);

#ifdef __cplusplus
}
#endif
#endif

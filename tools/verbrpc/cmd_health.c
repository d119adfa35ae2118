/* verbrpc health: grpc_health_probe for verbrpc servers, with its exit codes. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <verbrpc/health.vrpc.h>

#include "tool.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: verbrpc health [--timeout DUR] URI [SERVICE]\n"
                 "Calls verbrpc.health.v1.Health/Check, about SERVICE (\"pkg.Service\") or, without\n"
                 "it, the server as a whole, and prints \"status: SERVING\" or what went wrong.\n"
                 "  --timeout DUR  for connecting and for the call (\"1s\", \"250ms\"; default 10s)\n"
                 "Exit codes (grpc_health_probe's): 0 SERVING; 1 bad arguments; 2 connection failed\n"
                 "or timed out; 3 the call failed or timed out (NOT_FOUND: unknown service); 4 the\n"
                 "server answered with a status other than SERVING.\n");
}

int cmd_health(int argc, char **argv)
{
    static const struct option opts[] = {
        {"timeout", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Verbrpc__Health__V1__HealthCheckResponse *resp;
    int64_t timeout_us = TOOL_TIMEOUT_DEFAULT_MS * 1000LL;
    struct tool_conn c;
    struct vrpc_status st;
    int opt, rc;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return EXIT_OK;
        }
        if (opt != 't' || !tool_parse_duration(optarg, &timeout_us)) {
            if (opt == 't')
                fprintf(stderr, "verbrpc health: bad --timeout '%s'\n", optarg);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (argc - optind < 1 || argc - optind > 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if ((rc = tool_connect(&c, argv[optind], timeout_us)) != 0)
        return rc;
    req.service = argc - optind == 2 ? argv[optind + 1] : "";
    struct vrpc_call_opts o = tool_call_opts(&c, NULL, 0);
    if (verbrpc__health__v1__health__check__call(c.ch, &req, &resp, &o, &st) != VRPC_OK) {
        rc = tool_rpc_failed("health check", &st);
    } else {
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &verbrpc__health__v1__health_check_response__serving_status__descriptor, resp->status);
        const char *name = v ? v->name : "UNKNOWN";

        if (resp->status == VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
            printf("status: %s\n", name);
            rc = EXIT_OK;
        } else {
            fprintf(stderr, "verbrpc: service unhealthy (responded with \"%s\")\n", name);
            rc = EXIT_UNHEALTHY;
        }
    }
    tool_disconnect(&c);
    return rc;
}

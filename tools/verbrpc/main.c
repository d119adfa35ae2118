/* verbrpc: the command-line tool for verbrpc servers (health probe,
 * statistics, reflection, calls from JSON). One binary, one subcommand per
 * job; each has --help. Exit codes are in tool.h and in `verbrpc --help`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/reflection.vrpc.h>
#include <verbrpc/version.h>

#include "tool.h"
#ifdef VRPC_TOOL_DOCTOR
#include "tools/doctor/doctor.h"

/* verbrpc doctor: the RDMA host check of tools/doctor (exit 0 all fine, 1
 * problems found, 2 usage error). */
static int cmd_doctor(int argc, char **argv)
{
    argv[0] = "verbrpc doctor";
    return vrpc_doctor_main(argc, argv);
}
#endif

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"health", cmd_health, "health URI [SERVICE]         check health, exit 0 only if SERVING"},
    {"stats", cmd_stats, "stats URI [--json]           per-method calls, errors and latency"},
    {"list", cmd_list, "list URI [SERVICE]           the services served, or a service's methods"},
    {"describe", cmd_describe, "describe URI SYMBOL          a service, method, message or enum, as .proto"},
    {"call", cmd_call, "call URI METHOD [JSON | -]   call a method with a JSON request, print the JSON response"},
#ifdef VRPC_TOOL_DOCTOR
    {"doctor", cmd_doctor, "doctor [--peer IP]           check this host's RDMA setup (devices, GIDs, MTU, memlock)"},
#endif
};

static void usage(FILE *out)
{
    fprintf(out, "usage: verbrpc COMMAND [OPTIONS] ARGS\n"
                 "A command-line client for verbrpc servers. URI is tcp://host:port, verbs://ip:port or\n"
                 "host:port (verbs where an RDMA device serves it, else TCP). Commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %s\n", commands[i].summary);
    fprintf(out, "`verbrpc COMMAND --help` describes a command and its options.\n"
                 "Exit codes: 0 success; 1 bad arguments or input; 2 connection failure; 3 the RPC\n"
                 "failed (its status is printed); 4 (health) the server answered but not SERVING.\n"
                 "doctor: 0 all fine, 1 problems found (each with the command that fixes it), 2 usage.\n"
                 "Traffic is neither authenticated nor encrypted.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("verbrpc %s\n", VRPC_VERSION_STRING);
        return EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "verbrpc: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}

/* ---- shared ------------------------------------------------------------- */

bool tool_parse_duration(const char *s, int64_t *us)
{
    char *end;
    double v = strtod(s, &end);
    double mult;

    if (end == s || v < 0)
        return false;
    if (*end == '\0' || strcmp(end, "s") == 0)
        mult = 1e6;
    else if (strcmp(end, "ms") == 0)
        mult = 1e3;
    else if (strcmp(end, "us") == 0)
        mult = 1;
    else if (strcmp(end, "m") == 0)
        mult = 60e6;
    else
        return false;
    if (v * mult > 1e15)
        return false;
    *us = (int64_t)(v * mult);
    return *us > 0;
}

int tool_connect(struct tool_conn *c, const char *uri, int64_t timeout_us)
{
    struct vrpc_channel_opts o;
    int64_t ms = (timeout_us + 999) / 1000;
    int rc;

    vrpc_channel_opts_init(&o);
    o.threads = 1;
    o.no_spin = true; /* a tool: sleep, never spin */
    o.connect_timeout_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    c->uri = uri;
    c->timeout_us = timeout_us;
    rc = vrpc_channel_create(uri, &o, &c->ch);
    if (rc) {
        fprintf(stderr, "verbrpc: cannot use '%s': %s\n", uri, strerror(-rc));
        return EXIT_USAGE;
    }
    rc = vrpc_channel_connect(c->ch, ms > INT32_MAX ? INT32_MAX : (int)ms);
    if (rc == -EINVAL) { /* a URI that cannot be connected to as written: a bad argument */
        fprintf(stderr, "verbrpc: cannot connect to '%s': %s\n", uri, strerror(-rc));
        tool_disconnect(c);
        return EXIT_USAGE;
    }
    if (rc) {
        fprintf(stderr, "verbrpc: failed to connect to %s: %s\n", uri, rc == -ETIMEDOUT ? "timed out" : strerror(-rc));
        tool_disconnect(c);
        return EXIT_CONNECT;
    }
    return 0;
}

void tool_disconnect(struct tool_conn *c)
{
    vrpc_channel_destroy(c->ch);
    c->ch = NULL;
    vrpc_thread_release();
}

struct vrpc_call_opts tool_call_opts(const struct tool_conn *c, const struct vrpc_metadata *md, size_t n_md)
{
    struct vrpc_call_opts o = {.timeout_us = c->timeout_us, .md = md, .md_count = n_md};

    return o;
}

int tool_rpc_failed(const char *what, const struct vrpc_status *st)
{
    fprintf(stderr, "verbrpc: %s failed: %s%s%s\n", what, vrpc_code_name(st->code), st->message[0] ? ": " : "",
            st->message);
    return EXIT_RPC;
}

int tool_reflect(struct tool_conn *c, struct descpool *pool, const char *name, bool by_file, struct vrpc_status *st)
{
    Verbrpc__Reflection__V1__FileDescriptorResponse *resp;
    struct vrpc_call_opts o = tool_call_opts(c, NULL, 0);
    int code;

    if (by_file) {
        Verbrpc__Reflection__V1__FileByFilenameRequest req = VERBRPC__REFLECTION__V1__FILE_BY_FILENAME_REQUEST__INIT;

        req.filename = (char *)name;
        code = verbrpc__reflection__v1__reflection__file_by_filename__call(c->ch, &req, &resp, &o, st);
    } else {
        Verbrpc__Reflection__V1__FileContainingSymbolRequest req =
            VERBRPC__REFLECTION__V1__FILE_CONTAINING_SYMBOL_REQUEST__INIT;

        req.symbol = (char *)name;
        code = verbrpc__reflection__v1__reflection__file_containing_symbol__call(c->ch, &req, &resp, &o, st);
    }
    if (code != VRPC_OK)
        return code;
    for (size_t i = 0; i < resp->n_file_descriptor_proto; i++) {
        if (descpool_add(pool, resp->file_descriptor_proto[i].data, resp->file_descriptor_proto[i].len) != 0) {
            st->code = VRPC_INTERNAL;
            snprintf(st->message, sizeof(st->message), "the server sent a descriptor that does not parse");
            return VRPC_INTERNAL;
        }
    }
    return VRPC_OK;
}

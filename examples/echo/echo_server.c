/* echo_server: serves examples.echo.v1.Echo (and the built-in Health and
 * Stats services) until Ctrl-C, then shuts down gracefully.
 *   echo_server [--listen URI] [--threads N] [--pollers N] [--uri-file PATH] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/verbrpc.h>

#include "echo/echo.vrpc.h"
#include "ex_util.h"

static void say(struct vrpc_server_call *call, const Examples__Echo__V1__EchoRequest *req, void *user)
{
    Examples__Echo__V1__EchoReply reply = EXAMPLES__ECHO__V1__ECHO_REPLY__INIT;

    (void)user;
    /* The reply points into the request: it is packed before respond returns,
     * and the request stays valid until then. */
    reply.text = req->text;
    reply.payload = req->payload;
    examples__echo__v1__echo__say__respond(call, &reply);
}

static const Examples__Echo__V1__Echo_VrpcImpl echo_impl = {.say = say};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--listen URI] [--threads N] [--pollers N] [--uri-file PATH]\n"
            "  --listen URI      where to listen: tcp://HOST:PORT, verbs://IP:PORT (IP of an RDMA\n"
            "                    device), auto://HOST:PORT or HOST:PORT (default tcp://127.0.0.1:7070;\n"
            "                    port 0 picks a free one)\n"
            "  --threads N       scheduler workers running handlers (default 2)\n"
            "  --pollers N       transport poller threads (default 1)\n"
            "  --uri-file PATH   write the bound URI to PATH once listening\n"
            "Serves examples.echo.v1.Echo plus verbrpc's Health and Stats; Ctrl-C stops it.\n",
            argv0);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"listen", required_argument, NULL, 'l'},  {"threads", required_argument, NULL, 't'},
        {"pollers", required_argument, NULL, 'p'}, {"uri-file", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *listen_uri = "tcp://127.0.0.1:7070", *uri_file = NULL;
    struct vrpc_server_opts o;
    struct vrpc_server *s = NULL;
    unsigned long long v;
    char bound[256];
    int c, rc;

    ex_block_signals();
    vrpc_server_opts_init(&o);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'l':
            listen_uri = optarg;
            break;
        case 'u':
            uri_file = optarg;
            break;
        case 't':
        case 'p':
            if (!ex_parse_uint(optarg, &v) || v == 0 || v > 1024) {
                fprintf(stderr, "%s: --%s wants a number from 1 to 1024\n", argv[0], c == 't' ? "threads" : "pollers");
                return 2;
            }
            if (c == 't')
                o.threads = (unsigned)v;
            else
                o.pollers = (unsigned)v;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }

    rc = vrpc_server_create(&o, &s);
    if (rc == 0)
        rc = examples__echo__v1__echo__vrpc_register(s, &echo_impl);
    if (rc == 0)
        rc = vrpc_server_start(s, listen_uri);
    if (rc == 0)
        rc = vrpc_server_uri(s, bound, sizeof(bound));
    if (rc != 0) {
        fprintf(stderr, "echo_server: cannot serve on %s: %s\n", listen_uri, strerror(-rc));
        vrpc_server_destroy(s);
        return 1;
    }
    printf("echo_server: listening on %s\n", bound);
    fflush(stdout);
    if (uri_file && (rc = ex_write_file(uri_file, bound)) != 0)
        fprintf(stderr, "echo_server: cannot write %s: %s\n", uri_file, strerror(-rc));

    ex_wait_for_signal();
    rc = vrpc_server_shutdown(s, 2000);
    printf("echo_server: shut down%s\n", rc == 0 ? "" : " (calls still in flight were dropped)");
    vrpc_server_destroy(s);
    return 0;
}

/* echo_client: calls examples.echo.v1.Echo/Say and prints the answer and the
 * round-trip time.
 *   echo_client [--connect URI] [--threads N] [--count N] [TEXT...] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/verbrpc.h>

#include "echo/echo.vrpc.h"
#include "ex_util.h"

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--connect URI] [--threads N] [--count N] [TEXT...]\n"
            "  --connect URI   the server: tcp://HOST:PORT, verbs://IP:PORT, auto://HOST:PORT or\n"
            "                  HOST:PORT (default tcp://127.0.0.1:7070)\n"
            "  --threads N     scheduler workers for callbacks (default 2)\n"
            "  --count N       send the text N times (default 1); prints the last answer and\n"
            "                  the round-trip times\n"
            "Sends TEXT (default \"hello\") to examples.echo.v1.Echo/Say.\n",
            argv0);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"connect", required_argument, NULL, 'c'},
        {"threads", required_argument, NULL, 't'},
        {"count", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *uri = "tcp://127.0.0.1:7070";
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch = NULL;
    unsigned long long v, count = 1;
    char text[1024] = "";
    struct ex_hist *hist;
    int c, rc, code = VRPC_OK;

    vrpc_channel_opts_init(&o);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            uri = optarg;
            break;
        case 't':
        case 'n':
            if (!ex_parse_uint(optarg, &v) || v == 0 || (c != 'n' && v > 1024)) {
                fprintf(stderr, "%s: bad number '%s'\n", argv[0], optarg);
                return 2;
            }
            if (c == 't')
                o.threads = (unsigned)v;
            else
                count = v;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (i > optind)
            strncat(text, " ", sizeof(text) - strlen(text) - 1);
        strncat(text, argv[i], sizeof(text) - strlen(text) - 1);
    }
    if (!text[0])
        strcpy(text, "hello");

    rc = vrpc_channel_create(uri, &o, &ch);
    if (rc != 0) {
        fprintf(stderr, "echo_client: bad URI %s: %s\n", uri, strerror(-rc));
        return 2;
    }
    hist = calloc(1, sizeof(*hist));
    if (!hist) {
        vrpc_channel_destroy(ch);
        return 1;
    }
    for (unsigned long long i = 0; i < count; i++) {
        Examples__Echo__V1__EchoRequest req = EXAMPLES__ECHO__V1__ECHO_REQUEST__INIT;
        Examples__Echo__V1__EchoReply *reply;
        struct vrpc_status st;
        int64_t t0 = ex_now_ns();

        req.text = text;
        code = examples__echo__v1__echo__say__call(ch, &req, &reply, NULL, &st);
        if (code != VRPC_OK) {
            fprintf(stderr, "echo_client: %s: %s %s\n", uri, vrpc_code_name(st.code), st.message);
            break;
        }
        ex_hist_add(hist, ex_now_ns() - t0);
        if (i + 1 == count)
            printf("echo_client: %s answered \"%s\"\n", uri, reply->text);
    }
    if (code == VRPC_OK)
        printf("echo_client: %llu call(s), round trip p50 %.1f us, max %.1f us\n", count,
               ex_hist_quantile(hist, 0.5) / 1e3, ex_hist_quantile(hist, 1.0) / 1e3);
    free(hist);
    vrpc_channel_destroy(ch);
    return code == VRPC_OK ? 0 : 1;
}

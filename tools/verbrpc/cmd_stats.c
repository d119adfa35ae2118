/* verbrpc stats: the Stats service's snapshot, as a table, JSON or Prometheus
 * text. Each output format is one function of the table `formats`. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/metrics.h>
#include <verbrpc/stats.vrpc.h>

#include "pbjson.h"
#include "tool.h"

typedef Verbrpc__Stats__V1__GetStatsResponse Stats;

static int print_table(const Stats *r)
{
    int w = 6; /* "METHOD" */

    for (size_t i = 0; i < r->n_methods; i++)
        if ((int)strlen(r->methods[i]->method) > w)
            w = (int)strlen(r->methods[i]->method);
    printf("%-*s %10s %8s %8s %8s %8s %8s  %s\n", w, "METHOD", "CALLS", "ERRORS", "P50_US", "P90_US", "P99_US",
           "MAX_US", "ERRORS_BY_CODE");
    for (size_t i = 0; i < r->n_methods; i++) {
        const Verbrpc__Stats__V1__MethodStats *m = r->methods[i];

        printf("%-*s %10" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " ", w, m->method,
               m->calls, m->errors, m->latency_p50_us, m->latency_p90_us, m->latency_p99_us, m->latency_max_us);
        for (size_t k = 0; k < m->n_errors_by_code; k++)
            printf("%s%s=%" PRIu64, k ? "," : " ", m->errors_by_code[k]->code, m->errors_by_code[k]->count);
        printf("%s\n", m->n_errors_by_code ? "" : " -");
    }
    return EXIT_OK;
}

/* Protobuf's JSON mapping of the response, from stats.proto's own embedded
 * descriptor: what `verbrpc call URI verbrpc.stats.v1.Stats/Get` prints. */
static int print_json(const Stats *r)
{
    size_t len = verbrpc__stats__v1__get_stats_response__get_packed_size(r);
    uint8_t *buf = malloc(len ? len : 1);
    struct descpool pool;
    char err[PBJSON_ERR_MAX];
    json_t *j = NULL;
    int rc = EXIT_RPC;

    descpool_init(&pool);
    if (buf) {
        verbrpc__stats__v1__get_stats_response__pack(r, buf);
        if (descpool_add(&pool, verbrpc_2fstats_2eproto__vrpc_file.data, verbrpc_2fstats_2eproto__vrpc_file.len) == 0)
            j = pbjson_decode(&pool, "verbrpc.stats.v1.GetStatsResponse", buf, len, err, sizeof(err));
    }
    if (j) {
        char *s = pbjson_dumps(j, 2);

        printf("%s\n", s);
        free(s);
        rc = EXIT_OK;
    } else {
        fprintf(stderr, "verbrpc stats: cannot convert the response to JSON\n");
    }
    json_decref(j);
    descpool_free(&pool);
    free(buf);
    return rc;
}

/* Prometheus text of the Stats figures (vrpc_stats_prometheus_text): for a
 * server without a metrics endpoint, or a one-off scrape from a script. */
static int print_prometheus(const Stats *r)
{
    char *t;
    size_t len;

    if (vrpc_stats_prometheus_text(r, "", &t, &len)) {
        fprintf(stderr, "verbrpc stats: cannot render the response as Prometheus text\n");
        return EXIT_RPC;
    }
    fwrite(t, 1, len, stdout);
    free(t);
    return EXIT_OK;
}

static const struct {
    const char *flag; /* NULL: the default */
    int (*print)(const Stats *r);
} formats[] = {
    {NULL, print_table},
    {"json", print_json},
    {"prometheus", print_prometheus},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: verbrpc stats [--timeout DUR] [--prefix P] [--json | --prometheus] URI\n"
                 "Calls verbrpc.stats.v1.Stats/Get: per registered method, answered calls, errors\n"
                 "(by status code) and latency percentiles in microseconds (request arrival to\n"
                 "response sent).\n"
                 "  --json         the response in protobuf's JSON mapping instead of a table\n"
                 "  --prometheus   the figures as Prometheus text (vrpc_stats_* series)\n"
                 "  --prefix P     only methods whose full name starts with P (\"/pkg.Service/\")\n"
                 "  --timeout DUR  for connecting and for the call (default 10s)\n"
                 "Exit codes: 0; 1 bad arguments; 2 connection failed; 3 the call failed.\n");
}

int cmd_stats(int argc, char **argv)
{
    enum { OPT_TIMEOUT = 256, OPT_PREFIX, OPT_FORMAT };
    static const struct option opts[] = {{"timeout", required_argument, NULL, OPT_TIMEOUT},
                                         {"prefix", required_argument, NULL, OPT_PREFIX},
                                         {"json", no_argument, NULL, OPT_FORMAT},
                                         {"prometheus", no_argument, NULL, OPT_FORMAT},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    Verbrpc__Stats__V1__GetStatsRequest req = VERBRPC__STATS__V1__GET_STATS_REQUEST__INIT;
    Stats *resp;
    int64_t timeout_us = TOOL_TIMEOUT_DEFAULT_MS * 1000LL;
    size_t format = 0;
    struct tool_conn c;
    struct vrpc_status st;
    int opt, idx, rc;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return EXIT_OK;
        case OPT_TIMEOUT:
            if (!tool_parse_duration(optarg, &timeout_us)) {
                fprintf(stderr, "verbrpc stats: bad --timeout '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_PREFIX:
            req.method_prefix = optarg;
            break;
        case OPT_FORMAT:
            for (format = 1; format < sizeof(formats) / sizeof(formats[0]); format++)
                if (strcmp(formats[format].flag, opts[idx].name) == 0)
                    break;
            break;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (argc - optind != 1) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if ((rc = tool_connect(&c, argv[optind], timeout_us)) != 0)
        return rc;
    struct vrpc_call_opts o = tool_call_opts(&c, NULL, 0);
    if (verbrpc__stats__v1__stats__get__call(c.ch, &req, &resp, &o, &st) != VRPC_OK)
        rc = tool_rpc_failed("stats", &st);
    else
        rc = formats[format].print(resp);
    tool_disconnect(&c);
    return rc;
}

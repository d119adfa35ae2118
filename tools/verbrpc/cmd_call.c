/* verbrpc call: a request built from JSON by the method's descriptor (from
 * the server's reflection service or a descriptor set), sent as raw bytes
 * (rawcall.h), and the response printed as JSON (pbjson.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"
#include "rawcall.h"
#include "tool.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: verbrpc call [OPTIONS] URI METHOD [JSON | -]\n"
                 "Calls METHOD (\"pkg.Service/Method\", \"pkg.Service.Method\" or \"/pkg.Service/Method\")\n"
                 "with the request JSON (default {}; - reads it from standard input), in protobuf's\n"
                 "JSON mapping (lowerCamelCase or .proto field names, 64-bit integers as strings or\n"
                 "numbers, bytes as base64, enums by name or number, well-known types in their JSON\n"
                 "forms), and prints the response the same way (lowerCamelCase, 64-bit integers as\n"
                 "strings, fields with default values left out).\n"
                 "  --descriptor-set FILE  the method's types from FILE (protoc --descriptor_set_out\n"
                 "                         --include_imports) instead of the server's reflection service\n"
                 "  --metadata K=V         send metadata K with value V (repeatable; keys [a-z0-9-_.])\n"
                 "  --timeout DUR          deadline of the call, and of connecting (default 10s)\n"
                 "  --compact              print the response on one line\n"
                 "Exit codes: 0 OK; 1 bad arguments or JSON; 2 connection failed; 3 the call failed\n"
                 "(its status code and message are printed on standard error).\n");
}

static char *read_all(FILE *fp)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);

    while (buf) {
        size_t n = fread(buf + len, 1, cap - len - 1, fp);

        len += n;
        if (n == 0)
            break;
        if (cap - len < 2) {
            char *b = realloc(buf, cap * 2);

            if (!b) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
    }
    if (buf)
        buf[len] = '\0';
    return buf;
}

struct call_args {
    const char *uri, *method, *json, *set;
    struct vrpc_metadata md[VRPC_MD_MAX];
    size_t n_md;
    int64_t timeout_us;
    bool compact;
};

static int parse_args(int argc, char **argv, struct call_args *a)
{
    enum { OPT_TIMEOUT = 256, OPT_SET, OPT_MD, OPT_COMPACT };
    static const struct option opts[] = {{"timeout", required_argument, NULL, OPT_TIMEOUT},
                                         {"descriptor-set", required_argument, NULL, OPT_SET},
                                         {"metadata", required_argument, NULL, OPT_MD},
                                         {"compact", no_argument, NULL, OPT_COMPACT},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int opt;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return -1;
        case OPT_TIMEOUT:
            if (!tool_parse_duration(optarg, &a->timeout_us)) {
                fprintf(stderr, "verbrpc call: bad --timeout '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_SET:
            a->set = optarg;
            break;
        case OPT_MD: {
            char *eq = strchr(optarg, '=');

            if (!eq || eq == optarg || a->n_md == VRPC_MD_MAX) {
                fprintf(stderr, "verbrpc call: bad --metadata '%s' (K=V, at most %d)\n", optarg, VRPC_MD_MAX);
                return EXIT_USAGE;
            }
            *eq = '\0'; /* argv is ours to cut */
            a->md[a->n_md++] = (struct vrpc_metadata){.key = optarg, .value = eq + 1, .value_len = strlen(eq + 1)};
            break;
        }
        case OPT_COMPACT:
            a->compact = true;
            break;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (argc - optind < 2 || argc - optind > 3) {
        usage(stderr);
        return EXIT_USAGE;
    }
    a->uri = argv[optind];
    a->method = argv[optind + 1];
    a->json = argc - optind == 3 ? argv[optind + 2] : "{}";
    return 0;
}

/* The service name of METHOD, for the reflection service. */
static bool service_of(const char *method, char *buf, size_t len)
{
    const char *m = method + (method[0] == '/');
    const char *sep = strrchr(m, '/');

    if (!sep)
        sep = strrchr(m, '.');
    if (!sep || sep == m || (size_t)(sep - m) >= len)
        return false;
    memcpy(buf, m, (size_t)(sep - m));
    buf[sep - m] = '\0';
    return true;
}

int cmd_call(int argc, char **argv)
{
    struct call_args a = {.timeout_us = TOOL_TIMEOUT_DEFAULT_MS * 1000LL};
    struct tool_conn c = {0};
    struct descpool pool;
    struct vrpc_status st;
    struct pbbuf req = {0};
    char svc_name[512], full[1024], err[PBJSON_ERR_MAX];
    const struct dp_sym *svc;
    const DpMethod *m;
    json_t *in = NULL, *out;
    json_error_t jerr;
    char *text = NULL;
    uint8_t *resp = NULL;
    size_t resp_len;
    int rc = parse_args(argc, argv, &a);

    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (!service_of(a.method, svc_name, sizeof(svc_name))) {
        fprintf(stderr, "verbrpc call: '%s' is not a method name (pkg.Service/Method)\n", a.method);
        return EXIT_USAGE;
    }
    if (strcmp(a.json, "-") == 0 && !(text = read_all(stdin))) {
        fprintf(stderr, "verbrpc call: cannot read the request from standard input\n");
        return EXIT_USAGE;
    }
    in = json_loads(text ? text : a.json, JSON_DECODE_ANY, &jerr);
    free(text);
    if (!in) {
        fprintf(stderr, "verbrpc call: the request is not JSON: %s (line %d, column %d)\n", jerr.text, jerr.line,
                jerr.column);
        return EXIT_USAGE;
    }
    descpool_init(&pool);
    if (a.set && (rc = descpool_load_set(&pool, a.set)) != 0) {
        fprintf(stderr, "verbrpc call: cannot read descriptor set %s: %s\n", a.set, strerror(-rc));
        rc = EXIT_USAGE;
        goto out;
    }
    if ((rc = tool_connect(&c, a.uri, a.timeout_us)) != 0)
        goto out;
    if (!a.set && tool_reflect(&c, &pool, svc_name, false, &st) != VRPC_OK) {
        rc = tool_rpc_failed("looking the service up by reflection", &st);
        if (st.code == VRPC_NOT_FOUND) /* e.g. methods registered with hand-written descriptors */
            fprintf(stderr,
                    "verbrpc call: the server has no descriptor of %s; pass --descriptor-set FILE "
                    "(protoc --descriptor_set_out=FILE --include_imports)\n",
                    svc_name);
        goto out;
    }
    if (!descpool_method(&pool, a.method, &svc, &m)) {
        fprintf(stderr, "verbrpc call: no method %s in %s\n", a.method, a.set ? a.set : "the server's descriptors");
        rc = EXIT_USAGE;
        goto out;
    }
    if (pbjson_encode(&pool, m->input_type, in, &req, err, sizeof(err)) != 0) {
        fprintf(stderr, "verbrpc call: bad request for %s: %s\n", m->input_type + 1, err);
        rc = EXIT_USAGE;
        goto out;
    }
    snprintf(full, sizeof(full), "/%s/%s", svc->full, m->name);
    struct vrpc_call_opts o = tool_call_opts(&c, a.md, a.n_md);
    if (rawcall(c.ch, full, req.data, req.len, &o, &resp, &resp_len, &st) != VRPC_OK) {
        rc = tool_rpc_failed(full + 1, &st);
        goto out;
    }
    if (!(out = pbjson_decode(&pool, m->output_type, resp, resp_len, err, sizeof(err)))) {
        fprintf(stderr, "verbrpc call: the response does not decode as %s: %s\n", m->output_type + 1, err);
        rc = EXIT_RPC;
        goto out;
    }
    text = pbjson_dumps(out, a.compact ? 0 : 2);
    printf("%s\n", text);
    free(text);
    json_decref(out);
    rc = EXIT_OK;
out:
    free(resp);
    pbbuf_free(&req);
    json_decref(in);
    descpool_free(&pool);
    if (c.ch)
        tool_disconnect(&c);
    return rc;
}

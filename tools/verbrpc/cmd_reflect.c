/* verbrpc list / describe: the server's services and their descriptors,
 * through its reflection service, printed as .proto text. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/reflection.vrpc.h>

#include "tool.h"

/* --timeout and --help, shared by both; --descriptor-set for describe. */
static int parse(int argc, char **argv, const char *cmd, void (*usage)(FILE *), int64_t *timeout_us, const char **set)
{
    enum { OPT_TIMEOUT = 256, OPT_SET };
    static const struct option opts[] = {{"timeout", required_argument, NULL, OPT_TIMEOUT},
                                         {"descriptor-set", required_argument, NULL, OPT_SET},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int opt;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return -1;
        }
        if (opt == OPT_TIMEOUT && tool_parse_duration(optarg, timeout_us))
            continue;
        if (opt == OPT_SET && set) {
            *set = optarg;
            continue;
        }
        if (opt == OPT_TIMEOUT)
            fprintf(stderr, "verbrpc %s: bad --timeout '%s'\n", cmd, optarg);
        usage(stderr);
        return EXIT_USAGE;
    }
    return 0;
}

static void list_usage(FILE *out)
{
    fprintf(out, "usage: verbrpc list [--timeout DUR] URI [SERVICE]\n"
                 "The full names of the services the server has methods of (its reflection\n"
                 "service's ListServices), one a line; with SERVICE, its methods (\"pkg.Service.Method\").\n"
                 "  --timeout DUR  for connecting and for each call (default 10s)\n"
                 "Exit codes: 0; 1 bad arguments; 2 connection failed; 3 a call failed (NOT_FOUND: no\n"
                 "such service).\n");
}

int cmd_list(int argc, char **argv)
{
    Verbrpc__Reflection__V1__ListServicesRequest req = VERBRPC__REFLECTION__V1__LIST_SERVICES_REQUEST__INIT;
    Verbrpc__Reflection__V1__ListServicesResponse *resp;
    int64_t timeout_us = TOOL_TIMEOUT_DEFAULT_MS * 1000LL;
    struct tool_conn c;
    struct vrpc_status st;
    int rc = parse(argc, argv, "list", list_usage, &timeout_us, NULL);

    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (argc - optind < 1 || argc - optind > 2) {
        list_usage(stderr);
        return EXIT_USAGE;
    }
    const char *service = argc - optind == 2 ? argv[optind + 1] : NULL;
    if ((rc = tool_connect(&c, argv[optind], timeout_us)) != 0)
        return rc;
    if (!service) {
        struct vrpc_call_opts o = tool_call_opts(&c, NULL, 0);

        if (verbrpc__reflection__v1__reflection__list_services__call(c.ch, &req, &resp, &o, &st) != VRPC_OK) {
            rc = tool_rpc_failed("list", &st);
        } else {
            for (size_t i = 0; i < resp->n_services; i++)
                printf("%s\n", resp->services[i]);
        }
    } else {
        struct descpool pool;
        const struct dp_sym *s;

        descpool_init(&pool);
        if (tool_reflect(&c, &pool, service, false, &st) != VRPC_OK) {
            rc = tool_rpc_failed("list", &st);
        } else if (!(s = descpool_find(&pool, service)) || s->kind != DP_SERVICE) {
            fprintf(stderr, "verbrpc list: %s is not a service\n", service);
            rc = EXIT_USAGE;
        } else {
            const DpService *sd = s->d;

            for (size_t i = 0; i < sd->n_method; i++)
                printf("%s.%s\n", s->full, sd->method[i]->name);
        }
        descpool_free(&pool);
    }
    tool_disconnect(&c);
    return rc;
}

/* ---- describe ------------------------------------------------------------- */

static const char *const scalar_names[] = {
    NULL,    "double", "float", "int64",  "uint64", "int32",    "fixed64",  "fixed32", "bool",   "string",
    "group", NULL,     "bytes", "uint32", NULL,     "sfixed32", "sfixed64", "sint32",  "sint64",
};

static const char *field_type(const DpField *f)
{
    if (f->type_name)
        return f->type_name + (f->type_name[0] == '.');
    return f->type < sizeof(scalar_names) / sizeof(scalar_names[0]) && scalar_names[f->type] ? scalar_names[f->type]
                                                                                             : "?";
}

static const DpMsg *map_entry_of(const struct descpool *p, const DpField *f)
{
    const DpMsg *m = f->type_name && f->label == 3 ? descpool_message(p, f->type_name, NULL) : NULL;

    return m && m->options && m->options->map_entry ? m : NULL;
}

static void indent(int n) { printf("%*s", 2 * n, ""); }

static void print_field(const struct descpool *p, const DpField *f, bool proto3, int lvl)
{
    const DpMsg *entry = map_entry_of(p, f);

    indent(lvl);
    if (entry && entry->n_field == 2)
        printf("map<%s, %s>", field_type(entry->field[0]), field_type(entry->field[1]));
    else {
        bool in_oneof = f->has_oneof_index && !f->proto3_optional;
        const char *label = f->label == 3                   ? "repeated "
                            : f->label == 2                 ? "required "
                            : in_oneof                      ? ""
                            : !proto3 || f->proto3_optional ? "optional "
                                                            : "";

        printf("%s%s", label, field_type(f));
    }
    printf(" %s = %d;\n", f->name, f->number);
}

static void print_enum(const DpEnum *e, int lvl)
{
    indent(lvl);
    printf("enum %s {\n", e->name);
    for (size_t i = 0; i < e->n_value; i++) {
        indent(lvl + 1);
        printf("%s = %d;\n", e->value[i]->name, e->value[i]->number);
    }
    indent(lvl);
    printf("}\n");
}

static void print_message(const struct descpool *p, const DpMsg *m, bool proto3, int lvl)
{
    indent(lvl);
    printf("message %s {\n", m->name);
    for (size_t i = 0; i < m->n_nested_type; i++)
        if (!(m->nested_type[i]->options && m->nested_type[i]->options->map_entry))
            print_message(p, m->nested_type[i], proto3, lvl + 1);
    for (size_t i = 0; i < m->n_enum_type; i++)
        print_enum(m->enum_type[i], lvl + 1);
    for (size_t i = 0; i < m->n_field; i++) {
        const DpField *f = m->field[i];

        if (f->has_oneof_index && !f->proto3_optional) {
            /* a real oneof: print it once, with its members, at its first */
            bool first = true;

            for (size_t k = 0; k < i; k++)
                first &= !(m->field[k]->has_oneof_index && m->field[k]->oneof_index == f->oneof_index);
            if (!first)
                continue;
            indent(lvl + 1);
            printf("oneof %s {\n", m->oneof_decl[f->oneof_index]->name);
            for (size_t k = i; k < m->n_field; k++)
                if (m->field[k]->has_oneof_index && m->field[k]->oneof_index == f->oneof_index)
                    print_field(p, m->field[k], proto3, lvl + 2);
            indent(lvl + 1);
            printf("}\n");
            continue;
        }
        print_field(p, f, proto3, lvl + 1);
    }
    indent(lvl);
    printf("}\n");
}

static void print_method(const DpMethod *m, int lvl)
{
    indent(lvl);
    printf("rpc %s(%s) returns (%s);\n", m->name, m->input_type + (m->input_type[0] == '.'),
           m->output_type + (m->output_type[0] == '.'));
}

static void describe_usage(FILE *out)
{
    fprintf(out, "usage: verbrpc describe [--timeout DUR] [--descriptor-set FILE] URI SYMBOL\n"
                 "Prints SYMBOL as .proto text: a service (\"pkg.Service\"), a method (\"pkg.Service.Method\"\n"
                 "or \"pkg.Service/Method\", with its request and response messages), a message or\n"
                 "an enum, from the server's reflection service or from FILE (protoc\n"
                 "--descriptor_set_out --include_imports; then the server is not contacted).\n"
                 "  --timeout DUR  for connecting and for each call (default 10s)\n"
                 "Exit codes: 0; 1 bad arguments or SYMBOL not in FILE; 2 connection failed; 3 a call\n"
                 "failed (NOT_FOUND: the server declares no such symbol).\n");
}

int cmd_describe(int argc, char **argv)
{
    int64_t timeout_us = TOOL_TIMEOUT_DEFAULT_MS * 1000LL;
    const char *set = NULL;
    struct tool_conn c = {0};
    struct vrpc_status st;
    struct descpool pool;
    char sym[512];
    const struct dp_sym *s, *svc;
    const DpMethod *m;
    int rc = parse(argc, argv, "describe", describe_usage, &timeout_us, &set);

    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    if (argc - optind != 2 || strlen(argv[optind + 1]) >= sizeof(sym)) {
        describe_usage(stderr);
        return EXIT_USAGE;
    }
    snprintf(sym, sizeof(sym), "%s", argv[optind + 1] + (argv[optind + 1][0] == '/' || argv[optind + 1][0] == '.'));
    for (char *q = sym; *q; q++)
        if (*q == '/')
            *q = '.';
    descpool_init(&pool);
    if (set) {
        if ((rc = descpool_load_set(&pool, set)) != 0) {
            fprintf(stderr, "verbrpc describe: cannot read descriptor set %s: %s\n", set, strerror(-rc));
            descpool_free(&pool);
            return EXIT_USAGE;
        }
    } else {
        if ((rc = tool_connect(&c, argv[optind], timeout_us)) != 0) {
            descpool_free(&pool);
            return rc;
        }
        if (tool_reflect(&c, &pool, sym, false, &st) != VRPC_OK) {
            rc = tool_rpc_failed("describe", &st);
            goto out;
        }
    }
    rc = EXIT_OK;
    if ((s = descpool_find(&pool, sym))) {
        bool p3 = dp_proto3(s->file);

        printf("%s is a%s (%s):\n", s->full,
               s->kind == DP_MESSAGE ? " message"
               : s->kind == DP_ENUM  ? "n enum"
                                     : " service",
               s->file->name);
        if (s->kind == DP_MESSAGE) {
            print_message(&pool, s->d, p3, 0);
        } else if (s->kind == DP_ENUM) {
            print_enum(s->d, 0);
        } else {
            const DpService *sd = s->d;

            printf("service %s {\n", sd->name);
            for (size_t i = 0; i < sd->n_method; i++)
                print_method(sd->method[i], 1);
            printf("}\n");
        }
    } else if (descpool_method(&pool, sym, &svc, &m)) {
        const DpFile *fi, *fo;
        const DpMsg *in = descpool_message(&pool, m->input_type, &fi),
                    *outm = descpool_message(&pool, m->output_type, &fo);

        printf("%s is a method (%s):\n", sym, svc->file->name);
        print_method(m, 0);
        if (in) {
            printf("\n");
            print_message(&pool, in, dp_proto3(fi), 0);
        }
        if (outm && outm != in) {
            printf("\n");
            print_message(&pool, outm, dp_proto3(fo), 0);
        }
    } else {
        fprintf(stderr, "verbrpc describe: no symbol %s in %s\n", sym, set ? set : "the server's descriptors");
        rc = set ? EXIT_USAGE : EXIT_RPC;
    }
out:
    descpool_free(&pool);
    if (c.ch)
        tool_disconnect(&c);
    return rc;
}

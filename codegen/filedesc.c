/* filedesc: embeds each generated file's FileDescriptorProto, and those of
 * its imports, in the generated .vrpc.c, for the reflection service. The
 * bytes are what protoc sent the plugin, repacked by protobuf-c without
 * source_code_info: the same bytes `protoc --descriptor_set_out` writes
 * (tests/codegen/run_output_checks.sh compares them). */
#include "filedesc.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Google__Protobuf__FileDescriptorProto FileProto;
typedef Google__Protobuf__DescriptorProto MsgProto;
typedef Google__Protobuf__Compiler__CodeGeneratorRequest Request;

uint8_t *gen_file_desc_bytes(const FileProto *f, size_t *len)
{
    FileProto copy = *f; /* shallow: only the top-level pointer changes */
    uint8_t *buf;

    copy.source_code_info = NULL;
    *len = google__protobuf__file_descriptor_proto__get_packed_size(&copy);
    buf = malloc(*len ? *len : 1);
    if (!buf) {
        fprintf(stderr, "protoc-gen-verbrpc: out of memory\n");
        exit(1);
    }
    google__protobuf__file_descriptor_proto__pack(&copy, buf);
    return buf;
}

static const FileProto *find(const Request *req, const char *name)
{
    for (size_t i = 0; i < req->n_proto_file; i++)
        if (strcmp(req->proto_file[i]->name, name) == 0)
            return req->proto_file[i];
    return NULL;
}

/* Index of f in the closure list, or -1. */
static long index_of(const FileProto *const *list, size_t n, const FileProto *f)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == f)
            return (long)i;
    return -1;
}

/* Depth-first, imports before importers: the order the C needs. */
static int closure(const Request *req, const FileProto *f, const FileProto **list, size_t *n)
{
    if (index_of(list, *n, f) >= 0)
        return 0;
    for (size_t i = 0; i < f->n_dependency; i++) {
        const FileProto *d = find(req, f->dependency[i]);

        if (!d || closure(req, d, list, n) != 0)
            return -1;
    }
    list[(*n)++] = f;
    return 0;
}

static void emit_string(struct strbuf *c, const char *s)
{
    sb_appendc(c, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            sb_printf(c, "\\%c", *s);
        else if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            sb_printf(c, "\\%03o", (unsigned char)*s);
        else
            sb_appendc(c, *s);
    }
    sb_appendc(c, '"');
}

static void emit_symbol(struct strbuf *c, const char *pkg, const char *prefix, const char *name, size_t *n)
{
    sb_append(c, "    ");
    struct strbuf full = STRBUF_INIT;

    if (pkg && *pkg)
        sb_printf(&full, "%s.", pkg);
    if (prefix)
        sb_printf(&full, "%s.", prefix);
    sb_append(&full, name);
    emit_string(c, full.data ? full.data : "");
    sb_append(c, ",\n");
    sb_free(&full);
    (*n)++;
}

static void emit_msg_symbols(struct strbuf *c, const char *pkg, const char *prefix, MsgProto *const *msgs,
                             size_t n_msgs, size_t *n)
{
    for (size_t i = 0; i < n_msgs; i++) {
        const MsgProto *m = msgs[i];
        struct strbuf rel = STRBUF_INIT;

        emit_symbol(c, pkg, prefix, m->name, n);
        if (prefix)
            sb_printf(&rel, "%s.", prefix);
        sb_append(&rel, m->name);
        for (size_t e = 0; e < m->n_enum_type; e++)
            emit_symbol(c, pkg, rel.data, m->enum_type[e]->name, n);
        emit_msg_symbols(c, pkg, rel.data, m->nested_type, m->n_nested_type, n);
        sb_free(&rel);
    }
}

static void emit_one(struct strbuf *c, const Request *req, const FileProto *f, const char *var, bool exported,
                     const FileProto *const *list, size_t n_list, const char *const *vars)
{
    size_t len, n_sym = 0;
    uint8_t *bytes = gen_file_desc_bytes(f, &len);

    sb_printf(c, "/* %s */\nstatic const uint8_t %s_data[%zu] = {", f->name, var, len ? len : 1);
    for (size_t i = 0; i < len; i++)
        sb_printf(c, "%s0x%02x,", i % 16 ? " " : "\n    ", bytes[i]);
    if (!len)
        sb_append(c, "0");
    sb_append(c, "\n};\n");
    free(bytes);

    sb_printf(c, "static const char *const %s_symbols[] = {\n", var);
    emit_msg_symbols(c, f->package, NULL, f->message_type, f->n_message_type, &n_sym);
    for (size_t e = 0; e < f->n_enum_type; e++)
        emit_symbol(c, f->package, NULL, f->enum_type[e]->name, &n_sym);
    for (size_t s = 0; s < f->n_service; s++) {
        emit_symbol(c, f->package, NULL, f->service[s]->name, &n_sym);
        for (size_t m = 0; m < f->service[s]->n_method; m++)
            emit_symbol(c, f->package, f->service[s]->name, f->service[s]->method[m]->name, &n_sym);
    }
    if (!n_sym)
        sb_append(c, "    NULL,\n");
    sb_append(c, "};\n");

    sb_printf(c, "static const struct vrpc_file_desc *const %s_deps[] = {\n", var);
    for (size_t i = 0; i < f->n_dependency; i++)
        sb_printf(c, "    &%s,\n", vars[index_of(list, n_list, find(req, f->dependency[i]))]);
    if (!f->n_dependency)
        sb_append(c, "    NULL,\n");
    sb_append(c, "};\n");

    sb_printf(c, "%sconst struct vrpc_file_desc %s = {\n    .name = ", exported ? "" : "static ", var);
    emit_string(c, f->name);
    sb_printf(c,
              ",\n    .data = %s_data,\n    .len = %zu,\n"
              "    .symbols = %s_symbols,\n    .n_symbols = %zu,\n"
              "    .deps = %s_deps,\n    .n_deps = %zu,\n};\n\n",
              var, len, var, n_sym, var, f->n_dependency);
}

int gen_emit_file_descs(struct strbuf *c, const Request *req, const FileProto *f, const char *ident)
{
    const FileProto **list = calloc(req->n_proto_file + 1, sizeof(*list));
    char **vars = calloc(req->n_proto_file + 1, sizeof(*vars));
    size_t n = 0;
    int rc = -1;

    if (!list || !vars) {
        fprintf(stderr, "protoc-gen-verbrpc: out of memory\n");
        exit(1);
    }
    if (closure(req, f, list, &n) != 0)
        goto out;
    sb_append(c, "/* ======== descriptors, for the reflection service ======== */\n\n");
    for (size_t i = 0; i < n; i++) {
        struct strbuf v = STRBUF_INIT;

        if (list[i] == f)
            sb_printf(&v, "%s__vrpc_file", ident);
        else
            sb_printf(&v, "vrpc_fd_%zu", i);
        vars[i] = sb_steal(&v);
    }
    for (size_t i = 0; i < n; i++)
        emit_one(c, req, list[i], vars[i], list[i] == f, list, n, (const char *const *)vars);
    rc = 0;
out:
    for (size_t i = 0; i < n; i++)
        free(vars[i]);
    free(vars);
    free(list);
    return rc;
}

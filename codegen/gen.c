/* gen: checks the files protoc asks for and writes their verbrpc stubs.
 * Names of protoc-c's types and descriptors are derived with names.c, the
 * method-id hash is FNV-1a 32 of "/pkg.Service/Method" (vrpc_method_id()).
 * Errors name the file, the line and column protoc recorded, and the reason. */
#include "gen_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"

char *gen_str_printf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- parameter ------------------------------------------------------------ */

bool gen_parse_parameter(const char *param, struct gen_options *opt, char **protoc_c, char **err)
{
    char *copy, *save = NULL;

    opt->export_macro = NULL;
    *protoc_c = NULL;
    *err = NULL;
    if (gen_is_empty(param))
        return true;
    copy = xstrdup(param);
    for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        const char *val = eq ? eq + 1 : "";

        if (eq)
            *eq = '\0';
        if (strcmp(kv, "export_macro") == 0 && *val) {
            opt->export_macro = xstrdup(val);
        } else if (strcmp(kv, "protoc_c") == 0 && *val) {
            *protoc_c = xstrdup(val);
        } else {
            *err = gen_str_printf("unknown or empty generator option '%s' (known: export_macro=NAME, "
                                  "protoc_c=PATH)",
                                  kv);
            free(copy);
            return false;
        }
    }
    free(copy);
    return true;
}

/* ---- protobuf-c's file option c_package -------------------------------------
 * protobuf-c.proto extends FileOptions with field 1019 (ProtobufCFileOptions),
 * whose field 6 is c_package: it replaces the package in protoc-c's C names.
 * Our bootstrap descriptor.proto does not know the extension, so it arrives
 * as an unknown field and is decoded here by hand. */

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;

    for (unsigned shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* Returns field 6 of the ProtobufCFileOptions bytes, or NULL. */
static char *decode_c_package(const uint8_t *p, size_t len)
{
    const uint8_t *end = p + len;
    char *found = NULL;

    while (p < end) {
        uint64_t key, v;

        if (!read_varint(&p, end, &key))
            break;
        switch (key & 7) {
        case 0:
            if (!read_varint(&p, end, &v))
                goto out;
            break;
        case 1:
            if (end - p < 8)
                goto out;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                goto out;
            p += 4;
            break;
        case 2:
            if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p))
                goto out;
            if ((key >> 3) == 6) {
                free(found);
                found = xmalloc(v + 1);
                memcpy(found, p, v);
                found[v] = '\0';
            }
            p += v;
            break;
        default:
            goto out;
        }
    }
out:
    return found;
}

static char *file_c_package(const FileProto *f)
{
    char *pkg = NULL;

    if (!f->options)
        return NULL;
    for (unsigned i = 0; i < f->options->base.n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &f->options->base.unknown_fields[i];

        if (u->tag == 1019 && u->wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) {
            /* protobuf-c keeps the length prefix in a length-delimited
             * unknown field's data. */
            const uint8_t *d = u->data, *end = u->data + u->len;
            uint64_t n;
            char *p;

            if (!read_varint(&d, end, &n) || n > (uint64_t)(end - d))
                continue;
            p = decode_c_package(d, (size_t)n);
            if (p) {
                free(pkg);
                pkg = p;
            }
        }
    }
    return pkg;
}

/* The dotted name protoc-c builds C names from: the package replaced by
 * c_package when the file sets it. rel is the name inside the package. */
static char *c_dotted_name(const FileProto *f, const char *rel)
{
    char *cpkg = file_c_package(f);
    const char *pkg = cpkg ? cpkg : f->package;
    char *r = gen_is_empty(pkg) ? xstrdup(rel) : gen_str_printf("%s.%s", pkg, rel);

    free(cpkg);
    return r;
}

/* ---- symbol table -------------------------------------------------------- */

static void symtab_add_msgs(struct symtab *st, const FileProto *f, const char *rel_prefix, MsgProto *const *msgs,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const MsgProto *m = msgs[i];
        char *rel = rel_prefix ? gen_str_printf("%s.%s", rel_prefix, m->name) : xstrdup(m->name);
        char *dotted = c_dotted_name(f, rel);
        struct msg_sym *s;

        if (st->n == st->cap) {
            st->cap = st->cap ? st->cap * 2 : 64;
            st->v = xrealloc(st->v, st->cap * sizeof(*st->v));
        }
        s = &st->v[st->n++];
        s->full_name =
            gen_is_empty(f->package) ? gen_str_printf(".%s", rel) : gen_str_printf(".%s.%s", f->package, rel);
        s->c_type = pc_full_name_to_c(dotted);
        s->c_lower = pc_full_name_to_lower(dotted);
        free(dotted);
        symtab_add_msgs(st, f, rel, m->nested_type, m->n_nested_type);
        free(rel);
    }
}

const struct msg_sym *gen_symtab_find(const struct symtab *st, const char *full_name)
{
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->v[i].full_name, full_name) == 0)
            return &st->v[i];
    return NULL;
}

static void symtab_free(struct symtab *st)
{
    for (size_t i = 0; i < st->n; i++) {
        free(st->v[i].full_name);
        free(st->v[i].c_type);
        free(st->v[i].c_lower);
    }
    free(st->v);
}

/* ---- source locations ---------------------------------------------------- */

const Google__Protobuf__SourceCodeInfo__Location *gen_find_location(const FileProto *f, const int32_t *path, size_t n)
{
    if (!f->source_code_info)
        return NULL;
    for (size_t i = 0; i < f->source_code_info->n_location; i++) {
        const Google__Protobuf__SourceCodeInfo__Location *l = f->source_code_info->location[i];

        if (l->n_path == n && (n == 0 || memcmp(l->path, path, n * sizeof(*path)) == 0))
            return l;
    }
    return NULL;
}

void gen_svc_names_init(struct svc_names *sn, const FileProto *f, const SvcProto *s)
{
    char *dotted = c_dotted_name(f, s->name);

    sn->full = gen_is_empty(f->package) ? xstrdup(s->name) : gen_str_printf("%s.%s", f->package, s->name);
    sn->c_type = pc_full_name_to_c(dotted);
    sn->lower = pc_full_name_to_lower(dotted);
    sn->upper = pc_full_name_to_upper(dotted);
    free(dotted);
}

void gen_svc_names_free(struct svc_names *sn)
{
    free(sn->full);
    free(sn->c_type);
    free(sn->lower);
    free(sn->upper);
}

/* The impl struct has a `user` member besides the handlers. */
static bool member_reserved(const char *s) { return c_is_keyword(s) || strcmp(s, "user") == 0; }

void gen_method_names_init(struct method_names *mn, const struct svc_names *sn, const MethodProto *m,
                           const struct symtab *st)
{
    char *lower = pc_camel_to_lower(m->name);
    char *upper = pc_camel_to_upper(m->name);
    char *camel = pc_to_camel(m->name);

    mn->full = gen_str_printf("/%s/%s", sn->full, m->name);
    mn->id = vrpc_fnv1a32(mn->full);
    mn->prefix = gen_str_printf("%s__%s", sn->lower, lower);
    mn->upper = gen_str_printf("%s__%s", sn->upper, upper);
    mn->member = member_reserved(lower) ? gen_str_printf("%s_", lower) : xstrdup(lower);
    mn->done_type = gen_str_printf("%s_%s_Done", sn->c_type, camel);
    mn->async_type = gen_str_printf("%s_%s_Async", sn->c_type, camel);
    mn->read_type = gen_str_printf("%s_%s_OnRead", sn->c_type, camel);
    mn->ops_type = gen_str_printf("%s_%s_StreamOps", sn->c_type, camel);
    mn->kind = m->client_streaming && m->server_streaming ? GEN_BIDI_STREAMING
               : m->client_streaming                      ? GEN_CLIENT_STREAMING
               : m->server_streaming                      ? GEN_SERVER_STREAMING
                                                          : GEN_UNARY;
    mn->in = gen_symtab_find(st, m->input_type);
    mn->out = gen_symtab_find(st, m->output_type);
    free(lower);
    free(upper);
    free(camel);
}

void gen_method_names_free(struct method_names *mn)
{
    free(mn->full);
    free(mn->prefix);
    free(mn->upper);
    free(mn->member);
    free(mn->done_type);
    free(mn->async_type);
    free(mn->read_type);
    free(mn->ops_type);
}

const char *gen_kind_enum(enum gen_kind k)
{
    switch (k) {
    case GEN_SERVER_STREAMING:
        return "VRPC_METHOD_SERVER_STREAMING";
    case GEN_CLIENT_STREAMING:
        return "VRPC_METHOD_CLIENT_STREAMING";
    case GEN_BIDI_STREAMING:
        return "VRPC_METHOD_BIDI_STREAMING";
    case GEN_UNARY:
        break;
    }
    return "VRPC_METHOD_UNARY";
}

const char *gen_kind_words(enum gen_kind k)
{
    switch (k) {
    case GEN_SERVER_STREAMING:
        return "server streaming";
    case GEN_CLIENT_STREAMING:
        return "client streaming";
    case GEN_BIDI_STREAMING:
        return "bidirectional streaming";
    case GEN_UNARY:
        break;
    }
    return "unary";
}

/* ---- the driver ----------------------------------------------------------- */

static const FileProto *find_file(const Google__Protobuf__Compiler__CodeGeneratorRequest *req, const char *name)
{
    for (size_t i = 0; i < req->n_proto_file; i++)
        if (strcmp(req->proto_file[i]->name, name) == 0)
            return req->proto_file[i];
    return NULL;
}

void gen_run(const Google__Protobuf__Compiler__CodeGeneratorRequest *req, const struct gen_options *opt,
             struct gen_output *out)
{
    struct symtab st = {0};

    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < req->n_proto_file; i++) {
        const FileProto *f = req->proto_file[i];
        symtab_add_msgs(&st, f, NULL, f->message_type, f->n_message_type);
    }
    for (size_t i = 0; i < req->n_file_to_generate; i++) {
        const FileProto *f = find_file(req, req->file_to_generate[i]);

        if (!f) {
            sb_printf(&out->errors, "%s: not in the request's proto_file list\n", req->file_to_generate[i]);
            continue;
        }
        gen_check_file(out, f, &st);
    }
    if (out->errors.len == 0) {
        for (size_t i = 0; i < req->n_file_to_generate; i++)
            gen_emit_file(out, req, find_file(req, req->file_to_generate[i]), &st, opt);
    }
    symtab_free(&st);
}

void gen_output_free(struct gen_output *out)
{
    for (size_t i = 0; i < out->n_files; i++) {
        free(out->files[i].name);
        free(out->files[i].content);
    }
    free(out->files);
    sb_free(&out->errors);
    memset(out, 0, sizeof(*out));
}

/* ---- making the request digestible for protoc-c --------------------------- */

/* protoc-c's own list (c_helpers.cc kKeywordList): it appends '_' to field
 * names in it by itself, so those are left alone to keep its descriptors'
 * field names as they are. */
static bool protoc_c_escapes_field(const char *s)
{
    static const char *const list[] = {
        "and",
        "and_eq",
        "asm",
        "auto",
        "bitand",
        "bitor",
        "bool",
        "break",
        "case",
        "catch",
        "char",
        "class",
        "compl",
        "const",
        "const_cast",
        "continue",
        "default",
        "delete",
        "do",
        "double",
        "dynamic_cast",
        "else",
        "enum",
        "explicit",
        "extern",
        "false",
        "float",
        "for",
        "friend",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "mutable",
        "namespace",
        "new",
        "not",
        "not_eq",
        "operator",
        "or",
        "or_eq",
        "private",
        "protected",
        "public",
        "register",
        "reinterpret_cast",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "static_cast",
        "struct",
        "switch",
        "template",
        "this",
        "throw",
        "true",
        "try",
        "typedef",
        "typeid",
        "typename",
        "union",
        "unsigned",
        "using",
        "virtual",
        "void",
        "volatile",
        "wchar_t",
        "while",
        "xor",
        "xor_eq",
    };

    for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++)
        if (strcmp(s, list[i]) == 0)
            return true;
    return false;
}

static void rename_with_underscore(char **name)
{
    char *n = gen_str_printf("%s_", *name);

    free(*name);
    *name = n;
}

static void escape_fields(MsgProto **msgs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < msgs[i]->n_field; j++) {
            FieldProto *fd = msgs[i]->field[j];
            char *lower = xstrdup(fd->name);

            for (char *p = lower; *p; p++)
                if (*p >= 'A' && *p <= 'Z')
                    *p = (char)(*p - 'A' + 'a');
            if (c_is_keyword(lower) && !protoc_c_escapes_field(lower))
                rename_with_underscore(&fd->name);
            free(lower);
        }
        escape_fields(msgs[i]->nested_type, msgs[i]->n_nested_type);
    }
}

void gen_escape_for_protoc_c(Google__Protobuf__Compiler__CodeGeneratorRequest *req)
{
    for (size_t i = 0; i < req->n_proto_file; i++) {
        FileProto *f = req->proto_file[i];

        escape_fields(f->message_type, f->n_message_type);
        for (size_t si = 0; si < f->n_service; si++) {
            for (size_t mi = 0; mi < f->service[si]->n_method; mi++) {
                MethodProto *m = f->service[si]->method[mi];
                char *lower = pc_camel_to_lower(m->name);

                if (c_is_keyword(lower))
                    rename_with_underscore(&m->name);
                free(lower);
            }
        }
    }
}

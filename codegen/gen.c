/* gen: checks the files protoc asks for and writes their verbrpc stubs.
 * Names of protoc-c's types and descriptors are derived with names.c, the
 * method-id hash is FNV-1a 32 of "/pkg.Service/Method" (vrpc_method_id()).
 * Errors name the file, the line and column protoc recorded, and the reason. */
#include "gen.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filedesc.h"
#include "names.h"

typedef Google__Protobuf__FileDescriptorProto FileProto;
typedef Google__Protobuf__DescriptorProto MsgProto;
typedef Google__Protobuf__ServiceDescriptorProto SvcProto;
typedef Google__Protobuf__MethodDescriptorProto MethodProto;
typedef Google__Protobuf__FieldDescriptorProto FieldProto;

/* Field numbers used in SourceCodeInfo paths (descriptor.proto). */
enum {
    FILE_MESSAGE_TYPE = 4,
    FILE_SERVICE = 6,
    MSG_FIELD = 2,
    MSG_NESTED_TYPE = 3,
    SVC_METHOD = 2,
    MAX_PATH = 64, /* nesting deeper than this gets no line number, nothing worse */
};

/* One message type known to the request, with protoc-c's C names for it. */
struct msg_sym {
    char *full_name; /* ".pkg.Outer.Inner", as protoc spells type references */
    char *c_type;    /* "Pkg__Outer__Inner" */
    char *c_lower;   /* "pkg__outer__inner": <c_lower>__descriptor */
};

struct symtab {
    struct msg_sym *v;
    size_t n, cap;
};

/* A C identifier the generated code declares, remembered to detect clashes. */
struct ident {
    char *name;
    char *what; /* "method demo.v1.Echo.Say" */
    int32_t path[4];
    size_t n_path;
};

struct idents {
    struct ident *v;
    size_t n, cap;
};

static bool is_empty(const char *s) { return !s || !*s; }

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
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
    if (is_empty(param))
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
            *err = str_printf("unknown or empty generator option '%s' (known: export_macro=NAME, "
                              "protoc_c=PATH)", kv);
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
    char *r = is_empty(pkg) ? xstrdup(rel) : str_printf("%s.%s", pkg, rel);

    free(cpkg);
    return r;
}

/* ---- symbol table -------------------------------------------------------- */

static void symtab_add_msgs(struct symtab *st, const FileProto *f, const char *rel_prefix, MsgProto *const *msgs,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const MsgProto *m = msgs[i];
        char *rel = rel_prefix ? str_printf("%s.%s", rel_prefix, m->name) : xstrdup(m->name);
        char *dotted = c_dotted_name(f, rel);
        struct msg_sym *s;

        if (st->n == st->cap) {
            st->cap = st->cap ? st->cap * 2 : 64;
            st->v = xrealloc(st->v, st->cap * sizeof(*st->v));
        }
        s = &st->v[st->n++];
        s->full_name = is_empty(f->package) ? str_printf(".%s", rel) : str_printf(".%s.%s", f->package, rel);
        s->c_type = pc_full_name_to_c(dotted);
        s->c_lower = pc_full_name_to_lower(dotted);
        free(dotted);
        symtab_add_msgs(st, f, rel, m->nested_type, m->n_nested_type);
        free(rel);
    }
}

static const struct msg_sym *symtab_find(const struct symtab *st, const char *full_name)
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

/* ---- diagnostics --------------------------------------------------------- */

static const Google__Protobuf__SourceCodeInfo__Location *find_location(const FileProto *f, const int32_t *path,
                                                                        size_t n)
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

static void diag(struct gen_output *out, const FileProto *f, const int32_t *path, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void diag(struct gen_output *out, const FileProto *f, const int32_t *path, size_t n, const char *fmt, ...)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = path ? find_location(f, path, n) : NULL;
    va_list ap;
    int len;

    if (l && l->n_span >= 2)
        sb_printf(&out->errors, "%s:%d:%d: ", f->name, l->span[0] + 1, l->span[1] + 1);
    else
        sb_printf(&out->errors, "%s: ", f->name);
    va_start(ap, fmt);
    len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len > 0) {
        char *msg = xmalloc((size_t)len + 1);
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)len + 1, fmt, ap);
        va_end(ap);
        sb_append(&out->errors, msg);
        free(msg);
    }
    sb_appendc(&out->errors, '\n');
}

static int line_of(const FileProto *f, const int32_t *path, size_t n)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = find_location(f, path, n);

    return l && l->n_span >= 1 ? l->span[0] + 1 : 0;
}

/* ---- checks -------------------------------------------------------------- */

/* proto3 `optional` fields: protoc-c 1.4.1 refuses them with a message about
 * "code generator protoc-gen-c hasn't been updated"; say what is going on. */
static void check_optional(struct gen_output *out, const FileProto *f, MsgProto *const *msgs, size_t n,
                           int32_t *path, size_t depth, const char *prefix)
{
    for (size_t i = 0; i < n; i++) {
        const MsgProto *m = msgs[i];
        char *name = prefix ? str_printf("%s.%s", prefix, m->name) : xstrdup(m->name);

        if (depth + 4 > MAX_PATH) {
            free(name);
            continue;
        }
        path[depth] = (int32_t)i;
        for (size_t j = 0; j < m->n_field; j++) {
            const FieldProto *fd = m->field[j];

            if (fd->has_proto3_optional && fd->proto3_optional) {
                path[depth + 1] = MSG_FIELD;
                path[depth + 2] = (int32_t)j;
                diag(out, f, path, depth + 3,
                     "field '%s' of message '%s' is a proto3 'optional' field, which protoc-c 1.4.1 "
                     "(the protobuf-c generator verbrpc builds on) cannot compile; drop 'optional' "
                     "(a scalar then has no presence), wrap the value in a message such as "
                     "google.protobuf.Int32Value, or use a oneof",
                     fd->name, name);
            }
        }
        path[depth + 1] = MSG_NESTED_TYPE;
        check_optional(out, f, m->nested_type, m->n_nested_type, path, depth + 2, name);
        free(name);
    }
}

static void idents_add(struct idents *ids, char *name, char *what, const int32_t *path, size_t n_path)
{
    struct ident *id;

    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 32;
        ids->v = xrealloc(ids->v, ids->cap * sizeof(*ids->v));
    }
    id = &ids->v[ids->n++];
    id->name = name;
    id->what = what;
    memcpy(id->path, path, n_path * sizeof(*path));
    id->n_path = n_path;
}

static void idents_free(struct idents *ids)
{
    for (size_t i = 0; i < ids->n; i++) {
        free(ids->v[i].name);
        free(ids->v[i].what);
    }
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

static void check_clashes(struct gen_output *out, const FileProto *f, const struct idents *ids)
{
    for (size_t i = 1; i < ids->n; i++) {
        for (size_t j = 0; j < i; j++) {
            bool seen = false;

            if (strcmp(ids->v[i].name, ids->v[j].name) != 0)
                continue;
            /* One report per pair of clashing elements, not per C name. */
            for (size_t k = 1; k < i && !seen; k++)
                for (size_t l = 0; l < k && !seen; l++)
                    seen = strcmp(ids->v[k].what, ids->v[i].what) == 0 &&
                           strcmp(ids->v[l].what, ids->v[j].what) == 0 &&
                           strcmp(ids->v[k].name, ids->v[l].name) == 0;
            if (!seen)
                diag(out, f, ids->v[i].path, ids->v[i].n_path,
                     "%s gets the C name '%s', which %s (line %d) also gets; rename one of them", ids->v[i].what,
                     ids->v[i].name, ids->v[j].what, line_of(f, ids->v[j].path, ids->v[j].n_path));
            break;
        }
    }
}

/* ---- names of one service / method --------------------------------------- */

struct svc_names {
    char *full;    /* "demo.v1.Echo" */
    char *c_type;  /* "Demo__V1__Echo" */
    char *lower;   /* "demo__v1__echo" */
    char *upper;   /* "DEMO__V1__ECHO" */
};

struct method_names {
    char *full;          /* "/demo.v1.Echo/Say" */
    uint32_t id;
    char *prefix;        /* "demo__v1__echo__say" */
    char *upper;         /* "DEMO__V1__ECHO__SAY" */
    char *member;        /* "say": handler member of the impl struct */
    char *done_type;     /* "Demo__V1__Echo_Say_Done" */
    char *async_type;    /* "Demo__V1__Echo_Say_Async" */
    const struct msg_sym *in, *out;
};

static void svc_names_init(struct svc_names *sn, const FileProto *f, const SvcProto *s)
{
    char *dotted = c_dotted_name(f, s->name);

    sn->full = is_empty(f->package) ? xstrdup(s->name) : str_printf("%s.%s", f->package, s->name);
    sn->c_type = pc_full_name_to_c(dotted);
    sn->lower = pc_full_name_to_lower(dotted);
    sn->upper = pc_full_name_to_upper(dotted);
    free(dotted);
}

static void svc_names_free(struct svc_names *sn)
{
    free(sn->full);
    free(sn->c_type);
    free(sn->lower);
    free(sn->upper);
}

/* The impl struct has a `user` member besides the handlers. */
static bool member_reserved(const char *s) { return c_is_keyword(s) || strcmp(s, "user") == 0; }

static void method_names_init(struct method_names *mn, const struct svc_names *sn, const MethodProto *m,
                              const struct symtab *st)
{
    char *lower = pc_camel_to_lower(m->name);
    char *upper = pc_camel_to_upper(m->name);
    char *camel = pc_to_camel(m->name);

    mn->full = str_printf("/%s/%s", sn->full, m->name);
    mn->id = vrpc_fnv1a32(mn->full);
    mn->prefix = str_printf("%s__%s", sn->lower, lower);
    mn->upper = str_printf("%s__%s", sn->upper, upper);
    mn->member = member_reserved(lower) ? str_printf("%s_", lower) : xstrdup(lower);
    mn->done_type = str_printf("%s_%s_Done", sn->c_type, camel);
    mn->async_type = str_printf("%s_%s_Async", sn->c_type, camel);
    mn->in = symtab_find(st, m->input_type);
    mn->out = symtab_find(st, m->output_type);
    free(lower);
    free(upper);
    free(camel);
}

static void method_names_free(struct method_names *mn)
{
    free(mn->full);
    free(mn->prefix);
    free(mn->upper);
    free(mn->member);
    free(mn->done_type);
    free(mn->async_type);
}

static void check_file(struct gen_output *out, const FileProto *f, const struct symtab *st)
{
    int32_t path[MAX_PATH];
    struct idents ids = { 0 };
    struct {
        char *full;
        int32_t path[4];
    } *ids_full = NULL;
    size_t n_ids_full = 0, cap_ids_full = 0;

    path[0] = FILE_MESSAGE_TYPE;
    check_optional(out, f, f->message_type, f->n_message_type, path, 1, NULL);

    for (size_t si = 0; si < f->n_service; si++) {
        const SvcProto *s = f->service[si];
        struct svc_names sn;
        int32_t spath[2] = { FILE_SERVICE, (int32_t)si };

        svc_names_init(&sn, f, s);
        idents_add(&ids, str_printf("%s_VrpcImpl", sn.c_type), str_printf("service %s", sn.full), spath, 2);
        idents_add(&ids, str_printf("%s__vrpc_register", sn.lower), str_printf("service %s", sn.full), spath, 2);
        for (size_t mi = 0; mi < s->n_method; mi++) {
            const MethodProto *m = s->method[mi];
            int32_t mpath[4] = { FILE_SERVICE, (int32_t)si, SVC_METHOD, (int32_t)mi };
            struct method_names mn;

            method_names_init(&mn, &sn, m, st);
            if (m->client_streaming || m->server_streaming) {
                const char *kind = m->client_streaming && m->server_streaming ? "bidirectional streaming"
                                   : m->client_streaming                      ? "client streaming"
                                                                              : "server streaming";
                diag(out, f, mpath, 4,
                     "method '%s' of service '%s' is %s; verbrpc supports unary methods only "
                     "(one request, one response): remove 'stream' or split the stream into unary calls",
                     m->name, sn.full, kind);
            }
            if (!mn.in || !mn.out)
                diag(out, f, mpath, 4, "method '%s' of service '%s': type '%s' not found in the request", m->name,
                     sn.full, !mn.in ? m->input_type : m->output_type);
            idents_add(&ids, xstrdup(mn.prefix), str_printf("method '%s' of service '%s'", m->name, sn.full),
                       mpath, 4);
            idents_add(&ids, xstrdup(mn.done_type), str_printf("method '%s' of service '%s'", m->name, sn.full),
                       mpath, 4);
            /* Handler members live in the service's impl struct. */
            idents_add(&ids, str_printf("%s_VrpcImpl.%s", sn.c_type, mn.member),
                       str_printf("method '%s' of service '%s'", m->name, sn.full), mpath, 4);
            if (n_ids_full == cap_ids_full) {
                cap_ids_full = cap_ids_full ? cap_ids_full * 2 : 16;
                ids_full = xrealloc(ids_full, cap_ids_full * sizeof(*ids_full));
            }
            ids_full[n_ids_full].full = xstrdup(mn.full);
            memcpy(ids_full[n_ids_full].path, mpath, sizeof(mpath));
            n_ids_full++;
            method_names_free(&mn);
        }
        svc_names_free(&sn);
    }
    check_clashes(out, f, &ids);

    /* Method ids must be distinct within the file (FNV-1a clashes are rare
     * but possible); the core also rejects a clash between files when the
     * second method is registered. */
    for (size_t i = 0; i < n_ids_full; i++) {
        for (size_t j = 0; j < i; j++) {
            uint32_t id = vrpc_fnv1a32(ids_full[i].full);

            if (id == vrpc_fnv1a32(ids_full[j].full) && strcmp(ids_full[i].full, ids_full[j].full) != 0)
                diag(out, f, ids_full[i].path, 4,
                     "method %s has the same method id (0x%08" PRIx32 ", FNV-1a 32 of the full name) as %s; "
                     "rename one of them",
                     ids_full[i].full, id, ids_full[j].full);
        }
    }
    for (size_t i = 0; i < n_ids_full; i++)
        free(ids_full[i].full);
    free(ids_full);
    idents_free(&ids);
}

/* ---- emitting ------------------------------------------------------------ */

/* Writes a .proto comment as C comment lines (" * text"), made safe: no
 * comment terminator or opener survives. */
static void emit_comment_lines(struct strbuf *sb, const char *comment, const char *indent)
{
    const char *p = comment;

    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);

        if (n > 0 || nl) {
            sb_printf(sb, "%s *", indent);
            for (size_t i = 0; i < n; i++) {
                char c = p[i];
                if ((c == '/' && i + 1 < n && p[i + 1] == '*') || (c == '*' && i + 1 < n && p[i + 1] == '/'))
                    c = ' ';
                if (i == 0 && c == '/')
                    sb_appendc(sb, ' ');
                sb_appendc(sb, c);
            }
            sb_appendc(sb, '\n');
        }
        p += n;
        if (*p == '\n')
            p++;
    }
}

static void emit_location_comment(struct strbuf *sb, const FileProto *f, const int32_t *path, size_t n,
                                  const char *indent)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = find_location(f, path, n);

    if (!l)
        return;
    for (size_t i = 0; i < l->n_leading_detached_comments; i++) {
        sb_printf(sb, "%s/*\n", indent);
        emit_comment_lines(sb, l->leading_detached_comments[i], indent);
        sb_printf(sb, "%s */\n", indent);
    }
    if (!is_empty(l->leading_comments) || !is_empty(l->trailing_comments)) {
        sb_printf(sb, "%s/*\n", indent);
        if (!is_empty(l->leading_comments))
            emit_comment_lines(sb, l->leading_comments, indent);
        if (!is_empty(l->trailing_comments))
            emit_comment_lines(sb, l->trailing_comments, indent);
        sb_printf(sb, "%s */\n", indent);
    }
}

struct emit_ctx {
    const FileProto *f;
    const struct symtab *st;
    const char *api; /* "" or "VRPC_API " */
    const char *ident; /* the file's C identifier: <ident>__vrpc_file */
    struct strbuf h, c;
};

static void emit_method_decls(struct emit_ctx *e, const struct svc_names *sn, const MethodProto *m,
                              const struct method_names *mn, const int32_t *mpath)
{
    struct strbuf *h = &e->h;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    sb_printf(h, "/* ---- rpc %s(%s) returns (%s) ---- */\n", m->name, m->input_type + 1, m->output_type + 1);
    emit_location_comment(h, e->f, mpath, 4, "");
    sb_printf(h, "#define %s__METHOD_ID 0x%08" PRIx32 "u /* FNV-1a 32 of \"%s\" */\n", mn->upper, mn->id,
              mn->full);
    sb_printf(h, "%sextern const struct vrpc_method_desc %s__method;\n\n", e->api, mn->prefix);

    sb_printf(h,
              "/* Synchronous call: sends *req and waits for the answer. Returns the\n"
              " * status code (0 = VRPC_OK) and, if st is not NULL, the code and message in\n"
              " * *st. On VRPC_OK *resp points to the response, in the calling thread's\n"
              " * arena: valid until this thread's next call, never freed by the caller\n"
              " * (see vrpc_call()). *req stays the caller's. */\n");
    sb_printf(h,
              "%sint %s__call(struct vrpc_channel *ch, const %s *req, %s **resp,\n"
              "        const struct vrpc_call_opts *opts, struct vrpc_status *st);\n\n",
              e->api, mn->prefix, in, out);

    sb_printf(h, "typedef void (*%s)(const struct vrpc_status *st, const %s *resp, void *arg);\n", mn->done_type,
              out);
    sb_printf(h,
              "/* One asynchronous call's completion, owned by the caller: set done and arg,\n"
              " * keep it valid until done has started (done may free it). */\n");
    sb_printf(h, "typedef struct %s %s;\nstruct %s {\n    %s done;\n    void *arg;\n};\n", mn->async_type,
              mn->async_type, mn->async_type, mn->done_type);
    sb_printf(h,
              "/* Asynchronous call: returns 0 when accepted, and then a->done(st, resp,\n"
              " * a->arg) runs exactly once, on a scheduler worker, also on failure; resp is\n"
              " * NULL unless st->code is VRPC_OK, and both are valid only during done.\n"
              " * Returns a negative errno when not accepted (done never runs): -EAGAIN\n"
              " * when max_outstanding calls are pending and max_queued more are queued.\n"
              " * Never waits for a slot or a credit (only for a channel's first connect).\n"
              " * *req stays the caller's and may be reused at once. See vrpc_call_async(). */\n");
    sb_printf(h,
              "%sint %s__call_async(struct vrpc_channel *ch, const %s *req,\n"
              "        const struct vrpc_call_opts *opts, %s *a);\n\n",
              e->api, mn->prefix, in, mn->async_type);

    sb_printf(h,
              "/* Server side: answers the call with *resp (see vrpc_server_call_respond();\n"
              " * *resp stays the caller's). */\n");
    sb_printf(h, "%sint %s__respond(struct vrpc_server_call *call, const %s *resp);\n\n", e->api, mn->prefix,
              out);
    (void)sn;
}

static void emit_method_defs(struct emit_ctx *e, const struct svc_names *sn, const struct method_names *mn)
{
    struct strbuf *c = &e->c;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    sb_printf(c,
              "const struct vrpc_method_desc %s__method = {\n"
              "    .full_name = \"%s\",\n"
              "    .id = 0x%08" PRIx32 "u,\n"
              "    .input = &%s__descriptor,\n"
              "    .output = &%s__descriptor,\n"
              "    .file = &%s__vrpc_file,\n"
              "};\n\n",
              mn->prefix, mn->full, mn->id, mn->in->c_lower, mn->out->c_lower, e->ident);

    sb_printf(c,
              "int %s__call(struct vrpc_channel *ch, const %s *req, %s **resp,\n"
              "        const struct vrpc_call_opts *opts, struct vrpc_status *st)\n"
              "{\n"
              "    ProtobufCMessage *r = NULL;\n"
              "    int rc = vrpc_call(ch, &%s__method, (const ProtobufCMessage *)req, &r, opts, st);\n"
              "\n"
              "    if (rc == 0)\n"
              "        *resp = (%s *)r;\n"
              "    return rc;\n"
              "}\n\n",
              mn->prefix, in, out, mn->prefix, out);

    sb_printf(c,
              "static void %s__async_done(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)\n"
              "{\n"
              "    const %s *a = arg;\n"
              "\n"
              "    /* a may be freed by done: nothing touches it after the call. */\n"
              "    a->done(st, (const %s *)resp, a->arg);\n"
              "}\n\n",
              mn->prefix, mn->async_type, out);
    sb_printf(c,
              "int %s__call_async(struct vrpc_channel *ch, const %s *req,\n"
              "        const struct vrpc_call_opts *opts, %s *a)\n"
              "{\n"
              "    if (!a || !a->done)\n"
              "        return -EINVAL;\n"
              "    return vrpc_call_async(ch, &%s__method, (const ProtobufCMessage *)req, opts, %s__async_done, a);\n"
              "}\n\n",
              mn->prefix, in, mn->async_type, mn->prefix, mn->prefix);

    sb_printf(c,
              "int %s__respond(struct vrpc_server_call *call, const %s *resp)\n"
              "{\n"
              "    return vrpc_server_call_respond(call, (const ProtobufCMessage *)resp);\n"
              "}\n\n",
              mn->prefix, out);

    sb_printf(c,
              "static void %s__serve(struct vrpc_server_call *call, const ProtobufCMessage *req, void *impl)\n"
              "{\n"
              "    const %s_VrpcImpl *s = impl;\n"
              "\n"
              "    s->%s(call, (const %s *)req, s->user);\n"
              "}\n\n",
              mn->prefix, sn->c_type, mn->member, in);
}

static void emit_service(struct emit_ctx *e, size_t si)
{
    const FileProto *f = e->f;
    const SvcProto *s = f->service[si];
    int32_t spath[2] = { FILE_SERVICE, (int32_t)si };
    struct svc_names sn;
    struct method_names *mns = xmalloc(s->n_method * sizeof(*mns));

    svc_names_init(&sn, f, s);
    for (size_t mi = 0; mi < s->n_method; mi++)
        method_names_init(&mns[mi], &sn, s->method[mi], e->st);

    sb_printf(&e->h, "/* ======== service %s ======== */\n", sn.full);
    emit_location_comment(&e->h, f, spath, 2, "");
    sb_append(&e->h, "\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        int32_t mpath[4] = { FILE_SERVICE, (int32_t)si, SVC_METHOD, (int32_t)mi };
        emit_method_decls(e, &sn, s->method[mi], &mns[mi], mpath);
    }

    /* Method table, server implementation struct, registration. */
    sb_printf(&e->h, "/* Every method of %s, in .proto order. */\n", sn.full);
    sb_printf(&e->h, "#define %s__VRPC_N_METHODS %zu\n", sn.upper, s->n_method);
    sb_printf(&e->h, "%sextern const struct vrpc_method_desc *const %s__vrpc_methods[%zu];\n\n", e->api, sn.lower,
              s->n_method ? s->n_method : 1);

    sb_printf(&e->h,
              "/* A server's implementation of %s: one handler per method, all\n"
              " * called as fn(call, req, user). A handler answers with the method's\n"
              " * __respond() or with vrpc_server_call_fail(), at once or later from any\n"
              " * thread; *req is valid until then. A NULL handler leaves the method\n"
              " * unregistered (callers get UNIMPLEMENTED). */\n",
              sn.full);
    sb_printf(&e->h, "typedef struct %s_VrpcImpl %s_VrpcImpl;\nstruct %s_VrpcImpl {\n", sn.c_type, sn.c_type,
              sn.c_type);
    sb_append(&e->h, "    void *user; /* passed to every handler */\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        const struct method_names *mn = &mns[mi];

        sb_printf(&e->h, "    /* rpc %s */\n", s->method[mi]->name);
        sb_printf(&e->h, "    void (*%s)(struct vrpc_server_call *call, const %s *req, void *user);\n", mn->member,
                  mn->in->c_type);
    }
    sb_append(&e->h, "};\n\n");
    sb_printf(&e->h,
              "/* Registers every non-NULL handler of *impl with server s, before\n"
              " * vrpc_server_start(). *impl is read at every call: it must outlive the\n"
              " * server. Returns 0, -EINVAL if s or impl is NULL, or the first\n"
              " * vrpc_server_register() error (methods registered before it stay). */\n");
    sb_printf(&e->h, "%sint %s__vrpc_register(struct vrpc_server *s, const %s_VrpcImpl *impl);\n\n", e->api,
              sn.lower, sn.c_type);

    /* .c */
    sb_printf(&e->c, "/* ======== service %s ======== */\n\n", sn.full);
    for (size_t mi = 0; mi < s->n_method; mi++)
        emit_method_defs(e, &sn, &mns[mi]);
    sb_printf(&e->c, "const struct vrpc_method_desc *const %s__vrpc_methods[%zu] = {\n", sn.lower,
              s->n_method ? s->n_method : 1);
    for (size_t mi = 0; mi < s->n_method; mi++)
        sb_printf(&e->c, "    &%s__method,\n", mns[mi].prefix);
    if (!s->n_method)
        sb_append(&e->c, "    NULL,\n");
    sb_append(&e->c, "};\n\n");
    sb_printf(&e->c,
              "int %s__vrpc_register(struct vrpc_server *s, const %s_VrpcImpl *impl)\n"
              "{\n"
              "    /* The table is handed to the core as the handlers' user pointer; it\n"
              "     * is only ever read through it, so dropping const is safe. */\n"
              "    void *u = (void *)(uintptr_t)impl;\n"
              "    int rc = 0;\n"
              "\n"
              "    if (!s || !impl)\n"
              "        return -EINVAL;\n",
              sn.lower, sn.c_type);
    if (!s->n_method)
        sb_append(&e->c, "    (void)u;\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        const struct method_names *mn = &mns[mi];

        sb_printf(&e->c,
                  "    if (impl->%s && (rc = vrpc_server_register(s, &%s__method, %s__serve, u)) != 0)\n"
                  "        return rc;\n",
                  mn->member, mn->prefix, mn->prefix);
    }
    sb_append(&e->c, "    return rc;\n}\n\n");

    for (size_t mi = 0; mi < s->n_method; mi++)
        method_names_free(&mns[mi]);
    free(mns);
    svc_names_free(&sn);
}

static void emit_file(struct gen_output *out, const Google__Protobuf__Compiler__CodeGeneratorRequest *req,
                      const FileProto *f, const struct symtab *st, const struct gen_options *opt)
{
    char *base = pc_strip_proto(f->name);
    char *ident = pc_filename_identifier(f->name);
    char *api = opt->export_macro ? str_printf("%s ", opt->export_macro) : xstrdup("");
    struct emit_ctx e = { .f = f, .st = st, .api = api, .ident = ident, .h = STRBUF_INIT, .c = STRBUF_INIT };

    sb_printf(&e.h,
              "/* Generated by protoc-gen-verbrpc from %s. Do not edit.\n"
              " * verbrpc client stubs, method descriptors and server registration for\n"
              " * its services; the message types are protoc-c's, from %s.pb-c.h. */\n"
              "#ifndef VRPC_GEN_%s__INCLUDED\n#define VRPC_GEN_%s__INCLUDED\n\n"
              "#include <verbrpc/rpc.h>\n#include \"%s.pb-c.h\"\n\n"
              "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n",
              f->name, base, ident, ident, base);
    {
        /* The file's own description usually sits before `syntax` (path 12)
         * or `package` (path 2). */
        int32_t syntax_path[1] = { 12 }, package_path[1] = { 2 };
        size_t before = e.h.len;

        emit_location_comment(&e.h, f, syntax_path, 1, "");
        emit_location_comment(&e.h, f, package_path, 1, "");
        if (e.h.len != before)
            sb_append(&e.h, "\n");
    }
    sb_printf(&e.c,
              "/* Generated by protoc-gen-verbrpc from %s. Do not edit. */\n"
              "#include \"%s.vrpc.h\"\n\n#include <errno.h>\n#include <stdint.h>\n\n",
              f->name, base);
    sb_printf(&e.h,
              "/* This file's descriptor (and, through .deps, its imports'), served by\n"
              " * every server's reflection service for the methods registered from it. */\n"
              "%sextern const struct vrpc_file_desc %s__vrpc_file;\n\n",
              api, ident);
    if (gen_emit_file_descs(&e.c, req, f, ident) != 0)
        sb_printf(&out->errors, "%s: an import is missing from protoc's request\n", f->name);
    for (size_t si = 0; si < f->n_service; si++)
        emit_service(&e, si);
    sb_append(&e.h, "#ifdef __cplusplus\n}\n#endif\n#endif\n");

    out->files = xrealloc(out->files, (out->n_files + 2) * sizeof(*out->files));
    out->files[out->n_files].name = str_printf("%s.vrpc.h", base);
    out->files[out->n_files].content = sb_steal(&e.h);
    out->files[out->n_files + 1].name = str_printf("%s.vrpc.c", base);
    out->files[out->n_files + 1].content = sb_steal(&e.c);
    out->n_files += 2;
    free(api);
    free(ident);
    free(base);
}

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
    struct symtab st = { 0 };

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
        check_file(out, f, &st);
    }
    if (out->errors.len == 0) {
        for (size_t i = 0; i < req->n_file_to_generate; i++)
            emit_file(out, req, find_file(req, req->file_to_generate[i]), &st, opt);
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
        "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char", "class",
        "compl", "const", "const_cast", "continue", "default", "delete", "do", "double", "dynamic_cast", "else",
        "enum", "explicit", "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int", "long",
        "mutable", "namespace", "new", "not", "not_eq", "operator", "or", "or_eq", "private", "protected",
        "public", "register", "reinterpret_cast", "return", "short", "signed", "sizeof", "static",
        "static_cast", "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typeid",
        "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor",
        "xor_eq",
    };

    for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++)
        if (strcmp(s, list[i]) == 0)
            return true;
    return false;
}

static void rename_with_underscore(char **name)
{
    char *n = str_printf("%s_", *name);

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

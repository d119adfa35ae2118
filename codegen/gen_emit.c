/* gen_emit: writes one file's <name>.vrpc.h (declarations, the impl struct)
 * and <name>.vrpc.c (method descriptors, client stubs, server glue and
 * registration), with the .proto's comments carried over. */
#include "gen_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filedesc.h"
#include "names.h"

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

void gen_emit_location_comment(struct strbuf *sb, const FileProto *f, const int32_t *path, size_t n, const char *indent)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = gen_find_location(f, path, n);

    if (!l)
        return;
    for (size_t i = 0; i < l->n_leading_detached_comments; i++) {
        sb_printf(sb, "%s/*\n", indent);
        emit_comment_lines(sb, l->leading_detached_comments[i], indent);
        sb_printf(sb, "%s */\n", indent);
    }
    if (!gen_is_empty(l->leading_comments) || !gen_is_empty(l->trailing_comments)) {
        sb_printf(sb, "%s/*\n", indent);
        if (!gen_is_empty(l->leading_comments))
            emit_comment_lines(sb, l->leading_comments, indent);
        if (!gen_is_empty(l->trailing_comments))
            emit_comment_lines(sb, l->trailing_comments, indent);
        sb_printf(sb, "%s */\n", indent);
    }
}

static void emit_method_decls(struct emit_ctx *e, const struct svc_names *sn, const MethodProto *m,
                              const struct method_names *mn, const int32_t *mpath)
{
    struct strbuf *h = &e->h;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    sb_printf(h, "/* ---- rpc %s(%s) returns (%s) ---- */\n", m->name, m->input_type + 1, m->output_type + 1);
    gen_emit_location_comment(h, e->f, mpath, 4, "");
    sb_printf(h, "#define %s__METHOD_ID 0x%08" PRIx32 "u /* FNV-1a 32 of \"%s\" */\n", mn->upper, mn->id, mn->full);
    sb_printf(h, "%sextern const struct vrpc_method_desc %s__method;\n\n", e->api, mn->prefix);

    sb_printf(h, "/* Synchronous call: sends *req and waits for the answer. Returns the\n"
                 " * status code (0 = VRPC_OK) and, if st is not NULL, the code and message in\n"
                 " * *st. On VRPC_OK *resp points to the response, in the calling thread's\n"
                 " * arena: valid until this thread's next call, never freed by the caller\n"
                 " * (see vrpc_call()). *req stays the caller's. */\n");
    sb_printf(h,
              "%sint %s__call(struct vrpc_channel *ch, const %s *req, %s **resp,\n"
              "        const struct vrpc_call_opts *opts, struct vrpc_status *st);\n\n",
              e->api, mn->prefix, in, out);

    sb_printf(h, "typedef void (*%s)(const struct vrpc_status *st, const %s *resp, void *arg);\n", mn->done_type, out);
    sb_printf(h, "/* One asynchronous call's completion, owned by the caller: set done and arg,\n"
                 " * keep it valid until done has started (done may free it). */\n");
    sb_printf(h, "typedef struct %s %s;\nstruct %s {\n    %s done;\n    void *arg;\n};\n", mn->async_type,
              mn->async_type, mn->async_type, mn->done_type);
    sb_printf(h, "/* Asynchronous call: returns 0 when accepted, and then a->done(st, resp,\n"
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

    sb_printf(h, "/* Server side: answers the call with *resp (see vrpc_server_call_respond();\n"
                 " * *resp stays the caller's). */\n");
    sb_printf(h, "%sint %s__respond(struct vrpc_server_call *call, const %s *resp);\n\n", e->api, mn->prefix, out);
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
              "    .kind = %s,\n"
              "};\n\n",
              mn->prefix, mn->full, mn->id, mn->in->c_lower, mn->out->c_lower, e->ident, gen_kind_enum(mn->kind));
    if (mn->kind != GEN_UNARY) {
        gen_emit_stream_defs(e, sn, mn);
        return;
    }

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

/* The .h part of service si up to the impl struct: its banner, each
 * method's declarations, the method table. */
static void emit_service_decls(struct emit_ctx *e, size_t si, const struct svc_names *sn,
                               const struct method_names *mns)
{
    const SvcProto *s = e->f->service[si];
    int32_t spath[2] = {FILE_SERVICE, (int32_t)si};

    sb_printf(&e->h, "/* ======== service %s ======== */\n", sn->full);
    gen_emit_location_comment(&e->h, e->f, spath, 2, "");
    sb_append(&e->h, "\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        int32_t mpath[4] = {FILE_SERVICE, (int32_t)si, SVC_METHOD, (int32_t)mi};

        if (mns[mi].kind != GEN_UNARY)
            gen_emit_stream_decls(e, s->method[mi], &mns[mi], mpath);
        else
            emit_method_decls(e, sn, s->method[mi], &mns[mi], mpath);
    }

    /* Method table, server implementation struct, registration. */
    sb_printf(&e->h, "/* Every method of %s, in .proto order. */\n", sn->full);
    sb_printf(&e->h, "#define %s__VRPC_N_METHODS %zu\n", sn->upper, s->n_method);
    sb_printf(&e->h, "%sextern const struct vrpc_method_desc *const %s__vrpc_methods[%zu];\n\n", e->api, sn->lower,
              s->n_method ? s->n_method : 1);
}

static bool svc_has_streams(const SvcProto *s)
{
    for (size_t mi = 0; mi < s->n_method; mi++)
        if (s->method[mi]->client_streaming || s->method[mi]->server_streaming)
            return true;
    return false;
}

static bool file_has_streams(const FileProto *f)
{
    for (size_t si = 0; si < f->n_service; si++)
        if (svc_has_streams(f->service[si]))
            return true;
    return false;
}

/* The .h part of a service's server side: the impl struct, the
 * registration function. */
static void emit_impl_decl(struct emit_ctx *e, const SvcProto *s, const struct svc_names *sn,
                           const struct method_names *mns)
{
    sb_printf(&e->h,
              "/* A server's implementation of %s: one handler per method, all\n"
              " * called as fn(call, req, user). A handler answers with the method's\n"
              " * __respond() or with vrpc_server_call_fail(), at once or later from any\n"
              " * thread; *req is valid until then. A NULL handler leaves the method\n"
              " * unregistered (callers get UNIMPLEMENTED).%s */\n",
              sn->full,
              svc_has_streams(s) ? "\n * A streaming method's member is its table of typed stream callbacks\n"
                                   " * (its _StreamOps); a NULL start leaves it unregistered."
                                 : "");
    sb_printf(&e->h, "typedef struct %s_VrpcImpl %s_VrpcImpl;\nstruct %s_VrpcImpl {\n", sn->c_type, sn->c_type,
              sn->c_type);
    sb_append(&e->h, "    void *user; /* passed to every handler */\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        const struct method_names *mn = &mns[mi];

        sb_printf(&e->h, "    /* rpc %s */\n", s->method[mi]->name);
        if (mn->kind != GEN_UNARY) {
            gen_emit_stream_member(e, mn);
            continue;
        }
        sb_printf(&e->h, "    void (*%s)(struct vrpc_server_call *call, const %s *req, void *user);\n", mn->member,
                  mn->in->c_type);
    }
    sb_append(&e->h, "};\n\n");
    sb_printf(&e->h,
              "/* Registers every non-NULL handler of *impl with server s, before\n"
              " * vrpc_server_start(). *impl is read at every call: it must outlive the\n"
              " * server. Returns 0, -EINVAL if s or impl is NULL, or the first\n"
              " * %s error (methods registered before it stay). */\n",
              svc_has_streams(s) ? "vrpc_server_register() or vrpc_server_register_stream()\n *"
                                 : "vrpc_server_register()");
    sb_printf(&e->h, "%sint %s__vrpc_register(struct vrpc_server *s, const %s_VrpcImpl *impl);\n\n", e->api, sn->lower,
              sn->c_type);
}

/* The .c part of a service: each method's definitions, the method table,
 * the registration function. */
static void emit_service_defs(struct emit_ctx *e, const SvcProto *s, const struct svc_names *sn,
                              const struct method_names *mns)
{
    sb_printf(&e->c, "/* ======== service %s ======== */\n\n", sn->full);
    for (size_t mi = 0; mi < s->n_method; mi++)
        emit_method_defs(e, sn, &mns[mi]);
    sb_printf(&e->c, "const struct vrpc_method_desc *const %s__vrpc_methods[%zu] = {\n", sn->lower,
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
              sn->lower, sn->c_type);
    if (!s->n_method)
        sb_append(&e->c, "    (void)u;\n");
    for (size_t mi = 0; mi < s->n_method; mi++) {
        const struct method_names *mn = &mns[mi];

        if (mn->kind != GEN_UNARY) {
            gen_emit_stream_register(e, mn);
            continue;
        }
        sb_printf(&e->c,
                  "    if (impl->%s && (rc = vrpc_server_register(s, &%s__method, %s__serve, u)) != 0)\n"
                  "        return rc;\n",
                  mn->member, mn->prefix, mn->prefix);
    }
    sb_append(&e->c, "    return rc;\n}\n\n");
}

static void emit_service(struct emit_ctx *e, size_t si)
{
    const SvcProto *s = e->f->service[si];
    struct svc_names sn;
    struct method_names *mns = xmalloc(s->n_method * sizeof(*mns));

    gen_svc_names_init(&sn, e->f, s);
    for (size_t mi = 0; mi < s->n_method; mi++)
        gen_method_names_init(&mns[mi], &sn, s->method[mi], e->st);
    emit_service_decls(e, si, &sn, mns);
    emit_impl_decl(e, s, &sn, mns);
    emit_service_defs(e, s, &sn, mns);
    for (size_t mi = 0; mi < s->n_method; mi++)
        gen_method_names_free(&mns[mi]);
    free(mns);
    gen_svc_names_free(&sn);
}

void gen_emit_file(struct gen_output *out, const Google__Protobuf__Compiler__CodeGeneratorRequest *req,
                   const FileProto *f, const struct symtab *st, const struct gen_options *opt)
{
    char *base = pc_strip_proto(f->name);
    char *ident = pc_filename_identifier(f->name);
    char *api = opt->export_macro ? gen_str_printf("%s ", opt->export_macro) : xstrdup("");
    struct emit_ctx e = {.f = f, .st = st, .api = api, .ident = ident, .h = STRBUF_INIT, .c = STRBUF_INIT};

    sb_printf(&e.h,
              "/* Generated by protoc-gen-verbrpc from %s. Do not edit.\n"
              " * verbrpc client stubs, method descriptors and server registration for\n"
              " * its services; the message types are protoc-c's, from %s.pb-c.h. */\n"
              "#ifndef VRPC_GEN_%s__INCLUDED\n#define VRPC_GEN_%s__INCLUDED\n\n"
              "#include <verbrpc/%s.h>\n#include \"%s.pb-c.h\"\n\n"
              "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n",
              f->name, base, ident, ident, file_has_streams(f) ? "stream" : "rpc", base);
    {
        /* The file's own description usually sits before `syntax` (path 12)
         * or `package` (path 2). */
        int32_t syntax_path[1] = {12}, package_path[1] = {2};
        size_t before = e.h.len;

        gen_emit_location_comment(&e.h, f, syntax_path, 1, "");
        gen_emit_location_comment(&e.h, f, package_path, 1, "");
        if (e.h.len != before)
            sb_append(&e.h, "\n");
    }
    sb_printf(&e.c,
              "/* Generated by protoc-gen-verbrpc from %s. Do not edit. */\n"
              "#include \"%s.vrpc.h\"\n\n#include <errno.h>\n#include <stdint.h>\n%s\n",
              f->name, base, file_has_streams(f) ? "#include <string.h>\n" : "");
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
    out->files[out->n_files].name = gen_str_printf("%s.vrpc.h", base);
    out->files[out->n_files].content = sb_steal(&e.h);
    out->files[out->n_files + 1].name = gen_str_printf("%s.vrpc.c", base);
    out->files[out->n_files + 1].content = sb_steal(&e.c);
    out->n_files += 2;
    free(api);
    free(ident);
    free(base);
}

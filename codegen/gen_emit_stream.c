/* gen_emit_stream: the generated code of one streaming method (server,
 * client or bidirectional streaming), over <verbrpc/stream.h>: typed client
 * stubs (start, write, read, finish; start_async with a typed callback
 * table), the typed server callback table that is the method's member of
 * the service's impl struct, the trampolines that register it, and typed
 * server writes. The descriptor itself is written by gen_emit.c. */
#include "gen_priv.h"

#include <inttypes.h>
#include <stdlib.h>

static bool client_writes(const struct method_names *mn)
{
    return mn->kind == GEN_CLIENT_STREAMING || mn->kind == GEN_BIDI_STREAMING;
}

static bool server_writes_many(const struct method_names *mn)
{
    return mn->kind == GEN_SERVER_STREAMING || mn->kind == GEN_BIDI_STREAMING;
}

/* ---- declarations (.h) --------------------------------------------------- */

static void decl_client_sync(struct emit_ctx *e, const struct method_names *mn)
{
    struct strbuf *h = &e->h;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    if (mn->kind == GEN_SERVER_STREAMING) {
        sb_printf(h, "/* Client: opens the stream, sends *req (it stays the caller's) and\n"
                     " * half-closes; then read the answers with __read() and end with\n"
                     " * __finish(). Returns 0 and *out (the caller's until\n"
                     " * vrpc_stream_destroy()); a stream that could not open or send still\n"
                     " * returns 0 and its first read or finish says why. -EINVAL (bad\n"
                     " * arguments, or *req not sendable), -EMSGSIZE (*req too large): then\n"
                     " * nothing is left open. -ESHUTDOWN. See vrpc_stream_start(). */\n");
        sb_printf(h,
                  "%sint %s__start(struct vrpc_channel *ch, const %s *req,\n"
                  "        const struct vrpc_call_opts *opts, struct vrpc_stream **out);\n\n",
                  e->api, mn->prefix, in);
    } else {
        sb_printf(h, "/* Client: opens the stream; returns 0 and *out (the caller's until\n"
                     " * vrpc_stream_destroy()), errors as vrpc_stream_start(). Then __write()\n"
                     " * the requests, vrpc_stream_close_send() and __finish(). */\n");
        sb_printf(h,
                  "%sint %s__start(struct vrpc_channel *ch, const struct vrpc_call_opts *opts,\n"
                  "        struct vrpc_stream **out);\n\n",
                  e->api, mn->prefix);
        sb_printf(h, "/* Sends one request, blocking while the stream's window is closed\n"
                     " * (*msg stays the caller's). See vrpc_stream_write(). */\n");
        sb_printf(h, "%sint %s__write(struct vrpc_stream *s, const %s *msg);\n", e->api, mn->prefix, in);
        sb_printf(h, "/* Sends one request without waiting; cb runs once it went to the\n"
                     " * transport. See vrpc_stream_write_async(). */\n");
        sb_printf(
            h, "%sint %s__write_async(struct vrpc_stream *s, const %s *msg, vrpc_stream_write_cb cb, void *arg);\n\n",
            e->api, mn->prefix, in);
    }
    if (server_writes_many(mn)) {
        sb_printf(h, "/* Reads the next answer: 0 and *msg (in the stream's memory, valid until\n"
                     " * the next read or finish), -ENODATA at the end. See vrpc_stream_read(). */\n");
        sb_printf(h, "%sint %s__read(struct vrpc_stream *s, %s **msg);\n", e->api, mn->prefix, out);
        sb_printf(h, "/* Waits for the end: returns the status code (0 = VRPC_OK), and the code\n"
                     " * and message in *st if not NULL. See vrpc_stream_finish(). */\n");
        sb_printf(h, "%sint %s__finish(struct vrpc_stream *s, struct vrpc_status *st);\n\n", e->api, mn->prefix);
    } else {
        sb_printf(h, "/* Half-closes (if not yet) and waits for the end: returns the status code\n"
                     " * (0 = VRPC_OK; *st gets code and message if not NULL) and on VRPC_OK\n"
                     " * *resp, the one response (if resp is not NULL; valid until\n"
                     " * vrpc_stream_destroy()). See vrpc_stream_finish(). */\n");
        sb_printf(h, "%sint %s__finish(struct vrpc_stream *s, %s **resp, struct vrpc_status *st);\n\n", e->api,
                  mn->prefix, out);
    }
}

static void decl_client_async(struct emit_ctx *e, const struct method_names *mn)
{
    struct strbuf *h = &e->h;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    if (server_writes_many(mn))
        sb_printf(h, "typedef void (*%s)(struct vrpc_stream *s, const %s *msg, void *arg);\n", mn->read_type, out);
    if (mn->kind == GEN_CLIENT_STREAMING)
        sb_printf(h,
                  "typedef void (*%s)(struct vrpc_stream *s, const struct vrpc_status *st, const %s *resp, "
                  "void *arg);\n",
                  mn->done_type, out);
    else
        sb_printf(h, "typedef void (*%s)(struct vrpc_stream *s, const struct vrpc_status *st, void *arg);\n",
                  mn->done_type);
    if (mn->kind == GEN_CLIENT_STREAMING)
        sb_append(h, "/* An asynchronous stream's callback, owned by the caller: keep it valid\n"
                     " * until done has started (done may free it). done runs exactly once, at\n"
                     " * the end, with the final status and, on VRPC_OK, the response (both\n"
                     " * valid during the call). See vrpc_stream_cbs. */\n");
    else
        sb_append(h, "/* An asynchronous stream's callbacks, owned by the caller: keep it valid\n"
                     " * until done has started (done may free it). on_read gets each answer,\n"
                     " * in order (msg valid during the call; a NULL on_read drops them); done\n"
                     " * runs exactly once, at the end, with the final status (valid during the\n"
                     " * call). See vrpc_stream_cbs. */\n");
    sb_printf(h, "typedef struct %s %s;\nstruct %s {\n", mn->async_type, mn->async_type, mn->async_type);
    if (server_writes_many(mn))
        sb_printf(h, "    %s on_read;\n", mn->read_type);
    sb_printf(h, "    %s done;\n    void *arg;\n};\n", mn->done_type);
    if (mn->kind == GEN_SERVER_STREAMING)
        sb_append(h, "/* Client, asynchronous reading: as __start(), the answers and the end go\n"
                     " * to a's callbacks on scheduler workers. If the stream was opened but its\n"
                     " * request could not be sent (-EINVAL, -EMSGSIZE), it is destroyed and\n"
                     " * done has run (CANCELLED) before this returns. */\n");
    else
        sb_append(h, "/* Client, asynchronous reading: as __start(), the answers and the end go\n"
                     " * to a's callbacks on scheduler workers. Returns as __start(); done runs\n"
                     " * only if it returned 0. */\n");
    sb_printf(h,
              "%sint %s__start_async(struct vrpc_channel *ch, %s%s%sconst struct vrpc_call_opts *opts,\n"
              "        %s *a, struct vrpc_stream **out);\n\n",
              e->api, mn->prefix, mn->kind == GEN_SERVER_STREAMING ? "const " : "",
              mn->kind == GEN_SERVER_STREAMING ? in : "", mn->kind == GEN_SERVER_STREAMING ? " *req,\n        " : "",
              mn->async_type);
}

static void decl_server(struct emit_ctx *e, const struct method_names *mn)
{
    struct strbuf *h = &e->h;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    sb_printf(h,
              "/* Server: the method's callbacks, its member of the impl struct. start\n"
              " * runs when a stream opens; on_read for %s (msg valid during the\n"
              " * call); on_half_close once the client sends no more; on_cancel if the\n"
              " * stream is cancelled; user is the impl's. The stream ends with\n"
              " * vrpc_server_stream_finish(), exactly once, from any thread. Only start\n"
              " * is required (other NULL members: the event is ignored). See\n"
              " * vrpc_server_stream_ops. */\n",
              mn->kind == GEN_SERVER_STREAMING ? "the one request" : "each request, in order,");
    sb_printf(h,
              "typedef struct %s %s;\nstruct %s {\n"
              "    void (*start)(struct vrpc_server_stream *s, void *user);\n"
              "    void (*on_read)(struct vrpc_server_stream *s, const %s *msg, void *user);\n"
              "    void (*on_half_close)(struct vrpc_server_stream *s, void *user);\n"
              "    void (*on_cancel)(struct vrpc_server_stream *s, void *user);\n"
              "};\n",
              mn->ops_type, mn->ops_type, mn->ops_type, in);
    if (server_writes_many(mn)) {
        sb_printf(h, "/* Server: sends one answer (*msg stays the caller's), blocking while the\n"
                     " * client's window is closed. See vrpc_server_stream_write(). */\n");
        sb_printf(h, "%sint %s__send(struct vrpc_server_stream *s, const %s *msg);\n", e->api, mn->prefix, out);
        sb_printf(h, "/* Server: sends one answer without waiting. See\n"
                     " * vrpc_server_stream_write_async(). */\n");
        sb_printf(h,
                  "%sint %s__send_async(struct vrpc_server_stream *s, const %s *msg,\n"
                  "        vrpc_server_stream_write_cb cb, void *arg);\n\n",
                  e->api, mn->prefix, out);
    } else {
        sb_printf(h, "/* Server: answers with *resp (it stays the caller's) and finishes the\n"
                     " * stream VRPC_OK; s is released. If *resp cannot be sent the stream is\n"
                     " * finished INTERNAL (or just released, if it was cancelled) and the\n"
                     " * send's error returned. */\n");
        sb_printf(h, "%sint %s__respond(struct vrpc_server_stream *s, const %s *resp);\n\n", e->api, mn->prefix, out);
    }
}

void gen_emit_stream_decls(struct emit_ctx *e, const MethodProto *m, const struct method_names *mn,
                           const int32_t *mpath)
{
    struct strbuf *h = &e->h;

    sb_printf(h, "/* ---- rpc %s(%s%s) returns (%s%s), %s ---- */\n", m->name, client_writes(mn) ? "stream " : "",
              m->input_type + 1, server_writes_many(mn) ? "stream " : "", m->output_type + 1, gen_kind_words(mn->kind));
    gen_emit_location_comment(h, e->f, mpath, 4, "");
    sb_printf(h, "#define %s__METHOD_ID 0x%08" PRIx32 "u /* FNV-1a 32 of \"%s\" */\n", mn->upper, mn->id, mn->full);
    sb_printf(h, "%sextern const struct vrpc_method_desc %s__method;\n\n", e->api, mn->prefix);
    decl_client_sync(e, mn);
    decl_client_async(e, mn);
    decl_server(e, mn);
}

void gen_emit_stream_member(struct emit_ctx *e, const struct method_names *mn)
{
    sb_printf(&e->h, "    %s %s;\n", mn->ops_type, mn->member);
}

/* ---- definitions (.c) ---------------------------------------------------- */

/* The shared opener of __start and __start_async. */
static void def_open(struct emit_ctx *e, const struct method_names *mn)
{
    bool one = mn->kind == GEN_SERVER_STREAMING;

    sb_printf(&e->c,
              "static int %s__open(struct vrpc_channel *ch, %s%s%sconst struct vrpc_call_opts *opts,\n"
              "        const struct vrpc_stream_cbs *cbs, struct vrpc_stream **out)\n"
              "{\n"
              "    struct vrpc_stream_opts o;\n"
              "    struct vrpc_stream *s = NULL;\n"
              "    int rc;\n"
              "\n"
              "    if (!out%s)\n"
              "        return -EINVAL;\n"
              "    memset(&o, 0, sizeof(o));\n"
              "    if (opts)\n"
              "        o.call = *opts;\n"
              "    o.cbs = cbs;\n"
              "    rc = vrpc_stream_start(ch, &%s__method, &o, &s);\n"
              "    if (rc != 0)\n"
              "        return rc;\n",
              mn->prefix, one ? "const " : "", one ? mn->in->c_type : "", one ? " *req, " : "", one ? " || !req" : "",
              mn->prefix);
    if (one)
        sb_append(&e->c, "    rc = vrpc_stream_write(s, (const ProtobufCMessage *)req);\n"
                         "    if (rc == 0)\n"
                         "        rc = vrpc_stream_close_send(s);\n"
                         "    /* A request that cannot be sent is the caller's error; other\n"
                         "     * failures end the stream: its read or finish says why. */\n"
                         "    if (rc == -EINVAL || rc == -EMSGSIZE) {\n"
                         "        vrpc_stream_destroy(s);\n"
                         "        return rc;\n"
                         "    }\n");
    sb_append(&e->c, "    *out = s;\n    return 0;\n}\n\n");
}

static void def_client_async(struct emit_ctx *e, const struct method_names *mn)
{
    bool one = mn->kind == GEN_SERVER_STREAMING;
    char *set_read = server_writes_many(mn) ? gen_str_printf("    cbs.on_read = %s__on_read;\n", mn->prefix) : NULL;

    if (server_writes_many(mn))
        sb_printf(&e->c,
                  "static void %s__on_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)\n"
                  "{\n"
                  "    const %s *a = arg;\n"
                  "\n"
                  "    if (a->on_read)\n"
                  "        a->on_read(s, (const %s *)msg, a->arg);\n"
                  "}\n\n",
                  mn->prefix, mn->async_type, mn->out->c_type);
    sb_printf(&e->c,
              "static void %s__on_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage "
              "*resp, void *arg)\n"
              "{\n"
              "    const %s *a = arg;\n"
              "\n"
              "    /* a may be freed by done: nothing touches it after the call. */\n",
              mn->prefix, mn->async_type);
    if (mn->kind == GEN_CLIENT_STREAMING)
        sb_printf(&e->c, "    a->done(s, st, (const %s *)resp, a->arg);\n}\n\n", mn->out->c_type);
    else
        sb_append(&e->c, "    (void)resp;\n    a->done(s, st, a->arg);\n}\n\n");
    sb_printf(&e->c,
              "int %s__start_async(struct vrpc_channel *ch, %s%s%sconst struct vrpc_call_opts *opts,\n"
              "        %s *a, struct vrpc_stream **out)\n"
              "{\n"
              "    struct vrpc_stream_cbs cbs;\n"
              "\n"
              "    if (!a || !a->done)\n"
              "        return -EINVAL;\n"
              "    memset(&cbs, 0, sizeof(cbs));\n"
              "%s"
              "    cbs.on_done = %s__on_done;\n"
              "    cbs.arg = a;\n"
              "    return %s__open(ch, %sopts, &cbs, out);\n"
              "}\n\n",
              mn->prefix, one ? "const " : "", one ? mn->in->c_type : "", one ? " *req, " : "", mn->async_type,
              set_read ? set_read : "", mn->prefix, mn->prefix, one ? "req, " : "");
    free(set_read);
}

static void def_client_sync(struct emit_ctx *e, const struct method_names *mn)
{
    struct strbuf *c = &e->c;
    const char *in = mn->in->c_type, *out = mn->out->c_type;

    if (mn->kind == GEN_SERVER_STREAMING) {
        sb_printf(c,
                  "int %s__start(struct vrpc_channel *ch, const %s *req,\n"
                  "        const struct vrpc_call_opts *opts, struct vrpc_stream **out)\n"
                  "{\n    return %s__open(ch, req, opts, NULL, out);\n}\n\n",
                  mn->prefix, in, mn->prefix);
    } else {
        sb_printf(c,
                  "int %s__start(struct vrpc_channel *ch, const struct vrpc_call_opts *opts,\n"
                  "        struct vrpc_stream **out)\n"
                  "{\n    return %s__open(ch, opts, NULL, out);\n}\n\n",
                  mn->prefix, mn->prefix);
        sb_printf(c,
                  "int %s__write(struct vrpc_stream *s, const %s *msg)\n"
                  "{\n    return vrpc_stream_write(s, (const ProtobufCMessage *)msg);\n}\n\n",
                  mn->prefix, in);
        sb_printf(c,
                  "int %s__write_async(struct vrpc_stream *s, const %s *msg, vrpc_stream_write_cb cb, void *arg)\n"
                  "{\n    return vrpc_stream_write_async(s, (const ProtobufCMessage *)msg, cb, arg);\n}\n\n",
                  mn->prefix, in);
    }
    if (server_writes_many(mn)) {
        sb_printf(c,
                  "int %s__read(struct vrpc_stream *s, %s **msg)\n"
                  "{\n"
                  "    ProtobufCMessage *m = NULL;\n"
                  "    int rc = vrpc_stream_read(s, &m);\n"
                  "\n"
                  "    if (rc == 0)\n"
                  "        *msg = (%s *)m;\n"
                  "    return rc;\n"
                  "}\n\n",
                  mn->prefix, out, out);
        sb_printf(c,
                  "int %s__finish(struct vrpc_stream *s, struct vrpc_status *st)\n"
                  "{\n    return vrpc_stream_finish(s, NULL, st);\n}\n\n",
                  mn->prefix);
    } else {
        sb_printf(c,
                  "int %s__finish(struct vrpc_stream *s, %s **resp, struct vrpc_status *st)\n"
                  "{\n"
                  "    ProtobufCMessage *r = NULL;\n"
                  "    int rc = vrpc_stream_finish(s, resp ? &r : NULL, st);\n"
                  "\n"
                  "    if (rc == 0 && resp)\n"
                  "        *resp = (%s *)r;\n"
                  "    return rc;\n"
                  "}\n\n",
                  mn->prefix, out, out);
    }
}

static void def_server(struct emit_ctx *e, const struct svc_names *sn, const struct method_names *mn)
{
    struct strbuf *c = &e->c;
    const char *m = mn->member, *p = mn->prefix, *out = mn->out->c_type;

    sb_printf(c,
              "static void %s__srv_start(struct vrpc_server_stream *s, void *impl)\n"
              "{\n    const %s_VrpcImpl *i = impl;\n\n    i->%s.start(s, i->user);\n}\n\n",
              p, sn->c_type, m);
    sb_printf(c,
              "static void %s__srv_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *impl)\n"
              "{\n    const %s_VrpcImpl *i = impl;\n\n"
              "    if (i->%s.on_read)\n        i->%s.on_read(s, (const %s *)msg, i->user);\n}\n\n",
              p, sn->c_type, m, m, mn->in->c_type);
    sb_printf(c,
              "static void %s__srv_half_close(struct vrpc_server_stream *s, void *impl)\n"
              "{\n    const %s_VrpcImpl *i = impl;\n\n"
              "    if (i->%s.on_half_close)\n        i->%s.on_half_close(s, i->user);\n}\n\n",
              p, sn->c_type, m, m);
    sb_printf(c,
              "static void %s__srv_cancel(struct vrpc_server_stream *s, void *impl)\n"
              "{\n    const %s_VrpcImpl *i = impl;\n\n"
              "    if (i->%s.on_cancel)\n        i->%s.on_cancel(s, i->user);\n}\n\n",
              p, sn->c_type, m, m);
    sb_printf(c,
              "static const struct vrpc_server_stream_ops %s__stream_ops = {\n"
              "    .start = %s__srv_start,\n"
              "    .on_read = %s__srv_read,\n"
              "    .on_half_close = %s__srv_half_close,\n"
              "    .on_cancel = %s__srv_cancel,\n"
              "};\n\n",
              p, p, p, p, p);
    if (server_writes_many(mn)) {
        sb_printf(c,
                  "int %s__send(struct vrpc_server_stream *s, const %s *msg)\n"
                  "{\n    return vrpc_server_stream_write(s, (const ProtobufCMessage *)msg);\n}\n\n",
                  p, out);
        sb_printf(c,
                  "int %s__send_async(struct vrpc_server_stream *s, const %s *msg,\n"
                  "        vrpc_server_stream_write_cb cb, void *arg)\n"
                  "{\n    return vrpc_server_stream_write_async(s, (const ProtobufCMessage *)msg, cb, arg);\n}\n\n",
                  p, out);
    } else {
        sb_printf(c,
                  "int %s__respond(struct vrpc_server_stream *s, const %s *resp)\n"
                  "{\n"
                  "    int rc = vrpc_server_stream_write(s, (const ProtobufCMessage *)resp);\n"
                  "\n"
                  "    if (rc != 0) {\n"
                  "        vrpc_server_stream_finish(s, VRPC_INTERNAL, \"response could not be sent\", NULL, 0);\n"
                  "        return rc;\n"
                  "    }\n"
                  "    return vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);\n"
                  "}\n\n",
                  p, out);
    }
}

void gen_emit_stream_defs(struct emit_ctx *e, const struct svc_names *sn, const struct method_names *mn)
{
    def_open(e, mn);
    def_client_sync(e, mn);
    def_client_async(e, mn);
    def_server(e, sn, mn);
}

void gen_emit_stream_register(struct emit_ctx *e, const struct method_names *mn)
{
    sb_printf(&e->c,
              "    if (impl->%s.start && (rc = vrpc_server_register_stream(s, &%s__method, &%s__stream_ops, u)) != 0)\n"
              "        return rc;\n",
              mn->member, mn->prefix, mn->prefix);
}

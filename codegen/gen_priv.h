/* gen's private header: what its parts (gen.c: options, names, the
 * symbol table, the driver and protoc-c's escaping; gen_check.c: the checks
 * and their diagnostics; gen_emit.c: writing the .vrpc.h/.vrpc.c;
 * gen_emit_stream.c: the stubs of streaming methods) share. */
#ifndef VRPC_CODEGEN_GEN_PRIV_H
#define VRPC_CODEGEN_GEN_PRIV_H

#include <stdbool.h>
#include <stdint.h>

#include "gen.h"

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

static inline bool gen_is_empty(const char *s) { return !s || !*s; }

/* A malloc'd sprintf (exits on out of memory, as xmalloc). */
char *gen_str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The message type named full_name (".pkg.Msg") in st, or NULL. */
const struct msg_sym *gen_symtab_find(const struct symtab *st, const char *full_name);

/* protoc's SourceCodeInfo location of path[0..n) in f, or NULL. */
const Google__Protobuf__SourceCodeInfo__Location *gen_find_location(const FileProto *f, const int32_t *path, size_t n);

/* Names of one service / method. */
struct svc_names {
    char *full;   /* "demo.v1.Echo" */
    char *c_type; /* "Demo__V1__Echo" */
    char *lower;  /* "demo__v1__echo" */
    char *upper;  /* "DEMO__V1__ECHO" */
};

/* A method's shape (the values of enum vrpc_method_kind). */
enum gen_kind {
    GEN_UNARY = 0,
    GEN_SERVER_STREAMING = 1,
    GEN_CLIENT_STREAMING = 2,
    GEN_BIDI_STREAMING = 3,
};

struct method_names {
    char *full; /* "/demo.v1.Echo/Say" */
    uint32_t id;
    enum gen_kind kind;
    char *prefix;     /* "demo__v1__echo__say" */
    char *upper;      /* "DEMO__V1__ECHO__SAY" */
    char *member;     /* "say": handler member of the impl struct */
    char *done_type;  /* "Demo__V1__Echo_Say_Done" */
    char *async_type; /* "Demo__V1__Echo_Say_Async" */
    char *read_type;  /* "Demo__V1__Echo_Say_OnRead": streams' typed read callback */
    char *ops_type;   /* "Demo__V1__Echo_Say_StreamOps": streams' server callbacks */
    const struct msg_sym *in, *out;
};

void gen_svc_names_init(struct svc_names *sn, const FileProto *f, const SvcProto *s);
void gen_svc_names_free(struct svc_names *sn);
void gen_method_names_init(struct method_names *mn, const struct svc_names *sn, const MethodProto *m,
                           const struct symtab *st);
void gen_method_names_free(struct method_names *mn);

/* gen_check.c: reports in out->errors what in f cannot be generated. */
void gen_check_file(struct gen_output *out, const FileProto *f, const struct symtab *st);

/* The name of a kind in enum vrpc_method_kind ("VRPC_METHOD_UNARY") and
 * in words ("server streaming"). */
const char *gen_kind_enum(enum gen_kind k);
const char *gen_kind_words(enum gen_kind k);

/* What the emitters share: the file, its symbols, the export macro and
 * the two files being written. */
struct emit_ctx {
    const FileProto *f;
    const struct symtab *st;
    const char *api;   /* "" or "VRPC_API " */
    const char *ident; /* the file's C identifier: <ident>__vrpc_file */
    struct strbuf h, c;
};

/* gen_emit.c: the .proto comment recorded at path[0..n) of f, as a C
 * comment, each line prefixed with indent. */
void gen_emit_location_comment(struct strbuf *sb, const FileProto *f, const int32_t *path, size_t n,
                               const char *indent);

/* gen_emit_stream.c: a streaming method's declarations (.h), its
 * definitions (.c: descriptor, client stubs, server trampolines), its
 * member of the impl struct and its registration line. */
void gen_emit_stream_decls(struct emit_ctx *e, const MethodProto *m, const struct method_names *mn,
                           const int32_t *mpath);
void gen_emit_stream_defs(struct emit_ctx *e, const struct svc_names *sn, const struct method_names *mn);
void gen_emit_stream_member(struct emit_ctx *e, const struct method_names *mn);
void gen_emit_stream_register(struct emit_ctx *e, const struct method_names *mn);

/* gen_emit.c: appends f's <name>.vrpc.h and <name>.vrpc.c to out->files. */
void gen_emit_file(struct gen_output *out, const Google__Protobuf__Compiler__CodeGeneratorRequest *req,
                   const FileProto *f, const struct symtab *st, const struct gen_options *opt);

#endif

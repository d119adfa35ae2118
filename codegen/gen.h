/* gen: what protoc-gen-verbrpc does with one CodeGeneratorRequest: checks that
 * every file to generate can be served (no streaming, no proto3 `optional`,
 * no clashing C names) and writes <name>.vrpc.h / <name>.vrpc.c for it. */
#ifndef VRPC_CODEGEN_GEN_H
#define VRPC_CODEGEN_GEN_H

#include <stdbool.h>
#include <stddef.h>

#include "google/protobuf/compiler/plugin.pb-c.h"
#include "strbuf.h"

struct gen_options {
    /* Macro put before every generated function and object declaration,
     * e.g. "VRPC_API" for stubs compiled into libverbrpc; NULL: none. */
    const char *export_macro;
};

struct gen_file {
    char *name; /* relative to the output directory, e.g. "demo/echo.vrpc.h" */
    char *content;
};

struct gen_output {
    struct gen_file *files;
    size_t n_files;
    struct strbuf errors; /* one "file:line:col: reason" per line; empty on success */
};

/* Parses protoc's parameter string ("key=value,key=value"). Unknown keys are
 * reported in *err (malloc'd, caller frees) and make it return false.
 * Recognised keys: export_macro=NAME, protoc_c=PATH (used by main.c). */
bool gen_parse_parameter(const char *param, struct gen_options *opt, char **protoc_c, char **err);

/* Checks and generates every file in req->file_to_generate. On any error,
 * out->errors is non-empty and out->files is empty. */
void gen_run(const Google__Protobuf__Compiler__CodeGeneratorRequest *req, const struct gen_options *opt,
             struct gen_output *out);
void gen_output_free(struct gen_output *out);

/* Rewrites req (in place) so that protoc-c 1.4.1 can compile it: methods and
 * fields whose C member name would be a C keyword get a trailing '_' (protoc-c
 * itself escapes only some keywords in field names and none in method names,
 * and then emits code that does not compile). Wire names and field numbers are
 * unchanged; verbrpc's method names always come from the original request. */
void gen_escape_for_protoc_c(Google__Protobuf__Compiler__CodeGeneratorRequest *req);

#endif

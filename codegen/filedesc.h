/* filedesc: the descriptors protoc-gen-verbrpc embeds in generated code for
 * the reflection service (struct vrpc_file_desc, include/verbrpc/rpc.h). */
#ifndef VRPC_CODEGEN_FILEDESC_H
#define VRPC_CODEGEN_FILEDESC_H

#include "google/protobuf/compiler/plugin.pb-c.h"
#include "strbuf.h"

/* Appends to c the struct vrpc_file_desc of f, named <ident>__vrpc_file
 * (exported, declared by the caller in the header), and, static, those of
 * every file f imports transitively, each with the FileDescriptorProto
 * protoc sent in req, serialized without source_code_info. 0, or -1 if an
 * import is missing from req (protoc always sends them). */
int gen_emit_file_descs(struct strbuf *c, const Google__Protobuf__Compiler__CodeGeneratorRequest *req,
                        const Google__Protobuf__FileDescriptorProto *f, const char *ident);

/* f serialized as embedded: without source_code_info. *len set; malloc'd. */
uint8_t *gen_file_desc_bytes(const Google__Protobuf__FileDescriptorProto *f, size_t *len);

#endif

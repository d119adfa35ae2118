/* descpool: .proto descriptors known at run time (FileDescriptorProtos from a
 * server's reflection service or a `protoc --descriptor_set_out` file),
 * looked up by fully-qualified name. Read with protobuf-c's own types for
 * descriptor.proto; nothing here needs generated code for the user's types.
 * One thread. */
#ifndef VRPC_TOOL_DESCPOOL_H
#define VRPC_TOOL_DESCPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "google/protobuf/descriptor.pb-c.h"

typedef Google__Protobuf__FileDescriptorProto DpFile;
typedef Google__Protobuf__DescriptorProto DpMsg;
typedef Google__Protobuf__FieldDescriptorProto DpField;
typedef Google__Protobuf__EnumDescriptorProto DpEnum;
typedef Google__Protobuf__ServiceDescriptorProto DpService;
typedef Google__Protobuf__MethodDescriptorProto DpMethod;

enum dp_kind { DP_MESSAGE, DP_ENUM, DP_SERVICE };

struct dp_sym {
    char *full; /* "pkg.Outer.Inner", no leading dot */
    enum dp_kind kind;
    const void *d; /* DpMsg, DpEnum or DpService */
    const DpFile *file;
};

struct descpool {
    DpFile **files;
    size_t n_files;
    struct dp_sym *syms;
    size_t n_syms, cap_syms;
};

void descpool_init(struct descpool *p);
void descpool_free(struct descpool *p);

/* Adds one serialized FileDescriptorProto (copied); a file whose name is
 * already known is skipped. 0 or -EBADMSG / -ENOMEM. */
int descpool_add(struct descpool *p, const uint8_t *data, size_t len);
/* Adds every file of a serialized FileDescriptorSet read from path.
 * 0, -errno of the read, or -EBADMSG. */
int descpool_load_set(struct descpool *p, const char *path);

bool descpool_has_file(const struct descpool *p, const char *name);
/* name with or without a leading dot; NULL if unknown. */
const struct dp_sym *descpool_find(const struct descpool *p, const char *name);
const DpMsg *descpool_message(const struct descpool *p, const char *name, const DpFile **file);
const DpEnum *descpool_enum(const struct descpool *p, const char *name);

/* "pkg.Service/Method", "pkg.Service.Method" or "/pkg.Service/Method": the
 * service and method, or false. */
bool descpool_method(const struct descpool *p, const char *name, const struct dp_sym **svc, const DpMethod **m);

/* True if the file's syntax is proto3. */
bool dp_proto3(const DpFile *f);

#endif

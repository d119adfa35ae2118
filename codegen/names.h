/* names: protoc-c 1.4.1's rules for turning .proto names into C identifiers,
 * replicated exactly (protoc-c's c_helpers.cc: CamelToLower, CamelToUpper,
 * ToCamel, FullNameToC/Lower/Upper), plus the method-id hash. Generated stubs
 * refer to protoc-c's types and descriptors by these names, so any drift
 * here shows up as a compile error in the generator tests.
 * Every function returning char * returns a malloc'd string owned by the caller. */
#ifndef VRPC_CODEGEN_NAMES_H
#define VRPC_CODEGEN_NAMES_H

#include <stdbool.h>
#include <stdint.h>

/* "FooBar" -> "foo_bar", "HTTPRequest" -> "httprequest", "Foo2Bar" -> "foo2_bar",
 * "Msg_With_Under" -> "msg__with__under": an '_' goes before an upper-case
 * letter that follows a non-upper-case character; everything is lower-cased. */
char *pc_camel_to_lower(const char *name);
/* The same with everything upper-cased: "FooBar" -> "FOO_BAR". */
char *pc_camel_to_upper(const char *name);
/* "foo_bar" -> "FooBar": underscores dropped, the next character upper-cased. */
char *pc_to_camel(const char *name);

/* Dotted names, empty pieces skipped, pieces joined with "__":
 * "demo.v1.EchoRequest" -> "Demo__V1__EchoRequest" (to_c),
 * "demo__v1__echo_request" (to_lower), "DEMO__V1__ECHO_REQUEST" (to_upper). */
char *pc_full_name_to_c(const char *dotted);
char *pc_full_name_to_lower(const char *dotted);
char *pc_full_name_to_upper(const char *dotted);

/* "dir/a-b.proto" -> "dir_2fa_2db_2eproto": protoc-c's FilenameIdentifier. */
char *pc_filename_identifier(const char *filename);
/* "dir/foo.proto" -> "dir/foo" (also strips ".protodevel"). */
char *pc_strip_proto(const char *filename);

/* True if s is a C11 or C++ keyword (or a name the C library reserves that
 * would break a struct member, such as "_Bool"); such member names get a
 * trailing '_' in generated code. */
bool c_is_keyword(const char *s);

/* FNV-1a 32-bit of s: the stable method id of "/pkg.Service/Method",
 * identical to the core's vrpc_method_id(). */
uint32_t vrpc_fnv1a32(const char *s);

#endif

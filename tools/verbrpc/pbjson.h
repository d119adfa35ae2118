/* pbjson: protobuf's canonical JSON mapping for messages known only by their
 * descriptors (descpool.h): JSON (a jansson value) to protobuf wire bytes and
 * back, with no generated code for the message types. Field names are
 * lowerCamelCase (json_name) on output and either spelling on input; 64-bit
 * integers are strings on output (strings or numbers on input), bytes are
 * base64, enums are names, and the well-known types Timestamp, Duration, the
 * wrappers, Struct/Value/ListValue, FieldMask, Empty and Any have their
 * special forms. Groups are refused. One thread. */
#ifndef VRPC_TOOL_PBJSON_H
#define VRPC_TOOL_PBJSON_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "descpool.h"

/* A growable byte buffer (malloc'd). */
struct pbbuf {
    uint8_t *data;
    size_t len, cap;
};
void pbbuf_free(struct pbbuf *b);

#define PBJSON_ERR_MAX 256
#define PBJSON_MAX_DEPTH 64

/* Encodes `in` (a JSON object, or a well-known type's JSON form) as message
 * type `type` ("pkg.Msg") appended to out. 0, or -EINVAL with the reason
 * (naming the field's path) in err. */
int pbjson_encode(const struct descpool *p, const char *type, json_t *in, struct pbbuf *out, char *err, size_t errlen);

/* Decodes wire bytes of message type `type` into a new JSON value (caller
 * decrefs). Unknown fields are skipped. NULL with the reason in err. */
json_t *pbjson_decode(const struct descpool *p, const char *type, const uint8_t *data, size_t len, char *err,
                      size_t errlen);

/* JSON text of v: two-space indented (indent 0: one line), floating-point
 * numbers in the shortest form that reads back the same. malloc'd. */
char *pbjson_dumps(const json_t *v, int indent);

#endif

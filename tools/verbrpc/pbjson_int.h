/* What pbjson's encoder (pbjson_encode.c) and decoder (pbjson_decode.c)
 * share: field-type numbers, the error and path context, and descriptor
 * helpers (pbjson_common.c). Private to the tool. */
#ifndef VRPC_TOOL_PBJSON_INT_H
#define VRPC_TOOL_PBJSON_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pbjson.h"

/* FieldDescriptorProto.Type and .Label numbers (protoc-c's enums, shorter) */
#define T_DOUBLE 1
#define T_FLOAT 2
#define T_INT64 3
#define T_UINT64 4
#define T_INT32 5
#define T_FIXED64 6
#define T_FIXED32 7
#define T_BOOL 8
#define T_STRING 9
#define T_GROUP 10
#define T_MESSAGE 11
#define T_BYTES 12
#define T_UINT32 13
#define T_ENUM 14
#define T_SFIXED32 15
#define T_SFIXED64 16
#define T_SINT32 17
#define T_SINT64 18
#define L_REPEATED 3
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

struct ctx {
    const struct descpool *p;
    char *err;
    size_t errlen;
    char path[256]; /* "items[2].key", for messages */
    size_t plen;
    int depth;
};

/* The well-known types with a JSON form of their own. */
enum wkt {
    WKT_NONE,
    WKT_TIMESTAMP,
    WKT_DURATION,
    WKT_WRAPPER,
    WKT_STRUCT,
    WKT_VALUE,
    WKT_LIST,
    WKT_FIELDMASK,
    WKT_ANY,
};

#define TS_MIN (-62135596800LL) /* 0001-01-01T00:00:00Z */
#define TS_MAX 253402300799LL   /* 9999-12-31T23:59:59Z */
#define DUR_MAX 315576000000LL

/* Writes "path: reason" into c->err; returns -EINVAL. */
int pj_fail(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends to the path; returns the length pj_path_pop restores. */
size_t pj_path_push(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pj_path_pop(struct ctx *c, size_t old);
/* Appends n bytes to b. 0 or -ENOMEM. */
int pj_put(struct pbbuf *b, const void *d, size_t n);
/* lowerCamelCase of a field name, as protoc computes json_name. */
void pj_camel(const char *name, char *buf, size_t len);
/* f's JSON name (json_name, else computed into buf). */
const char *pj_json_name(const DpField *f, char *buf, size_t len);
const DpField *pj_field_by_number(const DpMsg *m, uint32_t num);
/* f's message or enum type without the leading dot; "" for scalars. */
const char *pj_type_name(const DpField *f);
bool pj_is_repeated(const DpField *f);
bool pj_is_scalar_numeric(const DpField *f);
/* The map entry type of f, or NULL if f is not a map. */
const DpMsg *pj_map_entry(struct ctx *c, const DpField *f);
int pj_wire_type(int type);
enum wkt pj_wkt_of(const char *type);

#endif

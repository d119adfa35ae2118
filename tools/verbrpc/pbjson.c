/* pbjson: JSON <-> protobuf wire bytes from run-time descriptors. Encoding
 * first rewrites a well-known type's JSON form into its plain message form
 * ("2020-01-01T00:00:00Z" -> {"seconds": "1577836800"}) and then encodes
 * every message the same way; decoding does the reverse. jansson parses and
 * holds the JSON; only its text output is written here (pbjson_dumps), for
 * the shortest round-tripping form of floating-point numbers, which
 * jansson's dump (always 17 digits) lacks. */
#define _DEFAULT_SOURCE /* timegm */
#include "pbjson.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int fail(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct ctx *c, const char *fmt, ...)
{
    char msg[PBJSON_ERR_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->err && c->errlen)
        snprintf(c->err, c->errlen, "%s%s%s", c->path, c->plen ? ": " : "", msg);
    return -EINVAL;
}

/* Appends ".name" or "[i]" to the path; returns the length to restore. */
static size_t path_push(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(struct ctx *c, const char *fmt, ...)
{
    size_t old = c->plen;
    va_list ap;

    if (c->plen < sizeof(c->path) - 1) {
        va_start(ap, fmt);
        int n = vsnprintf(c->path + c->plen, sizeof(c->path) - c->plen, fmt, ap);
        va_end(ap);
        c->plen = n < 0 ? c->plen : c->plen + (size_t)n >= sizeof(c->path) ? sizeof(c->path) - 1 : c->plen + (size_t)n;
    }
    return old;
}

static void path_pop(struct ctx *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

/* ---- bytes ----------------------------------------------------------------*/

void pbbuf_free(struct pbbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

static int put(struct pbbuf *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        uint8_t *v;

        while (cap < b->len + n)
            cap *= 2;
        if (!(v = realloc(b->data, cap)))
            return -ENOMEM;
        b->data = v;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, d, n);
    b->len += n;
    return 0;
}

static int put_varint(struct pbbuf *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;

    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return put(b, t, n);
}

static int put_tag(struct pbbuf *b, int32_t num, int wt) { return put_varint(b, ((uint64_t)(uint32_t)num << 3) | (unsigned)wt); }

static int put_len(struct pbbuf *b, const void *d, size_t n)
{
    int rc = put_varint(b, n);

    return rc ? rc : put(b, d, n);
}

static int put_le(struct pbbuf *b, uint64_t v, size_t n)
{
    uint8_t t[8];

    for (size_t i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    return put(b, t, n);
}

static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;

    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;

        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* ---- base64 (RFC 4648; both alphabets and optional padding on input) ------*/

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const uint8_t *d, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);

        *o++ = b64[v >> 18];
        *o++ = b64[(v >> 12) & 63];
        *o++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_val(char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+' || ch == '-')
        return 62;
    if (ch == '/' || ch == '_')
        return 63;
    return -1;
}

/* Decoded bytes appended to out; false if s is not base64. */
static bool b64_decode(const char *s, size_t n, struct pbbuf *out)
{
    uint32_t acc = 0;
    int bits = 0;

    while (n && s[n - 1] == '=')
        n--;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val(s[i]);

        if (v < 0)
            return false;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            uint8_t byte = (uint8_t)(acc >> (bits - 8));

            bits -= 8;
            if (put(out, &byte, 1))
                return false;
        }
    }
    return bits < 6; /* a lone sixth of a byte is not base64 */
}

/* ---- names ------------------------------------------------------------------*/

/* lowerCamelCase of a field name, as protoc computes json_name. */
static void camel(const char *name, char *buf, size_t len)
{
    size_t o = 0;
    bool up = false;

    for (; *name && o + 1 < len; name++) {
        if (*name == '_') {
            up = true;
            continue;
        }
        buf[o++] = up && *name >= 'a' && *name <= 'z' ? (char)(*name - 'a' + 'A') : *name;
        up = false;
    }
    buf[o] = '\0';
}

static const char *json_name(const DpField *f, char *buf, size_t len)
{
    if (f->json_name)
        return f->json_name;
    camel(f->name, buf, len);
    return buf;
}

static const DpField *field_by_key(const DpMsg *m, const char *key)
{
    char buf[256];

    for (size_t i = 0; i < m->n_field; i++)
        if (strcmp(m->field[i]->name, key) == 0 || strcmp(json_name(m->field[i], buf, sizeof(buf)), key) == 0)
            return m->field[i];
    return NULL;
}

static const DpField *field_by_number(const DpMsg *m, uint32_t num)
{
    for (size_t i = 0; i < m->n_field; i++)
        if ((uint32_t)m->field[i]->number == num)
            return m->field[i];
    return NULL;
}

static const char *type_name(const DpField *f) { return f->type_name ? f->type_name + (f->type_name[0] == '.') : ""; }

static bool is_repeated(const DpField *f) { return f->has_label && f->label == L_REPEATED; }

static bool is_scalar_numeric(const DpField *f)
{
    return f->type != T_STRING && f->type != T_BYTES && f->type != T_MESSAGE && f->type != T_GROUP;
}

static bool is_packed(const DpField *f, bool proto3)
{
    if (!is_repeated(f) || !is_scalar_numeric(f))
        return false;
    if (f->options && f->options->has_packed)
        return f->options->packed;
    return proto3;
}

/* Whether a zero value is written: not for proto3's implicit presence. */
static bool has_presence(const DpField *f, bool proto3)
{
    return !proto3 || f->type == T_MESSAGE || f->has_oneof_index || (f->has_proto3_optional && f->proto3_optional);
}

static const DpMsg *map_entry(struct ctx *c, const DpField *f)
{
    const DpMsg *m;

    if (!is_repeated(f) || f->type != T_MESSAGE)
        return NULL;
    m = descpool_message(c->p, type_name(f), NULL);
    return m && m->options && m->options->has_map_entry && m->options->map_entry ? m : NULL;
}

static int wire_type(int type)
{
    switch (type) {
    case T_DOUBLE: case T_FIXED64: case T_SFIXED64:
        return WT_I64;
    case T_FLOAT: case T_FIXED32: case T_SFIXED32:
        return WT_I32;
    case T_STRING: case T_BYTES: case T_MESSAGE:
        return WT_LEN;
    default:
        return WT_VARINT;
    }
}

/* ---- well-known types: JSON forms ---------------------------------------- */

enum wkt {
    WKT_NONE, WKT_TIMESTAMP, WKT_DURATION, WKT_WRAPPER, WKT_STRUCT, WKT_VALUE, WKT_LIST, WKT_FIELDMASK, WKT_ANY,
};

static enum wkt wkt_of(const char *type)
{
    static const struct { const char *name; enum wkt w; } t[] = {
        { "google.protobuf.Timestamp", WKT_TIMESTAMP }, { "google.protobuf.Duration", WKT_DURATION },
        { "google.protobuf.DoubleValue", WKT_WRAPPER }, { "google.protobuf.FloatValue", WKT_WRAPPER },
        { "google.protobuf.Int64Value", WKT_WRAPPER },  { "google.protobuf.UInt64Value", WKT_WRAPPER },
        { "google.protobuf.Int32Value", WKT_WRAPPER },  { "google.protobuf.UInt32Value", WKT_WRAPPER },
        { "google.protobuf.BoolValue", WKT_WRAPPER },   { "google.protobuf.StringValue", WKT_WRAPPER },
        { "google.protobuf.BytesValue", WKT_WRAPPER },  { "google.protobuf.Struct", WKT_STRUCT },
        { "google.protobuf.Value", WKT_VALUE },         { "google.protobuf.ListValue", WKT_LIST },
        { "google.protobuf.FieldMask", WKT_FIELDMASK }, { "google.protobuf.Any", WKT_ANY },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(type, t[i].name) == 0)
            return t[i].w;
    return WKT_NONE;
}

#define TS_MIN (-62135596800LL) /* 0001-01-01T00:00:00Z */
#define TS_MAX 253402300799LL   /* 9999-12-31T23:59:59Z */
#define DUR_MAX 315576000000LL

/* 0, 3, 6 or 9 fractional digits, as protobuf prints them. */
static void frac(char *buf, size_t len, int32_t nanos)
{
    if (nanos == 0)
        buf[0] = '\0';
    else if (nanos % 1000000 == 0)
        snprintf(buf, len, ".%03d", nanos / 1000000);
    else if (nanos % 1000 == 0)
        snprintf(buf, len, ".%06d", nanos / 1000);
    else
        snprintf(buf, len, ".%09d", nanos);
}

/* ".123" -> 123000000; *s advanced past the digits. false on > 9 digits. */
static bool parse_frac(const char **s, int32_t *nanos)
{
    int digits = 0;
    int32_t v = 0;

    *nanos = 0;
    if (**s != '.')
        return true;
    for ((*s)++; **s >= '0' && **s <= '9'; (*s)++, digits++) {
        if (digits == 9)
            return false;
        v = v * 10 + (**s - '0');
    }
    if (digits == 0)
        return false;
    for (int i = digits; i < 9; i++)
        v *= 10;
    *nanos = v;
    return true;
}

static json_t *sec_nanos(int64_t sec, int32_t nanos)
{
    char s[32];

    snprintf(s, sizeof(s), "%" PRId64, sec);
    return json_pack("{s:s,s:i}", "seconds", s, "nanos", (json_int_t)nanos);
}

static json_t *timestamp_in(struct ctx *c, json_t *v)
{
    const char *s = json_string_value(v);
    struct tm tm = { 0 };
    int32_t nanos;
    int n = 0, off = 0;

    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                     &tm.tm_sec, &n) != 6 || n != 19)
        goto bad;
    s += n;
    if (!parse_frac(&s, &nanos))
        goto bad;
    if (*s == 'Z' || *s == 'z') {
        s++;
    } else if (*s == '+' || *s == '-') {
        int hh, mm, k = 0;

        if (sscanf(s + 1, "%2d:%2d%n", &hh, &mm, &k) != 2 || k != 5)
            goto bad;
        off = (*s == '-' ? -1 : 1) * (hh * 3600 + mm * 60);
        s += 6;
    } else {
        goto bad;
    }
    if (*s)
        goto bad;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    int64_t sec = (int64_t)timegm(&tm) - off;
    if (sec < TS_MIN || sec > TS_MAX)
        goto bad;
    return sec_nanos(sec, nanos);
bad:
    fail(c, "expected an RFC 3339 timestamp (\"1972-01-01T10:00:20.021Z\")");
    return NULL;
}

static json_t *duration_in(struct ctx *c, json_t *v)
{
    const char *s = json_string_value(v);
    char *end;
    bool neg;
    int32_t nanos;

    if (!s || !*s)
        goto bad;
    neg = *s == '-';
    if (*s == '-' || *s == '+')
        s++;
    if (*s < '0' || *s > '9')
        goto bad;
    errno = 0;
    long long sec = strtoll(s, &end, 10);
    s = end;
    if (errno || sec > DUR_MAX || !parse_frac(&s, &nanos) || strcmp(s, "s") != 0)
        goto bad;
    return sec_nanos(neg ? -sec : sec, neg ? -nanos : nanos);
bad:
    fail(c, "expected a duration in seconds (\"1.5s\", \"-0.000001s\")");
    return NULL;
}

static json_t *fieldmask_in(struct ctx *c, json_t *v)
{
    const char *s = json_string_value(v);
    json_t *paths = json_array();
    char buf[1024];
    size_t o = 0;

    if (!s) {
        json_decref(paths);
        fail(c, "expected a field mask string (\"a.b,cD\")");
        return NULL;
    }
    for (;; s++) {
        if (*s == ',' || *s == '\0') {
            buf[o] = '\0';
            if (o)
                json_array_append_new(paths, json_string(buf));
            o = 0;
            if (!*s)
                break;
        } else if (o + 2 < sizeof(buf)) {
            if (*s >= 'A' && *s <= 'Z') {
                buf[o++] = '_';
                buf[o++] = (char)(*s - 'A' + 'a');
            } else {
                buf[o++] = *s;
            }
        }
    }
    return json_pack("{s:o}", "paths", paths);
}

/* The plain message form of a well-known type's JSON (new reference), or v
 * itself (new reference) if it is already in message form. NULL: error. */
static json_t *wkt_in(struct ctx *c, enum wkt w, json_t *v)
{
    switch (w) {
    case WKT_TIMESTAMP:
        return timestamp_in(c, v);
    case WKT_DURATION:
        return duration_in(c, v);
    case WKT_FIELDMASK:
        return fieldmask_in(c, v);
    case WKT_WRAPPER:
        return json_pack("{s:O}", "value", v);
    case WKT_STRUCT:
        if (!json_is_object(v))
            break;
        return json_pack("{s:O}", "fields", v);
    case WKT_LIST:
        if (!json_is_array(v))
            break;
        return json_pack("{s:O}", "values", v);
    case WKT_VALUE:
        switch (json_typeof(v)) {
        case JSON_NULL:
            return json_pack("{s:s}", "nullValue", "NULL_VALUE");
        case JSON_INTEGER: case JSON_REAL:
            return json_pack("{s:O}", "numberValue", v);
        case JSON_STRING:
            return json_pack("{s:O}", "stringValue", v);
        case JSON_TRUE: case JSON_FALSE:
            return json_pack("{s:O}", "boolValue", v);
        case JSON_OBJECT:
            return json_pack("{s:O}", "structValue", v);
        case JSON_ARRAY:
            return json_pack("{s:O}", "listValue", v);
        }
        break;
    default:
        return json_incref(v);
    }
    fail(c, "expected a JSON %s", w == WKT_STRUCT ? "object" : "array");
    return NULL;
}

/* ---- encode --------------------------------------------------------------- */

static int enc_msg(struct ctx *c, const char *type, json_t *v, struct pbbuf *out);

static int json_to_int(struct ctx *c, json_t *v, bool is_signed, int bits, uint64_t *out)
{
    long double x;

    if (json_is_integer(v)) {
        x = (long double)json_integer_value(v);
    } else if (json_is_real(v)) {
        x = json_real_value(v);
        if (x != floorl(x))
            return fail(c, "%g is not an integer", json_real_value(v));
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;

        errno = 0;
        if (is_signed) {
            long long ll = strtoll(s, &end, 10);
            x = (long double)ll;
        } else {
            if (strchr(s, '-'))
                return fail(c, "'%s' is negative for an unsigned field", s);
            unsigned long long ull = strtoull(s, &end, 10);
            x = (long double)ull;
            if (!errno && *s && !*end && bits == 64) {
                *out = ull; /* exact, beyond long double's doubt */
                return 0;
            }
        }
        if (errno || !*s || *end)
            return fail(c, "'%s' is not a %d-bit integer", s, bits);
        if (is_signed && bits == 64) {
            *out = (uint64_t)strtoll(s, NULL, 10);
            return 0;
        }
    } else {
        return fail(c, "expected an integer (number or string)");
    }
    long double lo = is_signed ? -ldexpl(1, bits - 1) : 0, hi = is_signed ? ldexpl(1, bits - 1) - 1 : ldexpl(1, bits) - 1;
    if (x < lo || x > hi)
        return fail(c, "%.0Lf is out of range for a %s%d field", x, is_signed ? "int" : "uint", bits);
    *out = is_signed ? (uint64_t)(int64_t)x : (uint64_t)x;
    return 0;
}

static int json_to_double(struct ctx *c, json_t *v, bool is_float, double *out)
{
    double d;

    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;

        if (strcmp(s, "NaN") == 0)
            d = NAN;
        else if (strcmp(s, "Infinity") == 0)
            d = INFINITY;
        else if (strcmp(s, "-Infinity") == 0)
            d = -INFINITY;
        else if ((d = strtod(s, &end)), !*s || *end || isinf(d) || isnan(d))
            return fail(c, "'%s' is not a number", s);
    } else {
        return fail(c, "expected a number");
    }
    if (is_float && isfinite(d) && fabs(d) > FLT_MAX)
        return fail(c, "%g is out of range for a float", d);
    *out = d;
    return 0;
}

static int enum_value(struct ctx *c, const DpField *f, json_t *v, int32_t *out)
{
    const DpEnum *e = descpool_enum(c->p, type_name(f));
    uint64_t u;

    if (json_is_null(v) && strcmp(type_name(f), "google.protobuf.NullValue") == 0) {
        *out = 0;
        return 0;
    }
    if (json_is_integer(v)) {
        if (json_to_int(c, v, true, 32, &u))
            return -EINVAL;
        *out = (int32_t)u;
        return 0;
    }
    if (!json_is_string(v))
        return fail(c, "expected an enum value name or number");
    for (size_t i = 0; e && i < e->n_value; i++) {
        if (strcmp(e->value[i]->name, json_string_value(v)) == 0) {
            *out = e->value[i]->number;
            return 0;
        }
    }
    return fail(c, "'%s' is not a value of enum %s", json_string_value(v), type_name(f));
}

/* The value of field f, without its tag, appended to out. */
static int enc_raw(struct ctx *c, const DpField *f, json_t *v, struct pbbuf *out)
{
    uint64_t u = 0;
    double d = 0;
    int32_t e = 0;

    switch (f->type) {
    case T_INT32:
    case T_INT64:
    case T_SINT32:
    case T_SINT64:
    case T_SFIXED32:
    case T_SFIXED64: {
        int bits = f->type == T_INT64 || f->type == T_SINT64 || f->type == T_SFIXED64 ? 64 : 32;

        if (json_to_int(c, v, true, bits, &u))
            return -EINVAL;
        if (f->type == T_SINT32)
            return put_varint(out, (uint32_t)(((uint32_t)u << 1) ^ (uint32_t)((int32_t)u >> 31)));
        if (f->type == T_SINT64)
            return put_varint(out, (u << 1) ^ (uint64_t)((int64_t)u >> 63));
        if (f->type == T_SFIXED32)
            return put_le(out, u, 4);
        if (f->type == T_SFIXED64)
            return put_le(out, u, 8);
        return put_varint(out, u); /* int32: sign-extended to 10 bytes, as protobuf does */
    }
    case T_UINT32:
    case T_UINT64:
    case T_FIXED32:
    case T_FIXED64:
        if (json_to_int(c, v, false, f->type == T_UINT64 || f->type == T_FIXED64 ? 64 : 32, &u))
            return -EINVAL;
        if (f->type == T_FIXED32)
            return put_le(out, u, 4);
        if (f->type == T_FIXED64)
            return put_le(out, u, 8);
        return put_varint(out, u);
    case T_BOOL:
        if (!json_is_boolean(v))
            return fail(c, "expected true or false");
        return put_varint(out, json_is_true(v));
    case T_ENUM:
        if (enum_value(c, f, v, &e))
            return -EINVAL;
        return put_varint(out, (uint64_t)(int64_t)e);
    case T_DOUBLE:
    case T_FLOAT:
        if (json_to_double(c, v, f->type == T_FLOAT, &d))
            return -EINVAL;
        if (f->type == T_FLOAT) {
            float fl = (float)d;
            uint32_t bits32;

            memcpy(&bits32, &fl, 4);
            return put_le(out, bits32, 4);
        }
        memcpy(&u, &d, 8);
        return put_le(out, u, 8);
    case T_STRING:
        if (!json_is_string(v))
            return fail(c, "expected a string");
        return put_len(out, json_string_value(v), json_string_length(v));
    case T_BYTES: {
        struct pbbuf b = { 0 };
        int rc;

        if (!json_is_string(v) || !b64_decode(json_string_value(v), json_string_length(v), &b)) {
            pbbuf_free(&b);
            return fail(c, "expected base64 bytes");
        }
        rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    case T_MESSAGE: {
        struct pbbuf b = { 0 };
        int rc = enc_msg(c, type_name(f), v, &b);

        if (rc == 0)
            rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    default:
        return fail(c, "groups are not supported");
    }
}

static bool all_zero(const struct pbbuf *b)
{
    for (size_t i = 0; i < b->len; i++)
        if (b->data[i])
            return false;
    return true;
}

/* One singular value with its tag. */
static int enc_one(struct ctx *c, const DpField *f, json_t *v, bool proto3, struct pbbuf *out)
{
    struct pbbuf b = { 0 };
    int rc = enc_raw(c, f, v, &b);

    /* proto3 implicit presence: a zero (0, false, "", first enum value) is not written */
    if (rc == 0 && (has_presence(f, proto3) || !all_zero(&b))) {
        rc = put_tag(out, f->number, wire_type(f->type));
        if (rc == 0)
            rc = put(out, b.data, b.len);
    }
    pbbuf_free(&b);
    return rc;
}

/* Whether a JSON null is a value of f (google.protobuf.Value's null), not
 * "the default". */
static bool null_is_value(const DpField *f)
{
    return (f->type == T_MESSAGE && strcmp(type_name(f), "google.protobuf.Value") == 0) ||
           (f->type == T_ENUM && strcmp(type_name(f), "google.protobuf.NullValue") == 0);
}

/* A map's JSON key (always a string) as its key field's JSON value. */
static json_t *map_key(struct ctx *c, const DpField *kf, const char *key)
{
    if (kf->type == T_BOOL) {
        if (strcmp(key, "true") == 0)
            return json_true();
        if (strcmp(key, "false") == 0)
            return json_false();
        fail(c, "map key '%s' is not a bool", key);
        return NULL;
    }
    return json_string(key); /* integers are read from strings too */
}

static int enc_map(struct ctx *c, const DpField *f, const DpMsg *entry, json_t *v, struct pbbuf *out)
{
    const DpField *kf = field_by_number(entry, 1), *vf = field_by_number(entry, 2);
    const char *key;
    json_t *val;

    if (!json_is_object(v))
        return fail(c, "expected a JSON object for a map");
    if (!kf || !vf)
        return fail(c, "map entry %s lacks its key or value field", entry->name);
    json_object_foreach(v, key, val) {
        size_t old = path_push(c, "[\"%s\"]", key);
        struct pbbuf b = { 0 };
        json_t *k = map_key(c, kf, key);
        int rc = k ? enc_one(c, kf, k, false, &b) : -EINVAL;

        json_decref(k);
        if (rc == 0 && (!json_is_null(val) || null_is_value(vf)))
            rc = enc_one(c, vf, val, false, &b);
        if (rc == 0)
            rc = put_tag(out, f->number, WT_LEN);
        if (rc == 0)
            rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        if (rc)
            return rc;
        path_pop(c, old);
    }
    return 0;
}

static int enc_field(struct ctx *c, const DpField *f, json_t *v, bool proto3, struct pbbuf *out)
{
    const DpMsg *entry = map_entry(c, f);
    size_t i;
    json_t *e;

    if (json_is_null(v) && !null_is_value(f))
        return 0; /* null: the field's default */
    if (entry)
        return enc_map(c, f, entry, v, out);
    if (!is_repeated(f))
        return enc_one(c, f, v, proto3, out);
    if (!json_is_array(v))
        return fail(c, "expected a JSON array for a repeated field");
    if (is_packed(f, proto3)) {
        struct pbbuf b = { 0 };
        int rc = 0;

        json_array_foreach(v, i, e) {
            size_t old = path_push(c, "[%zu]", i);

            if ((rc = enc_raw(c, f, e, &b)) != 0) {
                pbbuf_free(&b);
                return rc;
            }
            path_pop(c, old);
        }
        if (b.len)
            rc = put_tag(out, f->number, WT_LEN);
        if (rc == 0 && b.len)
            rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    json_array_foreach(v, i, e) {
        size_t old = path_push(c, "[%zu]", i);
        int rc = put_tag(out, f->number, wire_type(f->type));

        if (rc == 0)
            rc = enc_raw(c, f, e, out);
        if (rc)
            return rc;
        path_pop(c, old);
    }
    return 0;
}

static int enc_any(struct ctx *c, json_t *v, struct pbbuf *out)
{
    json_t *t = json_object_get(v, "@type"), *body;
    const char *url, *slash;
    struct pbbuf b = { 0 };
    int rc;

    if (!json_is_object(v))
        return fail(c, "expected a JSON object for google.protobuf.Any");
    if (json_object_size(v) == 0)
        return 0;
    if (!json_is_string(t))
        return fail(c, "google.protobuf.Any needs an \"@type\"");
    url = json_string_value(t);
    slash = strrchr(url, '/');
    const char *inner = slash ? slash + 1 : url;
    if (!descpool_message(c->p, inner, NULL))
        return fail(c, "unknown type %s in \"@type\"", inner);
    if (wkt_of(inner) != WKT_NONE && wkt_of(inner) != WKT_ANY) {
        body = json_incref(json_object_get(v, "value"));
        if (!body)
            return fail(c, "an Any of %s needs a \"value\"", inner);
    } else {
        body = json_deep_copy(v);
        json_object_del(body, "@type");
    }
    rc = enc_msg(c, inner, body, &b);
    json_decref(body);
    if (rc == 0)
        rc = put_tag(out, 1, WT_LEN);
    if (rc == 0)
        rc = put_len(out, url, strlen(url));
    if (rc == 0 && b.len)
        rc = put_tag(out, 2, WT_LEN);
    if (rc == 0 && b.len)
        rc = put_len(out, b.data, b.len);
    pbbuf_free(&b);
    return rc;
}

static int enc_msg(struct ctx *c, const char *type, json_t *v, struct pbbuf *out)
{
    const DpFile *file;
    const DpMsg *m = descpool_message(c->p, type, &file);
    enum wkt w = wkt_of(type);
    const char *key;
    json_t *val, *plain;
    int rc = 0;

    if (!m)
        return fail(c, "unknown message type %s", type);
    if (c->depth >= PBJSON_MAX_DEPTH)
        return fail(c, "nested deeper than %d", PBJSON_MAX_DEPTH);
    if (w == WKT_ANY)
        return enc_any(c, v, out);
    if (!(plain = wkt_in(c, w, v)))
        return -EINVAL;
    if (!json_is_object(plain)) {
        json_decref(plain);
        return fail(c, "expected a JSON object for %s", type);
    }
    c->depth++;
    json_object_foreach(plain, key, val) {
        const DpField *f = field_by_key(m, key);
        size_t old = path_push(c, "%s%s", c->plen ? "." : "", key);

        if (!f) {
            rc = fail(c, "no such field in %s", type);
            break;
        }
        if ((rc = enc_field(c, f, val, dp_proto3(file), out)) != 0)
            break;
        path_pop(c, old);
    }
    c->depth--;
    json_decref(plain);
    return rc;
}

int pbjson_encode(const struct descpool *p, const char *type, json_t *in, struct pbbuf *out, char *err,
                  size_t errlen)
{
    struct ctx c = { .p = p, .err = err, .errlen = errlen };

    return enc_msg(&c, type + (type[0] == '.'), in, out);
}

/* ---- decode --------------------------------------------------------------- */

static json_t *dec_msg(struct ctx *c, const char *type, const uint8_t *d, size_t n);

static json_t *int64_json(int64_t v)
{
    char s[24];

    snprintf(s, sizeof(s), "%" PRId64, v);
    return json_string(s);
}

static json_t *uint64_json(uint64_t v)
{
    char s[24];

    snprintf(s, sizeof(s), "%" PRIu64, v);
    return json_string(s);
}

static json_t *double_json(double d)
{
    if (isnan(d))
        return json_string("NaN");
    if (isinf(d))
        return json_string(d > 0 ? "Infinity" : "-Infinity");
    return json_real(d);
}

/* A float as the double nearest its shortest decimal form, so that it
 * prints as 0.1, not 0.10000000149011612. */
static json_t *float_json(float f)
{
    char s[32];

    if (!isfinite(f))
        return double_json(f);
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(s, sizeof(s), "%.*g", prec, (double)f);
        if ((float)strtod(s, NULL) == f)
            break;
    }
    return json_real(strtod(s, NULL));
}

static json_t *enum_json(struct ctx *c, const DpField *f, int32_t v)
{
    const DpEnum *e = descpool_enum(c->p, type_name(f));

    if (strcmp(type_name(f), "google.protobuf.NullValue") == 0)
        return json_null();
    for (size_t i = 0; e && i < e->n_value; i++)
        if (e->value[i]->number == v)
            return json_string(e->value[i]->name);
    return json_integer(v);
}

/* The JSON of one value of f read at *p (its tag already read, of wire type
 * wt, which matches f). NULL with err set on malformed input. */
static json_t *dec_value(struct ctx *c, const DpField *f, int wt, const uint8_t **p, const uint8_t *end)
{
    uint64_t u = 0;

    if (wt == WT_VARINT) {
        if (!get_varint(p, end, &u))
            goto trunc;
    } else if (wt == WT_I64 || wt == WT_I32) {
        size_t n = wt == WT_I64 ? 8 : 4;

        if ((size_t)(end - *p) < n)
            goto trunc;
        for (size_t i = 0; i < n; i++)
            u |= (uint64_t)(*p)[i] << (8 * i);
        *p += n;
    } else {
        uint64_t len;
        const uint8_t *s;

        if (!get_varint(p, end, &len) || len > (uint64_t)(end - *p))
            goto trunc;
        s = *p;
        *p += len;
        if (f->type == T_STRING) {
            json_t *j = json_stringn((const char *)s, (size_t)len);

            if (!j)
                fail(c, "string is not valid UTF-8");
            return j;
        }
        if (f->type == T_BYTES) {
            char *b = b64_encode(s, (size_t)len);
            json_t *j = b ? json_string(b) : NULL;

            free(b);
            return j;
        }
        return dec_msg(c, type_name(f), s, (size_t)len);
    }
    switch (f->type) {
    case T_INT32: return json_integer((int32_t)u);
    case T_INT64: return int64_json((int64_t)u);
    case T_UINT32: return json_integer((uint32_t)u);
    case T_UINT64: return uint64_json(u);
    case T_SINT32: return json_integer((int32_t)((uint32_t)u >> 1) ^ -(int32_t)(u & 1));
    case T_SINT64: return int64_json((int64_t)(u >> 1) ^ -(int64_t)(u & 1));
    case T_BOOL: return json_boolean(u != 0);
    case T_ENUM: return enum_json(c, f, (int32_t)u);
    case T_FIXED32: return json_integer((uint32_t)u);
    case T_SFIXED32: return json_integer((int32_t)(uint32_t)u);
    case T_FIXED64: return uint64_json(u);
    case T_SFIXED64: return int64_json((int64_t)u);
    case T_FLOAT: {
        uint32_t b32 = (uint32_t)u;
        float fl;

        memcpy(&fl, &b32, 4);
        return float_json(fl);
    }
    case T_DOUBLE: {
        double d;

        memcpy(&d, &u, 8);
        return double_json(d);
    }
    default:
        fail(c, "groups are not supported");
        return NULL;
    }
trunc:
    fail(c, "truncated field %s", f->name);
    return NULL;
}

static bool skip_field(int wt, const uint8_t **p, const uint8_t *end)
{
    uint64_t v;

    switch (wt) {
    case WT_VARINT:
        return get_varint(p, end, &v);
    case WT_I64:
    case WT_I32:
        if ((size_t)(end - *p) < (wt == WT_I64 ? 8u : 4u))
            return false;
        *p += wt == WT_I64 ? 8 : 4;
        return true;
    case WT_LEN:
        if (!get_varint(p, end, &v) || v > (uint64_t)(end - *p))
            return false;
        *p += v;
        return true;
    default:
        return false; /* groups */
    }
}

/* The JSON of a field with no value on the wire (a map entry's value). */
static json_t *default_json(struct ctx *c, const DpField *f)
{
    uint8_t zero[8] = { 0 };
    const uint8_t *p = zero;

    if (f->type == T_MESSAGE)
        return dec_msg(c, type_name(f), zero, 0);
    return dec_value(c, f, wire_type(f->type), &p, zero + 8);
}

static int add_map_entry(struct ctx *c, const DpField *f, const DpMsg *entry, json_t *obj, const char *name,
                         const uint8_t *d, size_t n)
{
    const DpField *kf = field_by_number(entry, 1), *vf = field_by_number(entry, 2);
    json_t *map = json_object_get(obj, name), *key = NULL, *val = NULL;
    const uint8_t *p = d, *end = d + n;
    char kbuf[32];
    const char *ks;

    if (!kf || !vf)
        return fail(c, "map entry %s lacks its key or value field", entry->name);
    if (!map) {
        map = json_object();
        json_object_set_new(obj, name, map);
    }
    while (p < end) {
        uint64_t tag;
        json_t *j;

        if (!get_varint(&p, end, &tag))
            goto bad;
        const DpField *ef = (tag >> 3) == 1 ? kf : (tag >> 3) == 2 ? vf : NULL;
        if (!ef || (int)(tag & 7) != wire_type(ef->type)) {
            if (!skip_field((int)(tag & 7), &p, end))
                goto bad;
            continue;
        }
        if (!(j = dec_value(c, ef, (int)(tag & 7), &p, end)))
            goto fail;
        json_decref(ef == kf ? key : val);
        *(ef == kf ? &key : &val) = j;
    }
    if (!key && !(key = default_json(c, kf)))
        goto fail;
    if (!val && !(val = default_json(c, vf)))
        goto fail;
    if (json_is_string(key))
        ks = json_string_value(key);
    else if (json_is_boolean(key))
        ks = json_is_true(key) ? "true" : "false";
    else
        ks = (snprintf(kbuf, sizeof(kbuf), "%" JSON_INTEGER_FORMAT, json_integer_value(key)), kbuf);
    json_object_set_new(map, ks, val);
    json_decref(key);
    (void)f;
    return 0;
bad:
    fail(c, "malformed map entry");
fail:
    json_decref(key);
    json_decref(val);
    return -EINVAL;
}

static json_t *wkt_out(struct ctx *c, enum wkt w, json_t *obj)
{
    json_t *r = NULL;

    switch (w) {
    case WKT_TIMESTAMP:
    case WKT_DURATION: {
        json_t *js = json_object_get(obj, "seconds");
        int64_t sec = js ? strtoll(json_string_value(js), NULL, 10) : 0;
        int32_t nanos = (int32_t)json_integer_value(json_object_get(obj, "nanos"));
        char f[16], s[64];

        if (w == WKT_TIMESTAMP) {
            struct tm tm;
            time_t t = (time_t)sec;

            if (sec < TS_MIN || sec > TS_MAX || nanos < 0 || nanos > 999999999 || !gmtime_r(&t, &tm)) {
                fail(c, "timestamp out of range");
                break;
            }
            frac(f, sizeof(f), nanos);
            snprintf(s, sizeof(s), "%04d-%02d-%02dT%02d:%02d:%02d%sZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, f);
        } else {
            if (sec > DUR_MAX || sec < -DUR_MAX || (sec > 0 && nanos < 0) || (sec < 0 && nanos > 0) ||
                nanos > 999999999 || nanos < -999999999) {
                fail(c, "duration out of range");
                break;
            }
            frac(f, sizeof(f), nanos < 0 ? -nanos : nanos);
            snprintf(s, sizeof(s), "%s%lld%ss", sec < 0 || nanos < 0 ? "-" : "", (long long)(sec < 0 ? -sec : sec), f);
        }
        r = json_string(s);
        break;
    }
    case WKT_WRAPPER: /* dec_msg has put the zero in when the wire had none */
        r = json_incref(json_object_get(obj, "value"));
        break;
    case WKT_STRUCT:
        r = json_incref(json_object_get(obj, "fields"));
        if (!r)
            r = json_object();
        break;
    case WKT_LIST:
        r = json_incref(json_object_get(obj, "values"));
        if (!r)
            r = json_array();
        break;
    case WKT_VALUE: {
        const char *k;
        json_t *v;

        json_object_foreach(obj, k, v) {
            json_decref(r);
            r = json_incref(v); /* the oneof's member: null for nullValue */
        }
        if (!r)
            fail(c, "google.protobuf.Value with no kind set");
        break;
    }
    case WKT_FIELDMASK: {
        json_t *paths = json_object_get(obj, "paths"), *p;
        size_t i;
        struct pbbuf b = { 0 };

        json_array_foreach(paths, i, p) {
            char buf[1024];

            if (i)
                put(&b, ",", 1);
            camel(json_string_value(p), buf, sizeof(buf));
            put(&b, buf, strlen(buf));
        }
        put(&b, "", 1);
        r = json_string((char *)b.data);
        pbbuf_free(&b);
        break;
    }
    default:
        r = json_incref(obj);
    }
    json_decref(obj);
    return r;
}

static json_t *dec_any(struct ctx *c, const uint8_t *d, size_t n)
{
    const uint8_t *p = d, *end = d + n, *val = NULL;
    uint64_t tag, len, vlen = 0;
    char *url = NULL;
    json_t *r = NULL, *inner;

    while (p < end) {
        if (!get_varint(&p, end, &tag))
            goto bad;
        if ((tag == (1 << 3 | WT_LEN) || tag == (2 << 3 | WT_LEN))) {
            if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p))
                goto bad;
            if (tag >> 3 == 1) {
                free(url);
                url = strndup((const char *)p, (size_t)len);
            } else {
                val = p;
                vlen = len;
            }
            p += len;
        } else if (!skip_field((int)(tag & 7), &p, end)) {
            goto bad;
        }
    }
    if (!url) {
        r = json_object();
        goto out;
    }
    const char *slash = strrchr(url, '/'), *type = slash ? slash + 1 : url;
    if (!descpool_message(c->p, type, NULL)) {
        fail(c, "Any holds %s, whose descriptor is unknown", type);
        goto out;
    }
    if (!(inner = dec_msg(c, type, val ? val : d, val ? (size_t)vlen : 0)))
        goto out;
    if (json_is_object(inner) && (wkt_of(type) == WKT_NONE || wkt_of(type) == WKT_ANY)) {
        r = json_pack("{s:s}", "@type", url);
        json_object_update(r, inner);
        json_decref(inner);
    } else {
        r = json_pack("{s:s,s:o}", "@type", url, "value", inner);
    }
out:
    free(url);
    return r;
bad:
    fail(c, "malformed google.protobuf.Any");
    free(url);
    return NULL;
}

static json_t *dec_msg(struct ctx *c, const char *type, const uint8_t *d, size_t n)
{
    const DpFile *file;
    const DpMsg *m = descpool_message(c->p, type, &file);
    const uint8_t *p = d, *end = d + n;
    enum wkt w = wkt_of(type);
    json_t *obj;
    char nbuf[256];

    if (!m) {
        fail(c, "unknown message type %s", type);
        return NULL;
    }
    if (c->depth >= PBJSON_MAX_DEPTH) {
        fail(c, "nested deeper than %d", PBJSON_MAX_DEPTH);
        return NULL;
    }
    if (w == WKT_ANY)
        return dec_any(c, d, n);
    obj = json_object();
    c->depth++;
    while (p < end) {
        uint64_t tag;
        const DpField *f;
        const DpMsg *entry;
        int wt;

        if (!get_varint(&p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
            fail(c, "malformed field tag");
            goto fail;
        }
        wt = (int)(tag & 7);
        f = field_by_number(m, (uint32_t)(tag >> 3));
        if (!f || (wt != wire_type(f->type) && !(wt == WT_LEN && is_repeated(f) && is_scalar_numeric(f)))) {
            if (!skip_field(wt, &p, end)) {
                fail(c, "malformed field %u", (unsigned)(tag >> 3));
                goto fail;
            }
            continue; /* unknown, or a wire type that does not fit: skipped, as protobuf keeps it aside */
        }
        const char *name = json_name(f, nbuf, sizeof(nbuf));
        size_t old = path_push(c, "%s%s", c->plen ? "." : "", name);
        if ((entry = map_entry(c, f))) {
            uint64_t len;

            if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p) ||
                add_map_entry(c, f, entry, obj, name, p, (size_t)len) != 0) {
                if (c->err && !c->err[0])
                    fail(c, "malformed map entry");
                goto fail;
            }
            p += len;
        } else if (is_repeated(f)) {
            json_t *arr = json_object_get(obj, name);

            if (!arr) {
                arr = json_array();
                json_object_set_new(obj, name, arr);
            }
            if (wt == WT_LEN && is_scalar_numeric(f)) {
                uint64_t len;
                const uint8_t *pe;

                if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p)) {
                    fail(c, "truncated packed field");
                    goto fail;
                }
                pe = p + len;
                while (p < pe) {
                    json_t *j = dec_value(c, f, wire_type(f->type), &p, pe);

                    if (!j)
                        goto fail;
                    json_array_append_new(arr, j);
                }
            } else {
                json_t *j = dec_value(c, f, wt, &p, end);

                if (!j)
                    goto fail;
                json_array_append_new(arr, j);
            }
        } else {
            json_t *j = dec_value(c, f, wt, &p, end), *old_v = json_object_get(obj, name);

            if (!j)
                goto fail;
            if (json_is_object(old_v) && json_is_object(j)) /* a message seen twice merges */
                json_object_update_recursive(old_v, j), json_decref(j);
            else
                json_object_set_new(obj, name, j);
        }
        path_pop(c, old);
    }
    c->depth--;
    if (w == WKT_WRAPPER && !json_object_get(obj, "value")) {
        const DpField *vf = field_by_number(m, 1);
        json_t *z = vf ? default_json(c, vf) : NULL;

        if (!z)
            goto fail_d;
        json_object_set_new(obj, "value", z);
    }
    return wkt_out(c, w, obj);
fail:
    c->depth--;
fail_d:
    json_decref(obj);
    return NULL;
}

json_t *pbjson_decode(const struct descpool *p, const char *type, const uint8_t *data, size_t len, char *err,
                      size_t errlen)
{
    struct ctx c = { .p = p, .err = err, .errlen = errlen };

    if (err && errlen)
        err[0] = '\0';
    return dec_msg(&c, type + (type[0] == '.'), data, len);
}

/* ---- text ------------------------------------------------------------------*/

static void dump(struct pbbuf *b, const json_t *v, int indent, int level)
{
    char s[64];
    const char *key;
    json_t *e;
    size_t i, n;

    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY: {
        bool obj = json_is_object(v);

        n = obj ? json_object_size(v) : json_array_size(v);
        put(b, obj ? "{" : "[", 1);
        if (n == 0) {
            put(b, obj ? "}" : "]", 1);
            break;
        }
        i = 0;
        void *it = obj ? json_object_iter((json_t *)v) : NULL;
        for (size_t k = 0; k < n; k++) {
            if (k)
                put(b, ",", 1);
            if (indent) {
                put(b, "\n", 1);
                for (int sp = 0; sp < indent * (level + 1); sp++)
                    put(b, " ", 1);
            }
            if (obj) {
                json_t *ks;
                char *q;

                key = json_object_iter_key(it);
                e = json_object_iter_value(it);
                it = json_object_iter_next((json_t *)v, it);
                ks = json_string(key);
                q = json_dumps(ks, JSON_ENCODE_ANY); /* jansson escapes the key */
                put(b, q, strlen(q));
                put(b, indent ? ": " : ":", indent ? 2 : 1);
                free(q);
                json_decref(ks);
            } else {
                e = json_array_get(v, k);
            }
            dump(b, e, indent, level + 1);
        }
        (void)i;
        if (indent) {
            put(b, "\n", 1);
            for (int sp = 0; sp < indent * level; sp++)
                put(b, " ", 1);
        }
        put(b, obj ? "}" : "]", 1);
        break;
    }
    case JSON_REAL: {
        double d = json_real_value(v);

        for (int prec = 1; prec <= 17; prec++) {
            snprintf(s, sizeof(s), "%.*g", prec, d);
            if (strtod(s, NULL) == d)
                break;
        }
        put(b, s, strlen(s));
        break;
    }
    default: {
        char *q = json_dumps(v, JSON_ENCODE_ANY); /* strings (escaped), integers, literals */

        put(b, q, strlen(q));
        free(q);
    }
    }
}

char *pbjson_dumps(const json_t *v, int indent)
{
    struct pbbuf b = { 0 };

    dump(&b, v, indent, 0);
    put(&b, "", 1);
    return (char *)b.data;
}

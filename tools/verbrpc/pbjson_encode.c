/* pbjson, JSON to wire bytes: a well-known type's JSON form is first
 * rewritten into its plain message form ("2020-01-01T00:00:00Z" ->
 * {"seconds": "1577836800"}), then every message is encoded the same way,
 * by its run-time descriptor. */
#define _DEFAULT_SOURCE /* timegm */
#include "pbjson_int.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int put_varint(struct pbbuf *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;

    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return pj_put(b, t, n);
}

static int put_tag(struct pbbuf *b, int32_t num, int wt)
{
    return put_varint(b, ((uint64_t)(uint32_t)num << 3) | (unsigned)wt);
}

static int put_len(struct pbbuf *b, const void *d, size_t n)
{
    int rc = put_varint(b, n);

    return rc ? rc : pj_put(b, d, n);
}

static int put_le(struct pbbuf *b, uint64_t v, size_t n)
{
    uint8_t t[8];

    for (size_t i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    return pj_put(b, t, n);
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
            if (pj_put(out, &byte, 1))
                return false;
        }
    }
    return bits < 6; /* a lone sixth of a byte is not base64 */
}

static const DpField *field_by_key(const DpMsg *m, const char *key)
{
    char buf[256];

    for (size_t i = 0; i < m->n_field; i++)
        if (strcmp(m->field[i]->name, key) == 0 || strcmp(pj_json_name(m->field[i], buf, sizeof(buf)), key) == 0)
            return m->field[i];
    return NULL;
}

static bool is_packed(const DpField *f, bool proto3)
{
    if (!pj_is_repeated(f) || !pj_is_scalar_numeric(f))
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
    struct tm tm = {0};
    int32_t nanos;
    int n = 0, off = 0;

    if (!s ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &n) != 6 ||
        n != 19)
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
    pj_fail(c, "expected an RFC 3339 timestamp (\"1972-01-01T10:00:20.021Z\")");
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
    pj_fail(c, "expected a duration in seconds (\"1.5s\", \"-0.000001s\")");
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
        pj_fail(c, "expected a field mask string (\"a.b,cD\")");
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
        case JSON_INTEGER:
        case JSON_REAL:
            return json_pack("{s:O}", "numberValue", v);
        case JSON_STRING:
            return json_pack("{s:O}", "stringValue", v);
        case JSON_TRUE:
        case JSON_FALSE:
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
    pj_fail(c, "expected a JSON %s", w == WKT_STRUCT ? "object" : "array");
    return NULL;
}

/* ---- messages ------------------------------------------------------------ */

static int enc_msg(struct ctx *c, const char *type, json_t *v, struct pbbuf *out);

static int json_to_int(struct ctx *c, json_t *v, bool is_signed, int bits, uint64_t *out)
{
    long double x;

    if (json_is_integer(v)) {
        x = (long double)json_integer_value(v);
    } else if (json_is_real(v)) {
        x = json_real_value(v);
        if (x != floorl(x))
            return pj_fail(c, "%g is not an integer", json_real_value(v));
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;

        errno = 0;
        if (is_signed) {
            long long ll = strtoll(s, &end, 10);
            x = (long double)ll;
        } else {
            if (strchr(s, '-'))
                return pj_fail(c, "'%s' is negative for an unsigned field", s);
            unsigned long long ull = strtoull(s, &end, 10);
            x = (long double)ull;
            if (!errno && *s && !*end && bits == 64) {
                *out = ull; /* exact, beyond long double's doubt */
                return 0;
            }
        }
        if (errno || !*s || *end)
            return pj_fail(c, "'%s' is not a %d-bit integer", s, bits);
        if (is_signed && bits == 64) {
            *out = (uint64_t)strtoll(s, NULL, 10);
            return 0;
        }
    } else {
        return pj_fail(c, "expected an integer (number or string)");
    }
    long double lo = is_signed ? -ldexpl(1, bits - 1) : 0,
                hi = is_signed ? ldexpl(1, bits - 1) - 1 : ldexpl(1, bits) - 1;
    if (x < lo || x > hi)
        return pj_fail(c, "%.0Lf is out of range for a %s%d field", x, is_signed ? "int" : "uint", bits);
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
            return pj_fail(c, "'%s' is not a number", s);
    } else {
        return pj_fail(c, "expected a number");
    }
    if (is_float && isfinite(d) && fabs(d) > FLT_MAX)
        return pj_fail(c, "%g is out of range for a float", d);
    *out = d;
    return 0;
}

static int enum_value(struct ctx *c, const DpField *f, json_t *v, int32_t *out)
{
    const DpEnum *e = descpool_enum(c->p, pj_type_name(f));
    uint64_t u;

    if (json_is_null(v) && strcmp(pj_type_name(f), "google.protobuf.NullValue") == 0) {
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
        return pj_fail(c, "expected an enum value name or number");
    for (size_t i = 0; e && i < e->n_value; i++) {
        if (strcmp(e->value[i]->name, json_string_value(v)) == 0) {
            *out = e->value[i]->number;
            return 0;
        }
    }
    return pj_fail(c, "'%s' is not a value of enum %s", json_string_value(v), pj_type_name(f));
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
            return pj_fail(c, "expected true or false");
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
            return pj_fail(c, "expected a string");
        return put_len(out, json_string_value(v), json_string_length(v));
    case T_BYTES: {
        struct pbbuf b = {0};
        int rc;

        if (!json_is_string(v) || !b64_decode(json_string_value(v), json_string_length(v), &b)) {
            pbbuf_free(&b);
            return pj_fail(c, "expected base64 bytes");
        }
        rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    case T_MESSAGE: {
        struct pbbuf b = {0};
        int rc = enc_msg(c, pj_type_name(f), v, &b);

        if (rc == 0)
            rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    default:
        return pj_fail(c, "groups are not supported");
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
    struct pbbuf b = {0};
    int rc = enc_raw(c, f, v, &b);

    /* proto3 implicit presence: a zero (0, false, "", first enum value) is not written */
    if (rc == 0 && (has_presence(f, proto3) || !all_zero(&b))) {
        rc = put_tag(out, f->number, pj_wire_type(f->type));
        if (rc == 0)
            rc = pj_put(out, b.data, b.len);
    }
    pbbuf_free(&b);
    return rc;
}

/* Whether a JSON null is a value of f (google.protobuf.Value's null), not
 * "the default". */
static bool null_is_value(const DpField *f)
{
    return (f->type == T_MESSAGE && strcmp(pj_type_name(f), "google.protobuf.Value") == 0) ||
           (f->type == T_ENUM && strcmp(pj_type_name(f), "google.protobuf.NullValue") == 0);
}

/* A map's JSON key (always a string) as its key field's JSON value. */
static json_t *map_key(struct ctx *c, const DpField *kf, const char *key)
{
    if (kf->type == T_BOOL) {
        if (strcmp(key, "true") == 0)
            return json_true();
        if (strcmp(key, "false") == 0)
            return json_false();
        pj_fail(c, "map key '%s' is not a bool", key);
        return NULL;
    }
    return json_string(key); /* integers are read from strings too */
}

static int enc_map(struct ctx *c, const DpField *f, const DpMsg *entry, json_t *v, struct pbbuf *out)
{
    const DpField *kf = pj_field_by_number(entry, 1), *vf = pj_field_by_number(entry, 2);
    const char *key;
    json_t *val;

    if (!json_is_object(v))
        return pj_fail(c, "expected a JSON object for a map");
    if (!kf || !vf)
        return pj_fail(c, "map entry %s lacks its key or value field", entry->name);
    json_object_foreach(v, key, val)
    {
        size_t old = pj_path_push(c, "[\"%s\"]", key);
        struct pbbuf b = {0};
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
        pj_path_pop(c, old);
    }
    return 0;
}

static int enc_field(struct ctx *c, const DpField *f, json_t *v, bool proto3, struct pbbuf *out)
{
    const DpMsg *entry = pj_map_entry(c, f);
    size_t i;
    json_t *e;

    if (json_is_null(v) && !null_is_value(f))
        return 0; /* null: the field's default */
    if (entry)
        return enc_map(c, f, entry, v, out);
    if (!pj_is_repeated(f))
        return enc_one(c, f, v, proto3, out);
    if (!json_is_array(v))
        return pj_fail(c, "expected a JSON array for a repeated field");
    if (is_packed(f, proto3)) {
        struct pbbuf b = {0};
        int rc = 0;

        json_array_foreach(v, i, e)
        {
            size_t old = pj_path_push(c, "[%zu]", i);

            if ((rc = enc_raw(c, f, e, &b)) != 0) {
                pbbuf_free(&b);
                return rc;
            }
            pj_path_pop(c, old);
        }
        if (b.len)
            rc = put_tag(out, f->number, WT_LEN);
        if (rc == 0 && b.len)
            rc = put_len(out, b.data, b.len);
        pbbuf_free(&b);
        return rc;
    }
    json_array_foreach(v, i, e)
    {
        size_t old = pj_path_push(c, "[%zu]", i);
        int rc = put_tag(out, f->number, pj_wire_type(f->type));

        if (rc == 0)
            rc = enc_raw(c, f, e, out);
        if (rc)
            return rc;
        pj_path_pop(c, old);
    }
    return 0;
}

static int enc_any(struct ctx *c, json_t *v, struct pbbuf *out)
{
    json_t *t = json_object_get(v, "@type"), *body;
    const char *url, *slash;
    struct pbbuf b = {0};
    int rc;

    if (!json_is_object(v))
        return pj_fail(c, "expected a JSON object for google.protobuf.Any");
    if (json_object_size(v) == 0)
        return 0;
    if (!json_is_string(t))
        return pj_fail(c, "google.protobuf.Any needs an \"@type\"");
    url = json_string_value(t);
    slash = strrchr(url, '/');
    const char *inner = slash ? slash + 1 : url;
    if (!descpool_message(c->p, inner, NULL))
        return pj_fail(c, "unknown type %s in \"@type\"", inner);
    if (pj_wkt_of(inner) != WKT_NONE && pj_wkt_of(inner) != WKT_ANY) {
        body = json_incref(json_object_get(v, "value"));
        if (!body)
            return pj_fail(c, "an Any of %s needs a \"value\"", inner);
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
    enum wkt w = pj_wkt_of(type);
    const char *key;
    json_t *val, *plain;
    int rc = 0;

    if (!m)
        return pj_fail(c, "unknown message type %s", type);
    if (c->depth >= PBJSON_MAX_DEPTH)
        return pj_fail(c, "nested deeper than %d", PBJSON_MAX_DEPTH);
    if (w == WKT_ANY)
        return enc_any(c, v, out);
    if (!(plain = wkt_in(c, w, v)))
        return -EINVAL;
    if (!json_is_object(plain)) {
        json_decref(plain);
        return pj_fail(c, "expected a JSON object for %s", type);
    }
    c->depth++;
    json_object_foreach(plain, key, val)
    {
        const DpField *f = field_by_key(m, key);
        size_t old = pj_path_push(c, "%s%s", c->plen ? "." : "", key);

        if (!f) {
            rc = pj_fail(c, "no such field in %s", type);
            break;
        }
        if ((rc = enc_field(c, f, val, dp_proto3(file), out)) != 0)
            break;
        pj_path_pop(c, old);
    }
    c->depth--;
    json_decref(plain);
    return rc;
}

int pbjson_encode(const struct descpool *p, const char *type, json_t *in, struct pbbuf *out, char *err, size_t errlen)
{
    struct ctx c = {.p = p, .err = err, .errlen = errlen};

    return enc_msg(&c, type + (type[0] == '.'), in, out);
}

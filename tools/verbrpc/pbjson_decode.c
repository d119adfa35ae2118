/* pbjson, wire bytes to JSON: every message is decoded by its run-time
 * descriptor into its plain JSON object, which a well-known type then turns
 * into its own JSON form (the reverse of pbjson_encode.c). */
#include "pbjson_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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

/* ---- messages ------------------------------------------------------------ */

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
    const DpEnum *e = descpool_enum(c->p, pj_type_name(f));

    if (strcmp(pj_type_name(f), "google.protobuf.NullValue") == 0)
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
                pj_fail(c, "string is not valid UTF-8");
            return j;
        }
        if (f->type == T_BYTES) {
            char *b = b64_encode(s, (size_t)len);
            json_t *j = b ? json_string(b) : NULL;

            free(b);
            return j;
        }
        return dec_msg(c, pj_type_name(f), s, (size_t)len);
    }
    switch (f->type) {
    case T_INT32:
        return json_integer((int32_t)u);
    case T_INT64:
        return int64_json((int64_t)u);
    case T_UINT32:
        return json_integer((uint32_t)u);
    case T_UINT64:
        return uint64_json(u);
    case T_SINT32:
        return json_integer((int32_t)((uint32_t)u >> 1) ^ -(int32_t)(u & 1));
    case T_SINT64:
        return int64_json((int64_t)(u >> 1) ^ -(int64_t)(u & 1));
    case T_BOOL:
        return json_boolean(u != 0);
    case T_ENUM:
        return enum_json(c, f, (int32_t)u);
    case T_FIXED32:
        return json_integer((uint32_t)u);
    case T_SFIXED32:
        return json_integer((int32_t)(uint32_t)u);
    case T_FIXED64:
        return uint64_json(u);
    case T_SFIXED64:
        return int64_json((int64_t)u);
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
        pj_fail(c, "groups are not supported");
        return NULL;
    }
trunc:
    pj_fail(c, "truncated field %s", f->name);
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
    uint8_t zero[8] = {0};
    const uint8_t *p = zero;

    if (f->type == T_MESSAGE)
        return dec_msg(c, pj_type_name(f), zero, 0);
    return dec_value(c, f, pj_wire_type(f->type), &p, zero + 8);
}

static int add_map_entry(struct ctx *c, const DpField *f, const DpMsg *entry, json_t *obj, const char *name,
                         const uint8_t *d, size_t n)
{
    const DpField *kf = pj_field_by_number(entry, 1), *vf = pj_field_by_number(entry, 2);
    json_t *map = json_object_get(obj, name), *key = NULL, *val = NULL;
    const uint8_t *p = d, *end = d + n;
    char kbuf[32];
    const char *ks;

    if (!kf || !vf)
        return pj_fail(c, "map entry %s lacks its key or value field", entry->name);
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
        if (!ef || (int)(tag & 7) != pj_wire_type(ef->type)) {
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
    pj_fail(c, "malformed map entry");
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
                pj_fail(c, "timestamp out of range");
                break;
            }
            frac(f, sizeof(f), nanos);
            snprintf(s, sizeof(s), "%04d-%02d-%02dT%02d:%02d:%02d%sZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, f);
        } else {
            if (sec > DUR_MAX || sec < -DUR_MAX || (sec > 0 && nanos < 0) || (sec < 0 && nanos > 0) ||
                nanos > 999999999 || nanos < -999999999) {
                pj_fail(c, "duration out of range");
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

        json_object_foreach(obj, k, v)
        {
            json_decref(r);
            r = json_incref(v); /* the oneof's member: null for nullValue */
        }
        if (!r)
            pj_fail(c, "google.protobuf.Value with no kind set");
        break;
    }
    case WKT_FIELDMASK: {
        json_t *paths = json_object_get(obj, "paths"), *p;
        size_t i;
        struct pbbuf b = {0};

        json_array_foreach(paths, i, p)
        {
            char buf[1024];

            if (i)
                pj_put(&b, ",", 1);
            pj_camel(json_string_value(p), buf, sizeof(buf));
            pj_put(&b, buf, strlen(buf));
        }
        pj_put(&b, "", 1);
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
        pj_fail(c, "Any holds %s, whose descriptor is unknown", type);
        goto out;
    }
    if (!(inner = dec_msg(c, type, val ? val : d, val ? (size_t)vlen : 0)))
        goto out;
    if (json_is_object(inner) && (pj_wkt_of(type) == WKT_NONE || pj_wkt_of(type) == WKT_ANY)) {
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
    pj_fail(c, "malformed google.protobuf.Any");
    free(url);
    return NULL;
}

static json_t *dec_msg(struct ctx *c, const char *type, const uint8_t *d, size_t n)
{
    const DpFile *file;
    const DpMsg *m = descpool_message(c->p, type, &file);
    const uint8_t *p = d, *end = d + n;
    enum wkt w = pj_wkt_of(type);
    json_t *obj;
    char nbuf[256];

    if (!m) {
        pj_fail(c, "unknown message type %s", type);
        return NULL;
    }
    if (c->depth >= PBJSON_MAX_DEPTH) {
        pj_fail(c, "nested deeper than %d", PBJSON_MAX_DEPTH);
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
            pj_fail(c, "malformed field tag");
            goto fail;
        }
        wt = (int)(tag & 7);
        f = pj_field_by_number(m, (uint32_t)(tag >> 3));
        if (!f || (wt != pj_wire_type(f->type) && !(wt == WT_LEN && pj_is_repeated(f) && pj_is_scalar_numeric(f)))) {
            if (!skip_field(wt, &p, end)) {
                pj_fail(c, "malformed field %u", (unsigned)(tag >> 3));
                goto fail;
            }
            continue; /* unknown, or a wire type that does not fit: skipped, as protobuf keeps it aside */
        }
        const char *name = pj_json_name(f, nbuf, sizeof(nbuf));
        size_t old = pj_path_push(c, "%s%s", c->plen ? "." : "", name);
        if ((entry = pj_map_entry(c, f))) {
            uint64_t len;

            if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p) ||
                add_map_entry(c, f, entry, obj, name, p, (size_t)len) != 0) {
                if (c->err && !c->err[0])
                    pj_fail(c, "malformed map entry");
                goto fail;
            }
            p += len;
        } else if (pj_is_repeated(f)) {
            json_t *arr = json_object_get(obj, name);

            if (!arr) {
                arr = json_array();
                json_object_set_new(obj, name, arr);
            }
            if (wt == WT_LEN && pj_is_scalar_numeric(f)) {
                uint64_t len;
                const uint8_t *pe;

                if (!get_varint(&p, end, &len) || len > (uint64_t)(end - p)) {
                    pj_fail(c, "truncated packed field");
                    goto fail;
                }
                pe = p + len;
                while (p < pe) {
                    json_t *j = dec_value(c, f, pj_wire_type(f->type), &p, pe);

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
        pj_path_pop(c, old);
    }
    c->depth--;
    if (w == WKT_WRAPPER && !json_object_get(obj, "value")) {
        const DpField *vf = pj_field_by_number(m, 1);
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
    struct ctx c = {.p = p, .err = err, .errlen = errlen};

    if (err && errlen)
        err[0] = '\0';
    return dec_msg(&c, type + (type[0] == '.'), data, len);
}

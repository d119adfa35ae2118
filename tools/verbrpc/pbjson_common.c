/* pbjson: what the encoder and the decoder share (pbjson_int.h), and the
 * JSON text output: jansson holds and parses the JSON, but its dump always
 * prints 17 significant digits, so numbers are written here in the shortest
 * form that reads back the same. */
#include "pbjson_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pj_fail(struct ctx *c, const char *fmt, ...)
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
size_t pj_path_push(struct ctx *c, const char *fmt, ...)
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

void pj_path_pop(struct ctx *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

void pbbuf_free(struct pbbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int pj_put(struct pbbuf *b, const void *d, size_t n)
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

/* lowerCamelCase of a field name, as protoc computes json_name. */
void pj_camel(const char *name, char *buf, size_t len)
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

const char *pj_json_name(const DpField *f, char *buf, size_t len)
{
    if (f->json_name)
        return f->json_name;
    pj_camel(f->name, buf, len);
    return buf;
}

const DpField *pj_field_by_number(const DpMsg *m, uint32_t num)
{
    for (size_t i = 0; i < m->n_field; i++)
        if ((uint32_t)m->field[i]->number == num)
            return m->field[i];
    return NULL;
}

const char *pj_type_name(const DpField *f) { return f->type_name ? f->type_name + (f->type_name[0] == '.') : ""; }

bool pj_is_repeated(const DpField *f) { return f->has_label && f->label == L_REPEATED; }

bool pj_is_scalar_numeric(const DpField *f)
{
    return f->type != T_STRING && f->type != T_BYTES && f->type != T_MESSAGE && f->type != T_GROUP;
}

const DpMsg *pj_map_entry(struct ctx *c, const DpField *f)
{
    const DpMsg *m;

    if (!pj_is_repeated(f) || f->type != T_MESSAGE)
        return NULL;
    m = descpool_message(c->p, pj_type_name(f), NULL);
    return m && m->options && m->options->has_map_entry && m->options->map_entry ? m : NULL;
}

int pj_wire_type(int type)
{
    switch (type) {
    case T_DOUBLE:
    case T_FIXED64:
    case T_SFIXED64:
        return WT_I64;
    case T_FLOAT:
    case T_FIXED32:
    case T_SFIXED32:
        return WT_I32;
    case T_STRING:
    case T_BYTES:
    case T_MESSAGE:
        return WT_LEN;
    default:
        return WT_VARINT;
    }
}

enum wkt pj_wkt_of(const char *type)
{
    static const struct {
        const char *name;
        enum wkt w;
    } t[] = {
        {"google.protobuf.Timestamp", WKT_TIMESTAMP}, {"google.protobuf.Duration", WKT_DURATION},
        {"google.protobuf.DoubleValue", WKT_WRAPPER}, {"google.protobuf.FloatValue", WKT_WRAPPER},
        {"google.protobuf.Int64Value", WKT_WRAPPER},  {"google.protobuf.UInt64Value", WKT_WRAPPER},
        {"google.protobuf.Int32Value", WKT_WRAPPER},  {"google.protobuf.UInt32Value", WKT_WRAPPER},
        {"google.protobuf.BoolValue", WKT_WRAPPER},   {"google.protobuf.StringValue", WKT_WRAPPER},
        {"google.protobuf.BytesValue", WKT_WRAPPER},  {"google.protobuf.Struct", WKT_STRUCT},
        {"google.protobuf.Value", WKT_VALUE},         {"google.protobuf.ListValue", WKT_LIST},
        {"google.protobuf.FieldMask", WKT_FIELDMASK}, {"google.protobuf.Any", WKT_ANY},
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(type, t[i].name) == 0)
            return t[i].w;
    return WKT_NONE;
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
        pj_put(b, obj ? "{" : "[", 1);
        if (n == 0) {
            pj_put(b, obj ? "}" : "]", 1);
            break;
        }
        i = 0;
        void *it = obj ? json_object_iter((json_t *)v) : NULL;
        for (size_t k = 0; k < n; k++) {
            if (k)
                pj_put(b, ",", 1);
            if (indent) {
                pj_put(b, "\n", 1);
                for (int sp = 0; sp < indent * (level + 1); sp++)
                    pj_put(b, " ", 1);
            }
            if (obj) {
                json_t *ks;
                char *q;

                key = json_object_iter_key(it);
                e = json_object_iter_value(it);
                it = json_object_iter_next((json_t *)v, it);
                ks = json_string(key);
                q = json_dumps(ks, JSON_ENCODE_ANY); /* jansson escapes the key */
                pj_put(b, q, strlen(q));
                pj_put(b, indent ? ": " : ":", indent ? 2 : 1);
                free(q);
                json_decref(ks);
            } else {
                e = json_array_get(v, k);
            }
            dump(b, e, indent, level + 1);
        }
        (void)i;
        if (indent) {
            pj_put(b, "\n", 1);
            for (int sp = 0; sp < indent * level; sp++)
                pj_put(b, " ", 1);
        }
        pj_put(b, obj ? "}" : "]", 1);
        break;
    }
    case JSON_REAL: {
        double d = json_real_value(v);

        for (int prec = 1; prec <= 17; prec++) {
            snprintf(s, sizeof(s), "%.*g", prec, d);
            if (strtod(s, NULL) == d)
                break;
        }
        pj_put(b, s, strlen(s));
        break;
    }
    default: {
        char *q = json_dumps(v, JSON_ENCODE_ANY); /* strings (escaped), integers, literals */

        pj_put(b, q, strlen(q));
        free(q);
    }
    }
}

char *pbjson_dumps(const json_t *v, int indent)
{
    struct pbbuf b = {0};

    dump(&b, v, indent, 0);
    pj_put(&b, "", 1);
    return (char *)b.data;
}

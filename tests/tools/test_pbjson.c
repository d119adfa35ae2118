/* The verbrpc tool's JSON mapping (tools/verbrpc/pbjson.c) from run-time
 * descriptors, against protobuf-c as the oracle for the wire: messages of
 * json_types.proto packed by protobuf-c decode to protobuf's canonical JSON,
 * and that JSON encodes back to bytes that protobuf-c unpacks to the same
 * values. Every scalar type (singular, repeated, packed and not), enums,
 * nested messages, oneofs, maps, bytes, strings with escapes and the
 * well-known types; then malformed input. The descriptors are those the
 * generator embedded (json_types.vrpc.c), loaded as the tool loads a
 * server's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_types.vrpc.h"
#include "pbjson.h"

static struct descpool g_pool;

static void add_file(const struct vrpc_file_desc *f)
{
    for (size_t i = 0; i < f->n_deps; i++)
        add_file(f->deps[i]);
    assert_int_equal(descpool_add(&g_pool, f->data, f->len), 0);
}

/* protobuf-c's packing of m, decoded by pbjson. */
static json_t *to_json(const ProtobufCMessage *m, const char *type)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len + 1);
    char err[PBJSON_ERR_MAX];
    json_t *j;

    protobuf_c_message_pack(m, buf);
    j = pbjson_decode(&g_pool, type, buf, len, err, sizeof(err));
    if (!j)
        fail_msg("decode %s: %s", type, err);
    free(buf);
    return j;
}

/* pbjson's encoding of j, unpacked by protobuf-c (caller frees). */
static ProtobufCMessage *from_json(json_t *j, const char *type, const ProtobufCMessageDescriptor *d)
{
    struct pbbuf b = {0};
    char err[PBJSON_ERR_MAX];
    ProtobufCMessage *m;

    if (pbjson_encode(&g_pool, type, j, &b, err, sizeof(err)) != 0)
        fail_msg("encode %s: %s", type, err);
    m = protobuf_c_message_unpack(d, NULL, b.len, b.data);
    assert_non_null(m);
    pbbuf_free(&b);
    return m;
}

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);

    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    return j;
}

static void expect_json(json_t *got, const char *want_text)
{
    json_t *want = parse(want_text);

    if (!json_equal(got, want)) {
        char *g = pbjson_dumps(got, 0);

        fail_msg("got %s\nwant %s", g, want_text);
    }
    json_decref(want);
}

static const char tricky[] = "quote\" backslash\\ slash/ nl\n tab\t ctl\x01 e\xc3\xa9 emoji\xf0\x9f\x98\x80";
static const uint8_t blob[] = {0x00, 0xff, 0x10, 0x80, 0x7f};

static void test_scalars(void **state)
{
    Vrpctest__Json__Scalars s = VRPCTEST__JSON__SCALARS__INIT, *back;
    json_t *j;

    (void)state;
    s.f_double = -1.0e-300;
    s.f_float = 0.1f;
    s.f_int64 = INT64_MIN;
    s.f_uint64 = UINT64_MAX;
    s.f_int32 = INT32_MIN;
    s.f_fixed64 = UINT64_MAX - 1;
    s.f_fixed32 = UINT32_MAX;
    s.f_bool = true;
    s.f_string = (char *)tricky;
    s.f_bytes.data = (uint8_t *)blob;
    s.f_bytes.len = sizeof(blob);
    s.f_uint32 = UINT32_MAX;
    s.f_enum = VRPCTEST__JSON__COLOR__NEGATIVE;
    s.f_sfixed32 = -2;
    s.f_sfixed64 = INT64_MIN + 1;
    s.f_sint32 = INT32_MIN;
    s.f_sint64 = -1;
    j = to_json(&s.base, "vrpctest.json.Scalars");
    expect_json(j,
                "{\"fDouble\": -1e-300, \"fFloat\": 0.1, \"fInt64\": \"-9223372036854775808\","
                " \"fUint64\": \"18446744073709551615\", \"fInt32\": -2147483648,"
                " \"fFixed64\": \"18446744073709551614\", \"fFixed32\": 4294967295, \"fBool\": true,"
                " \"fString\": \"quote\\\" backslash\\\\ slash/ nl\\n tab\\t ctl\\u0001 e\\u00e9 emoji\\ud83d\\ude00\","
                " \"fBytes\": \"AP8QgH8=\", \"fUint32\": 4294967295, \"fEnum\": \"NEGATIVE\", \"fSfixed32\": -2,"
                " \"fSfixed64\": \"-9223372036854775807\", \"fSint32\": -2147483648, \"fSint64\": \"-1\"}");
    char *text = pbjson_dumps(j, 0);
    assert_non_null(strstr(text, "\"fFloat\":0.1,")); /* shortest form, not 0.10000000149011612 */
    free(text);

    back = (Vrpctest__Json__Scalars *)from_json(j, "vrpctest.json.Scalars", &vrpctest__json__scalars__descriptor);
    assert_true(back->f_double == s.f_double);
    assert_true(back->f_float == s.f_float);
    assert_true(back->f_int64 == s.f_int64);
    assert_true(back->f_uint64 == s.f_uint64);
    assert_int_equal(back->f_int32, s.f_int32);
    assert_true(back->f_fixed64 == s.f_fixed64);
    assert_int_equal(back->f_fixed32, s.f_fixed32);
    assert_true(back->f_bool);
    assert_string_equal(back->f_string, tricky);
    assert_int_equal(back->f_bytes.len, sizeof(blob));
    assert_memory_equal(back->f_bytes.data, blob, sizeof(blob));
    assert_int_equal(back->f_uint32, s.f_uint32);
    assert_int_equal(back->f_enum, VRPCTEST__JSON__COLOR__NEGATIVE);
    assert_int_equal(back->f_sfixed32, -2);
    assert_true(back->f_sfixed64 == s.f_sfixed64);
    assert_int_equal(back->f_sint32, INT32_MIN);
    assert_true(back->f_sint64 == -1);
    protobuf_c_message_free_unpacked(&back->base, NULL);
    json_decref(j);
}

/* Input forms the mapping accepts besides the canonical ones: .proto names,
 * 64-bit integers as numbers, 32-bit ones as strings, exponents, enum
 * numbers, URL-safe unpadded base64, NaN and the infinities. */
static void test_scalar_inputs(void **state)
{
    json_t *j = parse("{\"f_int64\": 42, \"fInt32\": \"-7\", \"f_uint32\": 1e3, \"fEnum\": 2,"
                      " \"fBytes\": \"AP8QgH8\", \"fDouble\": \"NaN\", \"fFloat\": \"-Infinity\", \"fBool\": false}");
    Vrpctest__Json__Scalars *s;
    json_t *back;

    (void)state;
    s = (Vrpctest__Json__Scalars *)from_json(j, "vrpctest.json.Scalars", &vrpctest__json__scalars__descriptor);
    assert_true(s->f_int64 == 42);
    assert_int_equal(s->f_int32, -7);
    assert_int_equal(s->f_uint32, 1000);
    assert_int_equal(s->f_enum, VRPCTEST__JSON__COLOR__GREEN);
    assert_int_equal(s->f_bytes.len, sizeof(blob));
    assert_memory_equal(s->f_bytes.data, blob, sizeof(blob));
    assert_true(isnan(s->f_double));
    assert_true(isinf(s->f_float) && s->f_float < 0);
    back = to_json(&s->base, "vrpctest.json.Scalars");
    /* false and the zeros are not on the wire in proto3: left out */
    expect_json(back, "{\"fInt64\": \"42\", \"fInt32\": -7, \"fUint32\": 1000, \"fEnum\": \"GREEN\","
                      " \"fBytes\": \"AP8QgH8=\", \"fDouble\": \"NaN\", \"fFloat\": \"-Infinity\"}");
    protobuf_c_message_free_unpacked(&s->base, NULL);
    json_decref(j);
    json_decref(back);
}

static void test_repeated(void **state)
{
    const char *text =
        "{\"rDouble\": [1.5, -0.25], \"rFloat\": [3.25, 1e+30], \"rInt64\": [\"-1\", \"9007199254740993\"],"
        " \"rUint64\": [\"0\", \"18446744073709551615\"], \"rInt32\": [-1, 0, 2147483647],"
        " \"rFixed64\": [\"1\"], \"rFixed32\": [7, 4294967295], \"rBool\": [true, false, true],"
        " \"rString\": [\"a\", \"\", \"\\u00e9\\\"\"], \"rBytes\": [\"\", \"AP8=\"], \"rUint32\": [0, 5],"
        " \"rEnum\": [\"RED\", \"COLOR_UNSPECIFIED\", \"NEGATIVE\"], \"rSfixed32\": [-5], \"rSfixed64\": [\"-6\"],"
        " \"rSint32\": [-1, 1], \"rSint64\": [\"-9223372036854775808\"],"
        " \"rMsg\": [{\"fInt32\": 1}, {}, {\"fString\": \"x\"}], \"rUnpacked\": [3, -4]}";
    json_t *j = parse(text), *back;
    Vrpctest__Json__Repeated *r;

    (void)state;
    r = (Vrpctest__Json__Repeated *)from_json(j, "vrpctest.json.Repeated", &vrpctest__json__repeated__descriptor);
    assert_int_equal(r->n_r_int32, 3);
    assert_int_equal(r->r_int32[0], -1);
    assert_int_equal(r->r_int32[2], INT32_MAX);
    assert_true(r->r_int64[1] == 9007199254740993LL); /* beyond a double's integers */
    assert_true(r->r_uint64[1] == UINT64_MAX);
    assert_int_equal(r->n_r_bool, 3);
    assert_string_equal(r->r_string[2], "\xc3\xa9\"");
    assert_int_equal(r->r_enum[2], VRPCTEST__JSON__COLOR__NEGATIVE);
    assert_true(r->r_sint64[0] == INT64_MIN);
    assert_int_equal(r->n_r_msg, 3);
    assert_string_equal(r->r_msg[2]->f_string, "x");
    assert_int_equal(r->n_r_unpacked, 2);
    assert_int_equal(r->r_unpacked[1], -4);
    assert_true(r->r_float[1] == 1e30f);
    /* protobuf-c packs the packed ones and not r_unpacked: both decode */
    back = to_json(&r->base, "vrpctest.json.Repeated");
    expect_json(back, text);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    json_decref(j);
    json_decref(back);
}

static void test_nested_oneof(void **state)
{
    const char *text = "{\"inner\": {\"name\": \"a\", \"child\": {\"name\": \"b\", \"child\": {}}},"
                       " \"msg\": {\"name\": \"m\"}}";
    json_t *j = parse(text), *back;
    Vrpctest__Json__Nested *n;

    (void)state;
    n = (Vrpctest__Json__Nested *)from_json(j, "vrpctest.json.Nested", &vrpctest__json__nested__descriptor);
    assert_string_equal(n->inner->child->name, "b");
    assert_non_null(n->inner->child->child);
    assert_int_equal(n->choice_case, VRPCTEST__JSON__NESTED__CHOICE_MSG);
    back = to_json(&n->base, "vrpctest.json.Nested");
    expect_json(back, text);
    json_decref(back);
    protobuf_c_message_free_unpacked(&n->base, NULL);
    json_decref(j);

    j = parse("{\"number\": 0}"); /* a oneof member's 0 is sent too */
    n = (Vrpctest__Json__Nested *)from_json(j, "vrpctest.json.Nested", &vrpctest__json__nested__descriptor);
    assert_int_equal(n->choice_case, VRPCTEST__JSON__NESTED__CHOICE_NUMBER);
    back = to_json(&n->base, "vrpctest.json.Nested");
    expect_json(back, "{\"number\": 0}");
    json_decref(back);
    protobuf_c_message_free_unpacked(&n->base, NULL);
    json_decref(j);
}

static void test_maps(void **state)
{
    const char *text = "{\"byName\": {\"one\": 1, \"z\\\"q\": -2, \"zero\": 0},"
                       " \"byId\": {\"-5\": {\"name\": \"neg\"}, \"9007199254740993\": {}},"
                       " \"byFlag\": {\"true\": \"yes\", \"false\": \"\"}, \"colors\": {\"4294967295\": \"RED\"},"
                       " \"blobs\": {\"-1\": \"AP8QgH8=\"}}";
    json_t *j = parse(text), *back;
    Vrpctest__Json__Maps *m;
    bool neg = false;

    (void)state;
    m = (Vrpctest__Json__Maps *)from_json(j, "vrpctest.json.Maps", &vrpctest__json__maps__descriptor);
    assert_int_equal(m->n_by_name, 3);
    assert_int_equal(m->n_by_id, 2);
    for (size_t i = 0; i < m->n_by_id; i++)
        if (m->by_id[i]->key == -5)
            neg = !strcmp(m->by_id[i]->value->name, "neg");
    assert_true(neg);
    assert_int_equal(m->n_by_flag, 2);
    assert_int_equal(m->colors[0]->key, UINT32_MAX);
    assert_int_equal(m->colors[0]->value, VRPCTEST__JSON__COLOR__RED);
    assert_true(m->blobs[0]->key == -1);
    assert_int_equal(m->blobs[0]->value.len, sizeof(blob));
    back = to_json(&m->base, "vrpctest.json.Maps");
    expect_json(back, text); /* json_equal ignores key order */
    json_decref(back);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    json_decref(j);
}

static void test_well_known(void **state)
{
    const char *text =
        "{\"ts\": \"1972-01-01T10:00:20.021Z\", \"dur\": \"-1.000340012s\", \"i64\": \"-3\", \"str\": \"\","
        " \"flag\": false, \"dbl\": 2.5, \"u32\": 7, \"raw\": \"AP8=\","
        " \"st\": {\"a\": 1.0, \"b\": [true, null, \"s\", {\"c\": {}}], \"n\": null},"
        " \"val\": [1.5, \"x\"], \"list\": [{}, [], -0.5], \"mask\": \"fooBar,a.bC\", \"empty\": {},"
        " \"any\": {\"@type\": \"type.googleapis.com/vrpctest.json.Nested\", \"number\": 5},"
        " \"times\": [\"1970-01-01T00:00:00Z\", \"0001-01-01T00:00:00Z\", \"9999-12-31T23:59:59.999999999Z\","
        " \"2024-02-29T12:00:00.100Z\"], \"flt\": 0.1}";
    json_t *j = parse(text), *back;
    Vrpctest__Json__WellKnown *w;

    (void)state;
    w = (Vrpctest__Json__WellKnown *)from_json(j, "vrpctest.json.WellKnown", &vrpctest__json__well_known__descriptor);
    assert_true(w->ts->seconds == 63108020);
    assert_int_equal(w->ts->nanos, 21000000);
    assert_true(w->dur->seconds == -1);
    assert_int_equal(w->dur->nanos, -340012);
    assert_true(w->i64->value == -3);
    assert_non_null(w->str); /* a wrapper of "" is still set */
    assert_non_null(w->flag);
    assert_false(w->flag->value);
    assert_int_equal(w->st->n_fields, 3);
    assert_int_equal(w->val->kind_case, GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE);
    assert_int_equal(w->mask->n_paths, 2);
    assert_string_equal(w->mask->paths[0], "foo_bar");
    assert_string_equal(w->mask->paths[1], "a.b_c");
    assert_non_null(w->empty);
    assert_string_equal(w->any->type_url, "type.googleapis.com/vrpctest.json.Nested");
    assert_true(w->times[1]->seconds == -62135596800LL);
    assert_int_equal(w->times[2]->nanos, 999999999);
    back = to_json(&w->base, "vrpctest.json.WellKnown");
    expect_json(back, text);
    json_decref(back);
    protobuf_c_message_free_unpacked(&w->base, NULL);
    json_decref(j);

    /* other spellings read, printed canonically; an Any of a well-known type */
    j = parse("{\"ts\": \"1972-01-01T12:00:20+02:00\", \"dur\": \"3s\", \"val\": null,"
              " \"any\": {\"@type\": \"type.googleapis.com/google.protobuf.Duration\", \"value\": \"0.5s\"}}");
    w = (Vrpctest__Json__WellKnown *)from_json(j, "vrpctest.json.WellKnown", &vrpctest__json__well_known__descriptor);
    assert_int_equal(w->val->kind_case, GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE);
    back = to_json(&w->base, "vrpctest.json.WellKnown");
    expect_json(back,
                "{\"ts\": \"1972-01-01T10:00:20Z\", \"dur\": \"3s\", \"val\": null,"
                " \"any\": {\"@type\": \"type.googleapis.com/google.protobuf.Duration\", \"value\": \"0.500s\"}}");
    json_decref(back);
    protobuf_c_message_free_unpacked(&w->base, NULL);
    json_decref(j);
}

static void expect_error(const char *type, const char *text, const char *what)
{
    json_t *j = parse(text);
    struct pbbuf b = {0};
    char err[PBJSON_ERR_MAX] = "";

    assert_int_equal(pbjson_encode(&g_pool, type, j, &b, err, sizeof(err)), -EINVAL);
    if (!strstr(err, what))
        fail_msg("%s: error '%s' does not say '%s'", text, err, what);
    pbbuf_free(&b);
    json_decref(j);
}

static void test_errors(void **state)
{
    uint8_t trunc[] = {0x4a, 0x05, 'a'}, badutf8[] = {0x4a, 0x01, 0xff};
    char err[PBJSON_ERR_MAX];

    (void)state;
    expect_error("vrpctest.json.Scalars", "{\"nope\": 1}", "nope: no such field");
    expect_error("vrpctest.json.Scalars", "{\"fInt32\": 2147483648}", "out of range");
    expect_error("vrpctest.json.Scalars", "{\"fUint64\": \"-1\"}", "negative");
    expect_error("vrpctest.json.Scalars", "{\"fInt32\": 1.5}", "not an integer");
    expect_error("vrpctest.json.Scalars", "{\"fBytes\": \"!!\"}", "base64");
    expect_error("vrpctest.json.Scalars", "{\"fEnum\": \"BLUE\"}", "not a value of enum vrpctest.json.Color");
    expect_error("vrpctest.json.Scalars", "{\"fBool\": 1}", "true or false");
    expect_error("vrpctest.json.Scalars", "{\"fFloat\": 1e39}", "out of range for a float");
    expect_error("vrpctest.json.Repeated", "{\"rMsg\": [{}, {\"fInt32\": \"x\"}]}", "rMsg[1].fInt32");
    expect_error("vrpctest.json.Maps", "{\"byFlag\": {\"maybe\": \"x\"}}", "not a bool");
    expect_error("vrpctest.json.WellKnown", "{\"ts\": \"1972-01-01 10:00:20Z\"}", "ts: expected an RFC 3339");
    expect_error("vrpctest.json.WellKnown", "{\"dur\": \"5\"}", "duration");
    expect_error("vrpctest.json.WellKnown", "{\"any\": {\"@type\": \"x/no.Such\"}}", "unknown type no.Such");
    expect_error("vrpctest.json.Scalars", "[1]", "expected a JSON object");
    expect_error("no.Such", "{}", "unknown message type");
    assert_null(pbjson_decode(&g_pool, "vrpctest.json.Scalars", trunc, sizeof(trunc), err, sizeof(err)));
    assert_non_null(strstr(err, "truncated"));
    assert_null(pbjson_decode(&g_pool, "vrpctest.json.Scalars", badutf8, sizeof(badutf8), err, sizeof(err)));
    assert_non_null(strstr(err, "UTF-8"));
}

static void test_dumps(void **state)
{
    json_t *j = parse("{\"a\": [1, 2.5, \"q\\\"\"], \"b\": {}, \"c\": []}");
    char *s;

    (void)state;
    s = pbjson_dumps(j, 0);
    assert_string_equal(s, "{\"a\":[1,2.5,\"q\\\"\"],\"b\":{},\"c\":[]}");
    free(s);
    s = pbjson_dumps(j, 2);
    assert_string_equal(s, "{\n  \"a\": [\n    1,\n    2.5,\n    \"q\\\"\"\n  ],\n  \"b\": {},\n  \"c\": []\n}");
    free(s);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),      cmocka_unit_test(test_scalar_inputs), cmocka_unit_test(test_repeated),
        cmocka_unit_test(test_nested_oneof), cmocka_unit_test(test_maps),          cmocka_unit_test(test_well_known),
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_dumps),
    };
    int rc;

    descpool_init(&g_pool);
    add_file(&json_5ftypes_2eproto__vrpc_file);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    descpool_free(&g_pool);
    return rc;
}

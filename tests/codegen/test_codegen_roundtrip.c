/* Generated stubs at run time: a server implementing every service of
 * protos/ (through the generated impl tables and registration) and a client
 * calling each method through the generated sync and async stubs, over TCP
 * or verbs. Messages cover nested types, enums, oneofs, maps, repeated
 * fields, well-known types, C keywords as names, proto2 and c_package; each
 * answer is checked byte for byte against what the server was meant to send.
 *   test_codegen_roundtrip [--backend tcp|verbs] [--setup single|veth]
 * verbs: --setup single reads VRPC_VERBS_IP (server and client on one
 * device); veth reads VRPC_VERBS_IP_B (the server) and VRPC_VERBS_IP_A (the
 * client's source). Exits 77 when they are unset or the verbs backend is
 * unavailable. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_setup.h"
#include <verbrpc/health.vrpc.h>
#include <verbrpc/reflection.vrpc.h>
#include <verbrpc/stats.vrpc.h>
#include <verbrpc/transport.h>
#include <verbrpc/verbrpc.h>

#include "kw/keywords.vrpc.h"
#include "odd/odd_names.vrpc.h"
#include "shop/shop.vrpc.h"

static struct {
    struct vrpc_server *server;
    struct vrpc_channel *ch;
    char uri[256];
} g;

/* ---- a fully populated Item, the same on both sides ----------------------- */

struct item_store {
    Cg__Common__Item it;
    Cg__Common__Item__Dimensions dims, vdims;
    char *tags[2];
    int64_t prices[3];
    Cg__Common__Item__StockEntry stock[2], *stockp[2];
    Cg__Common__Item__VariantsEntry var, *varp[1];
    Google__Protobuf__Timestamp created;
    Google__Protobuf__Duration ttl;
    Google__Protobuf__Int32Value limit;
    Google__Protobuf__Any extra;
    Google__Protobuf__Struct attrs;
    Google__Protobuf__Struct__FieldsEntry fe, *fep[1];
    Google__Protobuf__Value val;
    Google__Protobuf__FieldMask mask;
    char *paths[2];
    uint8_t blob[4];
};

static void fill_item(struct item_store *s, const char *sku)
{
    static uint8_t any_bytes[] = {0x08, 0x2a};

    cg__common__item__init(&s->it);
    cg__common__item__dimensions__init(&s->dims);
    cg__common__item__dimensions__init(&s->vdims);
    s->it.sku = (char *)sku;
    s->it.color = CG__COMMON__COLOR__COLOR_GREEN;
    s->dims.width = 1.5;
    s->dims.height = 2.25;
    s->dims.unit = CG__COMMON__ITEM__DIMENSIONS__UNIT__UNIT_INCH;
    s->it.dims = &s->dims;
    s->tags[0] = "red";
    s->tags[1] = "sale";
    s->it.n_tags = 2;
    s->it.tags = s->tags;
    s->prices[0] = -1;
    s->prices[1] = 0;
    s->prices[2] = INT64_MAX;
    s->it.n_prices = 3;
    s->it.prices = s->prices;
    for (int i = 0; i < 2; i++) {
        cg__common__item__stock_entry__init(&s->stock[i]);
        s->stock[i].key = i ? "paris" : "lyon";
        s->stock[i].value = 10 * (i + 1);
        s->stockp[i] = &s->stock[i];
    }
    s->it.n_stock = 2;
    s->it.stock = s->stockp;
    cg__common__item__variants_entry__init(&s->var);
    s->vdims.width = 9;
    s->var.key = 7;
    s->var.value = &s->vdims;
    s->varp[0] = &s->var;
    s->it.n_variants = 1;
    s->it.variants = s->varp;
    s->it.discount_case = CG__COMMON__ITEM__DISCOUNT_COUPON;
    s->it.coupon = "WINTER";
    google__protobuf__timestamp__init(&s->created);
    s->created.seconds = 1700000000;
    s->created.nanos = 5;
    s->it.created = &s->created;
    google__protobuf__duration__init(&s->ttl);
    s->ttl.seconds = 60;
    s->it.ttl = &s->ttl;
    google__protobuf__int32_value__init(&s->limit);
    s->limit.value = -3;
    s->it.limit = &s->limit;
    google__protobuf__any__init(&s->extra);
    s->extra.type_url = "type.googleapis.com/google.protobuf.Int32Value";
    s->extra.value.data = any_bytes;
    s->extra.value.len = sizeof(any_bytes);
    s->it.extra = &s->extra;
    google__protobuf__struct__init(&s->attrs);
    google__protobuf__struct__fields_entry__init(&s->fe);
    google__protobuf__value__init(&s->val);
    s->val.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
    s->val.string_value = "v";
    s->fe.key = "k";
    s->fe.value = &s->val;
    s->fep[0] = &s->fe;
    s->attrs.n_fields = 1;
    s->attrs.fields = s->fep;
    s->it.attrs = &s->attrs;
    google__protobuf__field_mask__init(&s->mask);
    s->paths[0] = "sku";
    s->paths[1] = "dims.width";
    s->mask.n_paths = 2;
    s->mask.paths = s->paths;
    s->it.mask = &s->mask;
    memcpy(s->blob, "\0\1\2\3", 4);
    s->it.blob.data = s->blob;
    s->it.blob.len = 4;
}

/* Packs both messages and compares the bytes. */
static void assert_same_message(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    size_t na = protobuf_c_message_get_packed_size(a), nb = protobuf_c_message_get_packed_size(b);
    uint8_t *pa = malloc(na + 1), *pb = malloc(nb + 1);

    assert_non_null(pa);
    assert_non_null(pb);
    assert_ptr_equal(a->descriptor, b->descriptor);
    assert_int_equal(na, nb);
    protobuf_c_message_pack(a, pa);
    protobuf_c_message_pack(b, pb);
    assert_memory_equal(pa, pb, na);
    free(pa);
    free(pb);
}

/* ---- handlers ----------------------------------------------------------- */

static void catalog_lookup(struct vrpc_server_call *call, const Cg__Shop__V1__LookupRequest *req, void *user)
{
    struct item_store s;

    (void)user;
    if (strcmp(req->sku, "missing") == 0) {
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, "no item missing");
        return;
    }
    fill_item(&s, req->sku);
    cg__shop__v1__catalog__lookup__respond(call, &s.it);
}

static void catalog_list(struct vrpc_server_call *call, const Google__Protobuf__Empty *req, void *user)
{
    Cg__Shop__V1__SkuList list = CG__SHOP__V1__SKU_LIST__INIT;
    char *skus[] = {"a1", "b2", "c3"};

    (void)req;
    (void)user;
    list.n_skus = 3;
    list.skus = skus;
    cg__shop__v1__catalog__list_skus__respond(call, &list);
}

static void orders_echo(struct vrpc_server_call *call, const Cg__Common__Item *req, void *user)
{
    (void)user;
    cg__shop__v1__orders__echo__respond(call, req);
}

static void orders_nested(struct vrpc_server_call *call, const Cg__Common__Item__Dimensions *req, void *user)
{
    Cg__Common__Item__Dimensions d = *req;

    (void)user;
    d.width *= 2;
    cg__shop__v1__orders__nested__respond(call, &d);
}

/* Every method of service `void` answers with its request, and the method's
 * name in field `return` so the client sees which handler ran. */
static void kw_answer(struct vrpc_server_call *call, const Int__Switch__Static__Struct *req, const char *which)
{
    Int__Switch__Static__Struct r = *req;

    r.return_ = (char *)which;
    vrpc_server_call_respond(call, (const ProtobufCMessage *)&r);
}
static void kw_return(struct vrpc_server_call *c, const Int__Switch__Static__Struct *r, void *u)
{
    (void)u;
    kw_answer(c, r, "return");
}
static void kw_default(struct vrpc_server_call *c, const Int__Switch__Static__Struct *r, void *u)
{
    (void)u;
    kw_answer(c, r, "Default");
}
static void kw_while(struct vrpc_server_call *c, const Int__Switch__Static__Struct *r, void *u)
{
    (void)u;
    kw_answer(c, r, "While");
}
static void kw_bool(struct vrpc_server_call *c, const Int__Switch__Static__Struct *r, void *u)
{
    (void)u;
    kw_answer(c, r, "bool");
}
static void kw_delete(struct vrpc_server_call *c, const Int__Switch__Static__Person *r, void *u)
{
    Int__Switch__Static__Person p = *r;

    (void)u;
    p.enum_ = INT__SWITCH__STATIC__ENUM__ENUM_BREAK;
    int__switch__static__void__delete__respond(c, &p);
}
static void kw_user(struct vrpc_server_call *c, const Int__Switch__Static__Person *r, void *u)
{
    /* u must be the impl's user pointer (no cmocka assert here: handlers run
     * on scheduler workers). */
    if (u != &g)
        vrpc_server_call_fail(c, VRPC_INTERNAL, "user pointer lost");
    else
        int__switch__static__void__user__respond(c, r);
}

static void odd_get_thing(struct vrpc_server_call *c, const OddC__Pkg2__HTTPRequest *r, void *u)
{
    OddC__Pkg2__FooBar2Baz out = ODD_C__PKG2__FOO_BAR2_BAZ__INIT;
    OddC__Pkg2__HTTPRequest__InnerMsg *items[1] = {r->inner};

    (void)u;
    out.n_items = r->inner ? 1 : 0;
    out.items = items;
    odd_c__pkg2__my_service2__get_thing__respond(c, &out);
}
static void odd_do(struct vrpc_server_call *c, const OddC__Pkg2__HTTPRequest__InnerMsg *r, void *u)
{
    OddC__Pkg2__MsgWithUnder out = ODD_C__PKG2__MSG__WITH__UNDER__INIT;
    char buf[32];

    (void)u;
    snprintf(buf, sizeof(buf), "x9=%d", r->has_x9 ? r->x9 : -1);
    out.v = buf;
    odd_c__pkg2__my_service2__do__respond(c, &out);
}
static void odd_v1(struct vrpc_server_call *c, const OddC__Pkg2__ABCdefGHi2j *r, void *u)
{
    (void)u;
    odd_c__pkg2__my_service2__v1_call__respond(c, r);
}

static const Cg__Shop__V1__Catalog_VrpcImpl catalog_impl = {.lookup = catalog_lookup, .list_skus = catalog_list};
static const Cg__Shop__V1__Orders_VrpcImpl orders_impl = {.echo = orders_echo, .nested = orders_nested};
static const Int__Switch__Static__Void_VrpcImpl void_impl = {
    .user = &g,
    .return_ = kw_return,
    .default_ = kw_default,
    .while_ = kw_while,
    .delete_ = kw_delete,
    .user_ = kw_user,
    .bool_ = kw_bool,
};
static const OddC__Pkg2__MyService2_VrpcImpl odd_impl = {.get_thing = odd_get_thing, .do_ = odd_do, .v1_call = odd_v1};
/* lowercase_svc.lower is left NULL: unregistered, so callers get UNIMPLEMENTED. */
static const OddC__Pkg2__LowercaseSvc_VrpcImpl lower_impl = {.lower = NULL};

/* ---- tests ---------------------------------------------------------------- */

static void check_table(const struct vrpc_method_desc *const *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_non_null(m[i]->full_name);
        assert_int_equal(m[i]->id, vrpc_method_id(m[i]->full_name));
        assert_non_null(m[i]->input);
        assert_non_null(m[i]->output);
    }
}

static void test_descriptors(void **state)
{
    (void)state;
    check_table(cg__shop__v1__catalog__vrpc_methods, CG__SHOP__V1__CATALOG__VRPC_N_METHODS);
    check_table(cg__shop__v1__orders__vrpc_methods, CG__SHOP__V1__ORDERS__VRPC_N_METHODS);
    check_table(int__switch__static__void__vrpc_methods, INT__SWITCH__STATIC__VOID__VRPC_N_METHODS);
    check_table(odd_c__pkg2__my_service2__vrpc_methods, ODD_C__PKG2__MY_SERVICE2__VRPC_N_METHODS);
    assert_int_equal(INT__SWITCH__STATIC__VOID__VRPC_N_METHODS, 6);
    /* gRPC's spelling of full names, with the proto package (not c_package). */
    assert_string_equal(cg__shop__v1__orders__nested__method.full_name, "/cg.shop.v1.Orders/Nested");
    assert_string_equal(odd_c__pkg2__my_service2__get_thing__method.full_name,
                        "/odd.v2beta3.HTTP_Stuff.my_service2/GET_thing");
    assert_string_equal(int__switch__static__void__return__method.full_name, "/int.switch.static.void/return");
    assert_int_equal(CG__SHOP__V1__CATALOG__LOOKUP__METHOD_ID, vrpc_method_id("/cg.shop.v1.Catalog/Lookup"));
    /* Types from another package and nested types. */
    assert_ptr_equal(cg__shop__v1__orders__nested__method.input, &cg__common__item__dimensions__descriptor);
    assert_ptr_equal(cg__shop__v1__catalog__list_skus__method.input, &google__protobuf__empty__descriptor);
    assert_ptr_equal(odd_c__pkg2__my_service2__do__method.input, &odd_c__pkg2__httprequest__inner_msg__descriptor);
}

static void test_register_twice(void **state)
{
    struct vrpc_server *s = NULL;

    (void)state;
    assert_int_equal(vrpc_server_create(NULL, &s), 0);
    assert_int_equal(cg__shop__v1__catalog__vrpc_register(s, &catalog_impl), 0);
    assert_int_equal(cg__shop__v1__catalog__vrpc_register(s, &catalog_impl), -EEXIST);
    assert_int_equal(cg__shop__v1__catalog__vrpc_register(s, NULL), -EINVAL);
    vrpc_server_destroy(s);
}

static void test_shop(void **state)
{
    Cg__Shop__V1__LookupRequest lr = CG__SHOP__V1__LOOKUP_REQUEST__INIT;
    Google__Protobuf__Empty empty = GOOGLE__PROTOBUF__EMPTY__INIT;
    Cg__Common__Item__Dimensions d = CG__COMMON__ITEM__DIMENSIONS__INIT, *dr;
    Cg__Common__Item *item;
    Cg__Shop__V1__SkuList *list;
    struct item_store want;
    struct vrpc_status st;

    (void)state;
    lr.sku = "sku-42";
    assert_int_equal(cg__shop__v1__catalog__lookup__call(g.ch, &lr, &item, NULL, &st), VRPC_OK);
    fill_item(&want, "sku-42");
    assert_string_equal(item->coupon, "WINTER");
    assert_int_equal(item->n_stock, 2);
    assert_int_equal(item->created->seconds, 1700000000);
    assert_same_message(&item->base, &want.it.base);

    assert_int_equal(cg__shop__v1__orders__echo__call(g.ch, &want.it, &item, NULL, &st), VRPC_OK);
    assert_same_message(&item->base, &want.it.base);

    assert_int_equal(cg__shop__v1__catalog__list_skus__call(g.ch, &empty, &list, NULL, &st), VRPC_OK);
    assert_int_equal(list->n_skus, 3);
    assert_string_equal(list->skus[2], "c3");

    d.width = 21;
    assert_int_equal(cg__shop__v1__orders__nested__call(g.ch, &d, &dr, NULL, &st), VRPC_OK);
    assert_true(dr->width == 42);

    lr.sku = "missing";
    assert_int_equal(cg__shop__v1__catalog__lookup__call(g.ch, &lr, &item, NULL, &st), VRPC_NOT_FOUND);
    assert_int_equal(st.code, VRPC_NOT_FOUND);
    assert_string_equal(st.message, "no item missing");
}

static void test_keywords(void **state)
{
    static int (*const calls[])(struct vrpc_channel *, const Int__Switch__Static__Struct *,
                                Int__Switch__Static__Struct **, const struct vrpc_call_opts *, struct vrpc_status *) = {
        int__switch__static__void__return__call,
        int__switch__static__void__default__call,
        int__switch__static__void__while__call,
        int__switch__static__void__bool__call,
    };
    static const char *const names[] = {"return", "Default", "While", "bool"};
    Int__Switch__Static__Struct req = INT__SWITCH__STATIC__STRUCT__INIT, *resp;
    Int__Switch__Static__Person p = INT__SWITCH__STATIC__PERSON__INIT, *pr;
    int32_t ints[] = {1, 2};
    struct vrpc_status st;

    (void)state;
    req.default_ = 5;
    req.n_int_ = 2;
    req.int_ = ints;
    req.restrict_ = 1;
    req.errno_ = -7;
    req.static_assert_ = "sa";
    req.union_case = INT__SWITCH__STATIC__STRUCT__UNION_WHILE;
    req.while_ = 99;
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(calls[i](g.ch, &req, &resp, NULL, &st), VRPC_OK);
        assert_string_equal(resp->return_, names[i]);
        assert_int_equal(resp->default_, 5);
        assert_int_equal(resp->n_int_, 2);
        assert_true(resp->restrict_);
        assert_int_equal(resp->errno_, -7);
        assert_string_equal(resp->static_assert_, "sa");
        assert_int_equal(resp->union_case, INT__SWITCH__STATIC__STRUCT__UNION_WHILE);
        assert_int_equal(resp->while_, 99);
    }
    assert_int_equal(int__switch__static__void__delete__call(g.ch, &p, &pr, NULL, &st), VRPC_OK);
    assert_int_equal(pr->enum_, INT__SWITCH__STATIC__ENUM__ENUM_BREAK);
    assert_int_equal(int__switch__static__void__user__call(g.ch, &p, &pr, NULL, &st), VRPC_OK);
}

static void test_odd_names(void **state)
{
    OddC__Pkg2__HTTPRequest req = ODD_C__PKG2__HTTPREQUEST__INIT;
    OddC__Pkg2__HTTPRequest__InnerMsg inner = ODD_C__PKG2__HTTPREQUEST__INNER_MSG__INIT;
    OddC__Pkg2__ABCdefGHi2j a = ODD_C__PKG2__ABCDEF_GHI2J__INIT, *ar;
    OddC__Pkg2__FooBar2Baz *foo;
    OddC__Pkg2__MsgWithUnder *mw;
    struct vrpc_status st;

    (void)state;
    req.url = "http://x";
    inner.has_x9 = 1;
    inner.x9 = 9;
    req.inner = &inner;
    assert_int_equal(odd_c__pkg2__my_service2__get_thing__call(g.ch, &req, &foo, NULL, &st), VRPC_OK);
    assert_int_equal(foo->n_items, 1);
    assert_int_equal(foo->items[0]->x9, 9);
    assert_int_equal(odd_c__pkg2__my_service2__do__call(g.ch, &inner, &mw, NULL, &st), VRPC_OK);
    assert_string_equal(mw->v, "x9=9");
    assert_int_equal(odd_c__pkg2__my_service2__v1_call__call(g.ch, &a, &ar, NULL, &st), VRPC_OK);
    /* A NULL handler leaves the method unregistered. */
    assert_int_equal(odd_c__pkg2__lowercase_svc__lower__call(g.ch, &a, &ar, NULL, &st), VRPC_UNIMPLEMENTED);
}

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    enum vrpc_code code;
    double width;
    Cg__Shop__V1__Orders_Nested_Async a;
};

static void on_nested(const struct vrpc_status *st, const Cg__Common__Item__Dimensions *resp, void *arg)
{
    struct waiter *w = arg;

    pthread_mutex_lock(&w->mu);
    w->code = st->code;
    w->width = resp ? resp->width : -1;
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void test_async(void **state)
{
    enum { N = 32 };
    struct waiter w[N];
    Cg__Common__Item__Dimensions d = CG__COMMON__ITEM__DIMENSIONS__INIT;

    (void)state;
    for (int i = 0; i < N; i++) {
        pthread_mutex_init(&w[i].mu, NULL);
        pthread_cond_init(&w[i].cv, NULL);
        w[i].done = 0;
        w[i].a.done = on_nested;
        w[i].a.arg = &w[i];
        d.width = i;
        assert_int_equal(cg__shop__v1__orders__nested__call_async(g.ch, &d, NULL, &w[i].a), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_mutex_lock(&w[i].mu);
        while (!w[i].done)
            pthread_cond_wait(&w[i].cv, &w[i].mu);
        pthread_mutex_unlock(&w[i].mu);
        assert_int_equal(w[i].done, 1);
        assert_int_equal(w[i].code, VRPC_OK);
        assert_true(w[i].width == 2.0 * i);
        pthread_mutex_destroy(&w[i].mu);
        pthread_cond_destroy(&w[i].cv);
    }
    /* An incomplete completion struct is refused before anything is sent. */
    w[0].a.done = NULL;
    assert_int_equal(cg__shop__v1__orders__nested__call_async(g.ch, &d, NULL, &w[0].a), -EINVAL);
}

static void test_builtins(void **state)
{
    Verbrpc__Health__V1__HealthCheckRequest hreq = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Verbrpc__Health__V1__HealthCheckResponse *hresp;
    Verbrpc__Stats__V1__GetStatsRequest sreq = VERBRPC__STATS__V1__GET_STATS_REQUEST__INIT;
    Verbrpc__Stats__V1__GetStatsResponse *sresp;
    struct vrpc_status st;
    bool found = false;

    (void)state;
    assert_int_equal(verbrpc__health__v1__health__check__call(g.ch, &hreq, &hresp, NULL, &st), VRPC_OK);
    assert_int_equal(hresp->status, VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    hreq.service = "cg.shop.v1.Catalog";
    assert_int_equal(verbrpc__health__v1__health__check__call(g.ch, &hreq, &hresp, NULL, &st), VRPC_OK);
    assert_int_equal(hresp->status, VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    hreq.service = "cg.shop.v1.Cat";
    assert_int_equal(verbrpc__health__v1__health__check__call(g.ch, &hreq, &hresp, NULL, &st), VRPC_NOT_FOUND);

    sreq.method_prefix = "/cg.shop.v1.Catalog/";
    assert_int_equal(verbrpc__stats__v1__stats__get__call(g.ch, &sreq, &sresp, NULL, &st), VRPC_OK);
    assert_int_equal(sresp->n_methods, 2);
    for (size_t i = 0; i < sresp->n_methods; i++) {
        const Verbrpc__Stats__V1__MethodStats *m = sresp->methods[i];

        assert_int_equal(m->method_id, vrpc_method_id(m->method));
        if (strcmp(m->method, "/cg.shop.v1.Catalog/Lookup") == 0) {
            found = true;
            assert_true(m->calls >= 2); /* test_shop: one OK, one NOT_FOUND */
            assert_true(m->errors >= 1);
            assert_int_equal(m->n_errors_by_code, 1);
            assert_string_equal(m->errors_by_code[0]->code, "NOT_FOUND");
        }
    }
    assert_true(found);
}

/* The name (field 1, written first) of a serialized FileDescriptorProto. */
static bool fdp_named(const ProtobufCBinaryData *b, const char *name)
{
    size_t n = strlen(name);

    return b->len > 2 + n && b->data[0] == 0x0a && b->data[1] == n && memcmp(b->data + 2, name, n) == 0;
}

static bool fdp_in(const Verbrpc__Reflection__V1__FileDescriptorResponse *r, const char *name)
{
    for (size_t i = 0; i < r->n_file_descriptor_proto; i++)
        if (fdp_named(&r->file_descriptor_proto[i], name))
            return true;
    return false;
}

/* The reflection service over the wire: the services registered, a file
 * found by symbol with its imports, by name, and NOT_FOUND for neither. */
static void test_reflection(void **state)
{
    Verbrpc__Reflection__V1__ListServicesRequest lreq = VERBRPC__REFLECTION__V1__LIST_SERVICES_REQUEST__INIT;
    Verbrpc__Reflection__V1__ListServicesResponse *lresp;
    Verbrpc__Reflection__V1__FileContainingSymbolRequest sreq =
        VERBRPC__REFLECTION__V1__FILE_CONTAINING_SYMBOL_REQUEST__INIT;
    Verbrpc__Reflection__V1__FileByFilenameRequest freq = VERBRPC__REFLECTION__V1__FILE_BY_FILENAME_REQUEST__INIT;
    Verbrpc__Reflection__V1__FileDescriptorResponse *fresp;
    const char *want[] = {"verbrpc.health.v1.Health", "verbrpc.stats.v1.Stats", "verbrpc.reflection.v1.Reflection",
                          "cg.shop.v1.Catalog", "cg.shop.v1.Orders"};
    struct vrpc_status st;

    (void)state;
    assert_int_equal(verbrpc__reflection__v1__reflection__list_services__call(g.ch, &lreq, &lresp, NULL, &st), VRPC_OK);
    for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
        size_t i, seen = 0;

        for (i = 0; i < lresp->n_services; i++)
            seen += strcmp(lresp->services[i], want[w]) == 0;
        assert_int_equal(seen, 1); /* listed once, though it has several methods */
    }

    sreq.symbol = "cg.shop.v1.Catalog.Lookup";
    assert_int_equal(verbrpc__reflection__v1__reflection__file_containing_symbol__call(g.ch, &sreq, &fresp, NULL, &st),
                     VRPC_OK);
    assert_true(fresp->n_file_descriptor_proto >= 3);
    assert_true(fdp_named(&fresp->file_descriptor_proto[0], "shop/shop.proto")); /* the file first */
    assert_true(fdp_in(fresp, "common/types.proto"));
    assert_true(fdp_in(fresp, "google/protobuf/timestamp.proto")); /* an import's import */
    assert_int_equal(fresp->file_descriptor_proto[0].len, shop_2fshop_2eproto__vrpc_file.len);
    assert_memory_equal(fresp->file_descriptor_proto[0].data, shop_2fshop_2eproto__vrpc_file.data,
                        shop_2fshop_2eproto__vrpc_file.len);

    sreq.symbol = "cg.common.Item.Dimensions"; /* a nested message of an imported file */
    assert_int_equal(verbrpc__reflection__v1__reflection__file_containing_symbol__call(g.ch, &sreq, &fresp, NULL, &st),
                     VRPC_OK);
    assert_true(fdp_named(&fresp->file_descriptor_proto[0], "common/types.proto"));

    freq.filename = "verbrpc/stats.proto"; /* a built-in's own descriptor */
    assert_int_equal(verbrpc__reflection__v1__reflection__file_by_filename__call(g.ch, &freq, &fresp, NULL, &st),
                     VRPC_OK);
    assert_int_equal(fresp->n_file_descriptor_proto, 1);
    assert_true(fdp_named(&fresp->file_descriptor_proto[0], "verbrpc/stats.proto"));

    freq.filename = "nope.proto";
    assert_int_equal(verbrpc__reflection__v1__reflection__file_by_filename__call(g.ch, &freq, &fresp, NULL, &st),
                     VRPC_NOT_FOUND);
    assert_non_null(strstr(st.message, "nope.proto"));
    sreq.symbol = "cg.shop.v1.Catalog.Nope";
    assert_int_equal(verbrpc__reflection__v1__reflection__file_containing_symbol__call(g.ch, &sreq, &fresp, NULL, &st),
                     VRPC_NOT_FOUND);
}

int main(int argc, char **argv)
{
    const char *backend = "tcp", *setup_name = "single", *ip = "127.0.0.1", *src = NULL;
    struct vrpc_channel_opts co;
    char listen[128];
    int rc;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
        } else if (!strcmp(argv[i], "--setup") && i + 1 < argc) {
            setup_name = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--backend tcp|verbs] [--setup single|veth]\n", argv[0]);
            return 2;
        }
    }
    if (!strcmp(backend, "verbs")) {
        struct vrpc_transport *tp;

        rc = vrpc_test_verbs_addrs(setup_name, &ip, &src);
        if (rc)
            return rc == -ENOENT ? 77 : 2;
        rc = vrpc_transport_create("verbs", NULL, &tp);
        if (rc != 0) {
            printf("SKIP: the verbs backend is unavailable here: %s\n", strerror(-rc));
            return 77;
        }
        vrpc_transport_destroy(tp);
    } else if (strcmp(backend, "tcp") != 0) {
        fprintf(stderr, "%s: unknown backend %s\n", argv[0], backend);
        return 2;
    }
    snprintf(listen, sizeof(listen), "%s://%s:0", backend, ip);

    rc = vrpc_server_create(NULL, &g.server);
    if (rc == 0)
        rc = cg__shop__v1__catalog__vrpc_register(g.server, &catalog_impl);
    if (rc == 0)
        rc = cg__shop__v1__orders__vrpc_register(g.server, &orders_impl);
    if (rc == 0)
        rc = int__switch__static__void__vrpc_register(g.server, &void_impl);
    if (rc == 0)
        rc = odd_c__pkg2__my_service2__vrpc_register(g.server, &odd_impl);
    if (rc == 0)
        rc = odd_c__pkg2__lowercase_svc__vrpc_register(g.server, &lower_impl);
    if (rc == 0)
        rc = vrpc_server_start(g.server, listen);
    if (rc == 0)
        rc = vrpc_server_uri(g.server, g.uri, sizeof(g.uri));
    vrpc_channel_opts_init(&co);
    co.src_addr = src; /* veth: the client's side of the pair */
    if (rc == 0)
        rc = vrpc_channel_create(g.uri, &co, &g.ch);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot set up a server on %s: %s\n", argv[0], listen, strerror(-rc));
        vrpc_server_destroy(g.server);
        return 1;
    }
    printf("generated stubs round trip over %s (setup %s, client source %s)\n", g.uri, setup_name, src ? src : "any");

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptors), cmocka_unit_test(test_register_twice), cmocka_unit_test(test_shop),
        cmocka_unit_test(test_keywords),    cmocka_unit_test(test_odd_names),      cmocka_unit_test(test_async),
        cmocka_unit_test(test_builtins),    cmocka_unit_test(test_reflection),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(g.server);
    vrpc_thread_release();
    return rc;
}

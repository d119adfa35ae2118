/* The descriptors protoc-gen-verbrpc embeds for reflection: every file of
 * protos/ (and each file it imports, transitively, through .deps) carries
 * exactly the FileDescriptorProto bytes `protoc --descriptor_set_out
 * --include_imports` writes for it, its symbol list names its types,
 * services and methods, and every generated method points at its file.
 *   test_codegen_descriptors DESCRIPTOR_SET */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/types.vrpc.h"
#include "kw/keywords.vrpc.h"
#include "odd/odd_names.vrpc.h"
#include "shop/shop.vrpc.h"
#include "stream/feeds.vrpc.h"

static uint8_t *g_set;
static size_t g_set_len;

static uint64_t varint(const uint8_t **p, const uint8_t *end)
{
    uint64_t v = 0;

    for (unsigned shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;

        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    fail_msg("truncated varint in the descriptor set");
    return 0;
}

/* The entry of the FileDescriptorSet (field 1, repeated) whose name (field 1
 * of FileDescriptorProto, written first by protoc) is name. */
static bool set_entry(const char *name, const uint8_t **data, size_t *len)
{
    const uint8_t *p = g_set, *end = g_set + g_set_len;

    while (p < end) {
        assert_int_equal(*p++, 0x0a);
        size_t l = (size_t)varint(&p, end);
        const uint8_t *e = p, *q = p;

        assert_true(l <= (size_t)(end - p));
        p += l;
        assert_int_equal(*q++, 0x0a);
        size_t nl = (size_t)varint(&q, p);
        if (nl == strlen(name) && memcmp(q, name, nl) == 0) {
            *data = e;
            *len = l;
            return true;
        }
    }
    return false;
}

static unsigned check_file(const struct vrpc_file_desc *f)
{
    const uint8_t *want = NULL;
    size_t want_len = 0;
    unsigned files = 1;

    assert_true(set_entry(f->name, &want, &want_len));
    if (f->len != want_len || memcmp(f->data, want, want_len) != 0)
        fail_msg("%s: embedded descriptor (%zu bytes) differs from protoc's (%zu bytes)", f->name, f->len, want_len);
    for (size_t i = 0; i < f->n_deps; i++)
        files += check_file(f->deps[i]);
    return files;
}

static bool has_symbol(const struct vrpc_file_desc *f, const char *sym)
{
    for (size_t i = 0; i < f->n_symbols; i++)
        if (strcmp(f->symbols[i], sym) == 0)
            return true;
    return false;
}

static void test_bytes_equal_protoc(void **state)
{
    (void)state;
    /* shop.proto imports common/types.proto (which imports six well-known
     * types) and empty.proto: all reached through deps. */
    assert_true(check_file(&shop_2fshop_2eproto__vrpc_file) >= 9);
    check_file(&kw_2fkeywords_2eproto__vrpc_file);
    check_file(&odd_2fodd_5fnames_2eproto__vrpc_file); /* imports protobuf-c.proto, with options */
    check_file(&common_2ftypes_2eproto__vrpc_file);
    check_file(&stream_2ffeeds_2eproto__vrpc_file); /* streaming methods */
}

static void test_symbols_and_methods(void **state)
{
    const struct vrpc_file_desc *shop = &shop_2fshop_2eproto__vrpc_file;

    (void)state;
    assert_string_equal(shop->name, "shop/shop.proto");
    assert_true(has_symbol(shop, "cg.shop.v1.Catalog"));
    assert_true(has_symbol(shop, "cg.shop.v1.Catalog.Lookup"));
    assert_false(has_symbol(shop, "cg.shop.v1.Nope"));
    assert_true(has_symbol(&common_2ftypes_2eproto__vrpc_file, "cg.common.Item.Dimensions")); /* nested */
    assert_ptr_equal(cg__shop__v1__catalog__lookup__method.file, shop);
    assert_true(has_symbol(&stream_2ffeeds_2eproto__vrpc_file, "cg.stream.v1.Ticker.Trade"));
    assert_ptr_equal(cg__stream__v1__ticker__trade__method.file, &stream_2ffeeds_2eproto__vrpc_file);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_equal_protoc),
        cmocka_unit_test(test_symbols_and_methods),
    };
    FILE *fp;

    if (argc != 2 || !(fp = fopen(argv[1], "rb"))) {
        fprintf(stderr, "usage: test_codegen_descriptors DESCRIPTOR_SET\n");
        return 2;
    }
    fseek(fp, 0, SEEK_END);
    g_set_len = (size_t)ftell(fp);
    rewind(fp);
    g_set = malloc(g_set_len);
    if (!g_set || fread(g_set, 1, g_set_len, fp) != g_set_len)
        return 2;
    fclose(fp);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_set);
    return rc;
}

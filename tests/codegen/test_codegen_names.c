/* protoc-gen-verbrpc's copy of protoc-c's naming rules (codegen/names.c),
 * checked on odd names against what protoc-c 1.4.1 itself produced for
 * protos/odd/odd_names.proto (its .pb-c.h names are quoted below), and the
 * method-id hash against FNV-1a's published test vectors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>

#include "names.h"

static void expect(char *got, const char *want)
{
    assert_string_equal(got, want);
    free(got);
}

static void test_camel_to_lower(void **state)
{
    (void)state;
    expect(pc_camel_to_lower("EchoRequest"), "echo_request");
    expect(pc_camel_to_lower("HTTPRequest"), "httprequest");  /* odd_c__pkg2__httprequest__descriptor */
    expect(pc_camel_to_lower("foo_bar2Baz"), "foo_bar2_baz"); /* odd_c__pkg2__foo_bar2_baz__descriptor */
    expect(pc_camel_to_lower("Msg_With_Under"), "msg__with__under");
    expect(pc_camel_to_lower("ABCdefGHi2j"), "abcdef_ghi2j"); /* odd_c__pkg2__abcdef_ghi2j__descriptor */
    expect(pc_camel_to_lower("inner_msg"), "inner_msg");
    expect(pc_camel_to_lower("lower"), "lower");
    expect(pc_camel_to_lower("GET_thing"), "get_thing");
    expect(pc_camel_to_lower("v1Call"), "v1_call");
    expect(pc_camel_to_lower(""), "");
    expect(pc_camel_to_upper("EchoRequest"), "ECHO_REQUEST");
    expect(pc_camel_to_upper("v1Call"), "V1_CALL");
}

static void test_to_camel(void **state)
{
    (void)state;
    expect(pc_to_camel("foo_bar2Baz"), "FooBar2Baz"); /* OddC__Pkg2__FooBar2Baz */
    expect(pc_to_camel("Msg_With_Under"), "MsgWithUnder");
    expect(pc_to_camel("my_service2"), "MyService2"); /* OddC__Pkg2__MyService2_Service */
    expect(pc_to_camel("inner_msg"), "InnerMsg");
    expect(pc_to_camel("HTTP_Stuff"), "HTTPStuff");
    expect(pc_to_camel("v2beta3"), "V2beta3");
    expect(pc_to_camel("_x"), "X");
    expect(pc_to_camel("a__b"), "AB");
}

static void test_full_names(void **state)
{
    (void)state;
    expect(pc_full_name_to_c("odd_c.Pkg2.HTTPRequest.inner_msg"), "OddC__Pkg2__HTTPRequest__InnerMsg");
    expect(pc_full_name_to_lower("odd_c.Pkg2.HTTPRequest.inner_msg"), "odd_c__pkg2__httprequest__inner_msg");
    expect(pc_full_name_to_upper("demo.v1.EchoRequest"), "DEMO__V1__ECHO_REQUEST");
    expect(pc_full_name_to_c(".a..b."), "A__B"); /* empty pieces are skipped */
    expect(pc_full_name_to_c("int.switch.static.struct"), "Int__Switch__Static__Struct");
    expect(pc_filename_identifier("dir/a-b.proto"), "dir_2fa_2db_2eproto");
    expect(pc_strip_proto("dir/x.proto"), "dir/x");
    expect(pc_strip_proto("x.protodevel"), "x");
    expect(pc_strip_proto("noext"), "noext");
}

static void test_keywords(void **state)
{
    (void)state;
    assert_true(c_is_keyword("return"));
    assert_true(c_is_keyword("restrict"));
    assert_true(c_is_keyword("bool"));
    assert_true(c_is_keyword("errno"));
    assert_false(c_is_keyword("Return"));
    assert_false(c_is_keyword("user"));
    assert_false(c_is_keyword("returns"));
}

static void test_fnv1a(void **state)
{
    (void)state;
    assert_int_equal(vrpc_fnv1a32(""), 0x811c9dc5u);
    assert_int_equal(vrpc_fnv1a32("a"), 0xe40c292cu);
    assert_int_equal(vrpc_fnv1a32("foobar"), 0xbf9cf968u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_camel_to_lower), cmocka_unit_test(test_to_camel), cmocka_unit_test(test_full_names),
        cmocka_unit_test(test_keywords),       cmocka_unit_test(test_fnv1a),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

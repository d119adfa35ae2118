/* The library reports the version that VERSION and the headers carry. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include <verbrpc/verbrpc.h>

static void test_version_matches_header(void **state)
{
    (void)state;
    assert_string_equal(vrpc_version(), VRPC_VERSION_STRING);
    assert_int_equal(vrpc_version_number(), VRPC_VERSION_NUMBER);
    assert_true(VRPC_VERSION_NUMBER >= 0x000100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_matches_header),
    };
    return cmocka_run_group_tests_name("version", tests, NULL, NULL);
}

/* The knob table (common/env.h): defaults when unset, values in range taken,
 * values out of range or malformed ignored and reported once, flags, "set"
 * knobs, strings, and that a value is read once (until vrpc_env_reload). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <verbrpc/verbrpc.h>
#include "common/env.h"

struct seen {
    int n;
    char subsys[32];
    char line[VRPC_LOG_LINE_MAX];
};

static void catch (enum vrpc_log_level level, const char *subsys, const char *line, void *arg)
{
    struct seen *s = arg;
    s->n++;
    snprintf(s->subsys, sizeof s->subsys, "%s", subsys);
    snprintf(s->line, sizeof s->line, "%s", line);
}

static void test_defaults(void **state)
{
    unsetenv("VRPC_VERBS_RNR_RETRY");
    unsetenv("VRPC_VERBS_GID_INDEX");
    unsetenv("VRPC_FAULT");
    unsetenv("VRPC_NO_GATHER");
    vrpc_env_reload();
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_RNR_RETRY), 7);
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_GID_INDEX), -1);
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_PROTO_VERSION), -1);
    assert_null(vrpc_env_str(VRPC_ENV_FAULT));
    assert_false(vrpc_env_flag(VRPC_ENV_NO_GATHER));
}

static void test_range(void **state)
{
    struct seen s = {0};
    vrpc_log_set_handler(catch, &s);
    setenv("VRPC_VERBS_RNR_RETRY", "3", 1);
    setenv("VRPC_VERBS_GID_INDEX", "256", 1);
    setenv("VRPC_VERBS_ACK_TIMEOUT", "0x10", 1);
    vrpc_env_reload();
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_RNR_RETRY), 3);
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_ACK_TIMEOUT), 16);
    assert_int_equal(s.n, 0);
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_GID_INDEX), -1); /* ignored: the default */
    assert_int_equal(s.n, 1);
    assert_string_equal(s.subsys, "transport");
    assert_string_equal(s.line, "verbs: ignoring VRPC_VERBS_GID_INDEX=256 (want -1..255)");
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_GID_INDEX), -1);
    assert_int_equal(s.n, 1); /* reported once */
    setenv("VRPC_VERBS_RNR_RETRY", "2x", 1);
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_RNR_RETRY), 3); /* read once */
    vrpc_env_reload();
    assert_int_equal(vrpc_env_long(VRPC_ENV_VERBS_RNR_RETRY), 7);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.line, "verbs: ignoring VRPC_VERBS_RNR_RETRY=2x (want 0..7)");
    unsetenv("VRPC_VERBS_RNR_RETRY");
    unsetenv("VRPC_VERBS_GID_INDEX");
    unsetenv("VRPC_VERBS_ACK_TIMEOUT");
    vrpc_env_reload();
    vrpc_log_set_handler(NULL, NULL);
}

static void test_flags_and_strings(void **state)
{
    struct seen s = {0};
    vrpc_log_set_handler(catch, &s);
    setenv("VRPC_NO_GATHER", "1", 1);
    setenv("VRPC_SCHED_MEMBARRIER", "0", 1);
    setenv("VRPC_TCP_NO_FLOW_BUSY", "yes", 1);
    setenv("VRPC_VERBS_TRACE", "", 1);
    setenv("VRPC_FAULT", "seed=3", 1);
    vrpc_env_reload();
    assert_true(vrpc_env_flag(VRPC_ENV_NO_GATHER));
    assert_false(vrpc_env_flag(VRPC_ENV_SCHED_MEMBARRIER));
    assert_true(vrpc_env_flag(VRPC_ENV_VERBS_TRACE)); /* set, even empty */
    assert_string_equal(vrpc_env_str(VRPC_ENV_FAULT), "seed=3");
    assert_int_equal(s.n, 0);
    assert_false(vrpc_env_flag(VRPC_ENV_TCP_NO_FLOW_BUSY));
    assert_int_equal(s.n, 1);
    assert_string_equal(s.line, "tcp: ignoring VRPC_TCP_NO_FLOW_BUSY=yes (want 0 or 1)");
    unsetenv("VRPC_NO_GATHER");
    unsetenv("VRPC_SCHED_MEMBARRIER");
    unsetenv("VRPC_TCP_NO_FLOW_BUSY");
    unsetenv("VRPC_VERBS_TRACE");
    unsetenv("VRPC_FAULT");
    vrpc_env_reload();
    vrpc_log_set_handler(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_flags_and_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

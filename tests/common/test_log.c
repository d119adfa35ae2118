/* The public logging API (include/verbrpc/log.h): the threshold filters by
 * level, a handler receives level, subsystem and text, VRPC_LOG_OFF silences
 * the transport's and the RPC layer's lines too, VRPC_LOG is parsed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <verbrpc/verbrpc.h>

struct seen {
    int n;
    enum vrpc_log_level level;
    char subsys[32];
    char line[VRPC_LOG_LINE_MAX];
};

static void catch (enum vrpc_log_level level, const char *subsys, const char *line, void *arg)
{
    struct seen *s = arg;
    s->n++;
    s->level = level;
    snprintf(s->subsys, sizeof s->subsys, "%s", subsys);
    snprintf(s->line, sizeof s->line, "%s", line);
}

static void test_levels_filter(void **state)
{
    struct seen s = {0};
    vrpc_log_set_handler(catch, &s);
    vrpc_log_set_level(VRPC_LOG_WARN);
    vrpc_log(VRPC_LOG_DEBUG, "t", "debug %d", 1);
    vrpc_log(VRPC_LOG_INFO, "t", "info %d", 2);
    assert_int_equal(s.n, 0);
    vrpc_log(VRPC_LOG_WARN, "t", "warn %d", 3);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.level, VRPC_LOG_WARN);
    assert_string_equal(s.subsys, "t");
    assert_string_equal(s.line, "warn 3");
    vrpc_log(VRPC_LOG_ERROR, NULL, "error %s", "x");
    assert_int_equal(s.n, 2);
    assert_int_equal(s.level, VRPC_LOG_ERROR);
    assert_string_equal(s.subsys, "app");
    assert_string_equal(s.line, "error x");
    vrpc_log_set_level(VRPC_LOG_DEBUG);
    assert_true(vrpc_log_enabled(VRPC_LOG_DEBUG));
    vrpc_log(VRPC_LOG_DEBUG, "t", "now %s", "seen");
    assert_int_equal(s.n, 3);
    assert_string_equal(s.line, "now seen");
    vrpc_log_set_level(VRPC_LOG_ERROR);
    vrpc_log(VRPC_LOG_WARN, "t", "hidden");
    assert_int_equal(s.n, 3);
    assert_false(vrpc_log_enabled(VRPC_LOG_WARN));
    assert_false(vrpc_log_enabled(VRPC_LOG_OFF));
    vrpc_log_set_handler(NULL, NULL);
    vrpc_log_set_level(VRPC_LOG_WARN);
}

static void test_long_line_cut(void **state)
{
    struct seen s = {0};
    char big[2 * VRPC_LOG_LINE_MAX];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    vrpc_log_set_handler(catch, &s);
    vrpc_log(VRPC_LOG_ERROR, "t", "%s", big);
    assert_int_equal(s.n, 1);
    assert_int_equal(strlen(s.line), VRPC_LOG_LINE_MAX - 1);
    vrpc_log_set_handler(NULL, NULL);
}

/* A line each from the transport (a large buffer put back twice) and from
 * the RPC layer (a channel whose max_msg_size exceeds its max_pinned). */
static void provoke_transport_and_rpc(void)
{
    struct vrpc_transport *tp;
    struct vrpc_buf *b;
    struct vrpc_channel *ch = NULL;
    struct vrpc_channel_opts o;
    assert_int_equal(vrpc_transport_create("tcp", NULL, &tp), 0);
    assert_int_equal(vrpc_lbuf_get(tp, 100000, &b), 0);
    vrpc_lbuf_put(b);
    vrpc_lbuf_put(b);
    vrpc_transport_destroy(tp);
    vrpc_channel_opts_init(&o);
    o.max_msg_size = 2u << 20;
    o.max_pinned = 1u << 20;
    assert_int_equal(vrpc_channel_create("tcp://127.0.0.1:1", &o, &ch), -EINVAL);
}

static void test_transport_and_rpc_levels(void **state)
{
    struct seen s = {0};
    vrpc_log_set_handler(catch, &s);
    vrpc_log_set_level(VRPC_LOG_WARN);
    provoke_transport_and_rpc();
    assert_int_equal(s.n, 2);
    assert_int_equal(s.level, VRPC_LOG_WARN);
    assert_string_equal(s.subsys, "rpc");
    assert_non_null(strstr(s.line, "max_pinned"));
    /* off: neither layer reaches the handler */
    s.n = 0;
    vrpc_log_set_level(VRPC_LOG_OFF);
    provoke_transport_and_rpc();
    assert_int_equal(s.n, 0);
    vrpc_log_set_level(VRPC_LOG_WARN);
    vrpc_log_set_handler(NULL, NULL);
}

static void test_transport_subsys(void **state)
{
    struct seen s = {0};
    struct vrpc_transport *tp;
    struct vrpc_buf *b;
    vrpc_log_set_handler(catch, &s);
    assert_int_equal(vrpc_transport_create("tcp", NULL, &tp), 0);
    assert_int_equal(vrpc_lbuf_get(tp, 100000, &b), 0);
    vrpc_lbuf_put(b);
    vrpc_lbuf_put(b);
    vrpc_transport_destroy(tp);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.subsys, "transport");
    assert_non_null(strstr(s.line, "put back twice"));
    vrpc_log_set_handler(NULL, NULL);
}

static void test_parse(void **state)
{
    enum vrpc_log_level l;
    const struct {
        const char *s;
        enum vrpc_log_level l;
    } ok[] = {
        {"off", VRPC_LOG_OFF},   {"0", VRPC_LOG_OFF},        {"none", VRPC_LOG_OFF},  {"error", VRPC_LOG_ERROR},
        {"warn", VRPC_LOG_WARN}, {"WARNING", VRPC_LOG_WARN}, {"info", VRPC_LOG_INFO}, {"debug", VRPC_LOG_DEBUG},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(vrpc_log_level_parse(ok[i].s, &l), 0);
        assert_int_equal(l, ok[i].l);
    }
    assert_int_equal(vrpc_log_level_parse("loud", &l), -EINVAL);
    assert_int_equal(vrpc_log_level_parse("1", &l), -EINVAL);
    assert_string_equal(vrpc_log_level_name(VRPC_LOG_INFO), "info");
}

int main(int argc, char **argv)
{
    /* --env-off: run with VRPC_LOG=off; the environment, read once, must
     * silence the default handler's lines and set the threshold. */
    if (argc > 1 && !strcmp(argv[1], "--env-off")) {
        assert_int_equal(vrpc_log_get_level(), VRPC_LOG_OFF);
        return vrpc_log_enabled(VRPC_LOG_ERROR) ? 1 : 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_filter),
        cmocka_unit_test(test_long_line_cut),
        cmocka_unit_test(test_transport_subsys),
        cmocka_unit_test(test_transport_and_rpc_levels),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The latency modes end to end on TCP (vrpc_channel_opts.spin_us and
 * vrpc_server_opts.spin_us): in each mode (adaptive, always, a fixed window,
 * no_spin) synchronous and asynchronous calls are answered correctly, across
 * pauses longer than any window (the waits then sleep and are woken), and
 * the channel and server shut down, also with pollers and workers that never
 * sleep. What the modes map to is in tests/common/test_spin.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include "rpc_test.pb-c.h"

static struct vrpc_method_desc m_echo = {
    "/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_UNARY};

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    (void)user;
    rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

struct async_state {
    uint32_t done, ok;
};

static void async_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct async_state *a = arg;
    if (st->code == VRPC_OK && resp && ((const Vrpctest__EchoReply *)resp)->seq == 42)
        __atomic_add_fetch(&a->ok, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&a->done, 1, __ATOMIC_RELEASE);
}

static void run_mode(bool no_spin, uint32_t spin_us)
{
    struct vrpc_server_opts so;
    struct vrpc_channel_opts co;
    struct vrpc_server *s;
    struct vrpc_channel *ch;
    char uri[128];
    uint8_t buf[64];
    struct async_state a = {0};
    unsigned n = 300;

    m_echo.id = vrpc_method_id(m_echo.full_name);
    memset(buf, 5, sizeof buf);
    vrpc_server_opts_init(&so);
    so.no_spin = no_spin;
    so.spin_us = spin_us;
    so.threads = 1; /* in the always mode each thread keeps a CPU busy */
    assert_int_equal(vrpc_server_create(&so, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_start(s, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(vrpc_server_uri(s, uri, sizeof uri), 0);
    vrpc_channel_opts_init(&co);
    co.no_spin = no_spin;
    co.spin_us = spin_us;
    co.threads = 1;
    co.default_timeout_us = 10000000;
    assert_int_equal(vrpc_channel_create(uri, &co, &ch), 0);
    for (unsigned i = 0; i < n; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        Vrpctest__EchoReply *rep = NULL;
        struct vrpc_status st;
        r.payload.data = buf;
        r.payload.len = sizeof buf;
        r.seq = i;
        assert_int_equal(vrpc_call(ch, &m_echo, &r.base, (ProtobufCMessage **)&rep, NULL, &st), VRPC_OK);
        assert_int_equal(rep->seq, i);
        assert_memory_equal(rep->payload.data, buf, sizeof buf);
        if (i % 100 == 99)
            usleep(5000); /* longer than the adaptive cap: the next wait sleeps */
        r.seq = 42;
        assert_int_equal(vrpc_call_async(ch, &m_echo, &r.base, NULL, async_cb, &a), 0);
    }
    while (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) < n)
        usleep(1000);
    assert_int_equal(a.ok, n);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(s);
}

static void test_adaptive(void **state)
{
    (void)state;
    run_mode(false, VRPC_SPIN_ADAPTIVE);
}

static void test_always(void **state)
{
    (void)state;
    run_mode(false, VRPC_SPIN_ALWAYS);
}

static void test_fixed(void **state)
{
    (void)state;
    run_mode(false, 20);
}

static void test_no_spin_overrides(void **state)
{
    (void)state;
    run_mode(true, VRPC_SPIN_ALWAYS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adaptive),
        cmocka_unit_test(test_always),
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_no_spin_overrides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Errors that say what happened, at once, and the response arenas: malformed
 * URIs refused at create (channel and server) with -EINVAL, permanent
 * connect errors ending vrpc_channel_connect at once, UNIMPLEMENTED naming
 * the method, and a synchronous call inside an async callback leaving the
 * callback's resp intact. TCP over loopback. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include "rpc_test.pb-c.h"

#define M(name, in, out) \
    {"/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor}
static struct vrpc_method_desc m_echo = M("Echo", echo_request, echo_reply);
static struct vrpc_method_desc m_missing = M("Missing", echo_request, echo_reply);

static struct vrpc_server *g_srv;
static char g_uri[128];

static void echo_handler(struct vrpc_server_call *call, const ProtobufCMessage *req, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)req;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

static int setup(void **state)
{
    (void)state;
    m_echo.id = vrpc_method_id(m_echo.full_name);
    m_missing.id = vrpc_method_id(m_missing.full_name);
    if (vrpc_server_create(NULL, &g_srv) || vrpc_server_register(g_srv, &m_echo, echo_handler, NULL) ||
        vrpc_server_start(g_srv, "tcp://127.0.0.1:0") || vrpc_server_uri(g_srv, g_uri, sizeof g_uri))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vrpc_server_destroy(g_srv);
    return 0;
}

/* ---- a synchronous call inside an async callback ------------------------- */

struct nested {
    struct vrpc_channel *ch;
    unsigned done; /* atomic */
    int inner_code;
    uint64_t outer_seq_after;
    char outer_payload_after[64];
    char inner_payload[64];
};

static void nested_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct nested *n = arg;
    if (st->code == VRPC_OK) {
        const Vrpctest__EchoReply *outer = (const Vrpctest__EchoReply *)resp;
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        static const char inner[] = "inner response, longer than the outer one";
        r.seq = 2;
        r.payload.data = (uint8_t *)inner;
        r.payload.len = sizeof inner - 1;
        ProtobufCMessage *in = NULL;
        n->inner_code = vrpc_call(n->ch, &m_echo, &r.base, &in, NULL, NULL);
        if (n->inner_code == VRPC_OK) {
            const Vrpctest__EchoReply *ir = (const Vrpctest__EchoReply *)in;
            snprintf(n->inner_payload, sizeof n->inner_payload, "%.*s", (int)ir->payload.len,
                     (const char *)ir->payload.data);
        }
        /* the callback's resp, read after the nested call */
        n->outer_seq_after = outer->seq;
        snprintf(n->outer_payload_after, sizeof n->outer_payload_after, "%.*s", (int)outer->payload.len,
                 (const char *)outer->payload.data);
    } else {
        n->inner_code = -1;
    }
    __atomic_store_n(&n->done, 1, __ATOMIC_RELEASE);
}

static void test_sync_call_inside_callback(void **state)
{
    (void)state;
    struct nested n = {0};
    assert_int_equal(vrpc_channel_create(g_uri, NULL, &n.ch), 0);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    static const char outer[] = "outer";
    r.seq = 1;
    r.payload.data = (uint8_t *)outer;
    r.payload.len = sizeof outer - 1;
    assert_int_equal(vrpc_call_async(n.ch, &m_echo, &r.base, NULL, nested_cb, &n), 0);
    for (int i = 0; i < 10000 && !__atomic_load_n(&n.done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&n.done, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(n.inner_code, VRPC_OK);
    assert_string_equal(n.inner_payload, "inner response, longer than the outer one");
    assert_int_equal(n.outer_seq_after, 1);
    assert_string_equal(n.outer_payload_after, "outer");
    vrpc_channel_destroy(n.ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_call_inside_callback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

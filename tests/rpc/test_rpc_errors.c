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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc_test.pb-c.h"

#define M(name, in, out)                                                                                               \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor, NULL,                \
            VRPC_METHOD_UNARY                                                                                          \
    }
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

/* ---- URIs ------------------------------------------------------------------ */

static const char *const g_bad_uris[] = {
    "tcp:/127.0.0.1:7500",    /* one slash */
    "127.0.0.1",              /* no port */
    "tcp://127.0.0.1",        /* no port */
    "tcp://127.0.0.1:99999",  /* port out of range */
    "tcp://127.0.0.1:",       /* empty port */
    "tcp://127.0.0.1:-1",     /* not a number */
    "tcp://[::1:7500",        /* unclosed bracket */
    "tcp://[::1]7500",        /* no ':' after ']' */
    "tcp://[127.0.0.1]:7500", /* brackets around a non-IPv6 host */
    "tcp://::1:7500",         /* IPv6 without brackets */
    "tcp://:7500",            /* empty host */
    ":7500",                  /* empty host, bare */
    "foo://127.0.0.1:7500",   /* unknown scheme */
    "TCP://127.0.0.1:7500",   /* scheme not lowercase */
    "tcp://127.0.0.1:7500x",  /* trailing garbage */
    "tcp://127.0.0.1:7500/",  /* trailing garbage */
    "tcp://127.0.0.1:7500 ",  /* trailing blank */
    "tcp://host name:7500",   /* blank in the host */
    "",                       /* empty */
};

static void test_malformed_uris_refused_at_create(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof g_bad_uris / sizeof g_bad_uris[0]; i++) {
        const char *u = g_bad_uris[i];
        struct vrpc_channel *ch = NULL;
        struct vrpc_server *s = NULL;
        char why[160] = "";
        printf("# '%s'\n", u);
        assert_int_equal(vrpc_channel_create(u, NULL, &ch), -EINVAL);
        assert_null(ch);
        assert_int_equal(vrpc_server_create(NULL, &s), 0);
        assert_int_equal(vrpc_server_register(s, &m_echo, echo_handler, NULL), 0);
        assert_int_equal(vrpc_server_start(s, u), -EINVAL);
        vrpc_server_destroy(s);
        /* unknown schemes pass the syntax check: the backend list refuses them */
        if (strncmp(u, "foo://", 6)) {
            assert_int_equal(vrpc_uri_check(u, why, sizeof why), -EINVAL);
            printf("#   %s\n", why);
            assert_true(why[0] != 0);
        }
    }
}

static void test_good_uris_pass(void **state)
{
    (void)state;
    static const char *const good[] = {
        "tcp://127.0.0.1:7500",
        "127.0.0.1:7500",
        "localhost:0",
        "tcp://[::1]:7500",
        "auto://[::1]:0",
        "verbs://10.0.0.1:7500",
        "fault+tcp://127.0.0.1:1",
        "tcp://[fe80::1%eth0]:7500",
        "tcp://my-host_1.example:65535",
    };
    char why[160];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (vrpc_uri_check(good[i], why, sizeof why))
            fail_msg("'%s' refused: %s", good[i], why);
        assert_string_equal(why, "");
    }
    struct vrpc_channel *ch;
    assert_int_equal(vrpc_channel_create("tcp://127.0.0.1:7500", NULL, &ch), 0);
    vrpc_channel_destroy(ch);
    assert_int_equal(vrpc_channel_create("127.0.0.1:7500", NULL, &ch), 0);
    vrpc_channel_destroy(ch);
}

/* ---- permanent connect errors end vrpc_channel_connect at once ------------- */

/* A port nothing listens on: bound, then closed. */
static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_refused_connect_fails_at_once(void **state)
{
    (void)state;
    char uri[64];
    struct vrpc_channel *ch;
    snprintf(uri, sizeof uri, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(vrpc_channel_create(uri, NULL, &ch), 0);
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(vrpc_channel_connect(ch, 5000), -ECONNREFUSED);
    double s = (double)(vrpc_now_ns() - t0) / 1e9;
    printf("# refused after %.3f s (timeout 5 s)\n", s);
    assert_true(s < 2.5); /* not the 5 s timeout (generous for a loaded host) */
    vrpc_channel_destroy(ch);
}

static void test_unknown_host_named(void **state)
{
    (void)state;
    struct vrpc_channel *ch;
    struct vrpc_status st;
    assert_int_equal(vrpc_channel_create("tcp://no-such-host.invalid:7500", NULL, &ch), 0);
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(vrpc_channel_connect(ch, 5000), -ENXIO);
    double s = (double)(vrpc_now_ns() - t0) / 1e9;
    printf("# name failure after %.3f s (timeout 5 s)\n", s);
    assert_true(s < 2.5);
    vrpc_channel_destroy(ch);

    assert_int_equal(vrpc_channel_create("tcp://no-such-host.invalid:7500", NULL, &ch), 0);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp;
    assert_int_equal(vrpc_call(ch, &m_echo, &r.base, &resp, NULL, &st), VRPC_UNAVAILABLE);
    printf("# %s: %s\n", vrpc_code_name(st.code), st.message);
    assert_non_null(strstr(st.message, "cannot resolve"));
    assert_non_null(strstr(st.message, "no-such-host.invalid"));
    assert_null(strstr(st.message, "No route to host"));
    vrpc_channel_destroy(ch);
}

/* ---- UNIMPLEMENTED names the method ---------------------------------------- */

static void test_unimplemented_names_method(void **state)
{
    (void)state;
    struct vrpc_channel *ch;
    struct vrpc_status st;
    char id[16];
    assert_int_equal(vrpc_channel_create(g_uri, NULL, &ch), 0);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp;
    assert_int_equal(vrpc_call(ch, &m_missing, &r.base, &resp, NULL, &st), VRPC_UNIMPLEMENTED);
    printf("# %s: %s\n", vrpc_code_name(st.code), st.message);
    assert_non_null(strstr(st.message, "/vrpctest.Test/Missing"));
    snprintf(id, sizeof id, "0x%08x", m_missing.id);
    assert_non_null(strstr(st.message, id));
    assert_non_null(strstr(st.message, "not registered on this server"));
    vrpc_channel_destroy(ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_call_inside_callback),
        cmocka_unit_test(test_malformed_uris_refused_at_create),
        cmocka_unit_test(test_good_uris_pass),
        cmocka_unit_test(test_refused_connect_fails_at_once),
        cmocka_unit_test(test_unknown_host_named),
        cmocka_unit_test(test_unimplemented_names_method),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

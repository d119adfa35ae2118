/* Large messages end to end (--backend tcp|verbs): message size limits and
 * their errors, rendezvous payloads of every size class in both directions
 * with CRC32C checked end to end, the large-buffer cache bound, small calls
 * overtaking a large transfer, a server killed mid-transfer, and forged
 * descriptors from a raw peer. VRPC_TEST_QUICK=1 (set under sanitizers)
 * caps payloads at 16 MiB. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "verbs_setup.h"
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"
#include "rpc_test.pb-c.h"

static struct {
    const char *backend, *setup;
    const char *server_ip, *client_ip;
    bool quick;
    const char *self;
} g_opt;

#define M(name, in, out) \
    {"/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor}
static struct vrpc_method_desc m_echo = M("Echo", echo_request, echo_reply);

/* ---- CRC32C (Castagnoli), computed by the test on both ends ------------- */

static uint32_t g_crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        g_crc_table[i] = c;
    }
}

static uint32_t crc32c(const uint8_t *p, size_t n)
{
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++)
        c = g_crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

/* Deterministic bytes from a seed (xorshift), so both ends can make them. */
static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

/* ---- the server's handler ------------------------------------------------ */

enum mode {
    MODE_ECHO = 0,  /* answer with the request's payload */
    MODE_CRC = 1,   /* answer seq = CRC32C of the request payload, no payload */
    MODE_GEN = 2,   /* answer a payload of seq bytes made from sleep_ms as seed,
                       with its CRC32C in seq */
    MODE_SLEEP = 3, /* answer after sleep_ms, empty */
};

static int g_last_respond_rc = 1; /* rc of the last vrpc_server_call_respond */

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    uint8_t *gen = NULL;
    switch ((enum mode)r->mode) {
    case MODE_ECHO:
        rep.payload = r->payload;
        rep.seq = r->seq;
        break;
    case MODE_CRC:
        rep.seq = crc32c(r->payload.data, r->payload.len);
        break;
    case MODE_GEN:
        gen = malloc(r->seq ? r->seq : 1);
        if (!gen) {
            vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "test server out of memory");
            return;
        }
        fill(gen, r->seq, r->sleep_ms);
        rep.payload.data = gen;
        rep.payload.len = r->seq;
        rep.seq = crc32c(gen, r->seq);
        break;
    case MODE_SLEEP:
        usleep(r->sleep_ms * 1000u);
        break;
    }
    int rc = vrpc_server_call_respond(call, &rep.base);
    __atomic_store_n(&g_last_respond_rc, rc, __ATOMIC_RELEASE);
    free(gen);
}

/* ---- fixtures ---------------------------------------------------------------- */

static char *listen_uri(char *buf, size_t len, unsigned port)
{
    const char *ip = g_opt.server_ip;
    snprintf(buf, len, "%s://%s%s%s:%u", g_opt.backend, strchr(ip, ':') ? "[" : "", ip,
             strchr(ip, ':') ? "]" : "", port);
    return buf;
}

static struct vrpc_server *start_server(uint32_t max_msg, uint64_t max_pinned, char *uri, size_t urilen)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    char lu[VRPC_URI_MAX];
    vrpc_server_opts_init(&o);
    o.max_msg_size = max_msg;
    o.max_pinned = max_pinned;
    o.max_concurrent = 16;
    assert_int_equal(vrpc_server_create(&o, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_start(s, listen_uri(lu, sizeof(lu), 0)), 0);
    assert_int_equal(vrpc_server_uri(s, uri, urilen), 0);
    return s;
}

static struct vrpc_channel *new_channel(const char *uri, uint32_t max_msg, uint64_t max_pinned)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.max_msg_size = max_msg;
    o.max_pinned = max_pinned;
    o.max_outstanding = 16;
    o.src_addr = g_opt.client_ip;
    o.connect_timeout_ms = 5000;
    assert_int_equal(vrpc_channel_create(uri, &o, &ch), 0);
    assert_int_equal(vrpc_channel_connect(ch, 10000), 0);
    return ch;
}

static int call_echo(struct vrpc_channel *ch, const void *data, size_t len, uint64_t seq, enum mode mode,
                     uint32_t arg, Vrpctest__EchoReply **rep, struct vrpc_status *st)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.payload.data = (uint8_t *)data;
    r.payload.len = len;
    r.seq = seq;
    r.mode = mode;
    r.sleep_ms = arg;
    return vrpc_call(ch, &m_echo, &r.base, (ProtobufCMessage **)rep, NULL, st);
}

/* Encoded sizes of a request (payload of n bytes, mode) and of a reply with
 * only a payload of n bytes. */
static size_t req_size(size_t n, enum mode mode)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    static uint8_t dummy;
    r.payload.data = &dummy;
    r.payload.len = n;
    r.mode = mode;
    return protobuf_c_message_get_packed_size(&r.base);
}

static size_t rep_size(size_t n)
{
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    static uint8_t dummy;
    rep.payload.data = &dummy;
    rep.payload.len = n;
    return protobuf_c_message_get_packed_size(&rep.base);
}

/* ---- limits ------------------------------------------------------------------- */

static void test_limit_options(void **state)
{
    (void)state;
    struct vrpc_channel_opts co;
    struct vrpc_channel *ch;
    struct vrpc_server_opts so;
    struct vrpc_server *s;
    vrpc_channel_opts_init(&co);
    co.max_msg_size = VRPC_MSG_SIZE_MAX + 1;
    assert_int_equal(vrpc_channel_create("tcp://127.0.0.1:1", &co, &ch), -EINVAL);
    co.max_msg_size = 64u << 20;
    co.max_pinned = 32u << 20; /* a message of the limit could never get a buffer */
    assert_int_equal(vrpc_channel_create("tcp://127.0.0.1:1", &co, &ch), -EINVAL);
    co.max_msg_size = VRPC_MSG_SIZE_MAX;
    co.max_pinned = (uint64_t)VRPC_MSG_SIZE_MAX;
    assert_int_equal(vrpc_channel_create("tcp://127.0.0.1:1", &co, &ch), 0);
    vrpc_channel_destroy(ch);
    vrpc_server_opts_init(&so);
    so.max_msg_size = VRPC_MSG_SIZE_MAX + 1;
    assert_int_equal(vrpc_server_create(&so, &s), -EINVAL);
    so.max_msg_size = 300u << 20; /* above the default max_pinned, 256 MiB */
    assert_int_equal(vrpc_server_create(&so, &s), -EINVAL);
    so.max_pinned = 300u << 20;
    assert_int_equal(vrpc_server_create(&so, &s), 0);
    vrpc_server_destroy(s);
}

/* Limits below the eager size: no rendezvous involved. */
static void test_small_limits(void **state)
{
    (void)state;
    char uri[VRPC_URI_MAX], want[VRPC_STATUS_MSG_MAX];
    struct vrpc_server *s = start_server(6000, 0, uri, sizeof(uri));
    struct vrpc_channel *ch = new_channel(uri, 3000, 0);
    static uint8_t buf[7000];
    Vrpctest__EchoReply *rep;
    struct vrpc_status st;

    /* request over the server's limit: refused locally, both figures named */
    assert_int_equal(call_echo(ch, buf, 6100, 0, MODE_CRC, 0, &rep, &st), VRPC_RESOURCE_EXHAUSTED);
    snprintf(want, sizeof(want), "request of %zu bytes exceeds the server's limit of 6000 bytes", req_size(6100, MODE_CRC));
    assert_string_equal(st.message, want);
    /* request within it, response over the client's limit */
    assert_int_equal(call_echo(ch, buf, 5000, 0, MODE_CRC, 0, &rep, &st), VRPC_OK);
    assert_int_equal(rep->seq, crc32c(buf, 5000));
    __atomic_store_n(&g_last_respond_rc, 1, __ATOMIC_RELEASE);
    assert_int_equal(call_echo(ch, buf, 5000, 0, MODE_ECHO, 0, &rep, &st), VRPC_RESOURCE_EXHAUSTED);
    snprintf(want, sizeof(want), "response of %zu bytes exceeds the client's limit of 3000 bytes", rep_size(5000));
    assert_string_equal(st.message, want);
    assert_int_equal(__atomic_load_n(&g_last_respond_rc, __ATOMIC_ACQUIRE), -EMSGSIZE);
    /* and the connection carries on */
    assert_int_equal(call_echo(ch, buf, 2000, 0, MODE_ECHO, 0, &rep, &st), VRPC_OK);
    assert_int_equal(rep->payload.len, 2000);
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(s);
}

int main(int argc, char **argv)
{
    g_opt.backend = "tcp";
    g_opt.setup = "local";
    g_opt.self = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            g_opt.backend = argv[++i];
        else if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            g_opt.setup = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            g_opt.quick = true;
        else {
            fprintf(stderr, "usage: %s [--backend tcp|verbs] [--setup local|single|veth] [--quick]\n"
                            "--quick (or VRPC_TEST_QUICK=1): payloads up to 16 MiB only\n", argv[0]);
            return 2;
        }
    }
    if (getenv("VRPC_TEST_QUICK") && atoi(getenv("VRPC_TEST_QUICK")) > 0)
        g_opt.quick = true;
    crc_init();
    m_echo.id = vrpc_method_id(m_echo.full_name);
    if (!strcmp(g_opt.backend, "tcp")) {
        g_opt.server_ip = "127.0.0.1";
    } else {
        int rc = vrpc_test_verbs_addrs(g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
        if (rc)
            return rc == -ENOENT ? 77 : 2;
        struct vrpc_transport *tp;
        rc = vrpc_transport_create(g_opt.backend, NULL, &tp);
        if (rc) {
            printf("SKIP: backend '%s' unavailable here: %s\n", g_opt.backend, strerror(-rc));
            return 77;
        }
        vrpc_transport_destroy(tp);
    }
    printf("# large-message tests: backend %s, setup %s%s\n", g_opt.backend, g_opt.setup,
           g_opt.quick ? ", quick" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_options),
        cmocka_unit_test(test_small_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

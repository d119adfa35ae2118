/* Attack tests (issue 16, TCP): raw clients that speak the TCP transport's
 * and the RPC wire by hand and misbehave against one server, while a
 * well-behaved channel on the same server measures its own calls:
 *   - a client that makes calls and never reads its responses (it returns no
 *     credits), one and two at once;
 *   - seventeen announced large requests whose reads are never served;
 *   - sixteen connections serving their reads one byte at a time;
 *   - the same with large messages inside client streams;
 *   - a client that floods requests as fast as its credits allow;
 *   - a client that keeps the socket full of header-only frames.
 * Each asserts that the attacker gets a clear status or loses its connection,
 * that the well-behaved client keeps a 100 % success rate with a p95 within
 * 20x its p99 before the attack + 50 ms, that its large request still gets
 * through during the memory attacks, and that the large-message memory comes
 * back afterwards (lbuf in_use). Limits are small through the server's
 * options so that each case runs in seconds. Figures are printed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/rndv.h"
#include "rpc/wire.h"
#include "transport/tcp/tcp_wire.h"
#include "rpc_test.pb-c.h"
#include "verbs_setup.h"

#define ATK_EAGER 8192u /* the eager size the server uses (rpc/internal.h) */

#define M(name, in, out)                                                                                               \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor, NULL,                \
            VRPC_METHOD_UNARY                                                                                          \
    }
static struct vrpc_method_desc m_echo = M("Echo", echo_request, echo_reply);
/* a client stream whose messages the server drops */
static struct vrpc_method_desc m_sink = {"/vrpctest.Stream/Sink",           0,    &vrpctest__echo_request__descriptor,
                                         &vrpctest__echo_reply__descriptor, NULL, VRPC_METHOD_CLIENT_STREAMING};

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.seq = r->seq;
    if (r->mode == 0)
        rep.payload = r->payload;
    vrpc_server_call_respond(call, &rep.base);
}

static void sink_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }
static void sink_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)s, (void)msg, (void)user;
}
static void sink_end(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_OK, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops sink_ops = {sink_start, sink_read, sink_end, sink_end};

static struct {
    const char *backend, *server_ip, *client_ip;
} g_opt = {"tcp", "127.0.0.1", NULL};

/* ---- the server ------------------------------------------------------------ */

struct env {
    struct vrpc_server *srv;
    char uri[VRPC_URI_MAX];
};

static void env_start(struct env *e, const struct vrpc_server_opts *o)
{
    m_echo.id = vrpc_method_id(m_echo.full_name);
    assert_int_equal(vrpc_server_create(o, &e->srv), 0);
    assert_int_equal(vrpc_server_register(e->srv, &m_echo, h_echo, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(e->srv, &m_sink, &sink_ops, NULL), 0);
    char listen[VRPC_URI_MAX];
    snprintf(listen, sizeof(listen), "%s://%s:0", g_opt.backend, g_opt.server_ip);
    assert_int_equal(vrpc_server_start(e->srv, listen), 0);
    assert_int_equal(vrpc_server_uri(e->srv, e->uri, sizeof(e->uri)), 0);
}

static size_t lbuf_in_use(struct env *e)
{
    size_t pinned = 0, in_use = 0;
    vrpc_lbuf_stats(vrpc_server_transport(e->srv), &pinned, &in_use);
    return in_use;
}

/* Wait up to ms for the server's large buffers in use to fall to at most n. */
static bool wait_in_use(struct env *e, size_t n, int ms)
{
    for (int i = 0; i < ms / 10 && lbuf_in_use(e) > n; i++)
        usleep(10000);
    return lbuf_in_use(e) <= n;
}

/* ---- the raw attacker ----------------------------------------------------- */

enum atk_mode {
    ATK_NO_READ,     /* calls, returns no credits: its responses pile up at the server */
    ATK_LARGE,       /* announces large requests, never serves their reads */
    ATK_SLOW,        /* announces a large request, serves its read one byte per tick */
    ATK_FLOOD,       /* calls as fast as credits allow, reads everything */
    ATK_STREAM_SLOW, /* ATK_SLOW with a large message in a client stream */
    ATK_CREDITS,     /* header-only CREDIT frames granting nothing, 64 KiB at a time */
};

struct atk {
    enum atk_mode mode;
    const char *uri;
    uint32_t slots;  /* the server's max_concurrent */
    unsigned long frames; /* ATK_CREDITS: frames written */
    uint32_t nlarge; /* ATK_LARGE / ATK_SLOW: large requests to announce;
                             ATK_NO_READ: calls to make */
    uint32_t large_len;
    int run_ms; /* how long it attacks (it keeps its socket until stopped) */
    int fd;
    uint32_t credits;                      /* DATA frames we may send (the server's grant) */
    uint32_t owed;                         /* credits we owe the server (returned unless ATK_NO_READ) */
    unsigned sent;                         /* requests sent */
    unsigned by_code[VRPC_CODE_COUNT];     /* responses by status (atomic) */
    unsigned responses;                    /* (atomic) */
    unsigned closed;                       /* the server ended the connection (atomic) */
    unsigned ready;                        /* handshake done (atomic) */
    unsigned stop;                         /* (atomic) */
    uint32_t rd_tag[16], rd_left[16], nrd; /* ATK_SLOW: reads asked of us */
    uint8_t busy[256];                     /* ATK_FLOOD: slots with a call out */
    pthread_t th;
};

static int tcp_socket(const char *uri)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *p = strrchr(uri, ':');
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    sa.sin_port = htons((uint16_t)atoi(p + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void thdr(struct vrpc_tcp_hdr *h, uint8_t type, uint32_t len, uint32_t imm, uint16_t credits)
{
    *h = vrpc_tcp_hdr_make(type, len, imm, credits);
}

static bool write_all(int fd, const void *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p = (const char *)p + w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n)
{
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0)
            return false;
        p = (char *)p + r;
        n -= (size_t)r;
    }
    return true;
}

/* One DATA frame carrying an RPC frame (header + body). Needs a credit. */
static bool atk_data(struct atk *a, const struct vrpc_wire_hdr *h, const void *body, uint32_t blen)
{
    uint8_t f[VRPC_TCP_HDR_LEN + VRPC_WIRE_HDR_LEN + 512];
    uint16_t give = a->mode == ATK_NO_READ ? 0 : (uint16_t)a->owed;
    assert_true(blen <= 512);
    thdr((struct vrpc_tcp_hdr *)f, VRPC_TCP_DATA, VRPC_WIRE_HDR_LEN + blen, 0, give);
    vrpc_wire_hdr_encode(f + VRPC_TCP_HDR_LEN, h);
    memcpy(f + VRPC_TCP_HDR_LEN + VRPC_WIRE_HDR_LEN, body, blen);
    a->owed -= give;
    a->credits--;
    return write_all(a->fd, f, VRPC_TCP_HDR_LEN + VRPC_WIRE_HDR_LEN + blen);
}

/* Read whatever the server sent within ms: credits, responses, read requests.
 * false once the connection is gone. */
static bool atk_pump(struct atk *a, int ms)
{
    struct pollfd p = {.fd = a->fd, .events = POLLIN};
    static __thread uint8_t body[ATK_EAGER + 64];
    while (poll(&p, 1, ms) > 0) {
        struct vrpc_tcp_hdr h;
        ms = 0;
        if (!read_all(a->fd, &h, sizeof h)) {
            __atomic_store_n(&a->closed, 1, __ATOMIC_RELEASE);
            return false;
        }
        uint32_t len = le32toh(h.len);
        a->credits += le16toh(h.credits);
        if (len > sizeof(body) || !read_all(a->fd, body, len)) {
            __atomic_store_n(&a->closed, 1, __ATOMIC_RELEASE);
            return false;
        }
        if (h.type == VRPC_TCP_DATA) {
            a->owed++;
            struct vrpc_wire_hdr w;
            if (vrpc_wire_hdr_decode(body, len, &w) == 0 && w.type == VRPC_FT_HELLO_ACK)
                __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE);
            if (vrpc_wire_hdr_decode(body, len, &w) == 0 && w.type == VRPC_FT_RESPONSE && w.status < VRPC_CODE_COUNT) {
                __atomic_add_fetch(&a->by_code[w.status], 1, __ATOMIC_RELAXED);
                if (vrpc_wire_id_slot(w.request_id) < 256)
                    a->busy[vrpc_wire_id_slot(w.request_id)] = 0;
                __atomic_add_fetch(&a->responses, 1, __ATOMIC_RELEASE);
            }
        } else if (h.type == VRPC_TCP_READ_REQ && a->nrd < 16) {
            struct vrpc_tcp_read_req rq;
            memcpy(&rq, body, sizeof rq);
            a->rd_tag[a->nrd] = le32toh(h.imm);
            a->rd_left[a->nrd++] = le32toh(rq.length);
        }
        if (a->mode != ATK_NO_READ && a->owed) { /* return credits as a reader does */
            struct vrpc_tcp_hdr c;
            thdr(&c, VRPC_TCP_CREDIT, 0, 0, (uint16_t)a->owed);
            a->owed = 0;
            if (!write_all(a->fd, &c, sizeof c))
                return false;
        }
    }
    return true;
}

static void atk_handshake(struct atk *a)
{
    struct vrpc_tcp_hdr h;
    a->fd = tcp_socket(a->uri);
    /* grant the server 2 credits (the transport's minimum reservation) */
    thdr(&h, VRPC_TCP_HELLO, 0, ATK_EAGER, 2);
    assert_true(write_all(a->fd, &h, sizeof h));
    assert_true(read_all(a->fd, &h, sizeof h));
    assert_int_equal(h.type, VRPC_TCP_HELLO_ACK);
    a->credits = le16toh(h.credits);
    uint8_t hp[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 1u << 20, .max_concurrent = a->slots, .features = VRPC_FEAT_LARGE};
    vrpc_wire_hello_encode(hp, &hs);
    struct vrpc_wire_hdr w = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO, .payload_len = sizeof hp};
    assert_true(atk_data(a, &w, hp, sizeof hp));
    for (int i = 0; i < 200 && !__atomic_load_n(&a->ready, __ATOMIC_ACQUIRE); i++)
        atk_pump(a, 10);
    assert_true(a->ready);
}

static bool atk_call(struct atk *a, uint32_t slot, uint32_t gen)
{
    uint8_t pb[64];
    Vrpctest__EchoRequest rq = VRPCTEST__ECHO_REQUEST__INIT;
    uint8_t pay[32] = {1};
    rq.payload.data = pay;
    rq.payload.len = sizeof pay;
    rq.seq = gen;
    size_t n = vrpctest__echo_request__pack(&rq, pb);
    struct vrpc_wire_hdr w = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .method_id = m_echo.id,
                              .request_id = vrpc_wire_make_id(slot, gen),
                              .payload_len = (uint32_t)n};
    return atk_data(a, &w, pb, (uint32_t)n);
}

static bool atk_announce(struct atk *a, uint32_t slot)
{
    uint8_t d[VRPC_WIRE_DESC_LEN];
    struct vrpc_wire_desc desc = {.addr = 0x10000 + (uint64_t)slot * a->large_len, .rkey = 0x1234 + slot};
    vrpc_wire_desc_encode(d, &desc);
    struct vrpc_wire_hdr w = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .flags = VRPC_FF_RNDV,
                              .method_id = m_echo.id,
                              .request_id = vrpc_wire_make_id(slot, 1),
                              .payload_len = a->large_len};
    return atk_data(a, &w, d, sizeof d);
}

/* Open a client stream on slot and announce a large MESSAGE in it (two
 * frames, a credit each). */
static bool atk_stream_announce(struct atk *a, uint32_t slot)
{
    struct vrpc_wire_hdr w = {.version = VRPC_WIRE_VERSION,
                              .type = VRPC_FT_REQUEST,
                              .flags = VRPC_FF_STREAM,
                              .method_id = m_sink.id,
                              .request_id = vrpc_wire_make_id(slot, 1)};
    static const uint8_t none[1];
    if (!atk_data(a, &w, none, 0))
        return false;
    while (!a->credits)
        if (!atk_pump(a, 5))
            return false;
    uint8_t d[VRPC_WIRE_DESC_LEN];
    struct vrpc_wire_desc desc = {.addr = 0x10000 + (uint64_t)slot * a->large_len, .rkey = 0x1234 + slot};
    vrpc_wire_desc_encode(d, &desc);
    w = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION,
                               .type = VRPC_FT_MESSAGE,
                               .flags = VRPC_FF_RNDV,
                               .request_id = vrpc_wire_make_id(slot, 1),
                               .payload_len = a->large_len};
    return atk_data(a, &w, d, sizeof d);
}

/* Serve one byte of every read asked of us (ATK_SLOW). */
static bool atk_trickle(struct atk *a)
{
    for (uint32_t i = 0; i < a->nrd; i++) {
        if (!a->rd_left[i])
            continue;
        uint8_t f[VRPC_TCP_HDR_LEN + 1] = {0};
        thdr((struct vrpc_tcp_hdr *)f, VRPC_TCP_READ_RESP, 1, a->rd_tag[i], 0);
        if (!write_all(a->fd, f, sizeof f))
            return false;
        a->rd_left[i]--;
    }
    return true;
}

static void *atk_main(void *arg)
{
    struct atk *a = arg;
    int64_t end = vrpc_now_ns() + (int64_t)a->run_ms * 1000000;
    uint32_t slot = 0, gen = 1;
    bool up = true;
    if (a->mode == ATK_LARGE || a->mode == ATK_SLOW || a->mode == ATK_STREAM_SLOW) {
        for (uint32_t i = 0; i < a->nlarge && up; i++) {
            while (!a->credits && (up = atk_pump(a, 5)))
                ;
            up = up && (a->mode == ATK_STREAM_SLOW ? atk_stream_announce(a, i) : atk_announce(a, i));
            a->sent++;
        }
    }
    while (up && !__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        switch (a->mode) {
        case ATK_FLOOD:
            if (vrpc_now_ns() < end && a->credits && !a->busy[slot]) {
                a->busy[slot] = 1;
                up = atk_call(a, slot, gen++);
                a->sent++;
                slot = (slot + 1) % a->slots;
                up = up && atk_pump(a, 0);
            } else {
                up = atk_pump(a, vrpc_now_ns() < end ? 1 : 5);
            }
            break;
        case ATK_NO_READ:
            /* nlarge calls in rounds over every slot, each id reused only
             * after a pause in which the server has answered it (the answer
             * waits for our credits, which never come). Then it just stays. */
            if (vrpc_now_ns() < end && a->credits && a->sent < a->nlarge) {
                up = atk_call(a, slot, gen);
                a->sent++;
                if (++slot == a->slots) {
                    slot = 0;
                    gen++;
                    up = up && atk_pump(a, 30);
                }
                up = up && atk_pump(a, 0);
            } else {
                up = atk_pump(a, 5);
            }
            break;
        case ATK_SLOW:
        case ATK_STREAM_SLOW:
            up = atk_trickle(a) && atk_pump(a, 50);
            break;
        case ATK_LARGE:
            up = atk_pump(a, 20);
            break;
        case ATK_CREDITS:
            if (vrpc_now_ns() < end) {
                /* (blocks while the server's socket is full: as fast as it parses) */
                static struct vrpc_tcp_hdr noise[4096];
                for (unsigned i = 0; i < 4096; i++)
                    thdr(&noise[i], VRPC_TCP_CREDIT, 0, 0, 0);
                up = write_all(a->fd, noise, sizeof noise);
                a->frames += up ? 4096 : 0;
            } else {
                up = atk_pump(a, 5);
            }
            break;
        }
    }
    if (!up)
        __atomic_store_n(&a->closed, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void atk_start(struct atk *a, enum atk_mode mode, const char *uri, uint32_t slots, int run_ms, uint32_t nlarge)
{
    memset(a, 0, sizeof(*a));
    a->nlarge = nlarge;
    a->mode = mode;
    a->uri = uri;
    a->slots = slots;
    a->run_ms = run_ms;
    a->large_len = 1u << 20;
    atk_handshake(a);
    assert_int_equal(pthread_create(&a->th, NULL, atk_main, a), 0);
}

static void atk_stop(struct atk *a)
{
    __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
    pthread_join(a->th, NULL);
    close(a->fd);
}

static bool wait_flag(const unsigned *f, unsigned n, int ms)
{
    for (int i = 0; i < ms / 10 && __atomic_load_n(f, __ATOMIC_ACQUIRE) < n; i++)
        usleep(10000);
    return __atomic_load_n(f, __ATOMIC_ACQUIRE) >= n;
}

/* ---- the well-behaved client ------------------------------------------------ */

struct good {
    struct vrpc_channel *ch;
    unsigned ok, fail;
    unsigned fail_by[VRPC_CODE_COUNT];
    int64_t lat_us[20000];
    unsigned n;
};

static void good_open(struct good *g, const char *uri)
{
    struct vrpc_channel_opts co;
    memset(g, 0, sizeof(*g));
    vrpc_channel_opts_init(&co);
    co.default_timeout_us = 3000000;
    co.max_msg_size = 1u << 20;
    co.max_pinned = 32u << 20;
    co.src_addr = g_opt.client_ip;
    assert_int_equal(vrpc_channel_create(uri, &co, &g->ch), 0);
    assert_int_equal(vrpc_channel_connect(g->ch, 5000), 0);
}

static int cmp64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

static enum vrpc_code good_call(struct good *g, size_t payload)
{
    static uint8_t big[1u << 20];
    Vrpctest__EchoRequest rq = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp;
    struct vrpc_status st;
    rq.payload.data = big;
    rq.payload.len = payload;
    rq.mode = payload > 64 ? 1 : 0; /* large: answer without the payload */
    return (enum vrpc_code)vrpc_call(g->ch, &m_echo, &rq.base, &resp, NULL, &st);
}

/* Small calls for ms; records latency and outcome. */
static void good_run(struct good *g, int ms)
{
    g->ok = g->fail = g->n = 0;
    memset(g->fail_by, 0, sizeof(g->fail_by));
    int64_t end = vrpc_now_ns() + (int64_t)ms * 1000000;
    while (vrpc_now_ns() < end && g->n < 20000) {
        int64_t t0 = vrpc_now_ns();
        enum vrpc_code c = good_call(g, 32);
        g->lat_us[g->n++] = (vrpc_now_ns() - t0) / 1000;
        if (c == VRPC_OK) {
            g->ok++;
        } else {
            g->fail++;
            g->fail_by[c]++;
        }
        usleep(500);
    }
}

static int64_t pct(struct good *g, double q)
{
    if (!g->n)
        return 0;
    qsort(g->lat_us, g->n, sizeof(g->lat_us[0]), cmp64);
    return g->lat_us[(size_t)(q * (g->n - 1))];
}

struct figures {
    int64_t p50, p95, p99;
    unsigned ok, n;
};

static struct figures good_figures(struct good *g, const char *what, const char *when)
{
    struct figures f = {.p50 = pct(g, 0.50), .p95 = pct(g, 0.95), .p99 = pct(g, 0.99), .ok = g->ok, .n = g->n};
    printf("attack %-10s %-7s: %u/%u OK (%.1f %%), p50 %lld us, p99 %lld us", what, when, g->ok, g->n,
           g->n ? 100.0 * g->ok / g->n : 0.0, (long long)f.p50, (long long)f.p99);
    for (int c = 0; c < VRPC_CODE_COUNT; c++)
        if (g->fail_by[c])
            printf(", %u %s", g->fail_by[c], vrpc_code_name((enum vrpc_code)c));
    printf("\n");
    return f;
}

/* Every call succeeds, and at most 1 in 20 is slower than 20x the before-p99
 * + 50 ms, i.e. the p95 is within that bound (a starved client has most of its
 * calls slow or failing; one call caught behind a burst is not starvation, and
 * sanitizer builds make bursts slow). */
static void assert_kept(const struct figures *before, const struct figures *during)
{
    int64_t bound = 20 * before->p99 + 50000;
    assert_true(during->n > 0);
    assert_int_equal(during->ok, during->n);
    if (during->p95 > bound)
        fail_msg("p95 during the attack %lld us over the bound %lld us (p99 %lld us, before-p99 %lld us)",
                 (long long)during->p95, (long long)bound, (long long)during->p99, (long long)before->p99);
}

/* ---- cases ----------------------------------------------------------------- */

static void no_read_case(unsigned natk)
{
    struct env e;
    struct vrpc_server_opts so;
    struct good g;
    struct atk a[2];
    vrpc_server_opts_init(&so);
    /* many call credits and a small quota: the attackers' answers waiting for
     * credits could fill the shared send pool (1024 buffers) long before the
     * transport's queue (2 x 1024 + 64) says -EAGAIN */
    so.max_concurrent = 1024;
    so.max_sends_per_conn = 96;
    env_start(&e, &so);
    good_open(&g, e.uri);
    good_run(&g, 500);
    struct figures before = good_figures(&g, natk == 1 ? "no-read" : "no-read x2", "before");
    for (unsigned i = 0; i < natk; i++)
        atk_start(&a[i], ATK_NO_READ, e.uri, 1024, 3000, natk == 1 ? 1100 : 600);
    good_run(&g, 3000);
    struct figures during = good_figures(&g, natk == 1 ? "no-read" : "no-read x2", "during");
    /* each attacker's responses pile up until its quota: then it is closed
     * (the close ends when the transport's idle timeout gives up on it) */
    for (unsigned i = 0; i < natk; i++) {
        assert_true(wait_flag(&a[i].closed, 1, 20000));
        printf("attack no-read: attacker %u sent %u requests, got %u responses, then lost its connection\n", i,
               a[i].sent, a[i].responses);
        atk_stop(&a[i]);
    }
    assert_kept(&before, &during);
    good_run(&g, 300);
    assert_int_equal(g.ok, g.n);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(e.srv);
}

static void t_no_read_one(void **state)
{
    (void)state;
    no_read_case(1);
}

static void t_no_read_two(void **state)
{
    (void)state;
    no_read_case(2);
}

/* Large requests of the well-behaved client during a memory attack: retried
 * (RESOURCE_EXHAUSTED) until one goes through; how long that took, or -1. */
static int64_t good_large_until_ok(struct good *g, int ms)
{
    int64_t t0 = vrpc_now_ns(), end = t0 + (int64_t)ms * 1000000;
    unsigned refused = 0;
    while (vrpc_now_ns() < end) {
        enum vrpc_code c = good_call(g, 512u << 10);
        if (c == VRPC_OK) {
            printf("attack large: the good client's 512 KiB request went through after %lld ms (%u refused)\n",
                   (long long)((vrpc_now_ns() - t0) / 1000000), refused);
            return (vrpc_now_ns() - t0) / 1000000;
        }
        refused++;
        usleep(100000);
    }
    return -1;
}

static void server_large_opts(struct vrpc_server_opts *so)
{
    vrpc_server_opts_init(so);
    so->max_concurrent = 32;
    so->max_msg_size = 1u << 20;
    so->max_pinned = 8u << 20;    /* max_pinned_per_conn: 2 MiB by default */
    so->transfer_floor_ms = 1000; /* a 1 MiB read may take 2 s at the default 1 MiB/s */
}

static void t_large_never_served(void **state)
{
    (void)state;
    struct env e;
    struct vrpc_server_opts so;
    struct good g;
    struct atk a;
    server_large_opts(&so);
    env_start(&e, &so);
    good_open(&g, e.uri);
    size_t base = lbuf_in_use(&e);
    good_run(&g, 500);
    struct figures before = good_figures(&g, "large x17", "before");
    atk_start(&a, ATK_LARGE, e.uri, 32, 0, 17);
    assert_true(wait_flag(&a.responses, 15, 5000)); /* 2 MiB are its share: 15 refused at once */
    printf("attack large x17: %u of 17 announced requests refused RESOURCE_EXHAUSTED at once\n",
           a.by_code[VRPC_RESOURCE_EXHAUSTED]);
    assert_true(a.by_code[VRPC_RESOURCE_EXHAUSTED] >= 15);
    assert_true(good_large_until_ok(&g, 1000) >= 0); /* at once: 6 MiB are still free */
    good_run(&g, 1500);
    struct figures during = good_figures(&g, "large x17", "during");
    /* its two reads are abandoned at their limit (2 s): the first answered
     * RESOURCE_EXHAUSTED, and its connection failed with it */
    assert_true(wait_flag(&a.by_code[VRPC_RESOURCE_EXHAUSTED], 16, 10000));
    assert_true(wait_flag(&a.closed, 1, 20000));
    atk_stop(&a);
    assert_kept(&before, &during);
    assert_true(wait_in_use(&e, base, 20000));
    printf("attack large x17: lbuf in use %zu bytes after (%zu before)\n", lbuf_in_use(&e), base);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(e.srv);
}

/* Sixteen connections each announce a 1 MiB request (or a 1 MiB message in
 * a client stream) and serve its read one byte per 50 ms. */
static void slow_readers_case(enum atk_mode mode, const char *what)
{
    struct env e;
    struct vrpc_server_opts so;
    struct good g;
    static struct atk a[16];
    server_large_opts(&so);
    env_start(&e, &so);
    good_open(&g, e.uri);
    size_t base = lbuf_in_use(&e);
    good_run(&g, 500);
    struct figures before = good_figures(&g, what, "before");
    for (int i = 0; i < 16; i++)
        atk_start(&a[i], mode, e.uri, 32, 0, 1);
    usleep(300000);
    good_run(&g, 1500);
    struct figures during = good_figures(&g, what, "during");
    /* 8 of them hold the 8 MiB at first (the others are refused): only the
     * transfer limit (2 s from the announcement) frees it, trickle or not */
    int64_t waited = good_large_until_ok(&g, 25000);
    assert_true(waited >= 0);
    /* within about the limit (2 s), not the limit plus the transport's close
     * timeout (10 s) the slow readers would make a graceful close wait: the
     * server aborts them (vrpc_ep_abort), their memory comes back at once */
    assert_true(waited < 6000);
    /* every attacker is answered RESOURCE_EXHAUSTED: at once (no memory
     * left), or at its limit, and then loses its connection */
    unsigned closed = 0, refused = 0;
    for (int i = 0; i < 16; i++) {
        assert_true(wait_flag(&a[i].by_code[VRPC_RESOURCE_EXHAUSTED], 1, 20000));
        refused++;
        if (__atomic_load_n(&a[i].closed, __ATOMIC_ACQUIRE))
            closed++;
        atk_stop(&a[i]);
    }
    printf("attack %s: %u of 16 answered RESOURCE_EXHAUSTED, %u of them lost their connection "
           "(large transfer too slow)\n",
           what, refused, closed);
    assert_true(closed >= 1);
    assert_kept(&before, &during);
    assert_true(wait_in_use(&e, base, 20000));
    printf("attack %s: lbuf in use %zu bytes after (%zu before)\n", what, lbuf_in_use(&e), base);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(e.srv);
}

static void t_large_slow_readers(void **state)
{
    (void)state;
    slow_readers_case(ATK_SLOW, "slow x16");
}

static void t_stream_large_slow_readers(void **state)
{
    (void)state;
    slow_readers_case(ATK_STREAM_SLOW, "stream slow x16");
}

/* ---- a never-reading client on either backend ----------------------------
 * A transport endpoint of its own whose CQ has four receive buffers posted
 * and never reposts them: past those, it returns the server no credits, so
 * every further answer waits in the server's transport for credits (verbs
 * and TCP alike). */

struct ep_atk {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_ep *ep;
    unsigned recvs, disconnected; /* atomics */
};

static void ep_atk_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    (void)cq;
    struct ep_atk *a = arg;
    for (unsigned i = 0; i < n; i++) {
        if (wc[i].opcode == VRPC_WC_RECV) {
            if (wc[i].status == 0)
                __atomic_add_fetch(&a->recvs, 1, __ATOMIC_RELEASE);
            vrpc_pool_put(wc[i].buf); /* not reposted: no credit goes back */
        } else if (wc[i].opcode == VRPC_WC_SEND) {
            vrpc_pool_put(wc[i].buf);
        } else if (wc[i].opcode == VRPC_WC_DISCONNECTED) {
            __atomic_add_fetch(&a->disconnected, 1, __ATOMIC_RELEASE);
        }
    }
}

/* Send one RPC frame, retrying while the endpoint's queue is full; false
 * once the connection is gone. */
static bool ep_atk_send(struct ep_atk *a, const struct vrpc_wire_hdr *h, const void *body, uint32_t blen)
{
    struct vrpc_buf *b;
    for (int i = 0; !(b = vrpc_pool_get(a->pool)); i++) {
        if (i > 2000 || __atomic_load_n(&a->disconnected, __ATOMIC_ACQUIRE))
            return false;
        usleep(1000);
    }
    vrpc_wire_hdr_encode(b->data, h);
    memcpy((uint8_t *)b->data + VRPC_WIRE_HDR_LEN, body, blen);
    for (int i = 0;; i++) {
        int rc = vrpc_ep_send(a->ep, b, VRPC_WIRE_HDR_LEN + blen, 0, 0, 0);
        if (rc == 0)
            return true;
        if (rc != -EAGAIN || i > 2000) {
            vrpc_pool_put(b);
            return false;
        }
        usleep(1000);
    }
}

static void t_no_read_ep(void **state)
{
    (void)state;
    struct env e;
    struct vrpc_server_opts so;
    struct good g;
    struct ep_atk a = {0};
    struct vrpc_cq_attr ca;
    struct vrpc_ep_attr ea;
    vrpc_server_opts_init(&so);
    so.max_concurrent = 1024;
    so.max_sends_per_conn = 96;
    env_start(&e, &so);
    good_open(&g, e.uri);
    good_run(&g, 500);
    struct figures before = good_figures(&g, "no-read ep", "before");

    assert_int_equal(vrpc_transport_create(g_opt.backend, NULL, &a.tp), 0);
    assert_int_equal(vrpc_pool_create(a.tp, vrpc_transport_eager_size(a.tp), 256, &a.pool), 0);
    vrpc_cq_attr_init(&ca);
    ca.cb = ep_atk_cb;
    ca.cb_arg = &a;
    assert_int_equal(vrpc_cq_create(a.tp, &ca, &a.cq), 0);
    for (int i = 0; i < 4; i++) {
        struct vrpc_buf *b = vrpc_pool_get(a.pool);
        assert_int_equal(vrpc_cq_post_recv(a.cq, &b, NULL, 1), 0);
    }
    vrpc_ep_attr_init(&ea);
    ea.cq = a.cq;
    ea.src_addr = g_opt.client_ip;
    assert_int_equal(vrpc_connect(a.tp, e.uri, &ea, &a.ep), 0);
    uint8_t hp[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 1u << 20, .max_concurrent = 1024, .features = 0};
    vrpc_wire_hello_encode(hp, &hs);
    struct vrpc_wire_hdr w = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO, .payload_len = sizeof hp};
    assert_true(ep_atk_send(&a, &w, hp, sizeof hp));
    assert_true(wait_flag(&a.recvs, 1, 5000)); /* HELLO_ACK */
    /* 1100 calls: a round over the 1024 slots, a pause in which the server
     * answers them (into its credit queue), then a second round */
    unsigned sent = 0;
    for (uint32_t gen = 1; sent < 1100; gen++) {
        for (uint32_t slot = 0; slot < 1024 && sent < 1100; slot++, sent++) {
            uint8_t pb[64];
            Vrpctest__EchoRequest rq = VRPCTEST__ECHO_REQUEST__INIT;
            rq.seq = sent;
            size_t n = vrpctest__echo_request__pack(&rq, pb);
            struct vrpc_wire_hdr r = {.version = VRPC_WIRE_VERSION,
                                      .type = VRPC_FT_REQUEST,
                                      .method_id = m_echo.id,
                                      .request_id = vrpc_wire_make_id(slot, gen),
                                      .payload_len = (uint32_t)n};
            if (!ep_atk_send(&a, &r, pb, (uint32_t)n))
                goto stopped;
        }
        usleep(50000);
    }
stopped:
    good_run(&g, 2000);
    struct figures during = good_figures(&g, "no-read ep", "during");
    assert_true(wait_flag(&a.disconnected, 1, 30000));
    printf("attack no-read ep (%s): the attacker sent %u calls, received %u frames, then lost its connection\n",
           g_opt.backend, sent, a.recvs);
    assert_kept(&before, &during);
    vrpc_ep_destroy(a.ep);
    vrpc_cq_destroy(a.cq);
    vrpc_pool_destroy(a.pool);
    vrpc_transport_destroy(a.tp);
    vrpc_channel_destroy(g.ch);
    vrpc_server_destroy(e.srv);
}

/* One attacker against a server with options so while the well-behaved
 * client measures its calls (500 ms before, 2.5 s during): the attacker is
 * stopped on return, its counters in *a, the client's figures in
 * r->before and r->during; the caller checks the attacker's counters, then
 * attack_end checks the figures and ends the server and the client. */
struct attack_run {
    struct env e;
    struct good g;
    struct figures before, during;
};

static void attack_measure(struct attack_run *r, const struct vrpc_server_opts *so, enum atk_mode mode, uint32_t slots,
                           const char *what, struct atk *a)
{
    env_start(&r->e, so);
    good_open(&r->g, r->e.uri);
    good_run(&r->g, 500);
    r->before = good_figures(&r->g, what, "before");
    atk_start(a, mode, r->e.uri, slots, 3000, 0);
    usleep(100000);
    good_run(&r->g, 2500);
    r->during = good_figures(&r->g, what, "during");
    atk_stop(a);
}

/* The well-behaved client kept its latency and success rate; all goes. */
static void attack_end(struct attack_run *r)
{
    assert_kept(&r->before, &r->during);
    vrpc_channel_destroy(r->g.ch);
    vrpc_server_destroy(r->e.srv);
}

static void t_flood(void **state)
{
    (void)state;
    struct vrpc_server_opts so;
    struct attack_run r;
    struct atk a;
    vrpc_server_opts_init(&so);
    so.max_concurrent = 64;
    attack_measure(&r, &so, ATK_FLOOD, 64, "flood", &a);
    printf("attack flood: the flooder sent %u requests, got %u OK responses (it is bounded by its %u credits)\n",
           a.sent, a.by_code[VRPC_OK], so.max_concurrent);
    assert_true(a.by_code[VRPC_OK] > 0);
    attack_end(&r);
}

/* A peer that keeps the server's socket full of header-only frames (CREDIT
 * frames granting nothing: valid, and useless): the poller parses at most a
 * read's worth of them (a frame's body plus the 64 KiB carry) per pass, so
 * the other connections of its CQ keep their turn. */
static void t_credit_noise(void **state)
{
    (void)state;
    struct vrpc_server_opts so;
    struct attack_run r;
    struct atk a;
    vrpc_server_opts_init(&so);
    attack_measure(&r, &so, ATK_CREDITS, 64, "noise", &a);
    printf("attack noise: the peer wrote %lu header-only frames (%.1f MiB)\n", a.frames,
           (double)a.frames * VRPC_TCP_HDR_LEN / (1 << 20));
    assert_true(a.frames >= 4096);
    attack_end(&r);
}

/* ---- a server that trickles a large response -------------------------------
 * A raw TCP server (the transport's and the RPC wire by hand) answers the
 * channel's call with a 16 MiB rendezvous response and serves the channel's
 * read of it at one byte a second. The channel's transfer limit
 * (transfer_floor_ms + size / min_transfer_rate from the announcement; here
 * 1 s + 16 MiB at 16 MiB/s = 2 s) ends the call RESOURCE_EXHAUSTED naming
 * min_transfer_rate, gives the 16 MiB back and aborts the connection, which
 * the raw server sees end. Without the limit the call ran into its deadline
 * (8 s here) and the buffer stayed until the read's last byte. */

struct trickler {
    int lfd, fd;
    unsigned port;
    uint32_t len;    /* the announced response (or stream message) */
    bool stream;     /* a stream's REQUEST gets a large MESSAGE, not a RESPONSE */
    unsigned served; /* bytes of the read served (atomic) */
    unsigned reads;  /* READ_REQs seen (atomic) */
    unsigned ended;  /* the channel's side ended the connection (atomic) */
    int64_t ended_ns;
    unsigned stop; /* (atomic) */
    pthread_t th;
};

static bool tr_frame(int fd, uint8_t type, uint32_t imm, uint16_t credits, const void *body, uint32_t blen)
{
    uint8_t f[VRPC_TCP_HDR_LEN + 256];
    assert_true(blen <= 256);
    thdr((struct vrpc_tcp_hdr *)f, type, blen, imm, credits);
    if (blen)
        memcpy(f + VRPC_TCP_HDR_LEN, body, blen);
    return write_all(fd, f, VRPC_TCP_HDR_LEN + blen);
}

/* One DATA frame carrying an RPC frame; it returns one credit (every frame
 * of the channel's we read is answered at once, so 1 is what we owe). */
static bool tr_rpc(int fd, const struct vrpc_wire_hdr *w, const void *body, uint32_t blen)
{
    uint8_t f[VRPC_WIRE_HDR_LEN + 64];
    assert_true(blen <= 64);
    vrpc_wire_hdr_encode(f, w);
    memcpy(f + VRPC_WIRE_HDR_LEN, body, blen);
    return tr_frame(fd, VRPC_TCP_DATA, 0, 1, f, VRPC_WIRE_HDR_LEN + blen);
}

static void *trickler_main(void *arg)
{
    struct trickler *t = arg;
    static uint8_t body[ATK_EAGER + 64];
    uint32_t tag = 0, left = 0;
    int64_t next = 0;
    t->fd = accept(t->lfd, NULL, NULL);
    if (t->fd < 0)
        return NULL;
    while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (left && vrpc_now_ns() >= next) { /* one byte a second */
            uint8_t b = 0xab;
            if (!tr_frame(t->fd, VRPC_TCP_READ_RESP, tag, 0, &b, 1))
                break;
            left--;
            __atomic_add_fetch(&t->served, 1, __ATOMIC_RELEASE);
            next = vrpc_now_ns() + 1000000000;
        }
        if (poll(&p, 1, 10) <= 0)
            continue;
        struct vrpc_tcp_hdr h;
        if (!read_all(t->fd, &h, sizeof h))
            break;
        uint32_t len = le32toh(h.len);
        if (len > sizeof(body) || !read_all(t->fd, body, len))
            break;
        struct vrpc_wire_hdr w;
        if (h.type == VRPC_TCP_HELLO) { /* eager 8 KiB, 8 credits for the channel */
            if (!tr_frame(t->fd, VRPC_TCP_HELLO_ACK, ATK_EAGER, 8, NULL, 0))
                break;
        } else if (h.type == VRPC_TCP_DATA && vrpc_wire_hdr_decode(body, len, &w) == 0) {
            if (w.type == VRPC_FT_HELLO) {
                uint8_t hp[VRPC_WIRE_HELLO_LEN];
                struct vrpc_wire_hello hs = {
                    .max_msg_size = 32u << 20, .max_concurrent = 8, .features = VRPC_FEAT_LARGE | VRPC_FEAT_STREAM};
                vrpc_wire_hello_encode(hp, &hs);
                struct vrpc_wire_hdr a = {
                    .version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO_ACK, .payload_len = sizeof hp};
                if (!tr_rpc(t->fd, &a, hp, sizeof hp))
                    break;
            } else if (w.type == VRPC_FT_REQUEST) {
                uint8_t d[VRPC_WIRE_DESC_LEN];
                struct vrpc_wire_desc desc = {.addr = 0x100000, .rkey = 0x77};
                vrpc_wire_desc_encode(d, &desc);
                bool msg = t->stream && (w.flags & VRPC_FF_STREAM);
                struct vrpc_wire_hdr r = {.version = VRPC_WIRE_VERSION,
                                          .type = msg ? VRPC_FT_MESSAGE : VRPC_FT_RESPONSE,
                                          .flags = VRPC_FF_RNDV,
                                          .status = VRPC_OK,
                                          .request_id = w.request_id,
                                          .payload_len = t->len};
                if (!tr_rpc(t->fd, &r, d, sizeof d))
                    break;
            }
        } else if (h.type == VRPC_TCP_READ_REQ) {
            struct vrpc_tcp_read_req rq;
            memcpy(&rq, body, sizeof rq);
            tag = le32toh(h.imm);
            left = le32toh(rq.length);
            __atomic_add_fetch(&t->reads, 1, __ATOMIC_RELEASE);
        }
    }
    if (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        t->ended_ns = vrpc_now_ns();
        __atomic_store_n(&t->ended, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static size_t ch_in_use(struct vrpc_channel *ch)
{
    size_t pinned = 0, in_use = 0;
    vrpc_lbuf_stats(vrpc_channel_transport(ch), &pinned, &in_use);
    return in_use;
}

/* A trickler announcing 16 MiB (as a large stream message if stream) on a
 * port of its own, and a channel to it whose limit for that read is 2 s. */
static struct vrpc_channel *trickler_start(struct trickler *t, bool stream)
{
    memset(t, 0, sizeof *t);
    t->len = 16u << 20;
    t->stream = stream;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    t->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(t->lfd >= 0);
    assert_int_equal(bind(t->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(t->lfd, 4), 0);
    assert_int_equal(getsockname(t->lfd, (struct sockaddr *)&sa, &sl), 0);
    t->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&t->th, NULL, trickler_main, t), 0);

    struct vrpc_channel_opts co;
    vrpc_channel_opts_init(&co);
    co.max_msg_size = 32u << 20;
    co.min_transfer_rate = 16u << 20;
    co.transfer_floor_ms = 1000; /* the limit: 1 s + 16 MiB at 16 MiB/s = 2 s */
    char uri[VRPC_URI_MAX];
    snprintf(uri, sizeof uri, "tcp://127.0.0.1:%u", t->port);
    struct vrpc_channel *ch;
    assert_int_equal(vrpc_channel_create(uri, &co, &ch), 0);
    return ch;
}

/* After the limit: the buffer comes back, the trickler saw the connection
 * end (aborted, not left to time out); then everything stops. */
static void trickler_finish(struct trickler *t, struct vrpc_channel *ch, int64_t t0, int64_t ms)
{
    for (int i = 0; i < 100 && ch_in_use(ch); i++) /* the aborted read's completion puts it back */
        usleep(10000);
    assert_int_equal(ch_in_use(ch), 0);
    for (int i = 0; i < 100 && !__atomic_load_n(&t->ended, __ATOMIC_ACQUIRE); i++)
        usleep(10000);
    assert_true(__atomic_load_n(&t->ended, __ATOMIC_ACQUIRE));
    printf("attack trickle: the raw server saw the connection end %lld ms after the %s did\n",
           (long long)((t->ended_ns - t0) / 1000000 - ms), t->stream ? "stream" : "call");
    vrpc_channel_destroy(ch);
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    shutdown(t->lfd, SHUT_RDWR);
    pthread_join(t->th, NULL);
    if (t->fd >= 0)
        close(t->fd);
    close(t->lfd);
}

static void t_trickled_response(void **state)
{
    (void)state;
    static struct trickler t;
    struct vrpc_channel *ch = trickler_start(&t, false);
    Vrpctest__EchoRequest rq = VRPCTEST__ECHO_REQUEST__INIT;
    Vrpctest__EchoReply *rep = NULL;
    struct vrpc_status st;
    struct vrpc_call_opts o = {.timeout_us = 8000000};
    int64_t t0 = vrpc_now_ns();
    enum vrpc_code code = vrpc_call(ch, &m_echo, &rq.base, (ProtobufCMessage **)&rep, &o, &st);
    int64_t ms = (vrpc_now_ns() - t0) / 1000000;
    size_t held = ch_in_use(ch);
    printf("attack trickle: the 16 MiB response's call ended %s after %lld ms (\"%s\"); %u bytes served, "
           "%zu bytes of large buffers still in use\n",
           vrpc_code_name(code), (long long)ms, st.message, __atomic_load_n(&t.served, __ATOMIC_ACQUIRE), held);
    assert_int_equal(__atomic_load_n(&t.reads, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(code, VRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "min_transfer_rate"));
    assert_true(ms >= 1500 && ms < 6000); /* at its limit (2 s), well before the deadline */
    trickler_finish(&t, ch, t0, ms);
}

/* The same for a large message in a stream: a client stream whose one
 * response (the server's MESSAGE) is trickled. */
static void t_trickled_stream_message(void **state)
{
    (void)state;
    static struct trickler t;
    struct vrpc_channel *ch = trickler_start(&t, true);
    struct vrpc_stream_opts so = {.call = {.timeout_us = 8000000}};
    struct vrpc_stream *s;
    struct vrpc_status st;
    ProtobufCMessage *resp = NULL;
    int64_t t0 = vrpc_now_ns();
    assert_int_equal(vrpc_stream_start(ch, &m_sink, &so, &s), 0);
    vrpc_stream_close_send(s);
    enum vrpc_code code = (enum vrpc_code)vrpc_stream_finish(s, &resp, &st);
    int64_t ms = (vrpc_now_ns() - t0) / 1000000;
    printf("attack trickle: the 16 MiB stream message's stream ended %s after %lld ms (\"%s\"); %u bytes served, "
           "%zu bytes of large buffers still in use\n",
           vrpc_code_name(code), (long long)ms, st.message, __atomic_load_n(&t.served, __ATOMIC_ACQUIRE),
           ch_in_use(ch));
    assert_null(resp);
    vrpc_stream_destroy(s);
    assert_int_equal(__atomic_load_n(&t.reads, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(code, VRPC_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "min_transfer_rate"));
    assert_true(ms >= 1500 && ms < 6000); /* at its limit (2 s), well before the deadline */
    trickler_finish(&t, ch, t0, ms);
}

int main(int argc, char **argv)
{
    const char *setup = "local";
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            g_opt.backend = argv[++i];
        } else if (!strcmp(argv[i], "--setup") && i + 1 < argc) {
            setup = argv[++i];
        } else if (argv[i][0] != '-') {
            cmocka_set_test_filter(argv[i]); /* one case by name, e.g. t_no_read_one */
        } else {
            fprintf(stderr, "usage: %s [--backend tcp|verbs] [--setup single|veth] [CASE]\n", argv[0]);
            return 2;
        }
    }
    int src = vrpc_test_backend_addrs(g_opt.backend, setup, &g_opt.server_ip, &g_opt.client_ip);
    if (src)
        return src;
    m_echo.id = vrpc_method_id(m_echo.full_name);
    m_sink.id = vrpc_method_id(m_sink.full_name);
    if (strcmp(g_opt.backend, "tcp")) { /* the raw-socket attackers speak TCP only */
        const struct CMUnitTest ep_tests[] = {cmocka_unit_test(t_no_read_ep)};
        return cmocka_run_group_tests(ep_tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_no_read_ep),
        cmocka_unit_test(t_no_read_one),
        cmocka_unit_test(t_no_read_two),
        cmocka_unit_test(t_large_never_served),
        cmocka_unit_test(t_large_slow_readers),
        cmocka_unit_test(t_stream_large_slow_readers),
        cmocka_unit_test(t_trickled_response),
        cmocka_unit_test(t_trickled_stream_message),
        cmocka_unit_test(t_flood),
        cmocka_unit_test(t_credit_noise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

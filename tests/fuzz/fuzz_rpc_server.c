/* The RPC server's decoding of every frame a client sends (rpc/dispatch.c):
 * HELLO (settings, slots, features), REQUEST (ids, method, deadline,
 * metadata, the message through the protobuf guard, a rendezvous announce:
 * size, key, address), CANCEL and DONE, in any order and state, over a real
 * TCP connection. One server (TCP, one method /vrpctest.Test/Echo that
 * answers with the request's payload and seq) lives for the whole run; each
 * input is a list of RPC frames, u16 length then bytes, which the harness
 * sends from a fresh raw connection as TCP DATA frames after the transport's
 * own handshake, within the credits the server grants (it reads the
 * server's frames for their credits; a read request of the server is never
 * served), then it closes and waits for the server to close too (a close
 * right after the last frame: the server may drop calls still running). The server
 * must not crash or trip a sanitizer, must close once its peer has (5 s),
 * and must still answer a well-formed HELLO and call every 256 inputs. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include "fuzz_common.h"
#include "rpc/wire.h"
#include "rpc_test.pb-c.h"
#include "transport/tcp/tcp_wire.h"

#define EAGER 8192u

static struct vrpc_method_desc m_echo = {
    "/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_UNARY};
static struct vrpc_method_desc m_stream = {"/vrpctest.Test/Stream",           0,    &vrpctest__echo_request__descriptor,
                                           &vrpctest__echo_reply__descriptor, NULL, VRPC_METHOD_BIDI_STREAMING};
static struct vrpc_method_desc m_count = {
    "/vrpctest.Test/Count",      0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_SERVER_STREAMING};
static struct sockaddr_in sa;

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    (void)user;
    rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

/* Streams (the bidi method run on the poller, vrpc_server_run_on_poller;
 * the server-streaming one on workers): every message echoed (async, so a stalled window only queues a
 * bounded number), OK at the half-close, released on cancel. */
static void s_write_done(struct vrpc_server_stream *s, int rc, void *arg) { (void)s, (void)rc, (void)arg; }
static void s_start(struct vrpc_server_stream *s, void *user) { (void)s, (void)user; }
static void s_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    (void)user;
    rep.seq = r->seq;
    vrpc_server_stream_write_async(s, &rep.base, s_write_done, NULL);
}
static void s_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct vrpc_metadata md = {"t", "1", 1};
    vrpc_server_stream_finish(s, VRPC_OK, NULL, &md, 1);
}
static void s_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}
static const struct vrpc_server_stream_ops s_ops = {s_start, s_read, s_half_close, s_cancel};

static void start(void)
{
    static struct vrpc_server *s;
    struct vrpc_server_opts o;
    char uri[VRPC_URI_MAX];
    vrpc_server_opts_init(&o);
    m_echo.id = vrpc_method_id(m_echo.full_name);
    m_stream.id = vrpc_method_id(m_stream.full_name);
    m_count.id = vrpc_method_id(m_count.full_name);
    FUZZ_CHECK(vrpc_server_create(&o, &s) == 0 && vrpc_server_register(s, &m_echo, h_echo, NULL) == 0 &&
                   vrpc_server_register_stream(s, &m_stream, &s_ops, NULL) == 0 &&
                   vrpc_server_register_stream(s, &m_count, &s_ops, NULL) == 0 &&
                   /* the bidi method's on_read and small writes on the poller, the other on workers */
                   vrpc_server_run_on_poller(s, m_stream.full_name) == 0 &&
                   vrpc_server_start(s, "tcp://127.0.0.1:0") == 0 && vrpc_server_uri(s, uri, sizeof uri) == 0,
               "server did not start");
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(strrchr(uri, ':') + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void tcp_hdr(uint8_t *out, uint8_t type, uint32_t len, uint16_t credits)
{
    struct vrpc_tcp_hdr h = {.len = htole32(len),
                             .imm = htole32(type == VRPC_TCP_HELLO ? EAGER : 0),
                             .credits = htole16(credits),
                             .type = type,
                             .version = VRPC_TCP_VERSION,
                             .magic = htole32(VRPC_TCP_MAGIC)};
    memcpy(out, &h, sizeof h);
}

/* The server's stream, parsed just enough to count the credits it returns. */
struct rx {
    uint8_t hdr[VRPC_TCP_HDR_LEN];
    uint32_t got, skip;
    uint32_t credits;
    uint8_t type;                    /* of the frame being skipped */
    uint8_t body[VRPC_WIRE_HDR_LEN]; /* the first bytes of a DATA frame: an RPC header */
    uint32_t body_got;
    unsigned ok_responses; /* RESPONSE frames with status OK seen */
};

static void rx_feed(struct rx *r, const uint8_t *p, size_t n)
{
    while (n) {
        if (r->skip) {
            size_t k = n < r->skip ? n : r->skip;
            if (r->type == VRPC_TCP_DATA && r->body_got < VRPC_WIRE_HDR_LEN) {
                size_t c = VRPC_WIRE_HDR_LEN - r->body_got < k ? VRPC_WIRE_HDR_LEN - r->body_got : k;
                memcpy(r->body + r->body_got, p, c);
                r->body_got += (uint32_t)c;
                if (r->body_got == VRPC_WIRE_HDR_LEN && r->body[3] == VRPC_FT_RESPONSE && r->body[5] == 0)
                    r->ok_responses++;
            }
            r->skip -= (uint32_t)k, p += k, n -= k;
            continue;
        }
        size_t k = VRPC_TCP_HDR_LEN - r->got < n ? VRPC_TCP_HDR_LEN - r->got : n;
        memcpy(r->hdr + r->got, p, k);
        r->got += (uint32_t)k, p += k, n -= k;
        if (r->got == VRPC_TCP_HDR_LEN) {
            struct vrpc_tcp_hdr h;
            memcpy(&h, r->hdr, sizeof h);
            r->got = 0;
            r->credits += le16toh(h.credits);
            r->skip = le32toh(h.len);
            r->type = h.type;
            r->body_got = 0;
        }
    }
}

/* Run one client: handshake, the input's frames, close; whether the server
 * closed in time. */
static bool run_client(const uint8_t *data, size_t size, unsigned want_ok, unsigned *ok_responses)
{
    uint8_t out[VRPC_TCP_HDR_LEN + EAGER], in[65536];
    struct rx r = {.credits = 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    size_t off = 0;
    bool eof = false, shut = false;

    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    FUZZ_CHECK(fuzz_connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
    tcp_hdr(out, VRPC_TCP_HELLO, 0, 64);
    FUZZ_CHECK(send(fd, out, VRPC_TCP_HDR_LEN, MSG_NOSIGNAL) == VRPC_TCP_HDR_LEN, "send HELLO");
    ssize_t n = fuzz_recv_all(fd, in, VRPC_TCP_HDR_LEN);
    FUZZ_CHECK(n == VRPC_TCP_HDR_LEN && in[10] == VRPC_TCP_HELLO_ACK, "no HELLO_ACK (%zd)", n);
    rx_feed(&r, in, VRPC_TCP_HDR_LEN);
    int64_t deadline = now_ms() + 5000;
    while (!eof && now_ms() < deadline) {
        bool can_send = !shut && r.credits > 0;
        struct pollfd p = {.fd = fd, .events = POLLIN | (can_send ? POLLOUT : 0)};
        if (poll(&p, 1, shut ? 50 : 5) < 0)
            continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            n = recv(fd, in, sizeof in, MSG_DONTWAIT);
            if (n > 0)
                rx_feed(&r, in, (size_t)n);
            else if (n == 0 || (errno != EAGAIN && errno != EINTR))
                eof = true;
        }
        if (shut)
            continue;
        /* the next frame, if any, and if the server granted room for it */
        if (off + 2 > size) {
            if (r.ok_responses < want_ok && now_ms() < deadline - 2000)
                continue; /* a close now would cut the answers off */
            shutdown(fd, SHUT_WR);
            shut = true;
            continue;
        }
        if (!can_send || !(p.revents & POLLOUT)) {
            if (!r.credits && now_ms() > deadline - 4000) { /* no credits for 1 s: give up sending */
                shutdown(fd, SHUT_WR);
                shut = true;
            }
            continue;
        }
        size_t len = (size_t)data[off] | (size_t)data[off + 1] << 8;
        off += 2;
        if (len > size - off)
            len = size - off;
        if (len > EAGER)
            len = EAGER;
        tcp_hdr(out, VRPC_TCP_DATA, (uint32_t)len, 1);
        memcpy(out + VRPC_TCP_HDR_LEN, data + off, len);
        off += len;
        r.credits--;
        if (send(fd, out, VRPC_TCP_HDR_LEN + len, MSG_NOSIGNAL) != (ssize_t)(VRPC_TCP_HDR_LEN + len)) {
            shutdown(fd, SHUT_WR);
            shut = true;
        }
    }
    close(fd);
    *ok_responses = r.ok_responses;
    return eof;
}

/* A well-formed client: RPC HELLO and one call, answered with status OK. */
static void check_server_alive(void)
{
    uint8_t in[2 + 64 + 2 + 64];
    uint8_t *p = in;
    struct vrpc_wire_hdr h = {.version = VRPC_WIRE_VERSION, .type = VRPC_FT_HELLO, .payload_len = VRPC_WIRE_HELLO_LEN};
    struct vrpc_wire_hello hs = {.max_msg_size = 1 << 20, .max_concurrent = 4};
    p[0] = VRPC_WIRE_HDR_LEN + VRPC_WIRE_HELLO_LEN, p[1] = 0, p += 2;
    vrpc_wire_hdr_encode(p, &h), p += VRPC_WIRE_HDR_LEN;
    vrpc_wire_hello_encode(p, &hs), p += VRPC_WIRE_HELLO_LEN;
    static const uint8_t msg[] = {0x10, 0x07}; /* seq = 7 */
    h = (struct vrpc_wire_hdr){.version = VRPC_WIRE_VERSION,
                               .type = VRPC_FT_REQUEST,
                               .method_id = m_echo.id,
                               .request_id = vrpc_wire_make_id(0, 1),
                               .payload_len = sizeof msg};
    p[0] = VRPC_WIRE_HDR_LEN + sizeof msg, p[1] = 0, p += 2;
    vrpc_wire_hdr_encode(p, &h), p += VRPC_WIRE_HDR_LEN;
    memcpy(p, msg, sizeof msg), p += sizeof msg;
    unsigned ok;
    FUZZ_CHECK(run_client(in, (size_t)(p - in), 1, &ok), "the server does not close a well-formed client's connection");
    FUZZ_CHECK(ok == 1, "a well-formed call got %u OK responses", ok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    static unsigned runs;
    if (!started) {
        start();
        started = true;
    }
    unsigned ok;
    FUZZ_CHECK(run_client(data, size, 0, &ok), "the server kept a connection open 5 s after its peer closed");
    if (++runs % 256 == 0)
        check_server_alive();
    return 0;
}

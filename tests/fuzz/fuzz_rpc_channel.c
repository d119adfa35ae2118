/* The RPC channel's decoding of every frame a server sends (rpc/channel_conn.c, rpc/call.c, rpc/call_large.c):
 * HELLO_ACK (settings, credits, features), RESPONSE (status, message,
 * rendezvous descriptor of a large response: size, key, address), GOAWAY,
 * DONE, and a stream's MESSAGE, HEADERS, WINDOW and RESPONSE (rpc/stream*.c),
 * in any order and state, over a real TCP connection. A raw server
 * thread of the harness accepts the channel's connection, answers the
 * transport's handshake (64 credits, 8 KiB eager), and sends the input, a
 * list of RPC frames (u16 length, bytes), as TCP DATA frames within the
 * credits the channel grants, while reading whatever the channel sends
 * (a read request of the channel is never served). Per input a fresh
 * channel makes two Echo calls (deadline 50 ms; the seeds answer them by
 * their ids, slot 0 and 1 of generation 1), then opens one bidirectional
 * stream with callbacks (slot 2, deadline 50 ms, one async write; for an
 * input of odd length the stream runs on the poller, VRPC_CALL_CB_ON_POLLER),
 * and is destroyed. Each call and the stream must end exactly once with a valid status, and nothing may crash, leak or
 * trip a sanitizer. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include "fuzz_common.h"
#include "rpc_test.pb-c.h"
#include "transport/tcp/tcp_wire.h"

#define EAGER 8192u

static struct vrpc_method_desc m_echo = {
    "/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_UNARY};
static struct vrpc_method_desc m_bidi = {
    "/vrpctest.Test/Bidi",     0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_BIDI_STREAMING};
static int lfd;
static char uri[64];
/* The current input, copied for the server thread; busy while it serves. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *cur;
static size_t cur_len;
static int busy;
static int ending; /* the input's calls are over: stop serving */

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void tcp_hdr(uint8_t *out, uint8_t type, uint32_t len, uint32_t imm, uint16_t credits)
{
    struct vrpc_tcp_hdr h = {.len = htole32(len),
                             .imm = htole32(imm),
                             .credits = htole16(credits),
                             .type = type,
                             .version = VRPC_TCP_VERSION,
                             .magic = htole32(VRPC_TCP_MAGIC)};
    memcpy(out, &h, sizeof h);
}

/* The channel's stream, parsed just enough to count the credits it grants. */
struct rx {
    uint8_t hdr[VRPC_TCP_HDR_LEN];
    uint32_t got, skip, credits;
    bool hello;
    unsigned data; /* DATA frames received: the channel's HELLO, then its requests */
};

static void rx_feed(struct rx *r, const uint8_t *p, size_t n)
{
    while (n) {
        if (r->skip) {
            size_t k = n < r->skip ? n : r->skip;
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
            r->credits += le16toh(h.credits); /* HELLO: the initial grant */
            r->hello |= h.type == VRPC_TCP_HELLO;
            r->data += h.type == VRPC_TCP_DATA;
            r->skip = le32toh(h.len);
        }
    }
}

/* One connection: handshake, then the input's frames; until the channel
 * closes (or 5 s). */
static void serve(int fd, const uint8_t *in_data, size_t in_len)
{
    uint8_t out[VRPC_TCP_HDR_LEN + EAGER], in[65536];
    struct rx r = {.got = 0};
    size_t off = 0;
    bool acked = false;
    int64_t deadline = now_ms() + 5000, first = 0;
    for (;;) {
        /* the first frame (the seeds' HELLO_ACK) once the channel's HELLO is
         * in, the rest once its two requests are (or 20 ms later) */
        bool turn = off == 0 ? r.data >= 1 : r.data >= 3 || now_ms() >= first + 20;
        bool can_send = acked && turn && off + 2 <= in_len && r.credits > 0;
        struct pollfd p = {.fd = fd, .events = POLLIN | (can_send ? POLLOUT : 0)};
        if (now_ms() >= deadline || __atomic_load_n(&ending, __ATOMIC_ACQUIRE))
            break;
        if (poll(&p, 1, 20) < 0)
            continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(fd, in, sizeof in, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                break;
            if (n > 0)
                rx_feed(&r, in, (size_t)n);
        }
        if (!acked && r.hello) {
            tcp_hdr(out, VRPC_TCP_HELLO_ACK, 0, EAGER, 64);
            if (send(fd, out, VRPC_TCP_HDR_LEN, MSG_NOSIGNAL) != VRPC_TCP_HDR_LEN)
                break;
            acked = true;
            continue;
        }
        if (!can_send || !(p.revents & POLLOUT))
            continue;
        size_t len = (size_t)in_data[off] | (size_t)in_data[off + 1] << 8;
        off += 2;
        if (len > in_len - off)
            len = in_len - off;
        if (len > EAGER)
            len = EAGER;
        if (off == 2)
            first = now_ms();
        tcp_hdr(out, VRPC_TCP_DATA, (uint32_t)len, 0, 1);
        memcpy(out + VRPC_TCP_HDR_LEN, in_data + off, len);
        off += len;
        r.credits--;
        if (send(fd, out, VRPC_TCP_HDR_LEN + len, MSG_NOSIGNAL) != (ssize_t)(VRPC_TCP_HDR_LEN + len))
            break;
    }
    close(fd);
}

/* Serves every connection, one at a time, with the input current when it
 * was accepted (a reconnect of an earlier channel gets the same treatment). */
static void *server_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0 || !(p.revents & POLLIN))
            continue;
        pthread_mutex_lock(&mu);
        int fd = accept(lfd, NULL, NULL);
        size_t n = cur_len;
        uint8_t *copy = malloc(n ? n : 1);
        if (n)
            memcpy(copy, cur, n);
        busy = fd >= 0;
        pthread_mutex_unlock(&mu);
        if (fd >= 0)
            serve(fd, copy, n);
        free(copy);
        __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void start(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    pthread_t t;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    FUZZ_CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 16) == 0 &&
                   getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0,
               "listen: %s", strerror(errno));
    snprintf(uri, sizeof uri, "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
    m_echo.id = vrpc_method_id(m_echo.full_name);
    FUZZ_CHECK(pthread_create(&t, NULL, server_main, NULL) == 0, "server thread");
}

struct done {
    unsigned n; /* callbacks run (atomic) */
    int bad;    /* an invalid status was seen */
};

static void on_done(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct done *d = arg;
    if ((unsigned)st->code >= VRPC_CODE_COUNT || (st->code == VRPC_OK) != (resp != NULL) ||
        !memchr(st->message, 0, sizeof st->message))
        __atomic_store_n(&d->bad, 1, __ATOMIC_RELEASE);
    if (getenv("FUZZ_DEBUG")) /* replaying: what each call got */
        fprintf(stderr, "call: %d %s\n", st->code, st->message);
    __atomic_add_fetch(&d->n, 1, __ATOMIC_ACQ_REL);
}

/* The stream's callbacks: reads of the right type, one end with a valid status. */
static void st_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    struct done *d = arg;
    (void)s;
    if (!msg || msg->descriptor != &vrpctest__echo_reply__descriptor)
        __atomic_store_n(&d->bad, 1, __ATOMIC_RELEASE);
}

static void st_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct done *d = arg;
    (void)s;
    (void)resp;
    if ((unsigned)st->code >= VRPC_CODE_COUNT || !memchr(st->message, 0, sizeof st->message))
        __atomic_store_n(&d->bad, 1, __ATOMIC_RELEASE);
    if (getenv("FUZZ_DEBUG"))
        fprintf(stderr, "stream: %d %s\n", st->code, st->message);
    __atomic_add_fetch(&d->n, 1, __ATOMIC_ACQ_REL);
}

static void st_write(struct vrpc_stream *s, int rc, void *arg)
{
    (void)s;
    (void)rc;
    (void)arg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    if (!started) {
        start();
        started = true;
    }
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    struct done d = {0, 0};
    unsigned accepted = 0;
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    struct vrpc_call_opts co = {.timeout_us = 50000};

    pthread_mutex_lock(&mu);
    free(cur);
    cur = malloc(size ? size : 1);
    memcpy(cur, data, size);
    cur_len = size;
    pthread_mutex_unlock(&mu);
    vrpc_channel_opts_init(&o);
    o.connect_timeout_ms = 1000;
    o.backoff_initial_ms = 60000; /* no reconnect within an input */
    o.backoff_max_ms = 60000;
    FUZZ_CHECK(vrpc_channel_create(uri, &o, &ch) == 0, "channel create");
    req.seq = 7;
    for (int i = 0; i < 2; i++)
        accepted += vrpc_call_async(ch, &m_echo, &req.base, &co, on_done, &d) == 0;
    struct vrpc_stream_cbs cbs = {.on_read = st_read, .on_done = st_done, .arg = &d};
    struct vrpc_stream_opts so = {.call = co, .cbs = &cbs};
    if (size & 1) /* inputs of odd length: the stream's callbacks and small writes on the poller */
        so.call.flags |= VRPC_CALL_CB_ON_POLLER;
    struct vrpc_stream *s = NULL;
    if (vrpc_stream_start(ch, &m_bidi, &so, &s) == 0) {
        accepted++;
        vrpc_stream_write_async(s, &req.base, st_write, NULL);
    }
    int64_t until = now_ms() + 5000;
    while (__atomic_load_n(&d.n, __ATOMIC_ACQUIRE) < accepted && now_ms() < until)
        usleep(1000);
    FUZZ_CHECK(__atomic_load_n(&d.n, __ATOMIC_ACQUIRE) == accepted, "%u of %u calls ended within 5 s", d.n, accepted);
    /* the server stops now: a channel whose large response was announced
     * and never served waits in its close for the peer (up to the
     * transport's close timeout, 10 s) */
    __atomic_store_n(&ending, 1, __ATOMIC_RELEASE);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    FUZZ_CHECK(__atomic_load_n(&d.n, __ATOMIC_ACQUIRE) == accepted, "a call ended twice (%u of %u)", d.n, accepted);
    FUZZ_CHECK(!__atomic_load_n(&d.bad, __ATOMIC_ACQUIRE), "a call ended with an invalid status");
    /* the connection of this channel is over before the next input */
    until = now_ms() + 6000;
    while (__atomic_load_n(&busy, __ATOMIC_ACQUIRE) && now_ms() < until)
        usleep(1000);
    __atomic_store_n(&ending, 0, __ATOMIC_RELEASE);
    return 0;
}

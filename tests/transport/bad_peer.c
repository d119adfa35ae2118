/* TCP-only cases: peers that send garbage, a 4 GiB frame header, half a frame
 * then close, or one byte at a time; peers forging read requests (bad keys
 * and ranges) or read frames nobody asked for. Each must only end its own connection
 * (DISCONNECTED with a protocol error on the server, which logs it) while a
 * healthy connection on the same server carries on, and nothing leaks (the
 * server's receive buffers all come back at CQ destroy; ASan checks memory). */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"
#include "transport/tcp/tcp_wire.h"

#define WAIT_MS 10000

/* The port of a "tcp://127.0.0.1:PORT" URI. */
static int raw_socket(const char *uri)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *p = strrchr(uri, ':');
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_port = htons((uint16_t)atoi(p + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static void hdr(struct vrpc_tcp_hdr *h, uint8_t type, uint32_t len, uint32_t imm, uint16_t credits)
{
    *h = vrpc_tcp_hdr_make(type, len, imm, credits);
}

/* A raw connection that completed the handshake like a real client. */
static int raw_connect(const char *uri)
{
    struct vrpc_tcp_hdr h;
    int fd = raw_socket(uri);
    if (fd < 0)
        return -1;
    hdr(&h, VRPC_TCP_HELLO, 0, 8192, 2);
    if (write(fd, &h, sizeof h) != sizeof h || recv(fd, &h, sizeof h, MSG_WAITALL) != sizeof h ||
        h.type != VRPC_TCP_HELLO_ACK) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The server closed this raw connection (EOF or reset within ms). */
static bool closed_by_server(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b[64];
    while (poll(&p, 1, ms) > 0) {
        ssize_t n = read(fd, b, sizeof b);
        if (n <= 0)
            return true;
    }
    return false;
}

static bool wait_disc(struct echo *e, unsigned long n)
{
    int i;
    for (i = 0; i < WAIT_MS && atomic_load(&e->disconnected) < n; i++)
        usleep(1000);
    return atomic_load(&e->disconnected) >= n;
}

/* One checksummed round trip on a healthy connection. */
static void healthy_roundtrip(struct client *c, struct vrpc_ep *ep, uint32_t seed)
{
    struct vrpc_buf *b = vrpc_pool_get(c->pool);
    struct vrpc_wc w;
    uint32_t sum;
    assert_non_null(b);
    fill(b->data, 100, seed);
    sum = csum(b->data, 100);
    assert_int_equal(vrpc_ep_send(ep, b, 100, seed, 0, 0), 0);
    assert_true(coll_wait(&c->coll, VRPC_WC_RECV, ep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    assert_int_equal(csum(w.buf->data, w.byte_len), sum);
    assert_int_equal(vrpc_cq_post_recv(c->cq, &w.buf, NULL, 1), 0);
    assert_true(coll_wait(&c->coll, VRPC_WC_SEND, ep, WAIT_MS, &w));
    vrpc_pool_put(w.buf);
}

struct bad_env {
    struct vrpc_transport_attr sa;
    struct echo e;
    struct client c;
    struct vrpc_ep *ep;
};

static void env_start(struct bad_env *x, uint32_t idle_ms)
{
    struct echo_cfg ec = {.ncq = 1, .nbufs = 32, .tattr = &x->sa};
    vrpc_transport_attr_init(&x->sa);
    if (idle_ms)
        x->sa.idle_timeout_ms = idle_ms;
    assert_int_equal(echo_start(&x->e, &ec), 0);
    assert_int_equal(client_start(&x->c, NULL, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(client_connect(&x->c, x->e.uri, &x->ep), 0);
    healthy_roundtrip(&x->c, x->ep, 1);
}

/* After the bad peer: the healthy connection still works, and at shutdown
 * every one of the server's receive buffers comes back exactly once. */
static void env_stop(struct bad_env *x)
{
    struct vrpc_wc w;
    healthy_roundtrip(&x->c, x->ep, 2);
    vrpc_ep_destroy(x->ep);
    assert_true(coll_wait(&x->c.coll, VRPC_WC_DISCONNECTED, x->ep, WAIT_MS, &w));
    client_stop(&x->c);
    echo_stop(&x->e);
    assert_int_equal(atomic_load(&x->e.flushed_recvs), 32);
}

/* Garbage after a valid handshake, and garbage instead of a handshake. */
void t_bad_garbage(void **state)
{
    struct bad_env x;
    unsigned char junk[64];
    int fd, fd2;

    env_start(&x, 0);
    fd = raw_connect(x.e.uri);
    assert_true(fd >= 0);
    memset(junk, 0xab, sizeof junk);
    assert_int_equal(write(fd, junk, sizeof junk), sizeof junk);
    assert_true(closed_by_server(fd, WAIT_MS));
    assert_true(wait_disc(&x.e, 1));
    assert_int_equal(atomic_load(&x.e.last_disc_status), -EPROTO);
    close(fd);
    /* no handshake at all: refused before it is ever reported */
    fd2 = raw_socket(x.e.uri);
    assert_true(fd2 >= 0);
    assert_int_equal(write(fd2, junk, sizeof junk), sizeof junk);
    assert_true(closed_by_server(fd2, WAIT_MS));
    close(fd2);
    assert_int_equal(atomic_load(&x.e.accepted), 2); /* the healthy one and the first raw one */
    env_stop(&x);
}

/* A DATA header claiming 4 GiB (far above the eager size). */
void t_bad_huge_header(void **state)
{
    struct bad_env x;
    struct vrpc_tcp_hdr h;
    int fd;

    env_start(&x, 0);
    fd = raw_connect(x.e.uri);
    assert_true(fd >= 0);
    hdr(&h, VRPC_TCP_DATA, 0xffffffffu, 0, 0);
    assert_int_equal(write(fd, &h, sizeof h), sizeof h);
    assert_true(closed_by_server(fd, WAIT_MS));
    assert_true(wait_disc(&x.e, 1));
    assert_int_equal(atomic_load(&x.e.last_disc_status), -EMSGSIZE);
    close(fd);
    env_stop(&x);
}

/* Half a frame (header for 100 bytes, 50 sent), then close: the receive
 * buffer being filled goes back to the CQ (checked in env_stop), and back
 * among the receives a new connection may reserve: 40 such peers in turn
 * (more than the server's 32 receives) and each still gets its handshake
 * (found by tests/fuzz/fuzz_tcp_stream: each one used to lose a receive for
 * good, until the CQ refused every new connection). */
void t_bad_half_frame(void **state)
{
    struct bad_env x;
    struct vrpc_tcp_hdr h;
    char payload[50] = {0};
    int fd;

    env_start(&x, 0);
    for (unsigned i = 0; i < 40; i++) {
        fd = raw_connect(x.e.uri);
        assert_true(fd >= 0);
        hdr(&h, VRPC_TCP_DATA, 100, 0, 0);
        assert_int_equal(write(fd, &h, sizeof h), sizeof h);
        assert_int_equal(write(fd, payload, sizeof payload), sizeof payload);
        if (i == 0)
            usleep(50000);
        close(fd);
        assert_true(wait_disc(&x.e, i + 1));
        /* EOF mid-frame, or a reset if the kernel chose one (the later,
         * quicker ones may also meet a send of the handshake's credits) */
        if (i == 0)
            assert_true(atomic_load(&x.e.last_disc_status) == -EPROTO ||
                        atomic_load(&x.e.last_disc_status) == -ECONNRESET);
        else
            assert_true(atomic_load(&x.e.last_disc_status) < 0);
    }
    assert_int_equal(atomic_load(&x.e.recvs), 1); /* only the healthy round trip so far */
    env_stop(&x);
}

/* A peer that dribbles a frame one byte every 250 ms (scaled down from one a
 * second to keep the test short): the server's poller is never blocked (the
 * healthy connection keeps working meanwhile) and the connection fails with
 * -ETIMEDOUT once the frame is older than the idle timeout (1.5 s here). */
void t_bad_slow_peer(void **state)
{
    struct bad_env x;
    struct vrpc_tcp_hdr h;
    const unsigned char *p = (const unsigned char *)&h;
    unsigned i;
    int fd;

    env_start(&x, 1500);
    fd = raw_connect(x.e.uri);
    assert_true(fd >= 0);
    hdr(&h, VRPC_TCP_DATA, 8, 0, 0);
    for (i = 0; i < sizeof h && atomic_load(&x.e.disconnected) == 0; i++) {
        if (write(fd, p + i, 1) != 1)
            break;
        healthy_roundtrip(&x.c, x.ep, 10 + i);
        usleep(250000);
    }
    assert_true(wait_disc(&x.e, 1));
    assert_int_equal(atomic_load(&x.e.last_disc_status), -ETIMEDOUT);
    assert_true(i < sizeof h); /* cut off before it could finish the header */
    assert_true(closed_by_server(fd, WAIT_MS));
    close(fd);
    env_stop(&x);
}

/* ---- forged read requests ---------------------------------------------------- */

#define CANARY 0xc5
#define GOFF 4096u       /* the grant starts this far into the buffer */
#define GLEN (64u << 10) /* and is this long; canary bytes all around */

struct read_env {
    struct rig r;
    struct vrpc_ep *cep, *sep; /* a healthy connection */
    struct vrpc_buf *buf;      /* the server's buffer: canary, granted payload, canary */
    uint32_t sum;              /* of the whole buffer */
    const char *gp;            /* grant start */
};

static void read_env_start(struct read_env *x)
{
    unsigned char *p;
    assert_int_equal(rig_start(&x->r, 0), 0);
    assert_int_equal(rig_connect(&x->r, &x->cep, &x->sep), 0);
    assert_int_equal(vrpc_lbuf_get(x->r.s.tp, GOFF + GLEN + GOFF, &x->buf), 0);
    p = x->buf->data;
    memset(p, CANARY, x->buf->cap);
    fill(p + GOFF, GLEN, 1234);
    x->gp = (const char *)p + GOFF;
    x->sum = csum(p, x->buf->cap);
}

/* A raw peer whose server-side endpoint got a grant of the payload. */
static int raw_with_grant(struct read_env *x, struct vrpc_ep **rsep, uint32_t *key)
{
    struct vrpc_wc w;
    int fd = raw_connect(x->r.uri);
    assert_true(fd >= 0);
    assert_true(coll_wait(&x->r.s.coll, VRPC_WC_ACCEPTED, NULL, WAIT_MS, &w));
    *rsep = w.ep;
    assert_int_equal(vrpc_ep_grant(*rsep, x->buf->mr, x->gp, GLEN, key), 0);
    return fd;
}

static void send_read_req(int fd, uint32_t tag, uint64_t raddr, uint32_t key, uint32_t length)
{
    struct {
        struct vrpc_tcp_hdr h;
        struct vrpc_tcp_read_req r;
    } m;
    hdr(&m.h, VRPC_TCP_READ_REQ, sizeof m.r, tag, 0);
    m.r.raddr = htole64(raddr);
    m.r.rkey = htole32(key);
    m.r.length = htole32(length);
    assert_int_equal(write(fd, &m, sizeof m), sizeof m);
}

/* Everything the server sends until it closes (at most cap bytes). */
static size_t read_all(int fd, void *buf, size_t cap)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    size_t got = 0;
    while (got < cap && poll(&p, 1, WAIT_MS) > 0) {
        ssize_t n = read(fd, (char *)buf + got, cap - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got;
}

static void read_env_stop(struct read_env *x)
{
    struct vrpc_buf *dst;
    struct vrpc_wc w;
    uint32_t key;
    /* the healthy connection still reads and sends */
    assert_int_equal(vrpc_lbuf_get(x->r.c.tp, GLEN, &dst), 0);
    assert_int_equal(vrpc_ep_grant(x->sep, x->buf->mr, x->gp, GLEN, &key), 0);
    assert_int_equal(vrpc_ep_read(x->cep, dst, 0, GLEN, (uint64_t)(uintptr_t)x->gp, key, 9), 0);
    assert_true(coll_wait(&x->r.c.coll, VRPC_WC_READ, x->cep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    assert_memory_equal(dst->data, x->gp, GLEN);
    assert_int_equal(vrpc_ep_revoke(x->sep, key, 0), 0);
    assert_true(coll_wait(&x->r.s.coll, VRPC_WC_REVOKE, x->sep, WAIT_MS, &w));
    assert_int_equal(w.status, 0);
    /* the owner's memory, canaries included, is as it was */
    assert_int_equal(csum(x->buf->data, x->buf->cap), x->sum);
    vrpc_lbuf_put(dst);
    vrpc_lbuf_put(x->buf);
    vrpc_ep_destroy(x->cep);
    vrpc_ep_destroy(x->sep);
    assert_true(coll_wait(&x->r.s.coll, VRPC_WC_DISCONNECTED, x->sep, WAIT_MS, &w));
    rig_stop(&x->r);
}

/* Forged READ_REQs, each on its own raw connection holding a grant of 64 KiB
 * with canary bytes around it: wrong key, key of another connection, address
 * below / length past / address past the grant, zero length, ranges that
 * overflow. Each: exactly one READ_ERR for its tag and nothing else (no byte
 * of the buffer), the connection closes, the server reports -EPROTO; the
 * healthy connection carries on; a valid request returns just the payload. */
void t_bad_read_requests(void **state)
{
    struct read_env x;
    struct vrpc_wc w;
    uint64_t g;
    uint32_t other_key, key, i;
    unsigned char *in = malloc(GLEN + 64);
    struct vrpc_tcp_hdr h;
    struct vrpc_ep *rsep;
    int fd;

    assert_non_null(in);
    read_env_start(&x);
    g = (uint64_t)(uintptr_t)x.gp;
    assert_int_equal(vrpc_ep_grant(x.sep, x.buf->mr, x.gp, GLEN, &other_key), 0);

    /* the positive control: exactly the granted bytes come back */
    fd = raw_with_grant(&x, &rsep, &key);
    send_read_req(fd, 77, g + 10, key, GLEN - 10);
    assert_int_equal(recv(fd, &h, sizeof h, MSG_WAITALL), sizeof h);
    assert_int_equal(h.type, VRPC_TCP_READ_RESP);
    assert_int_equal(le32toh(h.imm), 77);
    assert_int_equal(le32toh(h.len), GLEN - 10);
    assert_int_equal(recv(fd, in, GLEN - 10, MSG_WAITALL), GLEN - 10);
    assert_memory_equal(in, x.gp + 10, GLEN - 10);
    close(fd);
    assert_true(coll_wait(&x.r.s.coll, VRPC_WC_DISCONNECTED, rsep, WAIT_MS, &w));
    assert_int_equal(vrpc_ep_revoke(rsep, key, 0), -ENOTCONN); /* the key died with it */
    vrpc_ep_destroy(rsep);

    for (i = 0; i < 8; i++) {
        static const char *what[] = {"wrong key",
                                     "key of another connection",
                                     "address below the grant",
                                     "length past the grant",
                                     "address past the grant",
                                     "zero length",
                                     "address + length overflows",
                                     "length overflows the grant"};
        uint64_t a = g;
        uint32_t k, len = 16;
        size_t got;
        fd = raw_with_grant(&x, &rsep, &key);
        k = key;
        switch (i) {
        case 0:
            k = key + 0x100;
            break;
        case 1:
            k = other_key;
            break;
        case 2:
            a = g - 1;
            break;
        case 3:
            len = GLEN + 1;
            break;
        case 4:
            a = g + GLEN - 8;
            break;
        case 5:
            len = 0;
            break;
        case 6:
            a = UINT64_MAX - 7;
            break;
        case 7:
            a = g + 8;
            len = 0xffffffffu;
            break;
        }
        printf("  forged read request: %s\n", what[i]);
        send_read_req(fd, 100 + i, a, k, len);
        got = read_all(fd, in, GLEN + 64);
        assert_int_equal(got, sizeof h); /* one header, not a byte of memory */
        memcpy(&h, in, sizeof h);
        assert_int_equal(h.type, VRPC_TCP_READ_ERR);
        assert_int_equal(le32toh(h.imm), 100 + i);
        assert_int_equal(le32toh(h.len), 0);
        close(fd);
        assert_true(coll_wait(&x.r.s.coll, VRPC_WC_DISCONNECTED, rsep, WAIT_MS, &w));
        assert_int_equal(w.status, -EPROTO);
        assert_int_equal(vrpc_ep_revoke(rsep, key, 0), -ENOTCONN); /* the key died with it */
        vrpc_ep_destroy(rsep);
    }
    assert_int_equal(vrpc_ep_revoke(x.sep, other_key, 0), 0);
    assert_true(coll_wait(&x.r.s.coll, VRPC_WC_REVOKE, x.sep, WAIT_MS, &w));
    free(in);
    read_env_stop(&x);
}

/* Read frames the reader never asked for: a READ_RESP and a READ_ERR for a
 * tag with no read outstanding, and a READ_REQ of the wrong length, are
 * protocol errors of that connection only. */
void t_bad_read_frames(void **state)
{
    struct read_env x;
    struct vrpc_wc w;
    struct vrpc_tcp_hdr h;
    unsigned i;
    int fd;

    read_env_start(&x);
    for (i = 0; i < 3; i++) {
        struct vrpc_ep *rsep;
        fd = raw_connect(x.r.uri);
        assert_true(fd >= 0);
        assert_true(coll_wait(&x.r.s.coll, VRPC_WC_ACCEPTED, NULL, WAIT_MS, &w));
        rsep = w.ep;
        if (i == 0)
            hdr(&h, VRPC_TCP_READ_RESP, 8, 5, 0);
        else if (i == 1)
            hdr(&h, VRPC_TCP_READ_ERR, 0, 5, 0);
        else
            hdr(&h, VRPC_TCP_READ_REQ, 8, 5, 0);
        assert_int_equal(write(fd, &h, sizeof h), sizeof h);
        assert_int_equal(write(fd, "12345678", 8), 8);
        assert_true(closed_by_server(fd, WAIT_MS));
        close(fd);
        assert_true(coll_wait(&x.r.s.coll, VRPC_WC_DISCONNECTED, rsep, WAIT_MS, &w));
        assert_int_equal(w.status, -EPROTO);
        vrpc_ep_destroy(rsep);
    }
    read_env_stop(&x);
}

/* ---- a bad owner: a raw server answering our reads wrongly, or not at all ---- */

struct raw_srv {
    int lfd, fd;
    char uri[VRPC_URI_MAX];
};

/* Listen on 127.0.0.1:0; raw_srv_accept() completes the handshake. */
static void raw_srv_listen(struct raw_srv *s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(s->uri, sizeof s->uri, "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
}

struct connector_arg {
    struct client *c;
    const char *uri;
    struct vrpc_ep *ep;
    int rc;
};

static void *connect_main(void *arg)
{
    struct connector_arg *a = arg;
    a->rc = client_connect(a->c, a->uri, &a->ep);
    return NULL;
}

/* Connect c to the raw server and answer the handshake by hand. */
static struct vrpc_ep *raw_srv_accept(struct raw_srv *s, struct client *c)
{
    struct connector_arg a = {.c = c, .uri = s->uri};
    struct vrpc_tcp_hdr h;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, connect_main, &a), 0);
    s->fd = accept(s->lfd, NULL, NULL);
    assert_true(s->fd >= 0);
    assert_int_equal(recv(s->fd, &h, sizeof h, MSG_WAITALL), sizeof h);
    assert_int_equal(h.type, VRPC_TCP_HELLO);
    hdr(&h, VRPC_TCP_HELLO_ACK, 0, 8192, 2);
    assert_int_equal(write(s->fd, &h, sizeof h), sizeof h);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    return a.ep;
}

/* Our reads against a raw owner: a READ_RESP for a tag we never used, a
 * READ_RESP longer than the read, silence, and a FIN with the read
 * unanswered. The first two fail the connection (-EPROTO) and the read
 * completes -ECANCELED; silence fails it after the idle timeout
 * (-ETIMEDOUT); the FIN is a lost connection, not a close (-ECONNRESET:
 * a closing peer serves our reads first). Each read completes exactly once. */
void t_bad_read_owner(void **state)
{
    struct vrpc_transport_attr a;
    struct client c;
    struct vrpc_buf *dst;
    unsigned i;

    vrpc_transport_attr_init(&a);
    a.idle_timeout_ms = 1500;
    assert_int_equal(client_start(&c, &a, 16, 8, 0, NULL, NULL), 0);
    assert_int_equal(vrpc_lbuf_get(c.tp, 4096, &dst), 0);
    for (i = 0; i < 4; i++) {
        /* 3: the owner closes with our read unanswered: lost, not closed */
        static const int want[] = {-EPROTO, -EPROTO, -ETIMEDOUT, -ECONNRESET};
        struct {
            struct vrpc_tcp_hdr h;
            struct vrpc_tcp_read_req r;
        } m;
        struct raw_srv s;
        struct vrpc_ep *ep;
        struct vrpc_wc w;
        char junk[8192] = {0};

        raw_srv_listen(&s);
        ep = raw_srv_accept(&s, &c);
        assert_int_equal(vrpc_ep_read(ep, dst, 0, 4096, 0x1000, 0x101, 7), 0);
        assert_int_equal(recv(s.fd, &m, sizeof m, MSG_WAITALL), sizeof m);
        assert_int_equal(m.h.type, VRPC_TCP_READ_REQ);
        assert_int_equal(le32toh(m.r.length), 4096);
        if (i == 0)
            hdr(&m.h, VRPC_TCP_READ_RESP, 16, le32toh(m.h.imm) ^ 0x10000, 0); /* another generation */
        else if (i == 1)
            hdr(&m.h, VRPC_TCP_READ_RESP, 4097, le32toh(m.h.imm), 0);
        if (i < 2) {
            assert_int_equal(write(s.fd, &m.h, sizeof m.h), sizeof m.h);
            assert_int_equal(write(s.fd, junk, sizeof junk), sizeof junk);
        } else if (i == 3) {
            shutdown(s.fd, SHUT_WR);
        }
        assert_true(coll_wait(&c.coll, VRPC_WC_READ, ep, WAIT_MS, &w));
        assert_int_equal(w.wr_id, 7);
        assert_ptr_equal(w.buf, dst);
        assert_int_equal(w.status, -ECANCELED);
        assert_true(coll_wait(&c.coll, VRPC_WC_DISCONNECTED, ep, WAIT_MS, &w));
        assert_int_equal(w.status, want[i]);
        vrpc_ep_destroy(ep);
        close(s.fd);
        close(s.lfd);
    }
    vrpc_lbuf_put(dst);
    usleep(20000);
    assert_int_equal(coll_count(&c.coll, VRPC_WC_READ, NULL), 0);
    client_stop(&c);
}

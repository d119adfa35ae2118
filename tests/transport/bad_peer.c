/* TCP-only cases: peers that send garbage, a 4 GiB frame header, half a frame
 * then close, or one byte at a time. Each must only end its own connection
 * (DISCONNECTED with a protocol error on the server, which logs it) while a
 * healthy connection on the same server carries on, and nothing leaks (the
 * server's receive buffers all come back at CQ destroy; ASan checks memory). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
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
    struct sockaddr_in sa = { .sin_family = AF_INET };
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
    memset(h, 0, sizeof *h);
    h->len = htole32(len);
    h->imm = htole32(imm);
    h->credits = htole16(credits);
    h->type = type;
    h->version = VRPC_TCP_VERSION;
    h->magic = htole32(VRPC_TCP_MAGIC);
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
    struct pollfd p = { .fd = fd, .events = POLLIN };
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
    struct echo_cfg ec = { .ncq = 1, .nbufs = 32, .tattr = &x->sa };
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
 * buffer being filled goes back to the CQ (checked in env_stop). */
void t_bad_half_frame(void **state)
{
    struct bad_env x;
    struct vrpc_tcp_hdr h;
    char payload[50] = { 0 };
    int fd;

    env_start(&x, 0);
    fd = raw_connect(x.e.uri);
    assert_true(fd >= 0);
    hdr(&h, VRPC_TCP_DATA, 100, 0, 0);
    assert_int_equal(write(fd, &h, sizeof h), sizeof h);
    assert_int_equal(write(fd, payload, sizeof payload), sizeof payload);
    usleep(50000);
    close(fd);
    assert_true(wait_disc(&x.e, 1));
    /* EOF mid-frame, or a reset if the kernel chose one */
    assert_true(atomic_load(&x.e.last_disc_status) == -EPROTO || atomic_load(&x.e.last_disc_status) == -ECONNRESET);
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

/* The TCP backend's frame parser, HELLO handling and read-request handling
 * (transport/tcp/tcp_*.c), driven as a peer drives them: through a socket. One
 * echo server (tests/transport/harness.c: TCP transport, one poller, 256
 * receives) lives for the whole run; each input is written as it is to a new
 * raw connection from 127.0.0.1, which then shuts down its sending side and
 * reads until the server closes (or 5 s pass). The input is the byte stream
 * of a client: usually a HELLO frame header first (the seeds have one), then
 * DATA, CREDIT and READ_* frames, split and joined as the fuzzer likes. The
 * server must never crash or trip a sanitizer, must end every connection
 * (EOF after our close), and its receive buffers must all come back: at
 * most 256 are ever posted, so a leak shows as a server that stops taking
 * new connections ("no receive buffers left"), which the check after each
 * input catches by a full handshake on a fresh connection every 256 inputs.
 * Coverage of the poller thread counts (libFuzzer's counters are global). */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "fuzz_common.h"
#include "harness.h"
#include "transport/tcp/tcp_wire.h"

static struct echo srv;
static struct sockaddr_in sa;

static void start(void)
{
    struct echo_cfg cfg = {.ncq = 1, .nbufs = 256};
    g_opt.backend = "tcp";
    g_opt.server_ip = "127.0.0.1";
    g_opt.setup = "local";
    FUZZ_CHECK(echo_start(&srv, &cfg) == 0, "echo server did not start");
    const char *p = strrchr(srv.uri, ':');
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(p + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Write what the server takes, read what it sends, until it closes. */
static bool run_stream(const uint8_t *data, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    size_t off = 0;
    bool eof = false, shut = false;
    int64_t deadline = now_ms() + 5000;
    char sink[65536];

    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS)
        FUZZ_CHECK(0, "connect: %s", strerror(errno));
    while (!eof && now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
        if (poll(&p, 1, 50) <= 0)
            continue;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, sink, sizeof sink, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                eof = true;
        }
        if (!shut && (p.revents & POLLOUT)) {
            ssize_t w = off < size ? send(fd, data + off, size - off, MSG_NOSIGNAL) : 0;
            if (w > 0)
                off += (size_t)w;
            if (off == size || (w < 0 && errno != EAGAIN && errno != EINTR)) {
                shutdown(fd, SHUT_WR);
                shut = true;
            }
        }
    }
    close(fd);
    return eof;
}

/* A real client's handshake gets its HELLO_ACK. */
static bool handshake_ok(void)
{
    struct vrpc_tcp_hdr h = {.len = 0,
                             .imm = htole32(8192),
                             .credits = htole16(4),
                             .type = VRPC_TCP_HELLO,
                             .version = VRPC_TCP_VERSION,
                             .magic = htole32(VRPC_TCP_MAGIC)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    FUZZ_CHECK(fuzz_connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
    FUZZ_CHECK(send(fd, &h, sizeof h, MSG_NOSIGNAL) == sizeof h, "send HELLO");
    bool ok = fuzz_recv_all(fd, &h, sizeof h) == sizeof h && h.type == VRPC_TCP_HELLO_ACK;
    close(fd);
    return ok;
}

/* The server still takes new connections, once the teardowns of the last
 * ones (which may trail their EOF a little) are through: 3 s. */
static void check_server_alive(void)
{
    for (int i = 0; i < 30; i++) {
        if (handshake_ok())
            return;
        usleep(100000);
    }
    FUZZ_CHECK(0, "the server no longer answers a HELLO (receive buffers lost?)");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    static unsigned runs;
    if (!started) {
        start();
        started = true;
    }
    FUZZ_CHECK(run_stream(data, size), "the server kept a connection open 5 s after its peer closed");
    /* every connection the server accepted has ended (DISCONNECTED, after
     * which the echo server destroys it) */
    int64_t until = now_ms() + 3000;
    unsigned long acc, disc;
    for (;;) {
        disc = atomic_load(&srv.disconnected); /* first: an ACCEPTED always precedes its DISCONNECTED */
        acc = atomic_load(&srv.accepted);
        if (acc == disc || now_ms() >= until)
            break;
        usleep(1000);
    }
    FUZZ_CHECK(acc == disc, "accepted %lu connections, %lu disconnected", acc, disc);
    if (++runs % 256 == 0)
        check_server_alive();
    return 0;
}

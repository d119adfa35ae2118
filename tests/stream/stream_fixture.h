/* Shared fixture of the streaming end-to-end tests (test_stream.c,
 * test_stream_fail.c): hand-written descriptors of the three stream shapes
 * and a unary echo, a test server whose stream handlers behave as the
 * request metadata "x-mode" says, message fill/check helpers, RSS, and a
 * child process (this program re-executed) for the SIGKILL cases.
 *
 * Stream modes (metadata "x-mode", counts in "x-n", sizes in "x-size"):
 *   gen    server streaming: after the one request, a writer thread sends
 *          x-n messages (seq 0.., payload x-size bytes of fill()), then
 *          finishes OK with trailing "x-sum" (checksum, 16 hex digits);
 *          initial metadata "x-hello" = "1". x-n 0: until the stream ends.
 *   agen   as gen, by vrpc_server_stream_write_async (at most
 *          VRPC_STREAM_ASYNC_WRITES_MAX outstanding, refilled from the
 *          write callbacks).
 *   echo   bidi: each message written back (blocking write from on_read);
 *          client streaming: counted and summed, the reply at half-close
 *          carries seq = count, payload = checksum (8 bytes LE). Finish OK at
 *          half-close with trailing "x-sum" and "x-count".
 *   stall  as echo, but on_read first waits until stall_release().
 *   abort  as echo, but after x-n messages the server ends the stream
 *          ABORTED "server gave up".
 *   hold   nothing is written; the stream ends only when cancelled.
 * Every server-side end is counted in g_srv (exactly once per stream). */
#ifndef VRPC_TESTS_STREAM_FIXTURE_H
#define VRPC_TESTS_STREAM_FIXTURE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc_test.pb-c.h"

struct stream_opts {
    const char *backend, *setup;
    const char *server_ip, *client_ip;
    unsigned scale;   /* VRPC_TEST_SCALE: round counts divided by it */
    const char *self; /* argv[0], re-executed for child processes */
};
extern struct stream_opts g_opt;

extern struct vrpc_method_desc m_unary, m_sstream, m_cstream, m_bidi;

/* Server-side observations (atomics; read with __atomic_load_n). */
struct srv_counts {
    unsigned started;       /* start callbacks */
    unsigned cancels;       /* on_cancel callbacks */
    unsigned ended;         /* vrpc_server_stream_finish calls */
    unsigned finish_ok;     /* ... that returned 0 */
    unsigned finish_reset;  /* ... that returned -ECONNRESET */
    unsigned write_reset;   /* writes (sync or async callbacks) with -ECONNRESET */
    unsigned write_other;   /* writes failing otherwise */
    unsigned bad_order;     /* client messages out of order or corrupt */
    unsigned stalled;       /* on_read calls currently waiting in stall */
    unsigned long written;  /* messages handed to the transport (write rc 0) */
    unsigned long accepted; /* async writes accepted */
    unsigned long received; /* client messages seen by on_read */
};
extern struct srv_counts g_srv;
/* Atomic read of a counter (of g_srv or a test's own). */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)

/* Server options the tests vary. */
struct srv_cfg {
    uint32_t max_concurrent, stream_window;
    unsigned threads;
};
struct vrpc_server *fx_server_start(const struct srv_cfg *c, char *uri, size_t uri_len);
/* The URI a test server listens on: the backend, the server address, port 0. */
void fx_listen_uri(char *buf, size_t len);
/* Destroy the server, then free the per-stream contexts. */
void fx_server_destroy(struct vrpc_server *srv);
void fx_counts_reset(void);
/* Wait (up to timeout_ms) until *p >= want; returns *p. */
unsigned fx_wait_at_least(const unsigned *p, unsigned want, int timeout_ms);

void stall_release(void);
void stall_arm(void);

struct vrpc_channel *fx_channel(const char *uri, uint32_t max_outstanding, uint32_t stream_window);

/* Open a stream of m with metadata x-mode/x-n/x-size; timeout_us 0: none. */
struct vrpc_stream *fx_open(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const char *mode,
                            unsigned long n, size_t size, int64_t timeout_us, const struct vrpc_stream_cbs *cbs);
/* The same with call flags (VRPC_CALL_CB_ON_POLLER). */
struct vrpc_stream *fx_open_flags(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const char *mode,
                                  unsigned long n, size_t size, int64_t timeout_us, const struct vrpc_stream_cbs *cbs,
                                  uint32_t flags);

/* Deterministic payload of message seq, and its check. */
void fill(uint8_t *p, size_t len, uint64_t seq);
bool check(const uint8_t *p, size_t len, uint64_t seq);
/* Running checksum over (seq, payload) pairs. */
uint64_t sum_add(uint64_t sum, uint64_t seq, const uint8_t *p, size_t len);
/* The 16-hex-digit value of trailing metadata key, or false. */
bool trailer_u64(const struct vrpc_stream *s, const char *key, uint64_t *v);

/* Resident set of this process, bytes. */
size_t rss_bytes(void);
/* Heap bytes allocated and not yet freed (the sanitizer's allocator count
 * under ASan/TSan, glibc's mallinfo2 otherwise). */
size_t heap_bytes(void);
/* RSS is the process's memory only without TSan (its shadow and sync
 * objects grow with every new address touched). */
#ifdef __SANITIZE_THREAD__
#define RSS_MEANINGFUL 0
#else
#define RSS_MEANINGFUL 1
#endif

/* A child: this program with --child ROLE ARG; its first stdout line is
 * returned in line (e.g. the server's URI). Returns the pid. */
int fx_spawn(const char *role, const char *arg, char *line, size_t line_len);
/* The child's main (role "server": serve and print the URI; "client": open
 * a gen stream to arg, read 10 messages, print "ready", wait to be killed). */
int fx_child_main(const char *role, const char *arg);

/* Parse the common command line and environment; 0 to go on, otherwise
 * the exit code (77 skip, 2 usage). */
int fx_parse(int argc, char **argv);
/* cmocka group run with VRPC_TEST_ONLY=a,b filtering (as tests/rpc). */
int fx_run(const char *group, const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
           CMFixtureFunction teardown);

#endif

/* The streaming tests' fixture: see stream_fixture.h. */
#define _GNU_SOURCE
#include "stream_fixture.h"

#include <errno.h>
#include <malloc.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "verbs_setup.h"
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* sanitizer/allocator_interface.h is not installed with gcc 12; the runtimes
 * (libasan, libtsan) export it */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

struct stream_opts g_opt;
struct srv_counts g_srv;

#define D(name, kind)                                                                                                  \
    {                                                                                                                  \
        "/vrpctest.Stream/" name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,     \
            kind                                                                                                       \
    }
struct vrpc_method_desc m_unary = D("Unary", VRPC_METHOD_UNARY);
struct vrpc_method_desc m_sstream = D("ServerStream", VRPC_METHOD_SERVER_STREAMING);
struct vrpc_method_desc m_cstream = D("ClientStream", VRPC_METHOD_CLIENT_STREAMING);
struct vrpc_method_desc m_bidi = D("Bidi", VRPC_METHOD_BIDI_STREAMING);

#define CNT(field) __atomic_add_fetch(&g_srv.field, 1, __ATOMIC_RELAXED)

/* ---- payloads ---------------------------------------------------------------- */

void fill(uint8_t *p, size_t len, uint64_t seq)
{
    uint8_t a = (uint8_t)(seq * 131u + 17u);
    for (size_t k = 0; k < len; k++)
        p[k] = (uint8_t)(a + k * 7u + (k >> 8));
}

bool check(const uint8_t *p, size_t len, uint64_t seq)
{
    uint8_t a = (uint8_t)(seq * 131u + 17u);
    for (size_t k = 0; k < len; k++)
        if (p[k] != (uint8_t)(a + k * 7u + (k >> 8)))
            return false;
    return true;
}

uint64_t sum_add(uint64_t sum, uint64_t seq, const uint8_t *p, size_t len)
{
    uint64_t h = 14695981039346656037ull ^ seq;
    for (size_t k = 0; k < len; k++)
        h = (h ^ p[k]) * 1099511628211ull;
    return sum * 31u + h + len;
}

static bool parse_hex(const void *v, size_t len, uint64_t *out)
{
    char buf[24];
    char *end;
    if (len == 0 || len >= sizeof(buf))
        return false;
    memcpy(buf, v, len);
    buf[len] = 0;
    *out = strtoull(buf, &end, 16);
    return *end == 0;
}

bool trailer_u64(const struct vrpc_stream *s, const char *key, uint64_t *v)
{
    const void *p;
    size_t len;
    return vrpc_stream_trailing_metadata_get(s, key, &p, &len) == 0 && parse_hex(p, len, v);
}

/* The heap the process has allocated and not freed: the sanitizers' own
 * allocator count under ASan and TSan (their shadow memory and TSan's sync
 * objects grow with every address first touched, so RSS there measures the
 * tool, not the library), glibc's in-use figures otherwise. */
size_t heap_bytes(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

size_t rss_bytes(void)
{
    unsigned long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

/* ---- the server's stream handlers ------------------------------------------------ */

enum smode { SM_GEN, SM_AGEN, SM_ECHO, SM_STALL, SM_ABORT, SM_HOLD };

struct sctx {
    struct sctx *next; /* every context, freed by fx_server_destroy */
    struct vrpc_server_stream *s;
    enum smode mode;
    enum vrpc_method_kind kind;
    unsigned long n;
    size_t size;
    pthread_mutex_t mu; /* recursive: serialises on_read's work, the pump and finish */
    bool finished, cancelled, producing, stop;
    uint64_t next_seq, rsum;           /* client messages received */
    unsigned long accepted, completed; /* agen */
    uint64_t wsum;                     /* what was written */
    pthread_t th;
    bool has_thread;
    uint8_t *buf;
};

static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sctx *g_ctxs;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool released;
} g_stall = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};

void stall_arm(void)
{
    pthread_mutex_lock(&g_stall.lock);
    g_stall.released = false;
    pthread_mutex_unlock(&g_stall.lock);
}

void stall_release(void)
{
    pthread_mutex_lock(&g_stall.lock);
    g_stall.released = true;
    pthread_cond_broadcast(&g_stall.cond);
    pthread_mutex_unlock(&g_stall.lock);
}

static void hex_md(char *buf, size_t len, uint64_t v) { snprintf(buf, len, "%016" PRIx64, v); }

/* Under c->mu. The one place a stream ends on the server. */
static void sfinish_locked(struct sctx *c, enum vrpc_code code, const char *msg, bool trailers)
{
    char hs[24], hc[24];
    struct vrpc_metadata md[2] = {{"x-sum", hs, 16}, {"x-count", hc, 16}};
    if (c->finished)
        return;
    c->finished = true;
    hex_md(hs, sizeof(hs), c->kind == VRPC_METHOD_SERVER_STREAMING ? c->wsum : c->rsum);
    hex_md(hc, sizeof(hc), c->next_seq);
    int rc = vrpc_server_stream_finish(c->s, code, msg, trailers ? md : NULL, trailers ? 2 : 0);
    CNT(ended);
    if (rc == 0)
        CNT(finish_ok);
    else if (rc == -ECONNRESET)
        CNT(finish_reset);
}

static void sfinish(struct sctx *c, enum vrpc_code code, const char *msg, bool trailers)
{
    pthread_mutex_lock(&c->mu);
    sfinish_locked(c, code, msg, trailers);
    pthread_mutex_unlock(&c->mu);
}

static unsigned long md_ulong(struct vrpc_server_stream *s, const char *key)
{
    const void *v;
    size_t len;
    char buf[24];
    if (vrpc_server_stream_metadata_get(s, key, &v, &len) || len >= sizeof(buf))
        return 0;
    memcpy(buf, v, len);
    buf[len] = 0;
    return strtoul(buf, NULL, 10);
}

static void count_write_rc(int rc)
{
    if (rc == 0)
        __atomic_add_fetch(&g_srv.written, 1, __ATOMIC_RELAXED);
    else if (rc == -ECONNRESET)
        CNT(write_reset);
    else
        CNT(write_other);
}

static int write_one(struct sctx *c, uint64_t seq, const uint8_t *data, size_t len)
{
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.seq = seq;
    rep.payload.data = (uint8_t *)data;
    rep.payload.len = len;
    int rc = vrpc_server_stream_write(c->s, &rep.base);
    count_write_rc(rc);
    return rc;
}

static void *gen_main(void *arg)
{
    struct sctx *c = arg;
    int rc = 0;
    for (uint64_t i = 0; c->n == 0 || i < c->n; i++) {
        fill(c->buf, c->size, i);
        if ((rc = write_one(c, i, c->buf, c->size)) != 0)
            break;
        c->wsum = sum_add(c->wsum, i, c->buf, c->size);
    }
    sfinish(c, rc ? VRPC_CANCELLED : VRPC_OK, NULL, rc == 0);
    return NULL;
}

static void agen_pump(struct sctx *c);

static void agen_cb(struct vrpc_server_stream *s, int rc, void *arg)
{
    struct sctx *c = arg;
    (void)s;
    pthread_mutex_lock(&c->mu);
    c->completed++;
    count_write_rc(rc);
    if (rc)
        c->stop = true;
    pthread_mutex_unlock(&c->mu);
    agen_pump(c);
}

static void agen_pump(struct sctx *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->stop && !c->finished && (c->n == 0 || c->accepted < c->n)) {
        Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
        rep.seq = c->accepted;
        rep.payload.data = c->buf;
        rep.payload.len = c->size;
        fill(c->buf, c->size, c->accepted);
        int rc = vrpc_server_stream_write_async(c->s, &rep.base, agen_cb, c);
        if (rc == -EAGAIN)
            break;
        if (rc) {
            count_write_rc(rc);
            c->stop = true;
            break;
        }
        c->wsum = sum_add(c->wsum, c->accepted, c->buf, c->size);
        c->accepted++;
        __atomic_add_fetch(&g_srv.accepted, 1, __ATOMIC_RELAXED);
    }
    if (c->completed == c->accepted && (c->stop || (c->n && c->accepted == c->n)))
        sfinish_locked(c, c->stop ? VRPC_CANCELLED : VRPC_OK, NULL, !c->stop);
    pthread_mutex_unlock(&c->mu);
}

static void s_start(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    static const char *names[] = {"gen", "agen", "echo", "stall", "abort", "hold"};
    const void *v;
    size_t len;
    struct sctx *c = calloc(1, sizeof(*c));
    pthread_mutexattr_t a;
    assert_non_null(c);
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->mu, &a);
    pthread_mutexattr_destroy(&a);
    c->s = s;
    c->kind = vrpc_server_stream_method(s)->kind;
    c->mode = SM_HOLD;
    if (vrpc_server_stream_metadata_get(s, "x-mode", &v, &len) == 0)
        for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (strlen(names[i]) == len && !memcmp(names[i], v, len))
                c->mode = (enum smode)i;
    c->n = md_ulong(s, "x-n");
    c->size = md_ulong(s, "x-size");
    c->buf = malloc(c->size ? c->size : 1);
    assert_non_null(c->buf);
    pthread_mutex_lock(&g_ctx_lock);
    c->next = g_ctxs;
    g_ctxs = c;
    pthread_mutex_unlock(&g_ctx_lock);
    vrpc_server_stream_set_ctx(s, c);
    if (c->mode == SM_GEN || c->mode == SM_AGEN) {
        struct vrpc_metadata md = {"x-hello", "1", 1};
        assert_int_equal(vrpc_server_stream_send_metadata(s, &md, 1), 0);
    }
    CNT(started);
}

/* Wait in stall until released or cancelled. */
static void stall_wait(struct sctx *c)
{
    CNT(stalled);
    pthread_mutex_lock(&g_stall.lock);
    while (!g_stall.released && !__atomic_load_n(&c->cancelled, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&g_stall.cond, &g_stall.lock);
    pthread_mutex_unlock(&g_stall.lock);
    __atomic_sub_fetch(&g_srv.stalled, 1, __ATOMIC_RELAXED);
}

static void s_read(struct vrpc_server_stream *s, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    __atomic_add_fetch(&g_srv.received, 1, __ATOMIC_RELAXED);
    if (c->mode == SM_GEN || c->mode == SM_AGEN) {
        pthread_mutex_lock(&c->mu);
        c->producing = !c->cancelled;
        pthread_mutex_unlock(&c->mu);
        if (!c->producing)
            return;
        if (c->mode == SM_AGEN) {
            agen_pump(c);
        } else {
            pthread_mutex_lock(&c->mu); /* fx_server_destroy reads has_thread */
            c->has_thread = pthread_create(&c->th, NULL, gen_main, c) == 0;
            pthread_mutex_unlock(&c->mu);
            assert_true(c->has_thread);
        }
        return;
    }
    if (c->mode == SM_HOLD)
        return; /* read, never answered */
    if (c->mode == SM_STALL)
        stall_wait(c);
    pthread_mutex_lock(&c->mu);
    if (r->seq != c->next_seq || !check(r->payload.data, r->payload.len, r->seq))
        CNT(bad_order);
    c->rsum = sum_add(c->rsum, r->seq, r->payload.data, r->payload.len);
    c->next_seq++;
    if (c->kind == VRPC_METHOD_BIDI_STREAMING && !c->finished && !c->cancelled) {
        int rc = write_one(c, r->seq, r->payload.data, r->payload.len);
        if (rc && rc != -ECONNRESET) { /* the client must hear of it, not wait */
            char why[96];
            snprintf(why, sizeof(why), "echo of %zu bytes: write failed: %s", r->payload.len, strerror(-rc));
            sfinish_locked(c, VRPC_INTERNAL, why, false);
        }
    }
    if (c->mode == SM_ABORT && c->next_seq == c->n)
        sfinish_locked(c, VRPC_ABORTED, "server gave up", false);
    pthread_mutex_unlock(&c->mu);
}

static void s_half_close(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    if (c->mode == SM_GEN || c->mode == SM_AGEN || c->mode == SM_HOLD)
        return; /* gen ends when its writer does; hold when cancelled */
    pthread_mutex_lock(&c->mu);
    if (c->kind == VRPC_METHOD_CLIENT_STREAMING && !c->finished) {
        uint8_t sum[8];
        for (int i = 0; i < 8; i++)
            sum[i] = (uint8_t)(c->rsum >> (8 * i));
        write_one(c, c->next_seq, sum, sizeof(sum));
    }
    sfinish_locked(c, VRPC_OK, NULL, true);
    pthread_mutex_unlock(&c->mu);
}

static void s_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    struct sctx *c = vrpc_server_stream_ctx(s);
    CNT(cancels);
    __atomic_store_n(&c->cancelled, true, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_stall.lock);
    pthread_cond_broadcast(&g_stall.cond);
    pthread_mutex_unlock(&g_stall.lock);
    /* A producer ends the stream when its write fails, and may be in finish
     * right now holding c->mu, waiting for this callback to return: no
     * c->mu for it here. (producing is only written by s_read, a callback of
     * this stream like this one: they never run at once.) */
    if (c->producing)
        return;
    pthread_mutex_lock(&c->mu);
    sfinish_locked(c, VRPC_CANCELLED, NULL, false);
    pthread_mutex_unlock(&c->mu);
}

static const struct vrpc_server_stream_ops g_ops = {s_start, s_read, s_half_close, s_cancel};

static void h_unary(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

void fx_listen_uri(char *buf, size_t len)
{
    const char *ip = g_opt.server_ip;
    bool v6 = strchr(ip, ':') != NULL;
    snprintf(buf, len, "%s://%s%s%s:0", g_opt.backend, v6 ? "[" : "", ip, v6 ? "]" : "");
}

struct vrpc_server *fx_server_start(const struct srv_cfg *cfg, char *uri, size_t uri_len)
{
    struct vrpc_server_opts o;
    struct vrpc_server *s;
    char luri[VRPC_URI_MAX];
    vrpc_server_opts_init(&o);
    o.max_concurrent = cfg && cfg->max_concurrent ? cfg->max_concurrent : 256;
    o.stream_window = cfg ? cfg->stream_window : 0;
    o.threads = cfg && cfg->threads ? cfg->threads : 4;
    assert_int_equal(vrpc_server_create(&o, &s), 0);
    assert_int_equal(vrpc_server_register(s, &m_unary, h_unary, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_unary, &g_ops, NULL), -EINVAL);
    assert_int_equal(vrpc_server_register_stream(s, &m_sstream, &g_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_cstream, &g_ops, NULL), 0);
    assert_int_equal(vrpc_server_register_stream(s, &m_bidi, &g_ops, NULL), 0);
    fx_listen_uri(luri, sizeof(luri));
    assert_int_equal(vrpc_server_start(s, luri), 0);
    assert_int_equal(vrpc_server_uri(s, uri, uri_len), 0);
    return s;
}

void fx_server_destroy(struct vrpc_server *srv)
{
    vrpc_server_destroy(srv);
    pthread_mutex_lock(&g_ctx_lock);
    struct sctx *c = g_ctxs;
    g_ctxs = NULL;
    pthread_mutex_unlock(&g_ctx_lock);
    while (c) {
        struct sctx *next = c->next;
        pthread_mutex_lock(&c->mu);
        bool joinable = c->has_thread;
        pthread_mutex_unlock(&c->mu);
        if (joinable)
            pthread_join(c->th, NULL);
        pthread_mutex_destroy(&c->mu);
        free(c->buf);
        free(c);
        c = next;
    }
}

void fx_counts_reset(void) { memset(&g_srv, 0, sizeof(g_srv)); }

unsigned fx_wait_at_least(const unsigned *p, unsigned want, int timeout_ms)
{
    int64_t end = vrpc_now_ns() + (int64_t)timeout_ms * 1000000;
    unsigned v;
    while ((v = __atomic_load_n(p, __ATOMIC_ACQUIRE)) < want && vrpc_now_ns() < end)
        usleep(1000);
    return v;
}

/* ---- client helpers ------------------------------------------------------------------ */

struct vrpc_channel *fx_channel(const char *uri, uint32_t max_outstanding, uint32_t stream_window)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.max_outstanding = max_outstanding;
    o.stream_window = stream_window;
    o.src_addr = g_opt.client_ip;
    o.connect_timeout_ms = 5000;
    assert_int_equal(vrpc_channel_create(uri, &o, &ch), 0);
    assert_int_equal(vrpc_channel_connect(ch, 10000), 0);
    return ch;
}

struct vrpc_stream *fx_open(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const char *mode,
                            unsigned long n, size_t size, int64_t timeout_us, const struct vrpc_stream_cbs *cbs)
{
    return fx_open_flags(ch, m, mode, n, size, timeout_us, cbs, 0);
}

struct vrpc_stream *fx_open_flags(struct vrpc_channel *ch, const struct vrpc_method_desc *m, const char *mode,
                                  unsigned long n, size_t size, int64_t timeout_us, const struct vrpc_stream_cbs *cbs,
                                  uint32_t flags)
{
    char ns[24], ss[24];
    struct vrpc_stream *s = NULL;
    snprintf(ns, sizeof(ns), "%lu", n);
    snprintf(ss, sizeof(ss), "%zu", size);
    struct vrpc_metadata md[3] = {{"x-mode", mode, strlen(mode)}, {"x-n", ns, strlen(ns)}, {"x-size", ss, strlen(ss)}};
    struct vrpc_stream_opts o = {
        .call = {.timeout_us = timeout_us ? timeout_us : VRPC_NO_TIMEOUT, .md = md, .md_count = 3, .flags = flags},
        .cbs = cbs};
    assert_int_equal(vrpc_stream_start(ch, m, &o, &s), 0);
    assert_non_null(s);
    return s;
}

/* ---- child processes ----------------------------------------------------------------- */

int fx_spawn(const char *role, const char *arg, char *line, size_t line_len)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/proc/self/exe", g_opt.self, "--child", role, arg, "--backend", g_opt.backend, "--setup", g_opt.setup,
              (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t got = 0;
    int64_t end = vrpc_now_ns() + 30 * 1000000000ll;
    while (got + 1 < line_len && vrpc_now_ns() < end) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(fds[0], line + got, 1);
        if (r <= 0 || line[got] == '\n')
            break;
        got++;
    }
    line[got] = 0;
    close(fds[0]);
    return pid;
}

static int child_client(const char *uri)
{
    struct vrpc_channel *ch = fx_channel(uri, 16, 0);
    struct vrpc_stream *s = fx_open(ch, &m_sstream, "gen", 0, 32, 0, NULL);
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *msg;
    int rc;
    if ((rc = vrpc_stream_write(s, &r.base)) || (rc = vrpc_stream_close_send(s))) {
        fprintf(stderr, "child client: write/close_send: %s\n", strerror(-rc));
        return 1;
    }
    for (int i = 0; i < 10; i++)
        if ((rc = vrpc_stream_read(s, &msg)) != 0) {
            struct vrpc_status st;
            vrpc_stream_finish(s, NULL, &st);
            fprintf(stderr, "child client: read %d: %s (%s)\n", i, strerror(-rc), st.message);
            return 1;
        }
    printf("ready\n");
    fflush(stdout);
    sleep(120); /* killed long before */
    return 0;
}

int fx_child_main(const char *role, const char *arg)
{
    char uri[VRPC_URI_MAX];
    if (!strcmp(role, "client"))
        return child_client(arg);
    struct vrpc_server *srv = fx_server_start(NULL, uri, sizeof(uri));
    printf("%s\n", uri);
    fflush(stdout);
    sleep(120); /* killed long before */
    fx_server_destroy(srv);
    return 0;
}

/* ---- command line -------------------------------------------------------------------- */

int fx_parse(int argc, char **argv)
{
    const char *child = NULL, *child_arg = "";
    g_opt.backend = "tcp";
    g_opt.setup = "local";
    g_opt.scale = 1;
    g_opt.self = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            g_opt.backend = argv[++i];
        } else if (!strcmp(argv[i], "--setup") && i + 1 < argc) {
            g_opt.setup = argv[++i];
        } else if (!strcmp(argv[i], "--child") && i + 2 < argc) {
            child = argv[++i];
            child_arg = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--backend tcp|verbs] [--setup local|single|veth]\n"
                    "verbs: --setup single reads VRPC_VERBS_IP; --setup veth reads\n"
                    "VRPC_VERBS_IP_A (client) and VRPC_VERBS_IP_B (server).\n"
                    "VRPC_TEST_SCALE=N divides the message and stream counts;\n"
                    "VRPC_TEST_ONLY=a,b runs the cases whose names contain a or b.\n",
                    argv[0]);
            return 2;
        }
    }
    m_unary.id = vrpc_method_id(m_unary.full_name);
    m_sstream.id = vrpc_method_id(m_sstream.full_name);
    m_cstream.id = vrpc_method_id(m_cstream.full_name);
    m_bidi.id = vrpc_method_id(m_bidi.full_name);
    const char *sc = getenv("VRPC_TEST_SCALE");
    if (sc && atoi(sc) > 0)
        g_opt.scale = (unsigned)atoi(sc);
    int rc = vrpc_test_backend_addrs(g_opt.backend, g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
    if (rc)
        return rc;
    setenv("VRPC_LOG", getenv("VRPC_LOG") ? getenv("VRPC_LOG") : "1", 0);
    if (child)
        exit(fx_child_main(child, child_arg));
    printf("# stream tests: backend %s, setup %s, scale 1/%u\n", g_opt.backend, g_opt.setup, g_opt.scale);
    return 0;
}

/* True if name contains one of the comma-separated parts of list. */
static bool fx_name_in(const char *name, const char *list)
{
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char part[64];
        snprintf(part, sizeof(part), "%.*s", (int)l, p);
        if (l && strstr(name, part))
            return true;
        p = e ? e + 1 : p + l;
    }
    return false;
}

int fx_run(const char *group, const struct CMUnitTest *tests, size_t n, CMFixtureFunction setup,
           CMFixtureFunction teardown)
{
    struct CMUnitTest *sel = calloc(n ? n : 1, sizeof(*sel));
    size_t nsel = 0;
    const char *only = getenv("VRPC_TEST_ONLY"), *skip = getenv("VRPC_TEST_SKIP");
    for (size_t i = 0; i < n; i++) {
        bool take = !only && !fx_name_in(tests[i].name, skip);
        if (only)
            take = fx_name_in(tests[i].name, only);
        if (take)
            sel[nsel++] = tests[i];
    }
    int rc = _cmocka_run_group_tests(group, sel, nsel, setup, teardown);
    free(sel);
    return rc;
}

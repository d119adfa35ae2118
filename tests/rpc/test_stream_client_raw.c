/* The client's streams against a fake server that writes frames by hand
 * (TCP): the stream's REQUEST, windows both ways (the client's writes stop
 * at the server's window, the client returns window only as it reads),
 * initial and trailing metadata, the ends (RESPONSE, deadline, cancel,
 * connection loss, channel destroy) exactly once, async reads and writes,
 * and every bad frame a server may send (the connection closes, the stream
 * ends UNAVAILABLE). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/transport.h>
#include "rpc/wire.h"
#include "rpc_test.pb-c.h"

#define MD(name, kind)                                                                                                 \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL, kind  \
    }
static struct vrpc_method_desc m_bidi = MD("Bidi", VRPC_METHOD_BIDI_STREAMING);
static struct vrpc_method_desc m_sstream = MD("Watch", VRPC_METHOD_SERVER_STREAMING);
static struct vrpc_method_desc m_cstream = MD("Upload", VRPC_METHOD_CLIENT_STREAMING);
static struct vrpc_method_desc m_unary = MD("Echo", VRPC_METHOD_UNARY);

/* ---- the fake server -------------------------------------------------------- */

#define NREC 4096
struct rec {
    struct vrpc_wire_hdr h;
    uint8_t body[256]; /* md + payload, cut */
};

struct fake {
    struct vrpc_transport *tp;
    struct vrpc_cq *cq;
    struct vrpc_pool *pool;
    struct vrpc_listener *l;
    struct vrpc_ep *ep; /* accepted (atomic) */
    char uri[VRPC_URI_MAX];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct rec *recs;
    unsigned n;            /* frames recorded (under lock) */
    unsigned disconnected; /* atomic */
    unsigned nreads;       /* READ completions (atomic) */
    int read_status;
    uint32_t window; /* the HELLO_ACK's stream_window */
};

static void fake_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct fake *f = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->opcode == VRPC_WC_RECV) {
            if (w->status == 0) {
                struct vrpc_wire_hdr h;
                if (vrpc_wire_hdr_decode(w->buf->data, w->byte_len, &h) == 0) {
                    pthread_mutex_lock(&f->lock);
                    if (f->n < NREC) {
                        f->recs[f->n].h = h;
                        uint32_t bl = w->byte_len - VRPC_WIRE_HDR_LEN;
                        memcpy(f->recs[f->n].body, w->buf->data + VRPC_WIRE_HDR_LEN, bl < 256 ? bl : 256);
                        f->n++;
                    }
                    pthread_cond_broadcast(&f->cond);
                    pthread_mutex_unlock(&f->lock);
                }
            }
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
        } else if (w->opcode == VRPC_WC_SEND) {
            vrpc_pool_put(w->buf);
        } else if (w->opcode == VRPC_WC_ACCEPTED) {
            __atomic_store_n(&f->ep, w->ep, __ATOMIC_RELEASE);
        } else if (w->opcode == VRPC_WC_READ) {
            f->read_status = w->status;
            __atomic_add_fetch(&f->nreads, 1, __ATOMIC_RELEASE);
        } else if (w->opcode == VRPC_WC_DISCONNECTED) {
            __atomic_add_fetch(&f->disconnected, 1, __ATOMIC_RELEASE);
        }
    }
}

static void fake_send(struct fake *f, const struct vrpc_wire_hdr *h0, const void *md, const void *payload)
{
    struct vrpc_wire_hdr h = *h0;
    h.version = VRPC_WIRE_VERSION;
    struct vrpc_buf *b;
    for (int i = 0; i < 2000 && !(b = vrpc_pool_get(f->pool)); i++)
        usleep(1000);
    assert_non_null(b);
    vrpc_wire_hdr_encode(b->data, &h);
    if (h.md_len)
        memcpy(b->data + VRPC_WIRE_HDR_LEN, md, h.md_len);
    if (h.payload_len)
        memcpy(b->data + VRPC_WIRE_HDR_LEN + h.md_len, payload, h.payload_len);
    struct vrpc_ep *ep = __atomic_load_n(&f->ep, __ATOMIC_ACQUIRE);
    assert_non_null(ep);
    int rc;
    for (int i = 0;
         i < 2000 && (rc = vrpc_ep_send(ep, b, VRPC_WIRE_HDR_LEN + h.md_len + h.payload_len, 0, 0, 0)) == -EAGAIN; i++)
        usleep(1000);
    assert_int_equal(rc, 0);
}

/* The index of the first frame of type at or after *from (then *from is
 * past it), waiting up to ms; -1 if none came. */
static int fake_wait(struct fake *f, uint8_t type, unsigned *from, int ms)
{
    pthread_mutex_lock(&f->lock);
    for (int waited = 0;; waited += 10) {
        for (unsigned i = *from; i < f->n; i++) {
            if (f->recs[i].h.type == type) {
                *from = i + 1;
                pthread_mutex_unlock(&f->lock);
                return (int)i;
            }
        }
        if (waited >= ms)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&f->cond, &f->lock, &ts);
    }
    pthread_mutex_unlock(&f->lock);
    return -1;
}

static unsigned fake_count(struct fake *f, uint8_t type);
/* Wait up to 5 s for n frames of type; the count seen. */
static unsigned fake_wait_count(struct fake *f, uint8_t type, unsigned n)
{
    unsigned k = 0;
    for (int i = 0; i < 5000 && (k = fake_count(f, type)) < n; i++)
        usleep(1000);
    return k;
}

static unsigned fake_count(struct fake *f, uint8_t type)
{
    unsigned k = 0;
    pthread_mutex_lock(&f->lock);
    for (unsigned i = 0; i < f->n; i++)
        k += f->recs[i].h.type == type;
    pthread_mutex_unlock(&f->lock);
    return k;
}

/* The sum of the WINDOW increments the client sent. */
static uint64_t fake_window_sum(struct fake *f)
{
    uint64_t sum = 0;
    pthread_mutex_lock(&f->lock);
    for (unsigned i = 0; i < f->n; i++) {
        uint32_t n;
        if (f->recs[i].h.type == VRPC_FT_WINDOW && vrpc_wire_window_decode(f->recs[i].body, 4, &n) == 0)
            sum += n;
    }
    pthread_mutex_unlock(&f->lock);
    return sum;
}

static void fake_open(struct fake *f, uint32_t window)
{
    struct vrpc_cq_attr ca;
    memset(f, 0, sizeof(*f));
    f->window = window;
    f->recs = calloc(NREC, sizeof(*f->recs));
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    assert_int_equal(vrpc_transport_create("tcp", NULL, &f->tp), 0);
    assert_int_equal(vrpc_pool_create(f->tp, vrpc_transport_eager_size(f->tp), 256, &f->pool), 0);
    vrpc_cq_attr_init(&ca);
    ca.cb = fake_cb;
    ca.cb_arg = f;
    assert_int_equal(vrpc_cq_create(f->tp, &ca, &f->cq), 0);
    for (int i = 0; i < 64; i++) {
        struct vrpc_buf *b = vrpc_pool_get(f->pool);
        assert_int_equal(vrpc_cq_post_recv(f->cq, &b, NULL, 1), 0);
    }
    struct vrpc_listen_attr la = {.cqs = &f->cq, .ncqs = 1};
    assert_int_equal(vrpc_listen(f->tp, "tcp://127.0.0.1:0", &la, &f->l), 0);
    assert_int_equal(vrpc_listener_uri(f->l, f->uri, sizeof(f->uri)), 0);
}

/* Answer the client's HELLO (stream window f->window). */
static void fake_hello(struct fake *f)
{
    unsigned from = 0;
    assert_true(fake_wait(f, VRPC_FT_HELLO, &from, 5000) >= 0);
    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 1 << 20,
                                 .max_concurrent = 64,
                                 .features = VRPC_FEAT_STREAM | VRPC_FEAT_LARGE,
                                 .stream_window = f->window};
    vrpc_wire_hello_encode(p, &hs);
    struct vrpc_wire_hdr h = {.type = VRPC_FT_HELLO_ACK, .payload_len = sizeof(p)};
    fake_send(f, &h, NULL, p);
}

static void fake_close(struct fake *f)
{
    struct vrpc_ep *ep = __atomic_load_n(&f->ep, __ATOMIC_ACQUIRE);
    if (ep) {
        vrpc_ep_close(ep);
        for (int i = 0; i < 5000 && !__atomic_load_n(&f->disconnected, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
        vrpc_ep_destroy(ep);
    }
    vrpc_listener_destroy(f->l);
    vrpc_cq_destroy(f->cq);
    vrpc_pool_destroy(f->pool);
    vrpc_transport_destroy(f->tp);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cond);
    free(f->recs);
}

/* ---- helpers ------------------------------------------------------------------ */

static struct vrpc_channel *new_channel(const char *uri, uint32_t window)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.stream_window = window;
    o.no_spin = true;
    assert_int_equal(vrpc_channel_create(uri, &o, &ch), 0);
    return ch;
}

/* Connect ch to f (answering the HELLO from this thread). */
struct conn_arg {
    struct vrpc_channel *ch;
    int rc;
};
static void *connect_main(void *arg)
{
    struct conn_arg *a = arg;
    a->rc = vrpc_channel_connect(a->ch, 5000);
    return NULL;
}
static void connect_fake(struct vrpc_channel *ch, struct fake *f)
{
    pthread_t t;
    struct conn_arg a = {.ch = ch};
    pthread_create(&t, NULL, connect_main, &a);
    fake_hello(f);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, 0);
}

/* A server frame on stream id (payload an EchoReply of seq, or raw bytes). */
static void srv_msg(struct fake *f, uint64_t id, uint64_t seq)
{
    Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
    uint8_t buf[64];
    r.seq = seq;
    size_t n = vrpctest__echo_reply__pack(&r, buf);
    struct vrpc_wire_hdr h = {.type = VRPC_FT_MESSAGE, .request_id = id, .payload_len = (uint32_t)n};
    fake_send(f, &h, NULL, buf);
}

static void srv_window(struct fake *f, uint64_t id, uint32_t n)
{
    uint8_t p[VRPC_WIRE_WINDOW_LEN];
    vrpc_wire_window_encode(p, n);
    struct vrpc_wire_hdr h = {.type = VRPC_FT_WINDOW, .request_id = id, .payload_len = sizeof(p)};
    fake_send(f, &h, NULL, p);
}

/* RESPONSE ending stream id: code, message, one trailer "t" = tval. */
static void srv_end(struct fake *f, uint64_t id, enum vrpc_code code, const char *msg, const char *tval)
{
    uint8_t md[128];
    struct vrpc_wire_hdr h = {.type = VRPC_FT_RESPONSE, .request_id = id, .status = code};
    if (tval) {
        struct vrpc_metadata e = {.key = "t", .value = tval, .value_len = strlen(tval)};
        h.md_len = (uint32_t)vrpc_wire_md_size(&e, 1);
        vrpc_wire_md_encode(md, &e, 1);
    }
    h.payload_len = msg ? (uint32_t)strlen(msg) : 0;
    fake_send(f, &h, md, msg);
}

static void srv_headers(struct fake *f, uint64_t id, const char *key, const char *val)
{
    uint8_t md[128];
    struct vrpc_metadata e = {.key = key, .value = val, .value_len = strlen(val)};
    struct vrpc_wire_hdr h = {.type = VRPC_FT_HEADERS, .request_id = id};
    h.md_len = (uint32_t)vrpc_wire_md_size(&e, 1);
    vrpc_wire_md_encode(md, &e, 1);
    fake_send(f, &h, md, NULL);
}

/* Start a stream of m on ch and return the REQUEST the fake server saw. */
static struct vrpc_stream *open_stream(struct vrpc_channel *ch, struct fake *f, const struct vrpc_method_desc *m,
                                       const struct vrpc_stream_opts *o, unsigned *from, uint64_t *id)
{
    struct vrpc_stream *s = NULL;
    assert_int_equal(vrpc_stream_start(ch, m, o, &s), 0);
    assert_non_null(s);
    int i = fake_wait(f, VRPC_FT_REQUEST, from, 5000);
    assert_true(i >= 0);
    struct vrpc_wire_hdr h = f->recs[i].h;
    assert_true(h.flags & VRPC_FF_STREAM);
    assert_int_equal(h.payload_len, 0);
    assert_int_equal(h.method_id, m->id);
    *id = h.request_id;
    return s;
}

static Vrpctest__EchoRequest req_of(uint64_t seq)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.seq = seq;
    return r;
}

struct writer {
    struct vrpc_stream *s;
    int n, rc;
    unsigned done; /* writes completed (atomic) */
};
static void *writer_main(void *arg)
{
    struct writer *w = arg;
    for (int i = 0; i < w->n; i++) {
        Vrpctest__EchoRequest r = req_of((uint64_t)i);
        if ((w->rc = vrpc_stream_write(w->s, &r.base)))
            break;
        __atomic_add_fetch(&w->done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* ---- tests --------------------------------------------------------------------- */

/* Bidi, synchronous: writes stop at the server's window of 2 and go on when
 * it returns window; the client returns window (window 4: after each read)
 * only as it reads; metadata both ends; RESPONSE OK ends it once. */
static void test_bidi_sync_windows(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 2);
    struct vrpc_channel *ch = new_channel(f.uri, 4);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);

    struct writer w = {.s = s, .n = 5};
    pthread_t t;
    pthread_create(&t, NULL, writer_main, &w);
    unsigned mfrom = from;
    assert_true(fake_wait(&f, VRPC_FT_MESSAGE, &mfrom, 5000) >= 0);
    assert_true(fake_wait(&f, VRPC_FT_MESSAGE, &mfrom, 5000) >= 0);
    /* the window is closed: no third message however long we wait a bit */
    assert_int_equal(fake_wait(&f, VRPC_FT_MESSAGE, &mfrom, 200), -1);
    assert_int_equal(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), 2);
    srv_window(&f, id, 3);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    assert_int_equal(fake_wait_count(&f, VRPC_FT_MESSAGE, 5), 5);
    /* their order and content */
    pthread_mutex_lock(&f.lock);
    uint64_t seq = 0;
    for (unsigned i = 0; i < f.n; i++) {
        if (f.recs[i].h.type != VRPC_FT_MESSAGE)
            continue;
        Vrpctest__EchoRequest *r = vrpctest__echo_request__unpack(NULL, f.recs[i].h.payload_len, f.recs[i].body);
        assert_non_null(r);
        assert_int_equal(r->seq, seq++);
        assert_int_equal(f.recs[i].h.request_id, id);
        vrpctest__echo_request__free_unpacked(r, NULL);
    }
    pthread_mutex_unlock(&f.lock);

    /* server -> client: the client's window is 4; it returns window as it reads */
    srv_headers(&f, id, "k", "v1");
    for (uint64_t i = 0; i < 4; i++)
        srv_msg(&f, id, i);
    usleep(100000);
    assert_int_equal(fake_window_sum(&f), 0); /* nothing read yet */
    ProtobufCMessage *msg;
    for (uint64_t i = 0; i < 4; i++) {
        assert_int_equal(vrpc_stream_read(s, &msg), 0);
        assert_int_equal(((Vrpctest__EchoReply *)msg)->seq, i);
    }
    for (int i = 0; i < 500 && fake_window_sum(&f) < 4; i++)
        usleep(1000);
    assert_int_equal(fake_window_sum(&f), 4);
    const void *v;
    size_t vl;
    assert_int_equal(vrpc_stream_initial_metadata_get(s, "k", &v, &vl), 0);
    assert_int_equal(vl, 2);
    assert_memory_equal(v, "v1", 2);
    assert_int_equal(vrpc_stream_close_send(s), 0);
    assert_int_equal(vrpc_stream_close_send(s), -EALREADY);
    assert_true(fake_wait(&f, VRPC_FT_HALF_CLOSE, &from, 5000) >= 0);
    Vrpctest__EchoRequest r = req_of(9);
    assert_int_equal(vrpc_stream_write(s, &r.base), -EPIPE);
    srv_end(&f, id, VRPC_OK, NULL, "bye");
    assert_int_equal(vrpc_stream_read(s, &msg), -ENODATA);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_OK);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK); /* the same again */
    assert_int_equal(vrpc_stream_trailing_metadata_get(s, "t", &v, &vl), 0);
    assert_int_equal(vl, 3);
    assert_memory_equal(v, "bye", 3);
    assert_int_equal(vrpc_stream_trailing_metadata_get(s, "nope", &v, &vl), -ENOENT);
    vrpc_stream_destroy(s);
    /* the slot is free again: a second stream opens on the same connection */
    s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    srv_end(&f, id, VRPC_NOT_FOUND, "gone", NULL);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_NOT_FOUND);
    assert_string_equal(st.message, "gone");
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    fake_close(&f);
}

/* Deadline, cancel and vrpc_channel_cancel end a stream exactly once with
 * their status and send CANCEL; frames crossing the CANCEL are dropped. */
static void test_deadline_and_cancel(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id, cid = 0;
    struct vrpc_stream_opts o = {.call = {.timeout_us = 100000}};
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, &o, &from, &id);
    ProtobufCMessage *msg;
    assert_int_equal(vrpc_stream_read(s, &msg), -ENODATA);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_DEADLINE_EXCEEDED);
    unsigned cf = from;
    int ci = fake_wait(&f, VRPC_FT_CANCEL, &cf, 5000);
    assert_true(ci >= 0);
    assert_int_equal(f.recs[ci].h.request_id, id);
    Vrpctest__EchoRequest r = req_of(1);
    assert_int_equal(vrpc_stream_write(s, &r.base), -ETIMEDOUT);
    srv_msg(&f, id, 1); /* crossed the CANCEL: dropped, the connection stays */
    srv_end(&f, id, VRPC_CANCELLED, NULL, NULL);
    vrpc_stream_destroy(s);

    s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    vrpc_stream_cancel(s);
    vrpc_stream_cancel(s);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_CANCELLED);
    srv_end(&f, id, VRPC_CANCELLED, NULL, NULL);
    vrpc_stream_destroy(s);

    o.call.timeout_us = 0;
    o.call.call_id = &cid;
    s = open_stream(ch, &f, &m_bidi, &o, &from, &id);
    assert_int_equal(cid, id);
    assert_int_equal(vrpc_channel_cancel(ch, cid), 0);
    assert_int_equal(vrpc_channel_cancel(ch, cid), -ENOENT);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_CANCELLED);
    vrpc_stream_destroy(s); /* before the server's answer: the slot waits for it */
    srv_end(&f, id, VRPC_CANCELLED, NULL, NULL);
    assert_int_equal(fake_wait_count(&f, VRPC_FT_CANCEL, 3), 3);
    assert_int_equal(__atomic_load_n(&f.disconnected, __ATOMIC_ACQUIRE), 0);
    vrpc_channel_destroy(ch);
    fake_close(&f);
}

/* Connection loss ends open streams UNAVAILABLE; channel destroy ends them
 * CANCELLED (the stream is destroyed after the channel). */
static void test_loss_and_channel_destroy(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    srv_msg(&f, id, 7);
    ProtobufCMessage *msg;
    assert_int_equal(vrpc_stream_read(s, &msg), 0);
    vrpc_ep_close(__atomic_load_n(&f.ep, __ATOMIC_ACQUIRE));
    assert_int_equal(vrpc_stream_read(s, &msg), -ENODATA);
    struct vrpc_status st;
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_UNAVAILABLE);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    fake_close(&f);

    fake_open(&f, 8);
    ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    from = 0;
    s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    vrpc_channel_destroy(ch);
    assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_CANCELLED);
    vrpc_stream_destroy(s);
    fake_close(&f);
}

/* GOAWAY: the open stream goes on on its connection (messages both ways,
 * its end); a new stream goes to a new connection. */
struct start_bg {
    struct vrpc_channel *ch;
    struct vrpc_stream *s;
    int rc;
};
static void *start_main(void *arg)
{
    struct start_bg *b = arg;
    b->rc = vrpc_stream_start(b->ch, &m_bidi, NULL, &b->s);
    return NULL;
}

static void test_goaway(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    struct vrpc_ep *ep1 = __atomic_load_n(&f.ep, __ATOMIC_ACQUIRE);
    struct vrpc_wire_hdr g = {.type = VRPC_FT_GOAWAY};
    fake_send(&f, &g, NULL, NULL);
    for (int i = 0; i < 5000 && vrpc_channel_state(ch) == VRPC_CHANNEL_READY; i++)
        usleep(1000);
    assert_int_not_equal(vrpc_channel_state(ch), VRPC_CHANNEL_READY);
    /* a new stream: a second connection (its HELLO answered here) */
    struct start_bg b = {.ch = ch};
    pthread_t t;
    pthread_create(&t, NULL, start_main, &b);
    unsigned hf = from;
    assert_true(fake_wait(&f, VRPC_FT_HELLO, &hf, 5000) >= 0);
    for (int i = 0; i < 5000 && __atomic_load_n(&f.ep, __ATOMIC_ACQUIRE) == ep1; i++)
        usleep(1000);
    struct vrpc_ep *ep2 = __atomic_load_n(&f.ep, __ATOMIC_ACQUIRE);
    assert_ptr_not_equal(ep2, ep1);
    uint8_t p[VRPC_WIRE_HELLO_LEN];
    struct vrpc_wire_hello hs = {.max_msg_size = 1 << 20,
                                 .max_concurrent = 64,
                                 .features = VRPC_FEAT_STREAM | VRPC_FEAT_LARGE,
                                 .stream_window = 8};
    vrpc_wire_hello_encode(p, &hs);
    struct vrpc_wire_hdr ha = {.type = VRPC_FT_HELLO_ACK, .payload_len = sizeof(p)};
    fake_send(&f, &ha, NULL, p);
    pthread_join(t, NULL);
    assert_int_equal(b.rc, 0);
    unsigned rf = hf;
    int ri = fake_wait(&f, VRPC_FT_REQUEST, &rf, 5000);
    assert_true(ri >= 0);
    uint64_t id2 = f.recs[ri].h.request_id;
    /* the old stream, on the old connection, both ways */
    Vrpctest__EchoRequest r = req_of(4);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    unsigned mf = hf;
    assert_true(fake_wait(&f, VRPC_FT_MESSAGE, &mf, 5000) >= 0);
    __atomic_store_n(&f.ep, ep1, __ATOMIC_RELEASE);
    srv_msg(&f, id, 8);
    srv_end(&f, id, VRPC_OK, NULL, NULL);
    ProtobufCMessage *msg;
    assert_int_equal(vrpc_stream_read(s, &msg), 0);
    assert_int_equal(((Vrpctest__EchoReply *)msg)->seq, 8);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);
    __atomic_store_n(&f.ep, ep2, __ATOMIC_RELEASE);
    srv_end(&f, id2, VRPC_OK, NULL, NULL);
    assert_int_equal(vrpc_stream_finish(b.s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(b.s);
    vrpc_channel_destroy(ch);
    vrpc_ep_close(ep1);
    vrpc_ep_destroy(ep1);
    fake_close(&f);
}

/* Each bad frame a server may send closes the connection and ends the
 * stream UNAVAILABLE. */
enum bad {
    BAD_UNKNOWN_ID,
    BAD_BEYOND_WINDOW,
    BAD_HEADERS_TWICE,
    BAD_HEADERS_AFTER_MSG,
    BAD_END_FLAG,
    BAD_HALF_CLOSE,
    BAD_WINDOW_OVERFLOW,
    BAD_WINDOW_UNARY,
    BAD_COUNT
};

static void send_bad(struct fake *f, enum bad k, uint64_t id, uint64_t unary_id)
{
    struct vrpc_wire_hdr h = {.type = VRPC_FT_MESSAGE, .request_id = id};
    switch (k) {
    case BAD_UNKNOWN_ID:
        srv_msg(f, id + (1ull << 32), 1);
        break;
    case BAD_BEYOND_WINDOW:
        for (int i = 0; i < 3; i++) /* the client's window is 2 */
            srv_msg(f, id, (uint64_t)i);
        break;
    case BAD_HEADERS_TWICE:
        srv_headers(f, id, "a", "1");
        srv_headers(f, id, "a", "2");
        break;
    case BAD_HEADERS_AFTER_MSG:
        srv_msg(f, id, 1);
        srv_headers(f, id, "a", "1");
        break;
    case BAD_END_FLAG:
        h.flags = VRPC_FF_END;
        fake_send(f, &h, NULL, NULL);
        break;
    case BAD_HALF_CLOSE:
        h.type = VRPC_FT_HALF_CLOSE;
        fake_send(f, &h, NULL, NULL);
        break;
    case BAD_WINDOW_OVERFLOW:
        srv_window(f, id, VRPC_WIRE_WINDOW_SUM_MAX);
        break;
    case BAD_WINDOW_UNARY:
        srv_window(f, unary_id, 1);
        break;
    default:
        break;
    }
}

struct unary_bg {
    struct vrpc_channel *ch;
    int code;
};
static void *unary_main(void *arg)
{
    struct unary_bg *u = arg;
    Vrpctest__EchoRequest r = req_of(1);
    ProtobufCMessage *resp;
    struct vrpc_status st;
    u->code = vrpc_call(u->ch, &m_unary, &r.base, &resp, NULL, &st);
    return NULL;
}

static void test_bad_server_frames(void **state)
{
    (void)state;
    for (int k = 0; k < BAD_COUNT; k++) {
        struct fake f;
        fake_open(&f, 8);
        struct vrpc_channel *ch = new_channel(f.uri, 2);
        connect_fake(ch, &f);
        unsigned from = 0;
        uint64_t id, uid = 0;
        struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
        struct unary_bg u = {.ch = ch};
        pthread_t t;
        if (k == BAD_WINDOW_UNARY) {
            pthread_create(&t, NULL, unary_main, &u);
            int i = fake_wait(&f, VRPC_FT_REQUEST, &from, 5000);
            assert_true(i >= 0);
            uid = f.recs[i].h.request_id;
        }
        send_bad(&f, (enum bad)k, id, uid);
        for (int i = 0; i < 5000 && !__atomic_load_n(&f.disconnected, __ATOMIC_ACQUIRE); i++)
            usleep(1000);
        if (!__atomic_load_n(&f.disconnected, __ATOMIC_ACQUIRE))
            fail_msg("bad frame kind %d did not close the connection", k);
        struct vrpc_status st;
        assert_int_equal(vrpc_stream_finish(s, NULL, &st), VRPC_UNAVAILABLE);
        if (k == BAD_WINDOW_UNARY) {
            pthread_join(t, NULL);
            assert_int_equal(u.code, VRPC_UNAVAILABLE);
        }
        vrpc_stream_destroy(s);
        vrpc_channel_destroy(ch);
        fake_close(&f);
    }
}

/* Callbacks: on_read in order, one at a time; on_done once, last; async
 * writes stop at the window and complete in order; destroy from on_done. */
struct cbs_state {
    pthread_mutex_t lock;
    uint64_t next;
    unsigned reads, dones, writes_ok, writes_bad;
    int code;
    bool bad_order;
    unsigned destroyed;
};

static void cb_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    struct cbs_state *c = arg;
    (void)s;
    pthread_mutex_lock(&c->lock);
    if (((const Vrpctest__EchoReply *)msg)->seq != c->next++ || c->dones)
        c->bad_order = true;
    c->reads++;
    pthread_mutex_unlock(&c->lock);
}

static void cb_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct cbs_state *c = arg;
    (void)resp;
    pthread_mutex_lock(&c->lock);
    c->dones++;
    c->code = st->code;
    pthread_mutex_unlock(&c->lock);
    vrpc_stream_destroy(s);
    __atomic_store_n(&c->destroyed, 1, __ATOMIC_RELEASE);
}

static void cb_write(struct vrpc_stream *s, int rc, void *arg)
{
    struct cbs_state *c = arg;
    (void)s;
    pthread_mutex_lock(&c->lock);
    if (rc == 0)
        c->writes_ok++;
    else
        c->writes_bad++;
    pthread_mutex_unlock(&c->lock);
}

static unsigned locked_read(struct cbs_state *c, unsigned *p)
{
    pthread_mutex_lock(&c->lock);
    unsigned v = *p;
    pthread_mutex_unlock(&c->lock);
    return v;
}

static void test_callbacks_and_async_writes(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 2);
    struct vrpc_channel *ch = new_channel(f.uri, 4);
    connect_fake(ch, &f);
    struct cbs_state c = {.lock = PTHREAD_MUTEX_INITIALIZER};
    struct vrpc_stream_cbs cbs = {.on_read = cb_read, .on_done = cb_done, .arg = &c};
    struct vrpc_stream_opts o = {.cbs = &cbs};
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, &o, &from, &id);
    ProtobufCMessage *msg;
    assert_int_equal(vrpc_stream_read(s, &msg), -EINVAL);
    for (int i = 0; i < 5; i++) {
        Vrpctest__EchoRequest r = req_of((uint64_t)i);
        assert_int_equal(vrpc_stream_write_async(s, &r.base, cb_write, &c), 0);
    }
    unsigned mf = from;
    assert_true(fake_wait(&f, VRPC_FT_MESSAGE, &mf, 5000) >= 0);
    assert_true(fake_wait(&f, VRPC_FT_MESSAGE, &mf, 5000) >= 0);
    assert_int_equal(fake_wait(&f, VRPC_FT_MESSAGE, &mf, 200), -1);
    assert_int_equal(locked_read(&c, &c.writes_ok), 2);
    assert_int_equal(vrpc_stream_close_send(s), 0); /* goes after the queued three */
    srv_window(&f, id, 10);
    assert_true(fake_wait(&f, VRPC_FT_HALF_CLOSE, &mf, 5000) >= 0);
    assert_int_equal(fake_wait_count(&f, VRPC_FT_MESSAGE, 5), 5);
    assert_int_equal(locked_read(&c, &c.writes_ok), 5);
    for (uint64_t i = 0; i < 40; i++) {
        /* within the client's window of 4, returned as the callbacks run */
        while (fake_window_sum(&f) + 4 <= i)
            usleep(1000);
        srv_msg(&f, id, i);
    }
    srv_end(&f, id, VRPC_OK, NULL, NULL);
    for (int i = 0; i < 5000 && !__atomic_load_n(&c.destroyed, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&c.destroyed, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(c.reads, 40);
    assert_int_equal(c.dones, 1);
    assert_int_equal(c.code, VRPC_OK);
    assert_false(c.bad_order);
    assert_int_equal(c.writes_bad, 0);
    vrpc_channel_destroy(ch);
    fake_close(&f);
}

struct answer {
    struct fake *f;
    uint64_t id;
    unsigned from;
    bool ok;
};
static void *answer_main(void *arg)
{
    struct answer *a = arg;
    a->ok = fake_wait(a->f, VRPC_FT_HALF_CLOSE, &a->from, 5000) >= 0;
    srv_msg(a->f, a->id, 42);
    srv_end(a->f, a->id, VRPC_OK, NULL, NULL);
    return NULL;
}

/* Server streaming takes one message; client streaming's response comes
 * from finish; vrpc_call of a streaming method fails UNIMPLEMENTED without
 * sending; a unary method does not start a stream. */
static void test_shapes(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = NULL;
    assert_int_equal(vrpc_stream_start(ch, &m_unary, NULL, &s), -EINVAL);
    assert_null(s);
    Vrpctest__EchoRequest r = req_of(1);
    ProtobufCMessage *resp;
    struct vrpc_status st;
    unsigned before = fake_count(&f, VRPC_FT_REQUEST);
    assert_int_equal(vrpc_call(ch, &m_bidi, &r.base, &resp, NULL, &st), VRPC_UNIMPLEMENTED);
    assert_int_equal(fake_count(&f, VRPC_FT_REQUEST), before);

    s = open_stream(ch, &f, &m_sstream, NULL, &from, &id);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    assert_int_equal(vrpc_stream_write(s, &r.base), -EINVAL);
    Vrpctest__EchoReply wrong = VRPCTEST__ECHO_REPLY__INIT;
    assert_int_equal(vrpc_stream_write(s, &wrong.base), -EINVAL);
    srv_msg(&f, id, 5);
    srv_end(&f, id, VRPC_OK, NULL, NULL);
    ProtobufCMessage *msg;
    assert_int_equal(vrpc_stream_read(s, &msg), 0);
    assert_int_equal(((Vrpctest__EchoReply *)msg)->seq, 5);
    assert_int_equal(vrpc_stream_read(s, &msg), -ENODATA);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);

    s = open_stream(ch, &f, &m_cstream, NULL, &from, &id);
    for (int i = 0; i < 3; i++)
        assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    /* the server answers once the client half-closed, which finish does */
    struct answer a = {.f = &f, .id = id, .from = from};
    pthread_t t;
    pthread_create(&t, NULL, answer_main, &a);
    assert_int_equal(vrpc_stream_finish(s, &resp, &st), VRPC_OK);
    assert_int_equal(((Vrpctest__EchoReply *)resp)->seq, 42);
    pthread_join(t, NULL);
    assert_true(a.ok);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    fake_close(&f);
}

/* Unary response metadata (vrpc_call_opts.resp_md): HEADERS' entries then
 * the RESPONSE's trailers, for a synchronous and an asynchronous call;
 * beyond cap they are counted dropped; a HEADERS twice closes the
 * connection. */
struct unary_md {
    struct fake *f;
    unsigned from;
    int ncalls;
};
static void *unary_md_server(void *arg)
{
    struct unary_md *u = arg;
    for (int k = 0; k < u->ncalls; k++) {
        int i = fake_wait(u->f, VRPC_FT_REQUEST, &u->from, 5000);
        if (i < 0)
            return NULL;
        uint64_t id = u->f->recs[i].h.request_id;
        srv_headers(u->f, id, "i", "one");
        uint8_t buf[64];
        Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
        r.seq = 3;
        size_t n = vrpctest__echo_reply__pack(&r, buf);
        struct vrpc_metadata e[2] = {{.key = "t1", .value = "x", .value_len = 1},
                                     {.key = "t2", .value = "yy", .value_len = 2}};
        uint8_t md[128];
        struct vrpc_wire_hdr h = {.type = VRPC_FT_RESPONSE, .request_id = id, .payload_len = (uint32_t)n};
        h.md_len = (uint32_t)vrpc_wire_md_size(e, 2);
        vrpc_wire_md_encode(md, e, 2);
        uint8_t fr[256];
        memcpy(fr, md, h.md_len);
        memcpy(fr + h.md_len, buf, n);
        h.version = VRPC_WIRE_VERSION;
        struct vrpc_buf *b = vrpc_pool_get(u->f->pool);
        vrpc_wire_hdr_encode(b->data, &h);
        memcpy(b->data + VRPC_WIRE_HDR_LEN, fr, h.md_len + n);
        vrpc_ep_send(__atomic_load_n(&u->f->ep, __ATOMIC_ACQUIRE), b, VRPC_WIRE_HDR_LEN + h.md_len + (uint32_t)n, 0, 0,
                     0);
    }
    return NULL;
}

struct async_md {
    struct vrpc_resp_md *rm;
    unsigned done; /* atomic */
    int code;
    bool ok;
};
static void async_md_cb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct async_md *a = arg;
    a->code = st->code;
    a->ok = resp && a->rm->n_initial == 1 && a->rm->n_trailing == 2 && strcmp(a->rm->entries[2].key, "t2") == 0 &&
            a->rm->entries[2].value_len == 2 && memcmp(a->rm->entries[2].value, "yy", 2) == 0;
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
}

static void test_unary_resp_md(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    struct unary_md u = {.f = &f, .ncalls = 3};
    pthread_t t;
    pthread_create(&t, NULL, unary_md_server, &u);
    struct vrpc_metadata ents[3];
    struct vrpc_resp_md rm = {.entries = ents, .cap = 3};
    struct vrpc_call_opts o = {.resp_md = &rm};
    Vrpctest__EchoRequest r = req_of(1);
    ProtobufCMessage *resp;
    struct vrpc_status st;
    assert_int_equal(vrpc_call(ch, &m_unary, &r.base, &resp, &o, &st), VRPC_OK);
    assert_int_equal(((Vrpctest__EchoReply *)resp)->seq, 3);
    assert_int_equal(rm.n_initial, 1);
    assert_int_equal(rm.n_trailing, 2);
    assert_int_equal(rm.n_dropped, 0);
    assert_string_equal(ents[0].key, "i");
    assert_memory_equal(ents[0].value, "one", 3);
    assert_string_equal(ents[1].key, "t1");
    assert_string_equal(ents[2].key, "t2");
    rm.cap = 1; /* the trailers do not fit */
    assert_int_equal(vrpc_call(ch, &m_unary, &r.base, &resp, &o, &st), VRPC_OK);
    assert_int_equal(rm.n_initial, 1);
    assert_int_equal(rm.n_trailing, 0);
    assert_int_equal(rm.n_dropped, 2);
    rm.cap = 3;
    struct async_md a = {.rm = &rm};
    assert_int_equal(vrpc_call_async(ch, &m_unary, &r.base, &o, async_md_cb, &a), 0);
    for (int i = 0; i < 5000 && !__atomic_load_n(&a.done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_int_equal(a.code, VRPC_OK);
    assert_true(a.ok);
    pthread_join(t, NULL);
    /* a call without resp_md ignores HEADERS; twice is a protocol error */
    struct unary_bg bg = {.ch = ch};
    pthread_create(&t, NULL, unary_main, &bg);
    int i = fake_wait(&f, VRPC_FT_REQUEST, &u.from, 5000);
    assert_true(i >= 0);
    srv_headers(&f, f.recs[i].h.request_id, "a", "1");
    srv_headers(&f, f.recs[i].h.request_id, "a", "2");
    pthread_join(t, NULL);
    assert_int_equal(bg.code, VRPC_UNAVAILABLE);
    vrpc_channel_destroy(ch);
    fake_close(&f);
}

/* A large MESSAGE from the server (RNDV): the client reads it, answers DONE
 * OK keyed by the stream's id, and delivers it in order with the small
 * ones around it. */
static void test_large_message_in(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    size_t big = 300 << 10;
    uint8_t *pay = malloc(big);
    for (size_t i = 0; i < big; i++)
        pay[i] = (uint8_t)(i * 7 + 1);
    Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
    r.seq = 2;
    r.payload.data = pay;
    r.payload.len = big;
    size_t plen = vrpctest__echo_reply__get_packed_size(&r);
    struct vrpc_buf *lb;
    assert_int_equal(vrpc_lbuf_get(f.tp, plen, &lb), 0);
    vrpctest__echo_reply__pack(&r, lb->data);
    uint32_t rkey;
    struct vrpc_ep *ep = __atomic_load_n(&f.ep, __ATOMIC_ACQUIRE);
    assert_int_equal(vrpc_ep_grant(ep, lb->mr, lb->data, (uint32_t)plen, &rkey), 0);
    srv_msg(&f, id, 1);
    uint8_t desc[VRPC_WIRE_DESC_LEN];
    struct vrpc_wire_desc d = {.addr = (uint64_t)(uintptr_t)lb->data, .rkey = rkey};
    vrpc_wire_desc_encode(desc, &d);
    struct vrpc_wire_hdr h = {
        .type = VRPC_FT_MESSAGE, .flags = VRPC_FF_RNDV, .request_id = id, .payload_len = (uint32_t)plen};
    /* the descriptor stands where the payload would: send it by hand */
    struct vrpc_buf *b = vrpc_pool_get(f.pool);
    h.version = VRPC_WIRE_VERSION;
    vrpc_wire_hdr_encode(b->data, &h);
    memcpy(b->data + VRPC_WIRE_HDR_LEN, desc, sizeof desc);
    assert_int_equal(vrpc_ep_send(ep, b, VRPC_WIRE_HDR_LEN + sizeof desc, 0, 0, 0), 0);
    srv_msg(&f, id, 3);
    ProtobufCMessage *msg;
    for (uint64_t want = 1; want <= 3; want++) {
        assert_int_equal(vrpc_stream_read(s, &msg), 0);
        Vrpctest__EchoReply *got = (Vrpctest__EchoReply *)msg;
        assert_int_equal(got->seq, want);
        if (want == 2) {
            assert_int_equal(got->payload.len, big);
            assert_memory_equal(got->payload.data, pay, big);
        }
    }
    unsigned df = from;
    int di = fake_wait(&f, VRPC_FT_DONE, &df, 5000);
    assert_true(di >= 0);
    assert_int_equal(f.recs[di].h.request_id, id);
    assert_int_equal(f.recs[di].h.status, VRPC_OK);
    assert_int_equal(vrpc_ep_revoke(ep, rkey, 1), 0);
    srv_end(&f, id, VRPC_OK, NULL, NULL);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    vrpc_lbuf_put(lb); /* before its transport goes (the channel's read is long over) */
    fake_close(&f);
    free(pay);
}

/* The fake server reads the large MESSAGE at index i (RNDV) and answers
 * DONE; returns the message's seq after checking its payload pattern. */
static uint64_t fake_read_large(struct fake *f, int i, size_t big)
{
    struct vrpc_wire_hdr h = f->recs[i].h;
    assert_true(h.flags & VRPC_FF_RNDV);
    struct vrpc_wire_desc d;
    assert_int_equal(vrpc_wire_desc_decode(f->recs[i].body, h.payload_len, &d), 0);
    struct vrpc_buf *lb;
    assert_int_equal(vrpc_lbuf_get(f->tp, h.payload_len, &lb), 0);
    unsigned before = __atomic_load_n(&f->nreads, __ATOMIC_ACQUIRE);
    struct vrpc_ep *ep = __atomic_load_n(&f->ep, __ATOMIC_ACQUIRE);
    assert_int_equal(vrpc_ep_read(ep, lb, 0, h.payload_len, d.addr, d.rkey, 0), 0);
    for (int k = 0; k < 5000 && __atomic_load_n(&f->nreads, __ATOMIC_ACQUIRE) == before; k++)
        usleep(1000);
    assert_int_equal(f->read_status, 0);
    Vrpctest__EchoRequest *r = vrpctest__echo_request__unpack(NULL, h.payload_len, lb->data);
    assert_non_null(r);
    assert_int_equal(r->payload.len, big);
    for (size_t k = 0; k < big; k++)
        if (r->payload.data[k] != (uint8_t)(k * 3 + r->seq))
            fail_msg("large message %llu: byte %zu differs", (unsigned long long)r->seq, k);
    uint64_t seq = r->seq;
    vrpctest__echo_request__free_unpacked(r, NULL);
    vrpc_lbuf_put(lb);
    struct vrpc_wire_hdr dh = {.type = VRPC_FT_DONE, .request_id = h.request_id};
    fake_send(f, &dh, NULL, NULL);
    return seq;
}

static void big_req(Vrpctest__EchoRequest *r, uint8_t *buf, size_t big, uint64_t seq)
{
    *r = req_of(seq);
    for (size_t k = 0; k < big; k++)
        buf[k] = (uint8_t)(k * 3 + seq);
    r->payload.data = buf;
    r->payload.len = big;
}

/* Large MESSAGEs to the server (RNDV), sync and async: each waits for the
 * previous one's DONE; content and order arrive intact. */
static void test_large_message_out(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, 8);
    struct vrpc_channel *ch = new_channel(f.uri, 8);
    connect_fake(ch, &f);
    unsigned from = 0;
    uint64_t id;
    struct vrpc_stream *s = open_stream(ch, &f, &m_bidi, NULL, &from, &id);
    size_t big = 200 << 10;
    uint8_t *b1 = malloc(big), *b2 = malloc(big), *b3 = malloc(big);
    Vrpctest__EchoRequest r;
    big_req(&r, b1, big, 1);
    assert_int_equal(vrpc_stream_write(s, &r.base), 0);
    int i = fake_wait(&f, VRPC_FT_MESSAGE, &from, 5000);
    assert_true(i >= 0);
    assert_int_equal(fake_read_large(&f, i, big), 1);
    struct cbs_state c = {.lock = PTHREAD_MUTEX_INITIALIZER};
    big_req(&r, b2, big, 2);
    assert_int_equal(vrpc_stream_write_async(s, &r.base, cb_write, &c), 0);
    big_req(&r, b3, big, 3);
    assert_int_equal(vrpc_stream_write_async(s, &r.base, cb_write, &c), 0);
    i = fake_wait(&f, VRPC_FT_MESSAGE, &from, 5000);
    assert_true(i >= 0);
    /* the third waits for the second's DONE */
    unsigned peek = from;
    assert_int_equal(fake_wait(&f, VRPC_FT_MESSAGE, &peek, 200), -1);
    assert_int_equal(fake_read_large(&f, i, big), 2);
    i = fake_wait(&f, VRPC_FT_MESSAGE, &from, 5000);
    assert_true(i >= 0);
    assert_int_equal(fake_read_large(&f, i, big), 3);
    for (int k = 0; k < 5000 && locked_read(&c, &c.writes_ok) < 2; k++)
        usleep(1000);
    assert_int_equal(locked_read(&c, &c.writes_ok), 2);
    srv_end(&f, id, VRPC_OK, NULL, NULL);
    assert_int_equal(vrpc_stream_finish(s, NULL, NULL), VRPC_OK);
    vrpc_stream_destroy(s);
    vrpc_channel_destroy(ch);
    fake_close(&f);
    free(b1);
    free(b2);
    free(b3);
}

static int setup(void **state)
{
    (void)state;
    struct vrpc_method_desc *ms[] = {&m_bidi, &m_sstream, &m_cstream, &m_unary};
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        ms[i]->id = vrpc_method_id(ms[i]->full_name);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bidi_sync_windows),
        cmocka_unit_test(test_deadline_and_cancel),
        cmocka_unit_test(test_loss_and_channel_destroy),
        cmocka_unit_test(test_bad_server_frames),
        cmocka_unit_test(test_callbacks_and_async_writes),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_unary_resp_md),
        cmocka_unit_test(test_large_message_in),
        cmocka_unit_test(test_large_message_out),
        cmocka_unit_test(test_goaway),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

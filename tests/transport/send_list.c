/* Conformance cases of vrpc_ep_send_list: lists of every length and size
 * through few credits arrive whole and in order, one SEND completion each
 * in order; a refused element stops the list there (*sent says where) and
 * the caller keeps the rest. Every backend runs them, with a list operation
 * of its own or the core's loop of single sends. */
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"

#define WAIT_MS 20000
#define LIST_MAX 24

static bool wait_until(atomic_ulong *v, unsigned long want, int ms)
{
    for (int i = 0; i < ms && atomic_load(v) < want; i++)
        usleep(1000);
    return atomic_load(v) >= want;
}

/* What the receiver checks: message seq has size list_size(seq) and
 * fill(seq) bytes, and comes after seq - 1. */
struct lcheck {
    uint32_t eager, next;
    unsigned long bad;
};

static uint32_t list_size(uint32_t seq, uint32_t eager)
{
    return seq % 11 == 0 ? 0 : seq % 13 == 0 ? eager : (seq * 2654435761u) % 300;
}

static void list_recv(struct echo *e, const struct vrpc_wc *w)
{
    struct lcheck *m = e->arg;
    uint32_t want = list_size(m->next, m->eager);
    unsigned char ref[300];
    bool ok = w->imm == m->next && w->byte_len == want;
    if (ok && want && want < sizeof ref) {
        fill(ref, want, m->next);
        ok = memcmp(ref, w->buf->data, want) == 0;
    }
    m->bad += !ok;
    m->next++;
}

/* The sender's completions: counted as counts_cb does, and their wr_ids
 * must come in the order the lists gave them. */
struct lsend {
    struct counts k;
    uint64_t next_wr;
    atomic_ulong out_of_order;
};

static void list_send_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct lsend *ls = arg;
    for (unsigned i = 0; i < n; i++)
        if (wc[i].opcode == VRPC_WC_SEND && wc[i].status == 0 && wc[i].wr_id != ls->next_wr++)
            atomic_fetch_add(&ls->out_of_order, 1);
    counts_cb(cq, wc, n, &ls->k);
}

/* Fill wrs[0..n) with messages seq.., buffers from pool. */
static void list_build(struct client *c, struct vrpc_send_wr *wrs, unsigned n, uint32_t seq, uint32_t eager)
{
    for (unsigned i = 0; i < n; i++) {
        struct vrpc_buf *b;
        uint32_t len = list_size(seq + i, eager);
        while (!(b = vrpc_pool_get(c->pool)))
            sched_yield();
        fill(b->data, len, seq + i);
        wrs[i] = (struct vrpc_send_wr){.buf = b, .len = len, .imm = seq + i, .wr_id = seq + i};
    }
}

/* The echo server of ec (its receiver checks into m) and a client of ca
 * with nbufs send buffers, its completions counted in ls, connected to it. */
static struct vrpc_ep *list_connect(struct echo *e, const struct echo_cfg *ec, struct client *c,
                                    const struct vrpc_transport_attr *ca, unsigned nbufs, struct lsend *ls,
                                    struct lcheck *m)
{
    struct vrpc_ep *ep;
    memset(ls, 0, sizeof *ls);
    assert_int_equal(echo_start(e, ec), 0);
    assert_int_equal(client_start(c, ca, nbufs, 8, 0, list_send_cb, ls), 0);
    ls->k.pool = c->pool;
    assert_int_equal(client_connect(c, e->uri, &ep), 0);
    m->eager = vrpc_ep_eager_size(ep);
    return ep;
}

/* Lists of 1..LIST_MAX messages of mixed sizes (empty to eager) through a
 * receiver of 4 credits: many wait for credits, some lists are refused
 * part-way (-EAGAIN: the rest is sent again); everything arrives once, in
 * order, intact, with one SEND completion each in order. */
void t_send_list_order(void **state)
{
    struct vrpc_transport_attr sa, ca;
    struct lcheck m = {0};
    struct echo_cfg ec = {.ncq = 1, .nbufs = 16, .tattr = &sa, .repost_only = true, .on_recv = list_recv, .arg = &m};
    struct echo e;
    struct client c;
    struct lsend ls;
    struct vrpc_ep *ep;
    struct vrpc_send_wr wrs[LIST_MAX];
    unsigned total = 3000 / g_opt.scale_div, eagain = 0;
    uint32_t seq = 0;

    vrpc_transport_attr_init(&sa);
    sa.credits = 4;
    vrpc_transport_attr_init(&ca);
    ca.max_queued = 32;
    ep = list_connect(&e, &ec, &c, &ca, 128, &ls, &m);
    for (unsigned len = 1; seq < total; len = len % LIST_MAX + 1) {
        unsigned n = len < total - seq ? len : total - seq, off = 0, sent;
        list_build(&c, wrs, n, seq, m.eager);
        int rc;
        while ((rc = vrpc_ep_send_list(ep, wrs + off, n - off, 0, &sent)) == -EAGAIN) {
            assert_true(sent < n - off);
            off += sent;
            eagain++;
            sched_yield();
        }
        assert_int_equal(rc, 0);
        assert_int_equal(sent, n - off);
        seq += n;
    }
    assert_true(wait_until(&e.recvs, total, 60000));
    assert_true(wait_until(&ls.k.send_ok, total, WAIT_MS));
    printf("  send lists: %u messages in lists of 1..%d, %u lists refused part-way (-EAGAIN)\n", total, LIST_MAX,
           eagain);
    assert_int_equal(m.bad, 0);
    assert_int_equal(m.next, total);
    assert_int_equal(atomic_load(&ls.k.send_ok), total);
    assert_int_equal(atomic_load(&ls.k.send_err), 0);
    assert_int_equal(atomic_load(&ls.out_of_order), 0);
    vrpc_ep_destroy(ep);
    assert_true(wait_until(&ls.k.disc, 1, WAIT_MS));
    client_stop(&c);
    echo_stop(&e);
}

/* Refusals: an element too large stops the list before it (-EMSGSIZE, the
 * ones before it go); a full credit queue stops it at the first that does
 * not fit (-EAGAIN, those accepted arrive once the peer frees buffers); a
 * closed endpoint takes none (-ENOTCONN). The caller keeps what was refused. */
void t_send_list_refused(void **state)
{
    struct vrpc_transport_attr ca;
    struct lcheck m = {0};
    struct echo_cfg ec = {.ncq = 1, .nbufs = 4, .hold = true, .repost_only = true, .on_recv = list_recv, .arg = &m};
    struct echo e;
    struct client c;
    struct lsend ls;
    struct vrpc_ep *ep;
    struct vrpc_send_wr wrs[LIST_MAX];
    unsigned sent = 99, i;
    uint32_t seq = 0;

    vrpc_transport_attr_init(&ca);
    ca.max_queued = 8;
    ep = list_connect(&e, &ec, &c, &ca, 64, &ls, &m);
    assert_int_equal(vrpc_ep_send_list(ep, NULL, 0, 0, &sent), 0);
    assert_int_equal(sent, 0);

    /* element 2 of 4 is one byte above the eager size */
    list_build(&c, wrs, 4, seq, m.eager);
    wrs[2].len = m.eager + 1;
    int rc = vrpc_ep_send_list(ep, wrs, 4, 0, &sent);
    assert_int_equal(rc, wrs[2].buf->cap < wrs[2].len ? -EINVAL : -EMSGSIZE); /* as vrpc_ep_send */
    assert_int_equal(sent, 2);
    vrpc_pool_put(wrs[2].buf);
    vrpc_pool_put(wrs[3].buf);
    seq += 2;

    /* the receiver holds its 4 buffers: credits run out, then the queue */
    list_build(&c, wrs, LIST_MAX, seq, m.eager);
    rc = vrpc_ep_send_list(ep, wrs, LIST_MAX, 0, &sent);
    printf("  a list of %d against 4 held buffers: %u taken, then %d (max_queued %u)\n", LIST_MAX, sent, rc,
           ca.max_queued);
    assert_int_equal(rc, -EAGAIN);
    /* -EAGAIN only once the credit queue is full: it holds max_queued, of
     * which the 2 sends before may take some where the receiver's credits
     * did not cover them (verbs with 4 buffers grants fewer than TCP) */
    assert_true(sent + 2 >= ca.max_queued && sent < LIST_MAX);
    for (i = sent; i < LIST_MAX; i++)
        vrpc_pool_put(wrs[i].buf);
    seq += sent;
    assert_true(wait_until(&e.recvs, 1, WAIT_MS));
    usleep(20000);
    assert_true(atomic_load(&e.recvs) <= ec.nbufs);
    echo_release(&e); /* buffers come back: credits flow, the queue drains */
    assert_true(wait_until(&e.recvs, seq, WAIT_MS));
    assert_true(wait_until(&ls.k.send_ok, seq, WAIT_MS));
    assert_int_equal(m.bad, 0);
    assert_int_equal(m.next, seq);

    /* closed: nothing is taken */
    assert_int_equal(vrpc_ep_close(ep), 0);
    list_build(&c, wrs, 3, seq, m.eager);
    assert_int_equal(vrpc_ep_send_list(ep, wrs, 3, 0, &sent), -ENOTCONN);
    assert_int_equal(sent, 0);
    for (i = 0; i < 3; i++)
        vrpc_pool_put(wrs[i].buf);
    assert_true(wait_until(&ls.k.disc, 1, WAIT_MS));
    assert_int_equal(atomic_load(&ls.k.disc_status), 0);
    assert_int_equal(atomic_load(&ls.k.send_ok), seq);
    assert_int_equal(atomic_load(&ls.k.send_err), 0);
    assert_int_equal(atomic_load(&ls.out_of_order), 0);
    vrpc_ep_destroy(ep);
    client_stop(&c);
    echo_stop(&e);
}

/* Test harness for the transport conformance suite: completion collector,
 * echo server running in its CQ callback, client helper, payload helpers. */
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct opts g_opt;

void listen_uri(char *buf, size_t len)
{
    bool v6 = strchr(g_opt.server_ip, ':') != NULL;
    snprintf(buf, len, "%s://%s%s%s:0", g_opt.backend, v6 ? "[" : "", g_opt.server_ip, v6 ? "]" : "");
}

uint32_t csum(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint32_t h = 2166136261u;
    while (n--)
        h = (h ^ *s++) * 16777619u;
    return h;
}

void fill(void *p, size_t n, uint32_t seed)
{
    unsigned char *d = p;
    uint32_t x = seed * 2654435761u + 1;
    size_t i;
    for (i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        d[i] = (unsigned char)(x >> 16);
    }
}

/* ---- collector ---- */

void coll_init(struct coll *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

void coll_fini(struct coll *c)
{
    free(c->wc);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

void coll_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct coll *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->n + n > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        while (cap < c->n + n)
            cap *= 2;
        c->wc = realloc(c->wc, cap * sizeof *c->wc);
        if (!c->wc)
            abort();
        c->cap = cap;
    }
    memcpy(c->wc + c->n, wc, n * sizeof *wc);
    c->n += n;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static bool match(const struct vrpc_wc *w, uint32_t opcode, struct vrpc_ep *ep)
{
    return w->opcode == opcode && (!ep || w->ep == ep);
}

bool coll_wait(struct coll *c, uint32_t opcode, struct vrpc_ep *ep, int ms, struct vrpc_wc *out)
{
    struct timespec dl;
    size_t i;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    for (;;) {
        for (i = 0; i < c->n; i++)
            if (match(&c->wc[i], opcode, ep)) {
                *out = c->wc[i];
                memmove(c->wc + i, c->wc + i + 1, (c->n - i - 1) * sizeof *c->wc);
                c->n--;
                pthread_mutex_unlock(&c->mu);
                return true;
            }
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT) {
            pthread_mutex_unlock(&c->mu);
            return false;
        }
    }
}

bool coll_wait_n(struct coll *c, uint32_t opcode, size_t n, int ms)
{
    int i;
    for (i = 0; i < ms; i += 5) {
        if (coll_count(c, opcode, NULL) >= n)
            return true;
        usleep(5000);
    }
    return coll_count(c, opcode, NULL) >= n;
}

void counts_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct counts *k = arg;
    unsigned i;
    for (i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        if (w->ep && w->ep == k->dead)
            atomic_fetch_add(&k->after_disc, 1);
        switch (w->opcode) {
        case VRPC_WC_SEND:
            atomic_fetch_add(w->status ? &k->send_err : &k->send_ok, 1);
            vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_RECV:
            if (w->status) {
                atomic_fetch_add(&k->recv_flush, 1);
                vrpc_pool_put(w->buf);
                break;
            }
            atomic_fetch_add(&k->recv_ok, 1);
            if (k->on_recv)
                k->on_recv(k, w);
            if (vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_ACCEPTED:
            atomic_fetch_add(&k->accepted, 1);
            break;
        case VRPC_WC_DISCONNECTED:
            atomic_store(&k->disc_status, w->status);
            k->dead = w->ep;
            atomic_fetch_add(&k->disc, 1);
            break;
        }
    }
}

size_t coll_count(struct coll *c, uint32_t opcode, struct vrpc_ep *ep)
{
    size_t i, k = 0;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++)
        k += match(&c->wc[i], opcode, ep);
    pthread_mutex_unlock(&c->mu);
    return k;
}

/* ---- echo server ---- */

static void repost_or_put(struct vrpc_cq *cq, struct vrpc_buf *b)
{
    if (vrpc_cq_post_recv(cq, &b, NULL, 1))
        vrpc_pool_put(b);
}

static void echo_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct echo *e = arg;
    unsigned i;
    size_t k;
    for (i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_ACCEPTED:
            pthread_mutex_lock(&e->mu);
            if (e->neps == e->epcap) {
                e->epcap = e->epcap ? e->epcap * 2 : 64;
                e->eps = realloc(e->eps, e->epcap * sizeof *e->eps);
            }
            e->eps[e->neps++] = w->ep;
            pthread_mutex_unlock(&e->mu);
            atomic_fetch_add(&e->accepted, 1);
            break;
        case VRPC_WC_RECV:
            if (w->status) {
                atomic_fetch_add(&e->flushed_recvs, 1);
                vrpc_pool_put(w->buf);
                break;
            }
            if (e->on_recv)
                e->on_recv(e, w);
            atomic_fetch_add(&e->recvs, 1); /* after on_recv: waiters see its effects */
            if (e->hold) {
                pthread_mutex_lock(&e->mu);
                if (e->nheld == e->heldcap) {
                    e->heldcap = e->heldcap ? e->heldcap * 2 : 64;
                    e->held = realloc(e->held, e->heldcap * sizeof *e->held);
                }
                e->held[e->nheld++] = w->buf;
                pthread_mutex_unlock(&e->mu);
            } else if (e->repost_only) {
                repost_or_put(cq, w->buf);
            } else if (vrpc_ep_send(w->ep, w->buf, w->byte_len, w->imm, 0, 0)) {
                atomic_fetch_add(&e->send_err, 1);
                repost_or_put(cq, w->buf);
            }
            break;
        case VRPC_WC_SEND:
            repost_or_put(cq, w->buf);
            break;
        case VRPC_WC_DISCONNECTED:
            atomic_store(&e->last_disc_status, w->status);
            if (w->status)
                atomic_fetch_add(&e->disc_err, 1);
            pthread_mutex_lock(&e->mu);
            for (k = 0; k < e->neps; k++)
                if (e->eps[k] == w->ep) {
                    e->eps[k] = e->eps[--e->neps];
                    break;
                }
            pthread_mutex_unlock(&e->mu);
            vrpc_ep_destroy(w->ep);
            atomic_fetch_add(&e->disconnected, 1); /* last: waiters see the rest */
            break;
        }
    }
}

int echo_start(struct echo *e, const struct echo_cfg *cfg)
{
    struct vrpc_cq_attr ca;
    struct vrpc_listen_attr la;
    char uri[VRPC_URI_MAX];
    unsigned i, per;
    int rc;

    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    e->ncq = cfg->ncq ? cfg->ncq : 1;
    e->hold = cfg->hold;
    e->repost_only = cfg->repost_only;
    e->on_recv = cfg->on_recv;
    e->arg = cfg->arg;
    if ((rc = vrpc_transport_create(g_opt.backend, cfg->tattr, &e->tp)))
        return rc;
    if ((rc = vrpc_pool_create(e->tp, vrpc_transport_eager_size(e->tp), cfg->nbufs, &e->pool)))
        return rc;
    vrpc_cq_attr_init(&ca);
    ca.cb = echo_cb;
    ca.cb_arg = e;
    ca.busy_poll_us = cfg->busy_poll_us;
    ca.name = "echo-cq";
    ca.max_recv = cfg->nbufs;
    per = cfg->nbufs / e->ncq;
    for (i = 0; i < e->ncq; i++) {
        unsigned k;
        if ((rc = vrpc_cq_create(e->tp, &ca, &e->cq[i])))
            return rc;
        for (k = 0; k < per; k++) {
            struct vrpc_buf *b = vrpc_pool_get(e->pool);
            if ((rc = vrpc_cq_post_recv(e->cq[i], &b, NULL, 1)))
                return rc;
        }
    }
    memset(&la, 0, sizeof la);
    la.cqs = e->cq;
    la.ncqs = e->ncq;
    la.max_conns = cfg->max_conns;
    listen_uri(uri, sizeof uri);
    if ((rc = vrpc_listen(e->tp, uri, &la, &e->l)))
        return rc;
    return vrpc_listener_uri(e->l, e->uri, sizeof e->uri);
}

void echo_release(struct echo *e)
{
    size_t i;
    pthread_mutex_lock(&e->mu);
    e->hold = false;
    for (i = 0; i < e->nheld; i++) {
        struct vrpc_buf *b = e->held[i];
        /* the buffer's CQ: post to the first (tests that hold use one CQ) */
        repost_or_put(e->cq[0], b);
    }
    e->nheld = 0;
    pthread_mutex_unlock(&e->mu);
}

void echo_stop(struct echo *e)
{
    size_t i;
    int waited;
    vrpc_listener_destroy(e->l);
    pthread_mutex_lock(&e->mu);
    for (i = 0; i < e->neps; i++)
        vrpc_ep_close(e->eps[i]);
    pthread_mutex_unlock(&e->mu);
    for (waited = 0; waited < 200; waited++) {
        size_t left;
        pthread_mutex_lock(&e->mu);
        left = e->neps;
        pthread_mutex_unlock(&e->mu);
        if (!left)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&e->mu);
    for (i = 0; i < e->nheld; i++)
        vrpc_pool_put(e->held[i]);
    e->nheld = 0;
    pthread_mutex_unlock(&e->mu);
    for (i = 0; i < e->ncq; i++)
        vrpc_cq_destroy(e->cq[i]); /* fails what is left; the callback destroys it */
    vrpc_pool_destroy(e->pool);
    vrpc_transport_destroy(e->tp);
    free(e->eps);
    free(e->held);
    pthread_mutex_destroy(&e->mu);
}

/* ---- client ---- */

int client_start(struct client *c, const struct vrpc_transport_attr *tattr, unsigned nbufs, unsigned nrecv,
                 uint32_t busy_poll_us, vrpc_cq_cb cb, void *arg)
{
    struct vrpc_cq_attr ca;
    unsigned i;
    int rc;
    memset(c, 0, sizeof *c);
    coll_init(&c->coll);
    if ((rc = vrpc_transport_create(g_opt.backend, tattr, &c->tp)))
        return rc;
    if ((rc = vrpc_pool_create(c->tp, vrpc_transport_eager_size(c->tp), nbufs, &c->pool)))
        return rc;
    vrpc_cq_attr_init(&ca);
    ca.cb = cb ? cb : coll_cb;
    ca.cb_arg = cb ? arg : &c->coll;
    ca.busy_poll_us = busy_poll_us;
    ca.name = "client-cq";
    if (cb) {
        struct counts *k = arg;
        k->pool = c->pool;
    }
    if ((rc = vrpc_cq_create(c->tp, &ca, &c->cq)))
        return rc;
    if (cb)
        ((struct counts *)arg)->cq = c->cq;
    for (i = 0; i < nrecv; i++) {
        struct vrpc_buf *b = vrpc_pool_get(c->pool);
        if (!b)
            return -ENOMEM;
        if ((rc = vrpc_cq_post_recv(c->cq, &b, NULL, 1)))
            return rc;
    }
    return 0;
}

int client_connect(struct client *c, const char *uri, struct vrpc_ep **ep)
{
    struct vrpc_ep_attr a;
    vrpc_ep_attr_init(&a);
    a.cq = c->cq;
    a.src_addr = g_opt.client_ip;
    return vrpc_connect(c->tp, uri, &a, ep);
}

void client_stop(struct client *c)
{
    size_t i;
    vrpc_cq_destroy(c->cq);
    c->cq = NULL;
    for (i = 0; i < c->coll.n; i++)
        if (c->coll.wc[i].buf)
            vrpc_pool_put(c->coll.wc[i].buf);
    vrpc_pool_destroy(c->pool);
    vrpc_transport_destroy(c->tp);
    coll_fini(&c->coll);
}

/* ---- read rig ---- */

int rig_start(struct rig *r, uint32_t chunk)
{
    struct vrpc_transport_attr a;
    struct vrpc_listen_attr la;
    char uri[VRPC_URI_MAX];
    int rc;

    memset(r, 0, sizeof *r);
    vrpc_transport_attr_init(&a);
    a.read_chunk = chunk;
    if ((rc = client_start(&r->s, &a, 64, 32, 0, NULL, NULL)) || (rc = client_start(&r->c, &a, 64, 32, 0, NULL, NULL)))
        return rc;
    memset(&la, 0, sizeof la);
    la.cqs = &r->s.cq;
    la.ncqs = 1;
    listen_uri(uri, sizeof uri);
    if ((rc = vrpc_listen(r->s.tp, uri, &la, &r->l)))
        return rc;
    return vrpc_listener_uri(r->l, r->uri, sizeof r->uri);
}

int rig_connect(struct rig *r, struct vrpc_ep **cep, struct vrpc_ep **sep)
{
    struct vrpc_wc w;
    int rc = client_connect(&r->c, r->uri, cep);
    if (rc)
        return rc;
    if (!coll_wait(&r->s.coll, VRPC_WC_ACCEPTED, NULL, 10000, &w))
        return -ETIMEDOUT;
    *sep = w.ep;
    return 0;
}

/* Only pool buffers may stay in the collectors (client_stop puts them back). */
static void drop_nonpool(struct coll *c)
{
    size_t i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++)
        if (c->wc[i].opcode != VRPC_WC_RECV && c->wc[i].opcode != VRPC_WC_SEND)
            c->wc[i].buf = NULL;
    pthread_mutex_unlock(&c->mu);
}

void rig_stop(struct rig *r)
{
    vrpc_listener_destroy(r->l);
    r->l = NULL;
    vrpc_cq_destroy(r->c.cq);
    r->c.cq = NULL;
    vrpc_cq_destroy(r->s.cq);
    r->s.cq = NULL;
    drop_nonpool(&r->c.coll);
    drop_nonpool(&r->s.coll);
    client_stop(&r->c);
    client_stop(&r->s);
}

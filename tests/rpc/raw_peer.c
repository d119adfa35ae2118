/* The raw peer of the RPC tests (raw_peer.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "raw_peer.h"

static void raw_cb(struct vrpc_cq *cq, const struct vrpc_wc *wc, unsigned n, void *arg)
{
    struct raw *r = arg;
    for (unsigned i = 0; i < n; i++) {
        const struct vrpc_wc *w = &wc[i];
        switch (w->opcode) {
        case VRPC_WC_RECV:
            pthread_mutex_lock(&r->lock);
            if (w->status == 0) {
                r->last_len = w->byte_len < sizeof(r->last) ? w->byte_len : sizeof(r->last);
                memcpy(r->last, w->buf->data, r->last_len);
                __atomic_add_fetch(&r->nrecv, 1, __ATOMIC_RELEASE);
            }
            pthread_mutex_unlock(&r->lock);
            if (w->status == -ECANCELED || vrpc_cq_post_recv(cq, &w->buf, NULL, 1))
                vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_SEND:
            vrpc_pool_put(w->buf);
            break;
        case VRPC_WC_ACCEPTED:
            __atomic_store_n(&r->accepted, w->ep, __ATOMIC_RELEASE);
            break;
        case VRPC_WC_DISCONNECTED:
            __atomic_add_fetch(&r->disconnected, 1, __ATOMIC_RELEASE);
            break;
        case VRPC_WC_READ:
            r->read_status = w->status;
            __atomic_add_fetch(&r->nreads, 1, __ATOMIC_RELEASE);
            break;
        default:
            break;
        }
    }
}

void raw_open(struct raw *r, const char *backend)
{
    struct vrpc_cq_attr ca;
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    assert_int_equal(vrpc_transport_create(backend, NULL, &r->tp), 0);
    assert_int_equal(vrpc_pool_create(r->tp, vrpc_transport_eager_size(r->tp), 64, &r->pool), 0);
    vrpc_cq_attr_init(&ca);
    ca.cb = raw_cb;
    ca.cb_arg = r;
    assert_int_equal(vrpc_cq_create(r->tp, &ca, &r->cq), 0);
    for (int i = 0; i < 32; i++) {
        struct vrpc_buf *b = vrpc_pool_get(r->pool);
        assert_int_equal(vrpc_cq_post_recv(r->cq, &b, NULL, 1), 0);
    }
}

void raw_connect(struct raw *r, const char *uri, const char *src_ip)
{
    struct vrpc_ep_attr ea;
    vrpc_ep_attr_init(&ea);
    ea.cq = r->cq;
    ea.src_addr = src_ip;
    assert_int_equal(vrpc_connect(r->tp, uri, &ea, &r->ep), 0);
}

bool raw_wait(const unsigned *counter, unsigned n, int ms)
{
    for (int i = 0; i < ms && __atomic_load_n(counter, __ATOMIC_ACQUIRE) < n; i++)
        usleep(1000);
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE) >= n;
}

void raw_send_bytes(struct raw *r, struct vrpc_ep *ep, const void *bytes, size_t len)
{
    struct vrpc_buf *b = vrpc_pool_get(r->pool);
    assert_non_null(b);
    memcpy(b->data, bytes, len);
    assert_int_equal(vrpc_ep_send(ep, b, (uint32_t)len, 0, 0, 0), 0);
}

void raw_close(struct raw *r)
{
    if (r->ep) {
        vrpc_ep_close(r->ep);
        raw_wait(&r->disconnected, 1, 10000);
        vrpc_ep_destroy(r->ep);
    }
    if (r->accepted) {
        vrpc_ep_close(r->accepted);
        raw_wait(&r->disconnected, 1, 10000);
        vrpc_ep_destroy(r->accepted);
    }
    vrpc_listener_destroy(r->l);
    vrpc_cq_destroy(r->cq);
    vrpc_pool_destroy(r->pool);
    vrpc_transport_destroy(r->tp);
    pthread_mutex_destroy(&r->lock);
}

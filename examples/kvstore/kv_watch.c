/* kv_watch: Watch and BulkPut of the kvstore server (see kv_watch.h).
 *
 * A watcher is finished exactly once, by whoever first claims it under the
 * lock (its on_cancel, a send that found it too far behind, or end_all),
 * and only once none of its writes is outstanding: finishing waits for the
 * writes queued for the client's window, which a client that stopped reading
 * never opens, and no Put (nor the shutdown) may wait for that. So the claim
 * marks it ending, and the last write callback finishes it (or the claimer
 * at once when none is outstanding). A send that finds the stream gone
 * (-ECONNRESET) only unlinks it; its on_cancel, which the core then runs,
 * claims it. */
#include "kv_watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kv_watcher {
    struct kv_watcher *next;
    struct kv_watch *w;
    struct vrpc_server_stream *s;
    char *prefix;
    size_t prefix_len;
    unsigned outstanding; /* writes whose callback has not run (lock) */
    bool linked;          /* on the list (lock) */
    bool claimed;         /* being ended: end_code, end_msg (lock) */
    enum vrpc_code end_code;
    const char *end_msg;
};

void kv_watch_init(struct kv_watch *w, struct kv_table *t)
{
    memset(w, 0, sizeof(*w));
    w->table = t;
    pthread_mutex_init(&w->lock, NULL);
}

void kv_watch_destroy(struct kv_watch *w) { pthread_mutex_destroy(&w->lock); }

static void unlink_locked(struct kv_watch *w, struct kv_watcher *x)
{
    if (!x->linked)
        return;
    for (struct kv_watcher **p = &w->list; *p; p = &(*p)->next) {
        if (*p == x) {
            *p = x->next;
            x->linked = false;
            __atomic_fetch_sub(&w->n, 1, __ATOMIC_RELEASE);
            return;
        }
    }
}

/* Claims x for ending with code; true if the caller is to finish it now
 * (nothing outstanding), false if the last write callback will (or someone
 * claimed it before). Lock held. */
static bool claim_locked(struct kv_watch *w, struct kv_watcher *x, enum vrpc_code code, const char *msg)
{
    if (x->claimed)
        return false;
    unlink_locked(w, x);
    x->claimed = true;
    x->end_code = code;
    x->end_msg = msg;
    return x->outstanding == 0;
}

static void finish_free(struct kv_watcher *x)
{
    vrpc_server_stream_finish(x->s, x->end_code, x->end_msg, NULL, 0);
    free(x->prefix);
    free(x);
}

static void written(struct vrpc_server_stream *s, int rc, void *arg)
{
    struct kv_watcher *x = arg;
    bool fin;

    (void)s;
    (void)rc; /* a failed write: the stream is over, its on_cancel claims it */
    pthread_mutex_lock(&x->w->lock);
    fin = --x->outstanding == 0 && x->claimed;
    pthread_mutex_unlock(&x->w->lock);
    if (fin)
        finish_free(x);
}

/* Sends ev to x; lock held. */
static int send_locked(struct kv_watcher *x, const Examples__Kvstore__V1__WatchEvent *ev)
{
    int rc = examples__kvstore__v1__kv_store__watch__send_async(x->s, ev, written, x);

    if (rc == 0)
        x->outstanding++; /* its callback waits for the lock: it cannot come first */
    return rc;
}

/* Sends ev to every watcher of its key; lock held. Watchers too far behind
 * are claimed; the ones to finish now go on *now. */
static void notify_locked(struct kv_watch *w, const Examples__Kvstore__V1__WatchEvent *ev, struct kv_watcher **now)
{
    struct kv_watcher *x = w->list, *next;

    for (; x; x = next) {
        int rc;

        next = x->next;
        if (strncmp(ev->key, x->prefix, x->prefix_len) != 0)
            continue;
        rc = send_locked(x, ev);
        if (rc == -EAGAIN) {
            if (claim_locked(w, x, VRPC_RESOURCE_EXHAUSTED, "watch fell behind: too many events not yet sent")) {
                x->next = *now;
                *now = x;
            }
        } else if (rc != 0) {
            unlink_locked(w, x); /* cancelled: its on_cancel claims it */
        }
    }
}

static void finish_list(struct kv_watcher *x)
{
    while (x) {
        struct kv_watcher *next = x->next;

        finish_free(x);
        x = next;
    }
}

static int change(struct kv_watch *w, const char *key, const uint8_t *value, size_t len, bool del)
{
    Examples__Kvstore__V1__WatchEvent ev = EXAMPLES__KVSTORE__V1__WATCH_EVENT__INIT;
    struct kv_watcher *now = NULL;
    int rc;

    if (__atomic_load_n(&w->n, __ATOMIC_ACQUIRE) == 0)
        return del ? kv_table_delete(w->table, key) : kv_table_put(w->table, key, value, len);
    /* Under the lock, so that watchers see the changes in the table's order. */
    pthread_mutex_lock(&w->lock);
    rc = del ? kv_table_delete(w->table, key) : kv_table_put(w->table, key, value, len);
    if (rc >= 0 && !(del && rc == 0)) {
        ev.kind =
            del ? EXAMPLES__KVSTORE__V1__WATCH_EVENT__KIND__DELETE : EXAMPLES__KVSTORE__V1__WATCH_EVENT__KIND__PUT;
        ev.key = (char *)key;
        ev.value.data = (uint8_t *)value;
        ev.value.len = del ? 0 : len;
        notify_locked(w, &ev, &now);
    }
    pthread_mutex_unlock(&w->lock);
    finish_list(now);
    return rc;
}

int kv_watch_put(struct kv_watch *w, const char *key, const uint8_t *value, size_t len)
{
    return change(w, key, value, len, false);
}

int kv_watch_delete(struct kv_watch *w, const char *key) { return change(w, key, NULL, 0, true); }

void kv_watch_end_all(struct kv_watch *w)
{
    struct kv_watcher *now = NULL;

    pthread_mutex_lock(&w->lock);
    w->closed = true;
    while (w->list) {
        struct kv_watcher *x = w->list;

        if (claim_locked(w, x, VRPC_UNAVAILABLE, "server shutting down")) { /* unlinks x */
            x->next = now;
            now = x;
        }
    }
    pthread_mutex_unlock(&w->lock);
    finish_list(now);
}

/* ---- Watch ---------------------------------------------------------------*/

static void watch_start(struct vrpc_server_stream *s, void *user)
{
    (void)s;
    (void)user; /* the watcher is made when its request arrives */
}

static void watch_read(struct vrpc_server_stream *s, const Examples__Kvstore__V1__WatchRequest *req, void *user)
{
    struct kv_watch *w = user;
    Examples__Kvstore__V1__WatchEvent created = EXAMPLES__KVSTORE__V1__WATCH_EVENT__INIT;
    struct kv_watcher *x = calloc(1, sizeof(*x));

    if (x)
        x->prefix = strdup(req->prefix ? req->prefix : "");
    if (!x || !x->prefix) {
        free(x);
        vrpc_server_stream_finish(s, VRPC_RESOURCE_EXHAUSTED, "out of memory", NULL, 0);
        return;
    }
    x->w = w;
    x->s = s;
    x->prefix_len = strlen(x->prefix);
    vrpc_server_stream_set_ctx(s, x);
    created.created = true;
    pthread_mutex_lock(&w->lock);
    /* The created event goes first, under the lock: every change after it
     * follows it on the stream. */
    if (w->closed) {
        x->claimed = true;
        x->end_code = VRPC_UNAVAILABLE;
        x->end_msg = "server shutting down";
    } else if (send_locked(x, &created) != 0) {
        x->claimed = true;
        x->end_code = VRPC_INTERNAL;
        x->end_msg = "cannot start the watch";
    } else {
        x->linked = true;
        x->next = w->list;
        w->list = x;
        __atomic_fetch_add(&w->n, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&w->lock);
    if (x->claimed) /* nothing outstanding: no callback knows x */
        finish_free(x);
}

static void watch_cancel(struct vrpc_server_stream *s, void *user)
{
    struct kv_watch *w = user;
    struct kv_watcher *x = vrpc_server_stream_ctx(s);
    bool now;

    if (!x) { /* before its request: nothing else knows the stream */
        vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
        return;
    }
    pthread_mutex_lock(&w->lock);
    now = claim_locked(w, x, VRPC_CANCELLED, NULL);
    pthread_mutex_unlock(&w->lock);
    if (now)
        finish_free(x);
}

/* ---- BulkPut ---------------------------------------------------------------*/

struct bulk {
    uint64_t stored, created;
};

static void bulk_start(struct vrpc_server_stream *s, void *user)
{
    struct bulk *b = calloc(1, sizeof(*b));

    (void)user;
    if (!b) {
        vrpc_server_stream_finish(s, VRPC_RESOURCE_EXHAUSTED, "out of memory", NULL, 0);
        return;
    }
    vrpc_server_stream_set_ctx(s, b);
}

static void bulk_read(struct vrpc_server_stream *s, const Examples__Kvstore__V1__PutRequest *req, void *user)
{
    struct bulk *b = vrpc_server_stream_ctx(s);
    int rc;

    if (!req->key || !req->key[0]) {
        vrpc_server_stream_finish(s, VRPC_INVALID_ARGUMENT, "empty key", NULL, 0);
        free(b);
        return;
    }
    rc = kv_watch_put(user, req->key, req->value.data, req->value.len);
    if (rc < 0) {
        vrpc_server_stream_finish(s, VRPC_RESOURCE_EXHAUSTED, "out of memory", NULL, 0);
        free(b);
        return;
    }
    b->stored++;
    b->created += rc == 1;
}

static void bulk_half_close(struct vrpc_server_stream *s, void *user)
{
    struct bulk *b = vrpc_server_stream_ctx(s);
    Examples__Kvstore__V1__BulkPutReply reply = EXAMPLES__KVSTORE__V1__BULK_PUT_REPLY__INIT;

    (void)user;
    reply.stored = b->stored;
    reply.created = b->created;
    examples__kvstore__v1__kv_store__bulk_put__respond(s, &reply);
    free(b);
}

static void bulk_cancel(struct vrpc_server_stream *s, void *user)
{
    (void)user;
    free(vrpc_server_stream_ctx(s));
    vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
}

void kv_watch_set_ops(Examples__Kvstore__V1__KvStore_VrpcImpl *impl)
{
    impl->watch.start = watch_start;
    impl->watch.on_read = watch_read;
    impl->watch.on_cancel = watch_cancel;
    impl->bulk_put.start = bulk_start;
    impl->bulk_put.on_read = bulk_read;
    impl->bulk_put.on_half_close = bulk_half_close;
    impl->bulk_put.on_cancel = bulk_cancel;
}

/* The health service (verbrpc.health.v1.Health, as gRPC's grpc.health.v1):
 * Check answers a service's serving status, Watch streams it (now, then each
 * change); vrpc_server_set_serving_status() sets it (<verbrpc/health.h>).
 *
 * State per server (struct health, the server core's hooks arg): the
 * statuses set, and the open Watch streams. Each watcher has at most one
 * write outstanding: a change while it is out is remembered (want) and sent
 * when it completes, so a slow watcher gets the latest status, never a
 * queue. Writes and finishes happen outside the lock (their callbacks may
 * take it); a watcher is freed only by whoever finishes it, and never while
 * its write is outstanding. */
#include "builtins.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/health.h>
#include <verbrpc/health.vrpc.h>

#include "rpc/health_hook.h"
#include "rpc/server_core.h"

struct set_status {
    char *service;
    enum vrpc_serving_status status;
};

struct health;

struct watcher {
    struct watcher *next;
    struct health *h;
    struct vrpc_server_stream *s;
    char *service;
    int sent;     /* last status handed to the transport, -1: none */
    int want;     /* the status to report */
    bool writing; /* a write is outstanding */
    bool gone;    /* cancelled or a write failed: nothing more is written */
    bool ending;  /* finish (end_code) once nothing is left to write */
    enum vrpc_code end_code;
};

struct health {
    struct vrpc_server *srv;
    Verbrpc__Health__V1__Health_VrpcImpl impl; /* user = this */
    pthread_mutex_t lock;
    struct set_status *set; /* the statuses set, n_set of them */
    size_t n_set, cap_set;
    struct watcher *watchers;
    bool shutting;
};

/* What to do with a watcher once the lock is dropped. */
enum action { ACT_NONE, ACT_WRITE, ACT_FINISH };

/* True if full_name ("/pkg.Service/Method") is a method of service. */
static bool method_of(const char *full_name, const char *service)
{
    size_t len = strlen(service);

    return full_name[0] == '/' && strncmp(full_name + 1, service, len) == 0 && full_name[1 + len] == '/';
}

/* True if the server has a method of service. Not on a hot path: it copies
 * the server's statistics. */
static bool has_methods(const struct health *h, const char *service)
{
    struct vrpc_method_stats one, *v;
    size_t n = 0;
    bool found = false;

    if (vrpc_server_stats(h->srv, &one, 1, &n) != 0 || n == 0)
        return false;
    v = malloc(n * sizeof(*v));
    if (!v)
        return false;
    if (vrpc_server_stats(h->srv, v, n, &n) == 0)
        for (size_t i = 0; i < n && !found; i++)
            found = method_of(v[i].method->full_name, service);
    free(v);
    return found;
}

/* The status set for service, or -1. Lock held. */
static int set_status_of(const struct health *h, const char *service)
{
    for (size_t i = 0; i < h->n_set; i++)
        if (strcmp(h->set[i].service, service) == 0)
            return (int)h->set[i].status;
    return -1;
}

/* service's status now; unknown: VRPC_HEALTH_SERVICE_UNKNOWN. Lock held
 * (has_methods takes the server's own lock only). */
static enum vrpc_serving_status status_of(const struct health *h, const char *service)
{
    int st;

    if (h->shutting)
        return VRPC_HEALTH_NOT_SERVING;
    st = set_status_of(h, service);
    if (st >= 0)
        return (enum vrpc_serving_status)st;
    if (service[0] == '\0' || has_methods(h, service))
        return VRPC_HEALTH_SERVING;
    return VRPC_HEALTH_SERVICE_UNKNOWN;
}

/* ---- Check ----------------------------------------------------------------*/

static void health_check(struct vrpc_server_call *call, const Verbrpc__Health__V1__HealthCheckRequest *req, void *user)
{
    struct health *h = user;
    Verbrpc__Health__V1__HealthCheckResponse resp = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    enum vrpc_serving_status st;

    pthread_mutex_lock(&h->lock);
    st = status_of(h, req->service ? req->service : "");
    pthread_mutex_unlock(&h->lock);
    if (st == VRPC_HEALTH_SERVICE_UNKNOWN) {
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, "health: unknown service");
        return;
    }
    resp.status = (Verbrpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    verbrpc__health__v1__health__check__respond(call, &resp);
}

/* ---- Watch ----------------------------------------------------------------*/

/* The next step for w. Lock held. ACT_FINISH unlinks w: the caller then
 * owns it. */
static enum action watcher_next(struct health *h, struct watcher *w)
{
    if (w->writing)
        return ACT_NONE;
    if (w->want != w->sent && !w->gone) {
        w->writing = true;
        w->sent = w->want;
        return ACT_WRITE;
    }
    if (!w->ending && !w->gone)
        return ACT_NONE;
    for (struct watcher **p = &h->watchers; *p; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            break;
        }
    }
    return ACT_FINISH;
}

static void watch_written(struct vrpc_server_stream *s, int rc, void *arg);

/* Carries out a for w, outside the lock. */
static void watcher_act(struct watcher *w, enum action a)
{
    struct health *h = w->h;

    while (a == ACT_WRITE) {
        Verbrpc__Health__V1__HealthCheckResponse resp = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        int rc;

        resp.status = (Verbrpc__Health__V1__HealthCheckResponse__ServingStatus)w->sent;
        rc = verbrpc__health__v1__health__watch__send_async(w->s, &resp, watch_written, w);
        if (rc == 0)
            return;
        pthread_mutex_lock(&h->lock); /* not accepted: the stream is over */
        w->writing = false;
        w->gone = true;
        a = watcher_next(h, w);
        pthread_mutex_unlock(&h->lock);
    }
    if (a == ACT_FINISH) {
        /* gone: the stream was cancelled, this only releases it */
        if (w->gone)
            vrpc_server_stream_finish(w->s, VRPC_CANCELLED, NULL, NULL, 0);
        else
            vrpc_server_stream_finish(w->s, w->end_code, w->end_code == VRPC_OK ? NULL : "server shutting down", NULL,
                                      0);
        free(w->service);
        free(w);
    }
}

static void watch_written(struct vrpc_server_stream *s, int rc, void *arg)
{
    struct watcher *w = arg;
    enum action a;

    (void)s;
    pthread_mutex_lock(&w->h->lock);
    w->writing = false;
    if (rc != 0)
        w->gone = true;
    a = watcher_next(w->h, w);
    pthread_mutex_unlock(&w->h->lock);
    watcher_act(w, a);
}

/* The one request: the watcher starts with the status now. */
static void watch_read(struct vrpc_server_stream *s, const Verbrpc__Health__V1__HealthCheckRequest *req, void *user)
{
    struct health *h = user;
    struct watcher *w = calloc(1, sizeof(*w));
    enum action a;

    if (w)
        w->service = strdup(req->service ? req->service : "");
    if (!w || !w->service) {
        free(w);
        vrpc_server_stream_finish(s, VRPC_RESOURCE_EXHAUSTED, "health: out of memory", NULL, 0);
        return;
    }
    w->h = h;
    w->s = s;
    w->sent = -1;
    w->end_code = VRPC_OK;
    vrpc_server_stream_set_ctx(s, w);
    pthread_mutex_lock(&h->lock);
    w->want = (int)status_of(h, w->service);
    if (h->shutting) {
        w->ending = true;
        w->end_code = VRPC_UNAVAILABLE;
    }
    w->next = h->watchers;
    h->watchers = w;
    a = watcher_next(h, w);
    pthread_mutex_unlock(&h->lock);
    watcher_act(w, a);
}

static void watch_start(struct vrpc_server_stream *s, void *user)
{
    (void)s;
    (void)user; /* the watcher is made when its request arrives */
}

static void watch_cancel(struct vrpc_server_stream *s, void *user)
{
    struct health *h = user;
    struct watcher *w = vrpc_server_stream_ctx(s);
    enum action a;

    if (!w) { /* cancelled before its request: nothing else holds it */
        vrpc_server_stream_finish(s, VRPC_CANCELLED, NULL, NULL, 0);
        return;
    }
    pthread_mutex_lock(&h->lock);
    w->gone = true;
    a = watcher_next(h, w);
    pthread_mutex_unlock(&h->lock);
    watcher_act(w, a);
}

/* Every watcher of service (NULL: all) gets want = its status now, and with
 * drain set ends UNAVAILABLE after it; then the steps are carried out. */
static void watchers_update(struct health *h, const char *service, bool drain)
{
    for (;;) {
        struct watcher *w;
        enum action a = ACT_NONE;

        /* One watcher per pass: watcher_act may free it, and the list may
         * change while the lock is dropped. A watcher already up to date
         * yields ACT_NONE and is not looked at again. */
        pthread_mutex_lock(&h->lock);
        for (w = h->watchers; w; w = w->next) {
            if (service && strcmp(w->service, service) != 0)
                continue;
            if (drain && !w->ending) {
                w->ending = true;
                w->end_code = VRPC_UNAVAILABLE;
            }
            w->want = (int)status_of(h, w->service);
            a = watcher_next(h, w);
            if (a != ACT_NONE)
                break;
        }
        pthread_mutex_unlock(&h->lock);
        if (!w)
            return;
        watcher_act(w, a);
    }
}

/* ---- the server's status API ------------------------------------------ */

int vrpc_server_set_serving_status(struct vrpc_server *s, const char *service, enum vrpc_serving_status status)
{
    struct health *h = s ? vrpc_server_core_hooks_arg(s) : NULL;
    int rc = 0;

    if (!s || !service || (status != VRPC_HEALTH_SERVING && status != VRPC_HEALTH_NOT_SERVING))
        return -EINVAL;
    if (!h)
        return -ENOTSUP; /* a core server, without the built-in services */
    pthread_mutex_lock(&h->lock);
    if (h->shutting) {
        rc = -ESHUTDOWN;
    } else {
        size_t i;

        for (i = 0; i < h->n_set && strcmp(h->set[i].service, service) != 0; i++)
            ;
        if (i == h->n_set) {
            char *name = strdup(service);

            if (h->n_set == h->cap_set) {
                size_t cap = h->cap_set ? h->cap_set * 2 : 8;
                struct set_status *v = realloc(h->set, cap * sizeof(*v));

                if (v) {
                    h->set = v;
                    h->cap_set = cap;
                }
            }
            if (!name || h->n_set == h->cap_set) {
                free(name);
                rc = -ENOMEM;
            } else {
                h->set[h->n_set++].service = name;
            }
        }
        if (rc == 0)
            h->set[i].status = status;
    }
    pthread_mutex_unlock(&h->lock);
    if (rc == 0)
        watchers_update(h, service, false);
    return rc;
}

static void health_on_shutdown(void *arg)
{
    struct health *h = arg;

    pthread_mutex_lock(&h->lock);
    h->shutting = true;
    pthread_mutex_unlock(&h->lock);
    watchers_update(h, NULL, true);
}

static void health_on_destroy(void *arg)
{
    struct health *h = arg;

    /* Every stream has ended by now (connections gone): any watcher left
     * was already released by the core. */
    while (h->watchers) {
        struct watcher *w = h->watchers;

        h->watchers = w->next;
        free(w->service);
        free(w);
    }
    for (size_t i = 0; i < h->n_set; i++)
        free(h->set[i].service);
    free(h->set);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

int vrpc_health_register(struct vrpc_server *s)
{
    struct health *h = calloc(1, sizeof(*h));
    struct vrpc_server_hooks hooks = {.on_shutdown = health_on_shutdown, .on_destroy = health_on_destroy};

    if (!h)
        return -ENOMEM;
    h->srv = s;
    pthread_mutex_init(&h->lock, NULL);
    h->impl.user = h;
    h->impl.check = health_check;
    h->impl.watch.start = watch_start;
    h->impl.watch.on_read = watch_read;
    h->impl.watch.on_cancel = watch_cancel;
    hooks.arg = h;
    /* The hooks first: from here on vrpc_server_destroy frees h. */
    vrpc_server_core_set_hooks(s, &hooks);
    return verbrpc__health__v1__health__vrpc_register(s, &h->impl);
}

/* ---- the client side: the probe channels over many servers use ------------ */

/* vrpc_health_probe_fn (rpc/health_hook.h): one Check of "" over ch. */
static int health_probe(struct vrpc_channel *ch, int64_t timeout_us)
{
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Verbrpc__Health__V1__HealthCheckResponse *resp = NULL;
    struct vrpc_call_opts co = {.timeout_us = timeout_us};
    int code = verbrpc__health__v1__health__check__call(ch, &req, &resp, &co, NULL);

    if (code == VRPC_OK)
        return resp->status == VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    return code == VRPC_UNIMPLEMENTED ? 1 : -1; /* a server without the Health service serves */
}

/* A Watch of the channel's (vrpc_health_watch_fn): the rpc/ side's
 * callbacks, freed when both the stream's end and the opener are done. */
struct health_watch {
    void (*update)(void *arg, int serving);
    void (*done)(void *arg, int code);
    void *arg;
    int refs; /* atomic: the opener's and the stream's */
    Verbrpc__Health__V1__Health_Watch_Async a;
};

static void health_watch_put(struct health_watch *w)
{
    if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(w);
}

static void health_watch_read(struct vrpc_stream *s, const Verbrpc__Health__V1__HealthCheckResponse *msg, void *arg)
{
    struct health_watch *w = arg;
    (void)s;
    w->update(w->arg, msg->status == VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
}

static void health_watch_done(struct vrpc_stream *s, const struct vrpc_status *st, void *arg)
{
    struct health_watch *w = arg;
    (void)s;
    w->done(w->arg, st->code);
    health_watch_put(w);
}

static int health_watch(struct vrpc_channel *ch, void (*update)(void *arg, int serving),
                        void (*done)(void *arg, int code), void *arg, struct vrpc_stream **out)
{
    struct health_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    *w = (struct health_watch){.update = update, .done = done, .arg = arg, .refs = 2};
    w->a = (Verbrpc__Health__V1__Health_Watch_Async){.on_read = health_watch_read, .done = health_watch_done, .arg = w};
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    struct vrpc_call_opts co = {.timeout_us = VRPC_NO_TIMEOUT}; /* it lasts as long as the connection */
    struct vrpc_stream *s;
    int rc = verbrpc__health__v1__health__watch__start_async(ch, &req, &co, &w->a, &s);
    if (rc == 0)
        *out = s;
    else if (__atomic_load_n(&w->refs, __ATOMIC_ACQUIRE) == 2)
        health_watch_put(w); /* done never ran: the stream's reference too */
    health_watch_put(w);
    return rc;
}

__attribute__((constructor)) static void health_probe_install(void)
{
    __atomic_store_n(&vrpc_health_probe, health_probe, __ATOMIC_RELEASE);
    __atomic_store_n(&vrpc_health_watch, health_watch, __ATOMIC_RELEASE);
}

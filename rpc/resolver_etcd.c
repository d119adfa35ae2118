/* etcd:// targets: the servers registered under a key prefix in etcd v3,
 *   etcd://host:port[,host:port...]/prefix
 * each key's value a server URI (what vrpc_etcd_register puts there). The
 * resolver's thread reads the prefix (/v3/kv/range), delivers the values,
 * then follows a watch (/v3/watch from the next revision) so that additions
 * and removals are delivered at once. When etcd cannot be reached or the
 * watch ends it tries the next endpoint after a back-off (100 ms doubling to
 * 5 s, +-20%), keeping the last set meanwhile. A value that is not a valid
 * URI is logged and left out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/container_of.h"
#include "common/log_internal.h"
#include "rpc/etcd_client.h"
#include "rpc/resolver_internal.h"

#define ETCD_BACKOFF_MIN_MS 100
#define ETCD_BACKOFF_MAX_MS 5000
#define ETCD_RANGE_TIMEOUT_MS 5000
#define ETCD_STALE (-ESTALE) /* the watch was cancelled or compacted: read the range again */

struct kv {
    char *key, *val;
    bool warned; /* val is no URI and that was logged */
};

struct etcd_resolver {
    struct vrpc_resolver base; /* first: the core's view */
    struct vrpc_rslv_loop loop;
    struct vrpc_rslv_out out;
    struct vrpc_etcd_client client;
    char *target;  /* for the log */
    char err[160]; /* what etcd's last error message in the watch said */
    char *key_b64, *end_b64;
    struct kv *kvs; /* the prefix's keys now */
    size_t n, cap;
    int64_t rev; /* the revision the map reflects */
    unsigned seed;
};

static void kvs_clear(struct etcd_resolver *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->kvs[i].key);
        free(r->kvs[i].val);
    }
    r->n = 0;
}

/* Put (val != NULL) or delete key; both strings borrowed. 0 or -ENOMEM. */
static int kvs_set(struct etcd_resolver *r, const char *key, const char *val)
{
    size_t i;
    for (i = 0; i < r->n && strcmp(r->kvs[i].key, key); i++)
        ;
    if (!val) {
        if (i < r->n) {
            free(r->kvs[i].key);
            free(r->kvs[i].val);
            r->kvs[i] = r->kvs[--r->n];
        }
        return 0;
    }
    char *v = strdup(val);
    if (!v)
        return -ENOMEM;
    if (i < r->n) {
        free(r->kvs[i].val);
        r->kvs[i].val = v;
        r->kvs[i].warned = false;
        return 0;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        struct kv *nk = realloc(r->kvs, cap * sizeof *nk);
        if (!nk) {
            free(v);
            return -ENOMEM;
        }
        r->kvs = nk;
        r->cap = cap;
    }
    if (!(r->kvs[r->n].key = strdup(key))) {
        free(v);
        return -ENOMEM;
    }
    r->kvs[r->n].warned = false;
    r->kvs[r->n++].val = v;
    return 0;
}

/* Deliver the values now in the map (if they changed). */
static void etcd_deliver(struct etcd_resolver *r)
{
    struct vrpc_uri_set s = {0};
    char why[128];
    for (size_t i = 0; i < r->n; i++) {
        why[0] = '\0';
        if (vrpc_uri_set_add(&s, r->kvs[i].val, why, sizeof why) && !r->kvs[i].warned) {
            r->kvs[i].warned = true;
            vrpc_rpc_log("resolver: etcd '%s': key '%s' holds '%.80s', not a server URI (%s): left out", r->target,
                         r->kvs[i].key, r->kvs[i].val, why);
        }
    }
    vrpc_rslv_deliver(&r->out, &s);
}

/* Apply one kv object (base64 key and value) of a range or a PUT event. */
static int apply_kv(struct etcd_resolver *r, json_t *kv, bool del)
{
    const char *k64 = json_string_value(json_object_get(kv, "key"));
    const char *v64 = json_string_value(json_object_get(kv, "value"));
    char *key = NULL, *val = NULL;
    size_t klen, vlen;
    int rc;

    if (!k64 || vrpc_b64_decode(k64, &key, &klen))
        return -EPROTO;
    if (del)
        rc = kvs_set(r, key, NULL);
    else if (vrpc_b64_decode(v64 ? v64 : "", &val, &vlen))
        rc = -EPROTO;
    else
        rc = kvs_set(r, key, val);
    free(key);
    free(val);
    return rc;
}

/* Read the whole prefix into the map. 0 or an errno (msg says why). */
static int etcd_range(struct etcd_resolver *r, char *msg, size_t msg_len)
{
    json_t *req = json_pack("{s:s, s:s}", "key", r->key_b64, "range_end", r->end_b64), *resp = NULL, *kv;
    size_t i;
    int rc;

    if (!req)
        return -ENOMEM;
    rc = vrpc_etcd_call(&r->client, "/v3/kv/range", req, ETCD_RANGE_TIMEOUT_MS, &resp, msg, msg_len);
    json_decref(req);
    if (rc)
        return rc;
    kvs_clear(r);
    json_array_foreach(json_object_get(resp, "kvs"), i, kv)
    {
        if ((rc = apply_kv(r, kv, false))) {
            snprintf(msg, msg_len, "a malformed key or value in the range");
            break;
        }
    }
    r->rev = vrpc_etcd_json_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return rc;
}

/* One message of the watch stream. */
static int on_watch_msg(void *ctx, json_t *m)
{
    struct etcd_resolver *r = ctx;
    json_t *res = json_object_get(m, "result"), *ev;
    size_t i;
    int rc;

    if (!res || json_object_get(m, "error")) {
        json_t *e = json_object_get(m, "error");
        const char *t = json_string_value(json_object_get(e, "message"));
        t = t ? t : json_string_value(e);
        snprintf(r->err, sizeof r->err, "the watch failed: %s", t ? t : "a message without a result");
        return -EPROTO;
    }
    if (json_is_true(json_object_get(res, "canceled")) || vrpc_etcd_json_i64(res, "compact_revision") > 0)
        return ETCD_STALE;
    json_array_foreach(json_object_get(res, "events"), i, ev)
    {
        const char *type = json_string_value(json_object_get(ev, "type"));
        if ((rc = apply_kv(r, json_object_get(ev, "kv"), type && !strcmp(type, "DELETE"))))
            return rc;
    }
    int64_t rev = vrpc_etcd_json_i64(json_object_get(res, "header"), "revision");
    if (rev > r->rev)
        r->rev = rev;
    if (i > 0)
        etcd_deliver(r);
    return 0;
}

static int etcd_watch(struct etcd_resolver *r, char *msg, size_t msg_len)
{
    json_t *req = json_pack("{s:{s:s, s:s, s:I}}", "create_request", "key", r->key_b64, "range_end", r->end_b64,
                            "start_revision", (json_int_t)(r->rev + 1));
    int rc;
    if (!req)
        return -ENOMEM;
    r->err[0] = '\0';
    rc = vrpc_etcd_stream(&r->client, "/v3/watch", req, on_watch_msg, r, msg, msg_len);
    json_decref(req);
    if (rc == 0) {
        snprintf(msg, msg_len, "etcd closed the watch");
        rc = -ECONNRESET;
    } else if (rc == -EPROTO && !msg[0])
        snprintf(msg, msg_len, "%s", r->err[0] ? r->err : "etcd ended the watch with an error");
    return rc;
}

static void etcd_main(void *arg)
{
    struct etcd_resolver *r = arg;
    uint32_t backoff = ETCD_BACKOFF_MIN_MS;
    char msg[256];
    int rc, last = 0;

    while (!vrpc_etcd_client_stopping(&r->client)) {
        msg[0] = '\0';
        if (!(rc = etcd_range(r, msg, sizeof msg))) {
            etcd_deliver(r);
            last = 0;
            backoff = ETCD_BACKOFF_MIN_MS;
            msg[0] = '\0';
            rc = etcd_watch(r, msg, sizeof msg);
        }
        if (rc == -ECANCELED || vrpc_etcd_client_stopping(&r->client))
            break;
        if (rc != last && rc != ETCD_STALE) /* once per kind of failure */
            vrpc_rpc_log("resolver: etcd '%s': %s; keeping the last set", r->target, msg[0] ? msg : strerror(-rc));
        last = rc;
        uint32_t wait = backoff * (80 + (uint32_t)(rand_r(&r->seed) % 41)) / 100;
        if (vrpc_rslv_loop_wait(&r->loop, rc == ETCD_STALE ? ETCD_BACKOFF_MIN_MS : wait))
            break;
        backoff = backoff * 2 > ETCD_BACKOFF_MAX_MS ? ETCD_BACKOFF_MAX_MS : backoff * 2;
    }
}

static void etcd_destroy(struct vrpc_resolver *base)
{
    struct etcd_resolver *r = container_of(base, struct etcd_resolver, base);
    if (r->client.multi)
        vrpc_etcd_client_stop(&r->client); /* ends a range or the watch at once */
    vrpc_rslv_loop_stop(&r->loop);
    vrpc_etcd_client_fini(&r->client);
    vrpc_rslv_out_fini(&r->out);
    kvs_clear(r);
    free(r->kvs);
    free(r->key_b64);
    free(r->end_b64);
    free(r->target);
    free(r);
}

/* Endpoints and prefix of rest into r. -EINVAL (why), -ENOMEM. */
static int etcd_parse(struct etcd_resolver *r, const char *rest, char *why, size_t why_len)
{
    const char *slash = strchr(rest, '/');
    char *eps, *end;
    size_t plen, elen;
    int rc;

    if (!slash || slash == rest) {
        snprintf(why, why_len, "want etcd://host:port[,host:port]/prefix");
        return -EINVAL;
    }
    if (!(eps = strndup(rest, (size_t)(slash - rest))))
        return -ENOMEM;
    rc = vrpc_etcd_client_init(&r->client, eps, why, why_len);
    free(eps);
    if (rc)
        return rc;
    plen = strlen(slash);
    if (!(end = malloc(plen + 1)))
        return -ENOMEM;
    elen = vrpc_etcd_prefix_end(slash, plen, end);
    r->key_b64 = vrpc_b64_encode(slash, plen);
    r->end_b64 = vrpc_b64_encode(end, elen);
    free(end);
    return r->key_b64 && r->end_b64 ? 0 : -ENOMEM;
}

static int etcd_create(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    struct etcd_resolver *r = calloc(1, sizeof *r);
    char why[160] = "";
    int rc;

    if (!r)
        return -ENOMEM;
    r->base.ops = &vrpc_resolver_etcd;
    r->out.fn = fn;
    r->out.arg = arg;
    r->seed = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)r;
    if (!(r->target = strdup(rest))) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = etcd_parse(r, rest, why, sizeof why))) {
        if (rc == -EINVAL)
            vrpc_rpc_log("resolver: bad target 'etcd://%s': %s", rest, why);
        goto fail;
    }
    if ((rc = vrpc_rslv_loop_start(&r->loop, etcd_main, r, 0)))
        goto fail;
    *out = &r->base;
    return 0;
fail:
    etcd_destroy(&r->base);
    return rc;
}

/* Ends a back-off at once (the watch already follows every change). */
static void etcd_refresh(struct vrpc_resolver *base)
{
    vrpc_rslv_loop_refresh(&container_of(base, struct etcd_resolver, base)->loop);
}

const struct vrpc_resolver_ops vrpc_resolver_etcd = {
    .scheme = "etcd",
    .create = etcd_create,
    .refresh = etcd_refresh,
    .destroy = etcd_destroy,
};

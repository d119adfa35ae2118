/* vrpc_etcd_register / vrpc_etcd_deregister (include/verbrpc/discovery.h):
 * a lease, the server's key under it, and a thread that keeps the lease
 * alive (and grants a new one if it was lost), over etcd's JSON gateway. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/discovery.h>
#include <verbrpc/transport.h>
#include "common/log_internal.h"
#include "rpc/etcd_client.h"
#include "rpc/resolver_internal.h"

#define REG_CALL_TIMEOUT_MS 3000
#define REG_RETRY_MS 1000

struct vrpc_etcd_reg {
    struct vrpc_etcd_client client;
    struct vrpc_rslv_loop loop;
    char *key; /* for the log */
    char *key_b64, *val_b64;
    uint32_t ttl_s;  /* asked for */
    int64_t ttl_eff; /* granted */
    int64_t lease;
};

/* A lease ID as grpc-gateway spells an int64: a decimal string. */
static void id_str(int64_t id, char *buf, size_t len) { snprintf(buf, len, "%" PRId64, id); }

/* Grant a lease and put the key under it. 0 or an errno (msg says why). */
static int grant_and_put(struct vrpc_etcd_reg *g, char *msg, size_t msg_len)
{
    json_t *req = json_pack("{s:I}", "TTL", (json_int_t)g->ttl_s), *resp = NULL;
    char id[32];
    int64_t lease;
    int rc;

    if (!req)
        return -ENOMEM;
    rc = vrpc_etcd_call(&g->client, "/v3/lease/grant", req, REG_CALL_TIMEOUT_MS, &resp, msg, msg_len);
    json_decref(req);
    if (rc)
        return rc;
    lease = vrpc_etcd_json_i64(resp, "ID");
    g->ttl_eff = vrpc_etcd_json_i64(resp, "TTL");
    json_decref(resp);
    if (lease <= 0 || g->ttl_eff <= 0) {
        snprintf(msg, msg_len, "the lease grant returned no lease");
        return -EPROTO;
    }
    id_str(lease, id, sizeof id);
    if (!(req = json_pack("{s:s, s:s, s:s}", "key", g->key_b64, "value", g->val_b64, "lease", id)))
        return -ENOMEM;
    rc = vrpc_etcd_call(&g->client, "/v3/kv/put", req, REG_CALL_TIMEOUT_MS, &resp, msg, msg_len);
    json_decref(req);
    json_decref(resp);
    if (!rc)
        g->lease = lease;
    return rc;
}

/* One keep-alive: 0, -ENOENT (the lease is gone), or a call's error. */
static int keepalive(struct vrpc_etcd_reg *g, char *msg, size_t msg_len)
{
    char id[32];
    json_t *req, *resp = NULL;
    int rc;

    id_str(g->lease, id, sizeof id);
    if (!(req = json_pack("{s:s}", "ID", id)))
        return -ENOMEM;
    rc = vrpc_etcd_call(&g->client, "/v3/lease/keepalive", req, REG_CALL_TIMEOUT_MS, &resp, msg, msg_len);
    json_decref(req);
    if (rc)
        return rc;
    /* a lease etcd no longer knows comes back with no TTL */
    rc = vrpc_etcd_json_i64(json_object_get(resp, "result"), "TTL") > 0 ? 0 : -ENOENT;
    json_decref(resp);
    return rc;
}

static void reg_main(void *arg)
{
    struct vrpc_etcd_reg *g = arg;
    uint64_t period = (uint64_t)g->ttl_eff * 1000 / 3, wait = period;
    char msg[256];
    int rc, last = 0;

    while (!vrpc_rslv_loop_wait(&g->loop, wait ? wait : 1)) {
        msg[0] = '\0';
        rc = keepalive(g, msg, sizeof msg);
        if (rc == -ENOENT) {
            vrpc_rpc_log("etcd: the lease of '%s' expired; registering again", g->key);
            rc = grant_and_put(g, msg, sizeof msg);
            period = (uint64_t)g->ttl_eff * 1000 / 3;
        }
        if (rc == -ECANCELED)
            break;
        if (rc && rc != last)
            vrpc_rpc_log("etcd: keeping '%s' registered: %s; retrying", g->key, msg[0] ? msg : strerror(-rc));
        last = rc;
        wait = rc && period > REG_RETRY_MS ? REG_RETRY_MS : period;
    }
}

static void reg_free(struct vrpc_etcd_reg *g)
{
    vrpc_etcd_client_fini(&g->client);
    free(g->key);
    free(g->key_b64);
    free(g->val_b64);
    free(g);
}

/* Check the arguments and fill g's strings; -EINVAL logged, -ENOMEM. */
static int reg_init(struct vrpc_etcd_reg *g, const char *endpoints, const char *prefix, const char *server_uri,
                    uint32_t ttl_s)
{
    char why[160] = "";
    size_t klen;
    int rc;

    if (!endpoints || !prefix || !*prefix || !server_uri || ttl_s < 1 || ttl_s > 86400) {
        vrpc_rpc_log("etcd: register: want endpoints, a non-empty prefix, a server URI and a TTL of 1..86400 s");
        return -EINVAL;
    }
    if (vrpc_uri_check(server_uri, why, sizeof why)) {
        vrpc_rpc_log("etcd: register: bad server URI '%s': %s", server_uri, why);
        return -EINVAL;
    }
    if ((rc = vrpc_etcd_client_init(&g->client, endpoints, why, sizeof why))) {
        if (rc == -EINVAL)
            vrpc_rpc_log("etcd: register: bad endpoints '%s': %s", endpoints, why);
        return rc;
    }
    klen = strlen(prefix) + strlen(server_uri);
    if (!(g->key = malloc(klen + 1)))
        return -ENOMEM;
    snprintf(g->key, klen + 1, "%s%s", prefix, server_uri);
    g->key_b64 = vrpc_b64_encode(g->key, klen);
    g->val_b64 = vrpc_b64_encode(server_uri, strlen(server_uri));
    g->ttl_s = ttl_s;
    return g->key_b64 && g->val_b64 ? 0 : -ENOMEM;
}

int vrpc_etcd_register(const char *endpoints, const char *prefix, const char *server_uri, uint32_t ttl_s,
                       struct vrpc_etcd_reg **out)
{
    struct vrpc_etcd_reg *g = calloc(1, sizeof *g);
    char msg[256] = "";
    int rc;

    if (!g)
        return -ENOMEM;
    if ((rc = reg_init(g, endpoints, prefix, server_uri, ttl_s)))
        goto fail;
    /* one try per endpoint: a call that fails to connect moves on to the next */
    for (size_t i = 0; i < g->client.n_eps; i++)
        if ((rc = grant_and_put(g, msg, sizeof msg)) != -ECONNREFUSED && rc != -ETIMEDOUT)
            break;
    if (rc) {
        vrpc_rpc_log("etcd: registering '%s': %s", g->key, msg[0] ? msg : strerror(-rc));
        goto fail;
    }
    if ((rc = vrpc_rslv_loop_start(&g->loop, reg_main, g, 0)))
        goto fail;
    *out = g;
    return 0;
fail:
    reg_free(g);
    return rc;
}

int vrpc_etcd_deregister(struct vrpc_etcd_reg *g)
{
    char id[32], msg[256] = "";
    json_t *req, *resp = NULL;
    int rc;

    if (!g)
        return 0;
    vrpc_etcd_client_stop(&g->client); /* ends a keep-alive in flight */
    vrpc_rslv_loop_stop(&g->loop);
    vrpc_etcd_client_resume(&g->client);
    id_str(g->lease, id, sizeof id);
    if (!(req = json_pack("{s:s}", "ID", id)))
        rc = -ENOMEM;
    else
        rc = vrpc_etcd_call(&g->client, "/v3/lease/revoke", req, REG_CALL_TIMEOUT_MS, &resp, msg, sizeof msg);
    if (rc)
        vrpc_rpc_log("etcd: revoking the lease of '%s': %s; the key goes when it expires", g->key,
                     msg[0] ? msg : strerror(-rc));
    json_decref(req);
    json_decref(resp);
    reg_free(g);
    return rc;
}

/* etcd discovery against a real etcd (etcd-server, started here on
 * 127.0.0.1): servers register (vrpc_etcd_register) and deregister, the
 * etcd:// resolver follows within a bounded time, a lost lease is granted
 * again, a value that is no URI is left out, etcd killed leaves the last set
 * and etcd restarted is followed again; a dead first endpoint is skipped.
 * Also, without etcd: the gateway's base64, prefix ends, malformed targets. */
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
#include <verbrpc/discovery.h>
#include "common/clock.h"
#include "etcd_harness.h"
#include "rpc/etcd_client.h"
#include "rpc/resolver.h"

static struct etcd_proc g_etcd;

struct seen {
    pthread_mutex_t mu;
    int updates;
    size_t n;
    char uris[16][128];
    int saw_n1; /* updates that delivered exactly one URI (sets can pass quicker than a poll) */
};

static void on_update(void *arg, const char *const *uris, size_t n)
{
    struct seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->updates++;
    s->saw_n1 += n == 1;
    s->n = n < 16 ? n : 16;
    for (size_t i = 0; i < s->n; i++)
        snprintf(s->uris[i], sizeof s->uris[i], "%s", uris[i]);
    pthread_mutex_unlock(&s->mu);
}

static int seen_n1(struct seen *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->saw_n1;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Whether the last set is exactly want ("a,b" in any order; "" none). */
static bool seen_is(struct seen *s, const char *want)
{
    char buf[512];
    size_t k = 0;
    bool ok = true;
    snprintf(buf, sizeof buf, "%s", want);
    pthread_mutex_lock(&s->mu);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
        bool found = false;
        for (size_t i = 0; i < s->n; i++)
            found |= !strcmp(s->uris[i], t);
        ok &= found;
    }
    ok &= k == s->n && s->updates > 0;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Wait until the set is want; prints how long it took. */
static bool seen_wait(struct seen *s, const char *want, int timeout_ms)
{
    int64_t t0 = vrpc_clock_mono_ns();
    while (!seen_is(s, want)) {
        if (vrpc_clock_mono_ns() - t0 > (int64_t)timeout_ms * 1000000) {
            fprintf(stderr, "set is not {%s} after %d ms\n", want, timeout_ms);
            return false;
        }
        usleep(5000);
    }
    printf("# set {%s} after %.1f ms\n", want, (double)(vrpc_clock_mono_ns() - t0) / 1e6);
    return true;
}

static int seen_updates(struct seen *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->updates;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Put key=val straight into etcd (base64 by the library's encoder). */
static void etcd_put(const char *key, const char *val)
{
    struct vrpc_etcd_client c;
    char why[128], msg[128];
    char *k = vrpc_b64_encode(key, strlen(key)), *v = vrpc_b64_encode(val, strlen(val));
    json_t *req = json_pack("{s:s, s:s}", "key", k, "value", v), *resp = NULL;
    assert_int_equal(vrpc_etcd_client_init(&c, g_etcd.endpoint, why, sizeof why), 0);
    assert_int_equal(vrpc_etcd_call(&c, "/v3/kv/put", req, 3000, &resp, msg, sizeof msg), 0);
    json_decref(req);
    json_decref(resp);
    free(k);
    free(v);
    vrpc_etcd_client_fini(&c);
}

/* Revoke the lease that holds key (as if it had expired). */
static void etcd_revoke_lease_of(const char *key)
{
    struct vrpc_etcd_client c;
    char why[128], msg[128], id[32];
    char *k = vrpc_b64_encode(key, strlen(key));
    json_t *req = json_pack("{s:s}", "key", k), *resp = NULL;
    assert_int_equal(vrpc_etcd_client_init(&c, g_etcd.endpoint, why, sizeof why), 0);
    assert_int_equal(vrpc_etcd_call(&c, "/v3/kv/range", req, 3000, &resp, msg, sizeof msg), 0);
    json_t *kv = json_array_get(json_object_get(resp, "kvs"), 0);
    assert_non_null(kv);
    snprintf(id, sizeof id, "%lld", (long long)vrpc_etcd_json_i64(kv, "lease"));
    assert_true(strcmp(id, "0") != 0);
    json_decref(req);
    json_decref(resp);
    req = json_pack("{s:s}", "ID", id);
    assert_int_equal(vrpc_etcd_call(&c, "/v3/lease/revoke", req, 3000, &resp, msg, sizeof msg), 0);
    json_decref(req);
    json_decref(resp);
    free(k);
    vrpc_etcd_client_fini(&c);
}

static void t_b64(void **state)
{
    (void)state;
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char *e = vrpc_b64_encode(plain[i], strlen(plain[i])), *d;
        size_t n;
        assert_string_equal(e, enc[i]);
        assert_int_equal(vrpc_b64_decode(enc[i], &d, &n), 0);
        assert_int_equal(n, strlen(plain[i]));
        assert_memory_equal(d, plain[i], n);
        free(e);
        free(d);
    }
    const char *bad[] = {"Zg=", "Z===", "Zg=a", "Zm9v!A==", "=Zg=", "Zg==Zg=="};
    for (int i = 0; i < 6; i++) {
        char *d = NULL;
        size_t n;
        if (vrpc_b64_decode(bad[i], &d, &n) != -EINVAL)
            fail_msg("'%s' decoded", bad[i]);
    }
}

static void t_prefix_end(void **state)
{
    (void)state;
    char out[16];
    assert_int_equal(vrpc_etcd_prefix_end("/svc/", 5, out), 5);
    assert_memory_equal(out, "/svc0", 5);
    assert_int_equal(vrpc_etcd_prefix_end("a\xff", 2, out), 1);
    assert_memory_equal(out, "b", 1);
    assert_int_equal(vrpc_etcd_prefix_end("\xff\xff", 2, out), 1);
    assert_int_equal(out[0], 0);
}

static void t_bad_targets(void **state)
{
    (void)state;
    const char *bad[] = {"etcd://",           "etcd://127.0.0.1:2379", "etcd:///svc/",          "etcd://h/svc/",
                         "etcd://h:1,,h:2/p", "etcd://h:1,/p",         "etcd://http://h:1/svc", "etcd://[::1/p"};
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct vrpc_resolver *r = NULL;
        if (vrpc_resolver_create(bad[i], on_update, &s, &r) != -EINVAL)
            fail_msg("'%s' was not refused with -EINVAL", bad[i]);
    }
    struct vrpc_etcd_reg *g = NULL;
    assert_int_equal(vrpc_etcd_register("127.0.0.1:1", "/p/", "tcp://h", 5, &g), -EINVAL);
    assert_int_equal(vrpc_etcd_register("127.0.0.1:1", "", "tcp://h:1", 5, &g), -EINVAL);
    assert_int_equal(vrpc_etcd_register("127.0.0.1:1", "/p/", "tcp://h:1", 0, &g), -EINVAL);
    assert_int_equal(vrpc_etcd_register("nohost", "/p/", "tcp://h:1", 5, &g), -EINVAL);
    assert_null(g);
    assert_int_equal(vrpc_etcd_deregister(NULL), 0);
}

#define A "tcp://127.0.0.1:5001"
#define B "tcp://127.0.0.1:5002"
#define C "verbs://[::1]:5003"

static void t_follow(void **state)
{
    (void)state;
    struct vrpc_etcd_reg *ra = NULL, *rb = NULL, *rc = NULL;
    struct vrpc_resolver *r = NULL;
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    char target[128];

    assert_int_equal(vrpc_etcd_register(g_etcd.endpoint, "/svc/", A, 5, &ra), 0);
    assert_int_equal(vrpc_etcd_register(g_etcd.endpoint, "/svc/", B, 5, &rb), 0);
    snprintf(target, sizeof target, "etcd://%s/svc/", g_etcd.endpoint);
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    assert_true(seen_wait(&s, A "," B, 10000));

    /* the watch: additions and removals at once */
    assert_int_equal(vrpc_etcd_register(g_etcd.endpoint, "/svc/", C, 3, &rc), 0);
    assert_true(seen_wait(&s, A "," B "," C, 5000));
    assert_int_equal(vrpc_etcd_deregister(rb), 0);
    assert_true(seen_wait(&s, A "," C, 5000));

    /* a value that is no URI is left out; keys outside the prefix are not seen */
    int updates = seen_updates(&s);
    etcd_put("/svc/bogus", "not a uri");
    etcd_put("/svd/x", "tcp://127.0.0.9:1");
    usleep(300 * 1000);
    assert_int_equal(seen_updates(&s), updates);
    assert_true(seen_is(&s, A "," C));

    /* C's lease lost (revoked behind its back): the key goes, C's keep-alive
     * notices within a third of its TTL and registers again */
    int n1 = seen_n1(&s);
    etcd_revoke_lease_of("/svc/" C);
    for (int i = 0; i < 500 && seen_n1(&s) == n1; i++) /* {A} was delivered, however briefly */
        usleep(10000);
    assert_true(seen_n1(&s) > n1);
    assert_true(seen_wait(&s, A "," C, 10000));

    /* etcd killed: the last set stays */
    etcd_kill(&g_etcd);
    updates = seen_updates(&s);
    usleep(1500 * 1000);
    assert_int_equal(seen_updates(&s), updates);
    assert_true(seen_is(&s, A "," C));

    /* etcd back: the resolver reconnects (back-off at most 5 s) and follows */
    assert_true(etcd_restart(&g_etcd));
    assert_int_equal(vrpc_etcd_deregister(ra), 0);
    assert_true(seen_wait(&s, C, 20000));
    vrpc_resolver_destroy(r);
    assert_int_equal(vrpc_etcd_deregister(rc), 0);
}

/* A dead first endpoint: the resolver and the registration use the next. */
static void t_failover(void **state)
{
    (void)state;
    struct vrpc_etcd_reg *g = NULL;
    struct vrpc_resolver *r = NULL;
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    char eps[128], target[160];

    snprintf(eps, sizeof eps, "127.0.0.1:1,%s", g_etcd.endpoint); /* port 1: nothing listens */
    assert_int_equal(vrpc_etcd_register(eps, "/fo/", A, 5, &g), 0);
    snprintf(target, sizeof target, "etcd://%s/fo/", eps);
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    assert_true(seen_wait(&s, A, 10000));
    assert_int_equal(vrpc_etcd_deregister(g), 0);
    assert_true(seen_wait(&s, "", 5000));
    int64_t t0 = vrpc_clock_mono_ns();
    vrpc_resolver_destroy(r); /* in the middle of a watch: at once */
    printf("# destroy during a watch took %.1f ms\n", (double)(vrpc_clock_mono_ns() - t0) / 1e6);
}

static void t_register_unreachable(void **state)
{
    (void)state;
    struct vrpc_etcd_reg *g = NULL;
    assert_int_equal(vrpc_etcd_register("127.0.0.1:1", "/svc/", A, 5, &g), -ECONNREFUSED);
    assert_null(g);
}

static int etcd_setup(void **state)
{
    (void)state;
    return etcd_start(&g_etcd) ? 0 : -1;
}

static int etcd_teardown(void **state)
{
    (void)state;
    etcd_stop(&g_etcd);
    return 0;
}

int main(void)
{
    const struct CMUnitTest offline[] = {
        cmocka_unit_test(t_b64),
        cmocka_unit_test(t_prefix_end),
        cmocka_unit_test(t_bad_targets),
        cmocka_unit_test(t_register_unreachable),
    };
    const struct CMUnitTest live[] = {
        cmocka_unit_test(t_follow),
        cmocka_unit_test(t_failover),
    };
    int rc = cmocka_run_group_tests_name("etcd_offline", offline, NULL, NULL);
    if (rc)
        return rc;
    if (!etcd_binary()) {
        printf("SKIP: the etcd tests need etcd (Debian: etcd-server, /usr/bin/etcd; scripts/install-deps.sh)\n");
        return 77;
    }
    return cmocka_run_group_tests_name("etcd_live", live, etcd_setup, etcd_teardown);
}

/* Many servers behind one channel (issue 20), over TCP or verbs (--backend,
 * --setup as in verbs_setup.h) with 3 to 5 server processes (lb_server.c):
 * round robin spreads evenly; a server killed during a load loses only its
 * in-flight calls, retried where the method allows; a restarted server gets
 * traffic again within a bounded time; a draining server gets no new calls;
 * consistent hashing is stable across channels and moves ~1/N of the keys;
 * retries against a server failing half the time; the budget caps retries
 * when every server fails; a non-idempotent method is not retried once sent;
 * outlier ejection. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <verbrpc/health.vrpc.h>
#include <verbrpc/metrics.h>
#include <verbrpc/stream.h>
#include "lb_test.h"
#include "verbs_setup.h"

#define NSRV 5
static struct lb_srv g_srv[NSRV];

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int start_n(int n, const char *extra)
{
    for (int i = 0; i < n; i++)
        if (lb_srv_start(&g_srv[i], i, 0, extra))
            return -1;
    return 0;
}

static void stop_all(void)
{
    for (int i = 0; i < NSRV; i++)
        lb_srv_stop(&g_srv[i], SIGKILL);
}

static int teardown(void **state)
{
    (void)state;
    stop_all();
    return 0;
}

/* A channel over servers idx[0..n) (NULL: the first n), all READY. */
static struct vrpc_channel *open_ch(const int *idx, int n, struct vrpc_channel_opts *o)
{
    struct lb_srv v[NSRV];
    for (int i = 0; i < n; i++)
        v[i] = g_srv[idx ? idx[i] : i];
    char target[512];
    lb_target(v, n, target, sizeof target);
    struct vrpc_channel_opts d;
    if (!o) {
        vrpc_channel_opts_init(&d);
        o = &d;
    }
    if (!o->backoff_max_ms)
        o->backoff_max_ms = 200;
    if (!o->backoff_initial_ms)
        o->backoff_initial_ms = 20;
    o->src_addr = lb_client_ip;
    struct vrpc_channel *ch = NULL;
    assert_int_equal(vrpc_channel_create(target, o, &ch), 0);
    struct vrpc_subchannel_info info[NSRV];
    int64_t end = now_ms() + 5000;
    for (;;) {
        size_t k = vrpc_channel_subchannels(ch, info, NSRV), ready = 0;
        for (size_t i = 0; i < k && i < NSRV; i++)
            ready += info[i].state == VRPC_CHANNEL_READY;
        if ((int)k == n && (int)ready == n)
            break;
        assert_true(now_ms() < end);
        usleep(2000);
    }
    return ch;
}

/* Which server (index) answered: its reply says "sID". */
static int call_echo(struct vrpc_channel *ch, const struct vrpc_method_desc *m, uint32_t mode, uint32_t sleep_ms,
                     const char *key, char *peer, size_t cap, int *code)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.mode = mode;
    r.sleep_ms = sleep_ms;
    ProtobufCMessage *resp;
    struct vrpc_call_opts co = {.timeout_us = 5000000, .peer = peer, .peer_cap = cap};
    if (key) {
        co.hash_key = key;
        co.hash_key_len = strlen(key);
    }
    struct vrpc_status st;
    *code = vrpc_call(ch, m, &r.base, &resp, &co, &st);
    if (*code)
        return -1;
    const Vrpctest__EchoReply *rep = (const Vrpctest__EchoReply *)resp;
    char id[8] = "";
    memcpy(id, rep->payload.data, rep->payload.len < 7 ? rep->payload.len : 7);
    return id[0] == 's' ? atoi(id + 1) : -1;
}

static uint64_t attempts_of(struct vrpc_channel *ch)
{
    struct vrpc_subchannel_info info[NSRV];
    size_t k = vrpc_channel_subchannels(ch, info, NSRV);
    uint64_t n = 0;
    for (size_t i = 0; i < k && i < NSRV; i++)
        n += info[i].calls;
    return n;
}

/* ---- round robin ------------------------------------------------------------ */

static void t_round_robin_even(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel *ch = open_ch(NULL, 3, NULL);
    int count[3] = {0};
    char peer[96];
    for (int i = 0; i < 3000; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, peer, sizeof peer, &code);
        assert_int_equal(code, VRPC_OK);
        assert_true(s >= 0 && s < 3);
        assert_string_equal(peer, g_srv[s].uri); /* the call says where it went */
        count[s]++;
    }
    printf("round robin over 3 servers, 3000 calls: %d %d %d\n", count[0], count[1], count[2]);
    for (int i = 0; i < 3; i++)
        assert_true(count[i] >= 900 && count[i] <= 1100);
    char *text;
    size_t len;
    assert_int_equal(vrpc_channel_metrics_text(ch, &text, &len), 0);
    assert_non_null(strstr(text, "vrpc_client_subchannel_calls_total{target=\"list://"));
    free(text);
    vrpc_channel_destroy(ch);
}

/* ---- a server killed during a load, then restarted ---------------------------- */

struct load {
    struct vrpc_channel *ch;
    const struct vrpc_method_desc *m;
    int64_t end_ms;
    int ok, failed;
};

static void *load_thread(void *arg)
{
    struct load *l = arg;
    while (now_ms() < l->end_ms) {
        int code;
        call_echo(l->ch, l->m, 0, 2, NULL, NULL, 0, &code);
        if (code == VRPC_OK)
            l->ok++;
        else
            l->failed++;
    }
    return NULL;
}

/* 4 threads of calls for 1.2 s, server 1 killed after 0.4 s: failures. */
static int kill_during_load(struct vrpc_channel *ch, const struct vrpc_method_desc *m, int *ok)
{
    struct load l[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        l[i] = (struct load){.ch = ch, .m = m, .end_ms = now_ms() + 1200};
        pthread_create(&t[i], NULL, load_thread, &l[i]);
    }
    usleep(400000);
    lb_srv_stop(&g_srv[1], SIGKILL);
    int failed = 0;
    *ok = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        failed += l[i].failed;
        *ok += l[i].ok;
    }
    return failed;
}

static void t_kill_and_restart(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol = {.method = "/vrpctest.Test/Echo", .max_attempts = 4, .idempotent = true};
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = &pol;
    o.n_retry = 1;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    int ok, failed = kill_during_load(ch, &lb_m_echo, &ok);
    printf("kill during load, idempotent Echo with retries: %d ok, %d failed\n", ok, failed);
    assert_int_equal(failed, 0);
    assert_true(ok > 100);

    /* restarted on its port: traffic again within the back-off (200 ms max) */
    int port = g_srv[1].port;
    assert_int_equal(lb_srv_start(&g_srv[1], 1, port, NULL), 0);
    int64_t t0 = now_ms(), got = -1;
    while (now_ms() - t0 < 5000) {
        int code;
        if (call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code) == 1) {
            got = now_ms() - t0;
            break;
        }
        assert_int_equal(code, VRPC_OK);
        usleep(1000);
    }
    printf("restarted server got a call after %lld ms\n", (long long)got);
    assert_true(got >= 0 && got < 3000);

    /* without retries (a method not marked idempotent): only calls in
     * flight on the killed server fail, at most one per thread */
    failed = kill_during_load(ch, &lb_m_once, &ok);
    printf("kill during load, EchoOnce without retries: %d ok, %d failed\n", ok, failed);
    assert_true(failed <= 4);
    vrpc_channel_destroy(ch);
}

/* ---- drain ---------------------------------------------------------------------- */

struct slow {
    struct vrpc_channel *ch;
    int code, server;
};

static void *slow_call(void *arg)
{
    struct slow *s = arg;
    s->server = call_echo(s->ch, &lb_m_echo, 0, 1000, NULL, NULL, 0, &s->code);
    return NULL;
}

static void t_drain(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel *ch = open_ch(NULL, 3, NULL);
    struct slow sl[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) { /* one slow call on each server (round robin) */
        sl[i] = (struct slow){.ch = ch};
        pthread_create(&t[i], NULL, slow_call, &sl[i]);
    }
    usleep(200000);
    kill(g_srv[0].pid, SIGTERM); /* drains: GOAWAY, answers its slow call */
    usleep(200000);
    int count[3] = {0};
    for (int i = 0; i < 300; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        count[s]++;
    }
    printf("while server 0 drains: %d %d %d\n", count[0], count[1], count[2]);
    assert_int_equal(count[0], 0);
    assert_true(count[1] > 100 && count[2] > 100);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(sl[i].code, VRPC_OK); /* also the draining server's */
    }
    lb_srv_stop(&g_srv[0], SIGTERM);
    vrpc_channel_destroy(ch);
}

/* ---- consistent hashing --------------------------------------------------------------- */

#define NKEYS 2000

static void place(struct vrpc_channel *ch, int *where)
{
    for (int k = 0; k < NKEYS; k++) {
        char key[32];
        snprintf(key, sizeof key, "key-%d", k);
        int code;
        where[k] = call_echo(ch, &lb_m_echo, 0, 0, key, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
    }
}

static void t_ring_hash(void **state)
{
    (void)state;
    assert_int_equal(start_n(5, NULL), 0);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.lb_policy = VRPC_LB_RING_HASH;
    static int a[NKEYS], b[NKEYS], c[NKEYS], d[NKEYS];
    const int four[] = {0, 1, 2, 3}, rev[] = {3, 2, 1, 0}, five[] = {0, 1, 2, 3, 4}, three[] = {0, 1, 2};
    struct vrpc_channel *ch = open_ch(four, 4, &o);
    place(ch, a);
    vrpc_channel_destroy(ch);
    ch = open_ch(rev, 4, &o); /* another channel, the same servers in another order */
    place(ch, b);
    vrpc_channel_destroy(ch);
    int per[5] = {0};
    for (int k = 0; k < NKEYS; k++) {
        assert_int_equal(a[k], b[k]);
        per[a[k]]++;
    }
    printf("ring hash, %d keys on 4 servers: %d %d %d %d\n", NKEYS, per[0], per[1], per[2], per[3]);
    for (int i = 0; i < 4; i++)
        assert_true(per[i] > NKEYS / 4 / 2);

    ch = open_ch(five, 5, &o); /* one added: ~1/5 move, all to it */
    place(ch, c);
    vrpc_channel_destroy(ch);
    int moved = 0;
    for (int k = 0; k < NKEYS; k++) {
        if (c[k] != a[k]) {
            moved++;
            assert_int_equal(c[k], 4);
        }
    }
    printf("server added (4 -> 5): %d of %d keys moved (%.1f%%)\n", moved, NKEYS, 100.0 * moved / NKEYS);
    assert_true(moved > NKEYS / 10 && moved < NKEYS * 32 / 100);

    ch = open_ch(three, 3, &o); /* one removed: only its keys move */
    place(ch, d);
    vrpc_channel_destroy(ch);
    moved = 0;
    for (int k = 0; k < NKEYS; k++) {
        if (d[k] != a[k]) {
            moved++;
            assert_int_equal(a[k], 3);
        }
    }
    printf("server removed (4 -> 3): %d of %d keys moved (%.1f%%)\n", moved, NKEYS, 100.0 * moved / NKEYS);
    assert_int_equal(moved, per[3]);
}

/* ---- retries ----------------------------------------------------------------------------- */

static void t_retry_half(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol = {
        .method = "*", .max_attempts = 5, .initial_backoff_ms = 1, .max_backoff_ms = 5, .idempotent = true};
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = &pol;
    o.n_retry = 1;
    o.retry_token_ratio_milli = 1000; /* half the attempts fail: a token back per success */
    o.outlier_failures = 1000000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    int failed = 0;
    for (int i = 0; i < 300; i++) {
        int code;
        call_echo(ch, &lb_m_echo, 1, 0, NULL, NULL, 0, &code);
        failed += code != VRPC_OK;
    }
    uint64_t att = attempts_of(ch);
    printf("servers failing every other call, with retries: %d of 300 failed, %llu attempts\n", failed,
           (unsigned long long)att);
    assert_int_equal(failed, 0);
    assert_true(att > 300);
    vrpc_channel_destroy(ch);

    vrpc_channel_opts_init(&o); /* the same without a policy: about half fail */
    o.outlier_failures = 1000000;
    ch = open_ch(NULL, 3, &o);
    failed = 0;
    for (int i = 0; i < 300; i++) {
        int code;
        call_echo(ch, &lb_m_echo, 1, 0, NULL, NULL, 0, &code);
        failed += code != VRPC_OK;
    }
    printf("the same without retries: %d of 300 failed\n", failed);
    assert_true(failed > 100 && failed < 200);
    vrpc_channel_destroy(ch);
}

static void t_budget(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol = {
        .method = "*", .max_attempts = 5, .initial_backoff_ms = 1, .max_backoff_ms = 2, .idempotent = true};
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = &pol;
    o.n_retry = 1;
    o.outlier_failures = 1000000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    for (int i = 0; i < 100; i++) {
        int code;
        call_echo(ch, &lb_m_echo, 2, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_UNAVAILABLE);
    }
    uint64_t att = attempts_of(ch);
    printf("every server fails, 100 calls of up to 5 attempts: %llu attempts (budget 10 tokens)\n",
           (unsigned long long)att);
    assert_true(att >= 100 && att <= 110);
    vrpc_channel_destroy(ch);
}

static void t_non_idempotent(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol[2] = {
        {.method = "/vrpctest.Test/EchoOnce", .max_attempts = 5, .initial_backoff_ms = 1, .idempotent = false},
        {.method = "/vrpctest.Test/Echo", .max_attempts = 3, .initial_backoff_ms = 1, .idempotent = true},
    };
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = pol;
    o.n_retry = 2;
    o.retry_max_tokens = 1000;
    o.outlier_failures = 1000000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    for (int i = 0; i < 50; i++) {
        int code;
        call_echo(ch, &lb_m_once, 2, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_UNAVAILABLE);
    }
    uint64_t once = attempts_of(ch);
    for (int i = 0; i < 50; i++) {
        int code;
        call_echo(ch, &lb_m_echo, 2, 0, NULL, NULL, 0, &code);
    }
    uint64_t idem = attempts_of(ch) - once;
    printf("50 failing calls: non-idempotent %llu attempts, idempotent %llu\n", (unsigned long long)once,
           (unsigned long long)idem);
    assert_int_equal(once, 50);
    assert_int_equal(idem, 150);
    vrpc_channel_destroy(ch);
}

/* ---- outlier ejection ----------------------------------------------------------------- */

static void t_outlier(void **state)
{
    (void)state;
    assert_int_equal(start_n(2, NULL), 0);
    assert_int_equal(lb_srv_start(&g_srv[2], 2, 0, "fail-all"), 0);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.outlier_eject_ms = 10000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    int failed = 0;
    for (int i = 0; i < 300; i++) {
        int code;
        call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        failed += code != VRPC_OK;
    }
    struct vrpc_subchannel_info info[3];
    assert_int_equal(vrpc_channel_subchannels(ch, info, 3), 3);
    printf("one server failing everything: %d of 300 calls failed, it was ejected %llu times\n", failed,
           (unsigned long long)info[2].ejections);
    assert_int_equal(failed, 5); /* the default: 5 consecutive failures eject */
    assert_true(info[2].ejected && info[2].ejections == 1);
    assert_false(info[0].ejected || info[1].ejected);
    vrpc_channel_destroy(ch);
}

/* ---- asynchronous calls ------------------------------------------------------------ */

struct acount {
    unsigned inflight, ok, failed, cancelled; /* atomic */
};

static void acb(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct acount *a = arg;
    if (st->code == VRPC_OK)
        assert_non_null(resp);
    __atomic_add_fetch(st->code == VRPC_OK          ? &a->ok
                       : st->code == VRPC_CANCELLED ? &a->cancelled
                                                    : &a->failed,
                       1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&a->inflight, 1, __ATOMIC_RELEASE);
}

static int async_echo(struct vrpc_channel *ch, struct acount *a, uint32_t mode, uint32_t sleep_ms,
                      struct vrpc_call_opts *co)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT; /* gone after the call returns: retries use a copy */
    r.mode = mode;
    r.sleep_ms = sleep_ms;
    __atomic_add_fetch(&a->inflight, 1, __ATOMIC_RELAXED);
    int rc = vrpc_call_async(ch, &lb_m_echo, &r.base, co, acb, a);
    if (rc)
        __atomic_sub_fetch(&a->inflight, 1, __ATOMIC_RELAXED);
    return rc;
}

static void wait_idle(struct acount *a, int ms)
{
    int64_t end = now_ms() + ms;
    while (__atomic_load_n(&a->inflight, __ATOMIC_ACQUIRE) && now_ms() < end)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&a->inflight, __ATOMIC_ACQUIRE), 0);
}

static void t_async_kill(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol = {.method = "*", .max_attempts = 4, .idempotent = true};
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = &pol;
    o.n_retry = 1;
    o.retry_max_tokens = 100; /* ~11 of 32 calls in flight die at once: the default budget (10) retries 5 */
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    struct acount a = {0};
    int64_t t0 = now_ms();
    bool killed = false;
    while (now_ms() - t0 < 1200) {
        if (!killed && now_ms() - t0 >= 400) {
            lb_srv_stop(&g_srv[1], SIGKILL);
            killed = true;
        }
        if (__atomic_load_n(&a.inflight, __ATOMIC_ACQUIRE) >= 32) {
            usleep(200);
            continue;
        }
        struct vrpc_call_opts co = {.timeout_us = 5000000};
        assert_int_equal(async_echo(ch, &a, 0, 2, &co), 0);
    }
    wait_idle(&a, 10000);
    printf("async load, server killed: %u ok, %u failed\n", a.ok, a.failed);
    assert_int_equal(a.failed, 0);
    assert_true(a.ok > 100);
    vrpc_channel_destroy(ch);
}

static void t_async_cancel_destroy(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_retry_policy pol = {
        .method = "*", .max_attempts = 5, .initial_backoff_ms = 5000, .max_backoff_ms = 5000, .idempotent = true};
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.retry = &pol;
    o.n_retry = 1;
    o.retry_max_tokens = 1000;
    o.outlier_failures = 1000000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    struct acount a = {0};
    uint64_t id_slow = 0, id_retry = 0;
    struct vrpc_call_opts co = {.timeout_us = 20000000, .call_id = &id_slow};
    assert_int_equal(async_echo(ch, &a, 0, 2000, &co), 0); /* in flight */
    co.call_id = &id_retry;
    assert_int_equal(async_echo(ch, &a, 2, 0, &co), 0); /* fails, then waits up to 5 s to retry */
    usleep(100000);
    int64_t t0 = now_ms();
    assert_int_equal(vrpc_channel_cancel(ch, id_slow), 0);
    assert_int_equal(vrpc_channel_cancel(ch, id_retry), 0);
    wait_idle(&a, 3000);
    printf("two async calls cancelled (one in flight, one waiting to retry) in %lld ms\n", (long long)(now_ms() - t0));
    assert_int_equal(a.cancelled, 2);
    assert_int_equal(vrpc_channel_cancel(ch, id_slow), -ENOENT);
    /* destroy with calls in flight and waiting to retry: each callback once */
    for (int i = 0; i < 10; i++) {
        co.call_id = NULL;
        assert_int_equal(async_echo(ch, &a, i % 2 ? 2 : 0, i % 2 ? 0 : 2000, &co), 0);
    }
    usleep(100000);
    vrpc_channel_destroy(ch);
    assert_int_equal(__atomic_load_n(&a.inflight, __ATOMIC_ACQUIRE), 0);
    assert_int_equal(a.cancelled, 12);
}

/* ---- the set changes (file://): an added server gets calls, a removed one none ---------- */

static void write_set(const char *path, const int *idx, int n)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n", g_srv[idx[i]].uri);
    fclose(f);
    assert_int_equal(rename(tmp, path), 0);
}

/* Calls until one reaches server want (ms taken, or -1 after 5 s). */
static int64_t until_server(struct vrpc_channel *ch, int want)
{
    int64_t t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        int code;
        if (call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code) == want)
            return now_ms() - t0;
        assert_int_equal(code, VRPC_OK);
        usleep(500);
    }
    return -1;
}

static void t_file_update(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    char dir[] = "/tmp/vrpc_lb_XXXXXX", path[300], target[320];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/servers", dir);
    const int two[] = {0, 1}, three[] = {0, 1, 2}, last[] = {1, 2};
    write_set(path, two, 2);
    snprintf(target, sizeof target, "file://%s?poll_ms=50", path);
    struct vrpc_channel *ch;
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.src_addr = lb_client_ip;
    assert_int_equal(vrpc_channel_create(target, &o, &ch), 0);
    assert_int_equal(vrpc_channel_connect(ch, 5000), 0);
    int64_t t = until_server(ch, 1);
    assert_true(t >= 0);
    write_set(path, three, 3); /* added */
    t = until_server(ch, 2);
    printf("file://: an added server got its first call after %lld ms\n", (long long)t);
    assert_true(t >= 0 && t < 3000);
    write_set(path, last, 2); /* server 0 removed */
    int64_t end = now_ms() + 3000;
    while (vrpc_channel_subchannels(ch, NULL, 0) != 2 && now_ms() < end)
        usleep(1000);
    assert_int_equal(vrpc_channel_subchannels(ch, NULL, 0), 2);
    int count[3] = {0};
    for (int i = 0; i < 200; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        count[s]++;
    }
    printf("file://: after server 0 was removed: %d %d %d\n", count[0], count[1], count[2]);
    assert_int_equal(count[0], 0);
    vrpc_channel_destroy(ch);
    unlink(path);
    rmdir(dir);
}

/* ---- transparent retry: the flag, not the words ----------------------------------------- */

/* A handler that fails with UNAVAILABLE "server is shutting down ...", the
 * words of a refusal, has run: the call is not retried (no retry policy,
 * a method never marked idempotent), one attempt per call. Transparent retry
 * used to go by the message's prefix and made 11 attempts of each (330 for
 * 30 calls); now only VRPC_STATUS_UNPROCESSED drives it. */
static void t_unprocessed_flag(void **state)
{
    (void)state;
    enum { NCALLS = 30 };
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel *ch = open_ch(NULL, 3, NULL);
    uint64_t a0 = attempts_of(ch);
    for (int i = 0; i < NCALLS; i++) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        r.mode = 3;
        ProtobufCMessage *resp;
        struct vrpc_call_opts co = {.timeout_us = 5000000};
        struct vrpc_status st;
        assert_int_equal(vrpc_call(ch, &lb_m_once, &r.base, &resp, &co, &st), VRPC_UNAVAILABLE);
        assert_non_null(strstr(st.message, "server is shutting down"));
        assert_false(st.flags & VRPC_STATUS_UNPROCESSED); /* it ran */
    }
    uint64_t n = attempts_of(ch) - a0;
    printf("%d calls whose handler failed with a refusal's words: %llu attempts\n", NCALLS, (unsigned long long)n);
    assert_int_equal(n, NCALLS);
    vrpc_channel_destroy(ch);
}

/* ---- health checks ---------------------------------------------------------------------- */

static void t_health(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.health_check_ms = 50;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    kill(g_srv[0].pid, SIGUSR1); /* NOT_SERVING */
    struct vrpc_subchannel_info info[3];
    int64_t end = now_ms() + 3000;
    while (vrpc_channel_subchannels(ch, info, 3) == 3 && info[0].healthy && now_ms() < end)
        usleep(2000);
    assert_false(info[0].healthy);
    int count[3] = {0};
    for (int i = 0; i < 300; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        count[s]++;
    }
    printf("server 0 NOT_SERVING: %d %d %d\n", count[0], count[1], count[2]);
    assert_int_equal(count[0], 0);
    kill(g_srv[0].pid, SIGUSR2); /* SERVING again */
    int64_t t = until_server(ch, 0);
    printf("back in rotation after %lld ms\n", (long long)t);
    assert_true(t >= 0 && t < 3000);
    vrpc_channel_destroy(ch);
}

/* Time until subchannel 0's health is want (us; -1 after 5 s), polled every 200 us. */
static int64_t until_healthy(struct vrpc_channel *ch, bool want)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct vrpc_subchannel_info info[NSRV];
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t us = (t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000;
        if (vrpc_channel_subchannels(ch, info, NSRV) >= 1 && info[0].healthy == want)
            return us;
        if (us > 5000000)
            return -1;
        usleep(200);
    }
}

/* Health by Watch: with a period of 10 s (a poll would take up to that
 * long) server 0's NOT_SERVING takes its subchannel out within a bound far
 * below it, and SERVING brings it back as fast. The times include the
 * signal reaching the server process. */
static void t_health_watch(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.health_check_ms = 10000;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    usleep(100000);              /* the Watch streams open on the lb thread's next round */
    kill(g_srv[0].pid, SIGUSR1); /* NOT_SERVING */
    int64_t out = until_healthy(ch, false);
    int count[3] = {0};
    for (int i = 0; i < 300; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        count[s]++;
    }
    kill(g_srv[0].pid, SIGUSR2); /* SERVING */
    int64_t back = until_healthy(ch, true);
    printf("Watch (period 10 s): server 0 out %.1f ms after NOT_SERVING, back %.1f ms after SERVING; "
           "calls meanwhile %d %d %d\n",
           out / 1000.0, back / 1000.0, count[0], count[1], count[2]);
    assert_true(out >= 0 && out < 2000000);
    assert_true(back >= 0 && back < 2000000);
    assert_int_equal(count[0], 0);
    vrpc_channel_destroy(ch);
}

/* Servers whose Health has Check alone (Watch UNIMPLEMENTED): the channel
 * polls Check instead, and NOT_SERVING still takes server 0 out. */
static void t_health_check_fallback(void **state)
{
    (void)state;
    assert_int_equal(start_n(3, "check-only"), 0);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.health_check_ms = 50;
    struct vrpc_channel *ch = open_ch(NULL, 3, &o);
    usleep(200000); /* Watch tried, UNIMPLEMENTED, Check from then on */
    kill(g_srv[0].pid, SIGUSR1);
    int64_t out = until_healthy(ch, false);
    int count[3] = {0};
    for (int i = 0; i < 300; i++) {
        int code, s = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        count[s]++;
    }
    kill(g_srv[0].pid, SIGUSR2);
    int64_t back = until_healthy(ch, true);
    printf("Check fallback (period 50 ms): server 0 out after %.1f ms, back after %.1f ms; calls %d %d %d\n",
           out / 1000.0, back / 1000.0, count[0], count[1], count[2]);
    assert_true(out >= 0 && out < 3000000);
    assert_true(back >= 0 && back < 3000000);
    assert_int_equal(count[0], 0);
    vrpc_channel_destroy(ch);
}

/* ---- a blackholed address among the servers -------------------------------------------- */

/* A TCP listener that never accepts: the kernel completes the handshake
 * (the backlog), then nothing answers verbrpc's, so a connect to it hangs
 * for connect_timeout_ms. The other servers of the list must not wait for
 * it: each subchannel connects on its own job. TCP only (a blackhole for
 * verbs would need the fabric's help). */
static void t_blackhole_connect(void **state)
{
    (void)state;
    if (strcmp(lb_backend, "tcp") != 0) {
        printf("t_blackhole_connect: TCP only, skipped on %s\n", lb_backend);
        return;
    }
    assert_int_equal(start_n(2, NULL), 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    char target[512];
    snprintf(target, sizeof target, "list://tcp://127.0.0.1:%u,%s,%s", ntohs(a.sin_port), g_srv[0].uri, g_srv[1].uri);
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.connect_timeout_ms = 3000;
    o.backoff_initial_ms = 20;
    o.backoff_max_ms = 200;
    struct vrpc_channel *ch;
    int64_t t0 = now_ms();
    assert_int_equal(vrpc_channel_create(target, &o, &ch), 0);
    struct vrpc_subchannel_info info[3];
    int64_t ready_ms = -1;
    bool hole_ready = true;
    while (now_ms() - t0 < 10000) {
        size_t k = vrpc_channel_subchannels(ch, info, 3);
        if (k == 3 && info[1].state == VRPC_CHANNEL_READY && info[2].state == VRPC_CHANNEL_READY) {
            ready_ms = now_ms() - t0;
            hole_ready = info[0].state == VRPC_CHANNEL_READY;
            break;
        }
        usleep(1000);
    }
    printf("blackholed address first in the list (connect_timeout_ms 3000): the other two READY after %lld ms\n",
           (long long)ready_ms);
    assert_true(ready_ms >= 0);
    assert_false(hole_ready);
    assert_true(ready_ms < 1500); /* well before the blackhole's connect gives up */
    int code;
    for (int i = 0; i < 20; i++) {
        int srv = call_echo(ch, &lb_m_echo, 0, 0, NULL, NULL, 0, &code);
        assert_int_equal(code, VRPC_OK);
        assert_true(srv == 0 || srv == 1);
    }
    vrpc_channel_destroy(ch);
    close(fd);
}

/* ---- streams over many servers ------------------------------------------------------------ */

static int g_serving, g_not_serving, g_done; /* atomic: what the Watch streams read */

static void watch_read(struct vrpc_stream *s, const ProtobufCMessage *msg, void *arg)
{
    const Verbrpc__Health__V1__HealthCheckResponse *r = (const Verbrpc__Health__V1__HealthCheckResponse *)msg;
    (void)s, (void)arg;
    if (r->status == VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
        __atomic_add_fetch(&g_serving, 1, __ATOMIC_RELAXED);
    else if (r->status == VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING)
        __atomic_add_fetch(&g_not_serving, 1, __ATOMIC_RELAXED);
}

static void watch_done(struct vrpc_stream *s, const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    (void)s, (void)st, (void)resp, (void)arg;
    __atomic_add_fetch(&g_done, 1, __ATOMIC_RELAXED);
}

static int wait_count(int *v, int want, int ms)
{
    int64_t end = now_ms() + ms;
    while (__atomic_load_n(v, __ATOMIC_RELAXED) < want && now_ms() < end)
        usleep(2000);
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

/* Each stream is placed once, by the policy: 30 Health/Watch streams over 3
 * servers with round robin put 10 on each, so server 0 going NOT_SERVING is
 * heard by exactly 10 of them. */
static void t_streams(void **state)
{
    (void)state;
    enum { NS = 30 };
    assert_int_equal(start_n(3, NULL), 0);
    struct vrpc_channel *ch = open_ch(NULL, 3, NULL);
    struct vrpc_stream *st[NS];
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    struct vrpc_stream_cbs cbs = {.on_read = watch_read, .on_done = watch_done};
    struct vrpc_stream_opts so = {.call = {.timeout_us = 20000000}, .cbs = &cbs};
    g_serving = g_not_serving = g_done = 0;
    for (int i = 0; i < NS; i++) {
        assert_int_equal(vrpc_stream_start(ch, &verbrpc__health__v1__health__watch__method, &so, &st[i]), 0);
        assert_int_equal(vrpc_stream_write(st[i], &req.base), 0);
        assert_int_equal(vrpc_stream_close_send(st[i]), 0);
    }
    assert_int_equal(wait_count(&g_serving, NS, 5000), NS); /* each hears SERVING first */
    kill(g_srv[0].pid, SIGUSR1);                            /* NOT_SERVING */
    int changed = wait_count(&g_not_serving, NS / 3, 5000);
    usleep(200000); /* and no stream of another server hears it */
    changed = __atomic_load_n(&g_not_serving, __ATOMIC_RELAXED);
    printf("30 Watch streams over 3 servers: %d heard server 0 go NOT_SERVING\n", changed);
    assert_int_equal(changed, NS / 3);
    assert_int_equal(__atomic_load_n(&g_done, __ATOMIC_RELAXED), 0);
    for (int i = 0; i < NS; i++)
        vrpc_stream_destroy(st[i]); /* cancels: on_done runs first */
    assert_int_equal(__atomic_load_n(&g_done, __ATOMIC_RELAXED), NS);
    vrpc_channel_destroy(ch);
}

/* A plain channel names its server too. */
static void t_peer_plain(void **state)
{
    (void)state;
    assert_int_equal(start_n(1, NULL), 0);
    struct vrpc_channel *ch;
    struct vrpc_channel_opts o;
    vrpc_channel_opts_init(&o);
    o.src_addr = lb_client_ip;
    assert_int_equal(vrpc_channel_create(g_srv[0].uri, &o, &ch), 0);
    char peer[96] = "x";
    int code;
    assert_int_equal(call_echo(ch, &lb_m_echo, 0, 0, NULL, peer, sizeof peer, &code), 0);
    assert_non_null(strstr(peer, lb_server_ip));
    vrpc_channel_destroy(ch);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--serve") == 0)
        return lb_serve(argc, argv);
    const char *setup = "local";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            lb_backend = argv[++i];
        else if (!strcmp(argv[i], "--setup") && i + 1 < argc)
            setup = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--backend tcp|verbs] [--setup local|single|veth]\n"
                    "verbs: --setup single reads VRPC_VERBS_IP (servers and client); --setup veth\n"
                    "reads VRPC_VERBS_IP_A (client) and VRPC_VERBS_IP_B (the servers).\n",
                    argv[0]);
            return 2;
        }
    }
    int setup_rc = vrpc_test_backend_addrs(lb_backend, setup, &lb_server_ip, &lb_client_ip);
    if (setup_rc)
        return setup_rc;
    printf("# lb tests: backend %s, setup %s, servers on %s\n", lb_backend, setup, lb_server_ip);
    signal(SIGPIPE, SIG_IGN);
    lb_test_methods_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(t_round_robin_even, teardown),
        cmocka_unit_test_teardown(t_kill_and_restart, teardown),
        cmocka_unit_test_teardown(t_drain, teardown),
        cmocka_unit_test_teardown(t_ring_hash, teardown),
        cmocka_unit_test_teardown(t_retry_half, teardown),
        cmocka_unit_test_teardown(t_budget, teardown),
        cmocka_unit_test_teardown(t_non_idempotent, teardown),
        cmocka_unit_test_teardown(t_outlier, teardown),
        cmocka_unit_test_teardown(t_async_kill, teardown),
        cmocka_unit_test_teardown(t_async_cancel_destroy, teardown),
        cmocka_unit_test_teardown(t_file_update, teardown),
        cmocka_unit_test_teardown(t_unprocessed_flag, teardown),
        cmocka_unit_test_teardown(t_health, teardown),
        cmocka_unit_test_teardown(t_health_watch, teardown),
        cmocka_unit_test_teardown(t_health_check_fallback, teardown),
        cmocka_unit_test_teardown(t_blackhole_connect, teardown),
        cmocka_unit_test_teardown(t_peer_plain, teardown),
        cmocka_unit_test_teardown(t_streams, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

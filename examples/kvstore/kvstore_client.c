/* kvstore_client: single KvStore commands, Watch and BulkPut streams
 * (kv_stream_cmds.c), the server's health and statistics, or a load (closed loop: a fixed number of calls in flight,
 * each completion issuing the next) that prints throughput and latency
 * percentiles.
 *   kvstore_client [--connect URI] [--threads N] COMMAND ...
 * Run with --help for the commands and the load options. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <verbrpc/health.vrpc.h>
#include <verbrpc/stats.vrpc.h>
#include <verbrpc/verbrpc.h>

#include "ex_util.h"
#include "kv_stream_cmds.h"
#include "kvstore/kvstore.vrpc.h"

struct load_cfg {
    unsigned long long keys, value_size, outstanding, duration_s, get_pct;
    bool sync, json;
};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--connect URI] [--threads N] COMMAND [ARGS]\n"
            "  --connect URI     the server: tcp://HOST:PORT, verbs://IP:PORT, auto://HOST:PORT or\n"
            "                    HOST:PORT (default tcp://127.0.0.1:7071), or several servers\n"
            "                    (list://tcp://H1:P1,tcp://H2:P2,..., dns://, file://, etcd://): the\n"
            "                    store is sharded, each key on one server by consistent hashing\n"
            "                    (scan, health and stats then ask one of them)\n"
            "  --threads N       scheduler workers running async completions (default 2)\n"
            "commands:\n"
            "  put KEY VALUE     store VALUE under KEY\n"
            "  fill KEY BYTES    store BYTES bytes of a pattern under KEY (sizes above the\n"
            "                    eager size travel by rendezvous: RDMA READ on verbs);\n"
            "                    prints the value's FNV-1a checksum and the time taken\n"
            "  get KEY           print the value under KEY (longer values: size + checksum)\n"
            "  delete KEY        remove KEY\n"
            "  scan [START [END [LIMIT]]]  pairs with START <= key < END, in key order\n"
            "  watch [PREFIX [COUNT]]  print each change to keys starting with PREFIX (a Watch\n"
            "                    stream); stop after COUNT changes (default: until the server ends it)\n"
            "  bulkput PREFIX COUNT [BYTES]  store COUNT pairs PREFIX00000000... with BYTES-byte\n"
            "                    values (default 16) on one BulkPut stream; prints the rate\n"
            "  health [SERVICE]  the server's health (or a service's, e.g. examples.kvstore.v1.KvStore)\n"
            "  stats [PREFIX]    the server's per-method statistics (methods starting with PREFIX)\n"
            "  load              run a load and print throughput and latency; options:\n"
            "    --keys N          distinct keys, stored first (default 10000)\n"
            "    --value-size B    bytes per value (default 64)\n"
            "    --outstanding K   calls in flight (default 16)\n"
            "    --duration S      seconds of load after the prefill (default 5)\n"
            "    --get-ratio P     percent of Get calls, the rest Put (default 80)\n"
            "    --sync            K threads making blocking calls instead of async calls\n"
            "    --json            also print one JSON line with the figures\n",
            argv0);
}

static void print_status(const char *what, const struct vrpc_status *st)
{
    fprintf(stderr, "kvstore_client: %s: %s%s%s\n", what, vrpc_code_name(st->code), st->message[0] ? ": " : "",
            st->message);
}

/* FNV-1a 64 over a value: what fill prints and get prints back for long values. */
static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void print_bytes(const uint8_t *p, size_t n)
{
    bool text = true;

    if (n > 80) {
        printf("(%zu bytes, fnv1a %016llx)", n, (unsigned long long)checksum(p, n));
        return;
    }
    for (size_t i = 0; i < n && text; i++)
        text = isprint(p[i]) || p[i] == ' ';
    if (text) {
        printf("\"%.*s\"", (int)n, (const char *)p);
    } else {
        printf("0x");
        for (size_t i = 0; i < n; i++)
            printf("%02x", p[i]);
    }
}

/* Calls on KEY: placed by consistent hashing on the key when --connect names
 * several servers (list://, dns://, file://, etcd://; a plain URI ignores it),
 * so that every client puts a key on the same server. */
static bool g_sharded;

static const struct vrpc_call_opts *key_opts(struct vrpc_call_opts *co, const char *key, char *peer, size_t cap)
{
    memset(co, 0, sizeof(*co));
    co->hash_key = key;
    co->hash_key_len = strlen(key);
    co->peer = peer;
    co->peer_cap = cap;
    return co;
}

/* Which server took the call, for a sharded store. */
static void show_server(const char *peer)
{
    if (g_sharded)
        fprintf(stderr, "(server %s)\n", peer);
}

/* ---- single commands ------------------------------------------------------ */

static int cmd_put(struct vrpc_channel *ch, const char *key, const char *value)
{
    Examples__Kvstore__V1__PutRequest req = EXAMPLES__KVSTORE__V1__PUT_REQUEST__INIT;
    Examples__Kvstore__V1__PutReply *reply;
    struct vrpc_status st;
    struct vrpc_call_opts co;
    char peer[96] = "";

    req.key = (char *)key;
    req.value.data = (uint8_t *)value;
    req.value.len = strlen(value);
    if (examples__kvstore__v1__kv_store__put__call(ch, &req, &reply, key_opts(&co, key, peer, sizeof peer), &st) !=
        VRPC_OK) {
        print_status("put", &st);
        return 1;
    }
    printf("put %s: %s\n", key, reply->created ? "created" : "replaced");
    show_server(peer);
    return 0;
}

static int cmd_fill(struct vrpc_channel *ch, const char *key, size_t bytes)
{
    Examples__Kvstore__V1__PutRequest req = EXAMPLES__KVSTORE__V1__PUT_REQUEST__INIT;
    Examples__Kvstore__V1__PutReply *reply;
    struct vrpc_status st;
    struct vrpc_call_opts co;
    char peer[96] = "";
    uint8_t *value = malloc(bytes ? bytes : 1);
    int64_t t0;

    if (!value) {
        fprintf(stderr, "kvstore_client: fill: cannot allocate %zu bytes\n", bytes);
        return 1;
    }
    for (size_t i = 0; i < bytes; i++)
        value[i] = (uint8_t)(i * 2654435761u >> 24);
    req.key = (char *)key;
    req.value.data = value;
    req.value.len = bytes;
    t0 = ex_now_ns();
    if (examples__kvstore__v1__kv_store__put__call(ch, &req, &reply, key_opts(&co, key, peer, sizeof peer), &st) !=
        VRPC_OK) {
        print_status("fill", &st);
        free(value);
        return 1;
    }
    printf("fill %s: %s, %zu bytes, fnv1a %016llx, %.2f ms\n", key, reply->created ? "created" : "replaced", bytes,
           (unsigned long long)checksum(value, bytes), (ex_now_ns() - t0) / 1e6);
    free(value);
    show_server(peer);
    return 0;
}

static int cmd_get(struct vrpc_channel *ch, const char *key)
{
    Examples__Kvstore__V1__GetRequest req = EXAMPLES__KVSTORE__V1__GET_REQUEST__INIT;
    Examples__Kvstore__V1__GetReply *reply;
    struct vrpc_status st;
    struct vrpc_call_opts co;
    char peer[96] = "";

    req.key = (char *)key;
    if (examples__kvstore__v1__kv_store__get__call(ch, &req, &reply, key_opts(&co, key, peer, sizeof peer), &st) !=
        VRPC_OK) {
        print_status("get", &st);
        return 1;
    }
    printf("%s = ", key);
    print_bytes(reply->value.data, reply->value.len);
    printf("\n");
    show_server(peer);
    return 0;
}

static int cmd_delete(struct vrpc_channel *ch, const char *key)
{
    Examples__Kvstore__V1__DeleteRequest req = EXAMPLES__KVSTORE__V1__DELETE_REQUEST__INIT;
    Examples__Kvstore__V1__DeleteReply *reply;
    struct vrpc_status st;
    struct vrpc_call_opts co;
    char peer[96] = "";

    req.key = (char *)key;
    if (examples__kvstore__v1__kv_store__delete__call(ch, &req, &reply, key_opts(&co, key, peer, sizeof peer), &st) !=
        VRPC_OK) {
        print_status("delete", &st);
        return 1;
    }
    printf("delete %s: %s\n", key, reply->existed ? "deleted" : "was absent");
    show_server(peer);
    return 0;
}

static int cmd_scan(struct vrpc_channel *ch, const char *start, const char *end, unsigned limit)
{
    Examples__Kvstore__V1__ScanRequest req = EXAMPLES__KVSTORE__V1__SCAN_REQUEST__INIT;
    Examples__Kvstore__V1__ScanReply *reply;
    struct vrpc_status st;

    req.start_key = (char *)start;
    req.end_key = (char *)end;
    req.limit = limit;
    if (examples__kvstore__v1__kv_store__scan__call(ch, &req, &reply, NULL, &st) != VRPC_OK) {
        print_status("scan", &st);
        return 1;
    }
    for (size_t i = 0; i < reply->n_items; i++) {
        printf("%s = ", reply->items[i]->key);
        print_bytes(reply->items[i]->value.data, reply->items[i]->value.len);
        printf("\n");
    }
    printf("(%zu pair%s%s)\n", reply->n_items, reply->n_items == 1 ? "" : "s", reply->more ? ", more in range" : "");
    return 0;
}

static int cmd_health(struct vrpc_channel *ch, const char *service)
{
    Verbrpc__Health__V1__HealthCheckRequest req = VERBRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Verbrpc__Health__V1__HealthCheckResponse *resp;
    struct vrpc_status st;
    const ProtobufCEnumValue *ev;

    req.service = (char *)service;
    if (verbrpc__health__v1__health__check__call(ch, &req, &resp, NULL, &st) != VRPC_OK) {
        print_status("health", &st);
        return 1;
    }
    ev = protobuf_c_enum_descriptor_get_value(&verbrpc__health__v1__health_check_response__serving_status__descriptor,
                                              resp->status);
    printf("health %s: %s\n", service[0] ? service : "(server)", ev ? ev->name : "?");
    return 0;
}

static int cmd_stats(struct vrpc_channel *ch, const char *prefix)
{
    Verbrpc__Stats__V1__GetStatsRequest req = VERBRPC__STATS__V1__GET_STATS_REQUEST__INIT;
    Verbrpc__Stats__V1__GetStatsResponse *resp;
    struct vrpc_status st;

    req.method_prefix = (char *)prefix;
    if (verbrpc__stats__v1__stats__get__call(ch, &req, &resp, NULL, &st) != VRPC_OK) {
        print_status("stats", &st);
        return 1;
    }
    printf("%-40s %10s %8s %8s %8s %8s %8s\n", "method", "calls", "errors", "p50 us", "p90 us", "p99 us", "max us");
    for (size_t i = 0; i < resp->n_methods; i++) {
        const Verbrpc__Stats__V1__MethodStats *m = resp->methods[i];

        printf("%-40s %10llu %8llu %8llu %8llu %8llu %8llu", m->method, (unsigned long long)m->calls,
               (unsigned long long)m->errors, (unsigned long long)m->latency_p50_us,
               (unsigned long long)m->latency_p90_us, (unsigned long long)m->latency_p99_us,
               (unsigned long long)m->latency_max_us);
        for (size_t j = 0; j < m->n_errors_by_code; j++)
            printf("%s %s:%llu", j ? "" : "  ", m->errors_by_code[j]->code,
                   (unsigned long long)m->errors_by_code[j]->count);
        printf("\n");
    }
    return 0;
}

/* ---- load ------------------------------------------------------------------
 * Each slot is one call in flight. Async mode: a slot's completion (on a
 * scheduler worker) records the latency and issues the slot's next call until
 * the deadline. Sync mode: one thread per slot making blocking calls. */

struct load {
    struct vrpc_channel *ch;
    const struct load_cfg *cfg;
    uint8_t *value;
    bool prefill;                              /* storing every key once, in order */
    uint64_t next_key;                         /* prefill: next key to store (atomic) */
    int64_t end_ns;                            /* measured phase: no new call after this */
    int active;                                /* slots still running (atomic) */
    uint64_t calls, gets, puts, failed_starts; /* atomics; calls, gets, puts: OK ones */
    uint64_t by_code[VRPC_CODE_COUNT];         /* atomics: every finished call by code */
    struct ex_hist hist;                       /* latency of OK calls */
    /* Back-off while the server is unavailable: after an UNAVAILABLE call no
     * slot starts a call before backoff_until_ns; the delay doubles from
     * BACKOFF_MIN_MS per failure in a row, up to BACKOFF_MAX_MS, and an OK
     * call resets it. Async slots that must wait are parked and restarted
     * by the main thread (no worker sleeps). */
    int64_t backoff_until_ns; /* atomic */
    uint32_t backoff_ms;      /* atomic: the next delay */
    uint64_t backoffs;        /* atomic: how many times it backed off */
    uint64_t prefill_errors;  /* atomic: puts of the prefill that failed */
    int parked;               /* async slots waiting for the back-off (atomic) */
};

#define BACKOFF_MIN_MS 10u
#define BACKOFF_MAX_MS 1000u

struct slot {
    struct load *L;
    Examples__Kvstore__V1__KvStore_Get_Async get_a;
    Examples__Kvstore__V1__KvStore_Put_Async put_a;
    int64_t t0;
    uint64_t rng;
    int parked;       /* async: waiting for the back-off to pass (atomic) */
    pthread_t thread; /* sync mode */
};

static uint64_t next_rand(uint64_t *s) /* xorshift64* */
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void add(uint64_t *p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* Picks the slot's next call. false when the slot is done. */
static bool next_op(struct slot *sl, bool *is_get, uint64_t *key)
{
    struct load *L = sl->L;

    if (L->prefill) {
        *key = __atomic_fetch_add(&L->next_key, 1, __ATOMIC_RELAXED);
        *is_get = false;
        return *key < L->cfg->keys;
    }
    if (ex_now_ns() >= L->end_ns)
        return false;
    *key = next_rand(&sl->rng) % L->cfg->keys;
    *is_get = next_rand(&sl->rng) % 100 < L->cfg->get_pct;
    return true;
}

/* Counts the call (OK ones as throughput and latency, others as errors by
 * code) and updates the back-off; true when the slot must wait before its
 * next call. */
static bool record(struct slot *sl, bool is_get, enum vrpc_code code)
{
    struct load *L = sl->L;

    if (code == VRPC_UNAVAILABLE) {
        uint32_t d = __atomic_load_n(&L->backoff_ms, __ATOMIC_RELAXED);
        uint32_t next = d ? (d * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d * 2) : BACKOFF_MIN_MS;
        if (!d)
            d = BACKOFF_MIN_MS;
        int64_t now = ex_now_ns(), until = __atomic_load_n(&L->backoff_until_ns, __ATOMIC_RELAXED);
        /* calls that fail while a back-off runs (all slots at a lost
         * connection) do not lengthen it: one step per back-off */
        if (now >= until && __atomic_compare_exchange_n(&L->backoff_until_ns, &until, now + (int64_t)d * 1000000, false,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            __atomic_store_n(&L->backoff_ms, next, __ATOMIC_RELAXED);
            add(&L->backoffs, 1);
        }
    } else if (code == VRPC_OK) {
        __atomic_store_n(&L->backoff_ms, 0, __ATOMIC_RELAXED);
    }
    if (L->prefill && code != VRPC_OK)
        add(&L->prefill_errors, 1);
    if (!L->prefill) {
        add(&L->by_code[code < VRPC_CODE_COUNT ? code : VRPC_UNKNOWN], 1);
        if (code == VRPC_OK) {
            ex_hist_add(&L->hist, ex_now_ns() - sl->t0);
            add(&L->calls, 1);
            add(is_get ? &L->gets : &L->puts, 1);
        }
    }
    return ex_now_ns() < __atomic_load_n(&L->backoff_until_ns, __ATOMIC_RELAXED);
}

/* Async: park the slot until the back-off passes (run_phase restarts it). */
static void park(struct slot *sl)
{
    __atomic_store_n(&sl->parked, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&sl->L->parked, 1, __ATOMIC_RELEASE);
}

static void finish(struct slot *sl) { __atomic_fetch_sub(&sl->L->active, 1, __ATOMIC_RELEASE); }

static void issue(struct slot *sl);

static void on_get(const struct vrpc_status *st, const Examples__Kvstore__V1__GetReply *resp, void *arg)
{
    (void)resp;
    if (record(arg, true, st->code))
        park(arg);
    else
        issue(arg);
}

static void on_put(const struct vrpc_status *st, const Examples__Kvstore__V1__PutReply *resp, void *arg)
{
    (void)resp;
    if (record(arg, false, st->code))
        park(arg);
    else
        issue(arg);
}

static void issue(struct slot *sl)
{
    struct load *L = sl->L;
    struct vrpc_call_opts co;
    char key[32];
    uint64_t k;
    bool is_get;
    int rc;

    if (!next_op(sl, &is_get, &k)) {
        finish(sl);
        return;
    }
    snprintf(key, sizeof(key), "key%08llu", (unsigned long long)k);
    sl->t0 = ex_now_ns();
    if (is_get) {
        Examples__Kvstore__V1__GetRequest req = EXAMPLES__KVSTORE__V1__GET_REQUEST__INIT;

        req.key = key;
        rc = examples__kvstore__v1__kv_store__get__call_async(L->ch, &req, key_opts(&co, key, NULL, 0), &sl->get_a);
    } else {
        Examples__Kvstore__V1__PutRequest req = EXAMPLES__KVSTORE__V1__PUT_REQUEST__INIT;

        req.key = key;
        req.value.data = L->value;
        req.value.len = L->cfg->value_size;
        rc = examples__kvstore__v1__kv_store__put__call_async(L->ch, &req, key_opts(&co, key, NULL, 0), &sl->put_a);
    }
    if (rc != 0) { /* not accepted: the completion will not run */
        add(&L->failed_starts, 1);
        finish(sl);
    }
}

static void *sync_worker(void *arg)
{
    struct slot *sl = arg;
    struct load *L = sl->L;
    char key[32];
    uint64_t k;
    bool is_get;

    while (next_op(sl, &is_get, &k)) {
        struct vrpc_status st;
        struct vrpc_call_opts co;
        int code;

        snprintf(key, sizeof(key), "key%08llu", (unsigned long long)k);
        sl->t0 = ex_now_ns();
        if (is_get) {
            Examples__Kvstore__V1__GetRequest req = EXAMPLES__KVSTORE__V1__GET_REQUEST__INIT;
            Examples__Kvstore__V1__GetReply *resp;

            req.key = key;
            code = examples__kvstore__v1__kv_store__get__call(L->ch, &req, &resp, key_opts(&co, key, NULL, 0), &st);
        } else {
            Examples__Kvstore__V1__PutRequest req = EXAMPLES__KVSTORE__V1__PUT_REQUEST__INIT;
            Examples__Kvstore__V1__PutReply *resp;

            req.key = key;
            req.value.data = L->value;
            req.value.len = L->cfg->value_size;
            code = examples__kvstore__v1__kv_store__put__call(L->ch, &req, &resp, key_opts(&co, key, NULL, 0), &st);
        }
        if (record(sl, is_get, (enum vrpc_code)code)) {
            int64_t left = __atomic_load_n(&L->backoff_until_ns, __ATOMIC_RELAXED) - ex_now_ns();
            if (left > 0) {
                struct timespec ts = {left / 1000000000, left % 1000000000};
                nanosleep(&ts, NULL);
            }
        }
    }
    finish(sl);
    vrpc_thread_release();
    return NULL;
}

/* Runs one phase (prefill or measured) with every slot; returns when all
 * slots are done. */
static int run_phase(struct load *L, struct slot *slots, size_t n)
{
    struct timespec tick = {0, 5 * 1000 * 1000};

    __atomic_store_n(&L->active, (int)n, __ATOMIC_RELAXED);
    for (size_t i = 0; i < n; i++) {
        if (L->cfg->sync) {
            if (pthread_create(&slots[i].thread, NULL, sync_worker, &slots[i]) != 0) {
                fprintf(stderr, "kvstore_client: cannot start thread %zu\n", i);
                finish(&slots[i]);
                slots[i].thread = 0;
            }
        } else {
            issue(&slots[i]);
        }
    }
    while (__atomic_load_n(&L->active, __ATOMIC_ACQUIRE) > 0) {
        nanosleep(&tick, NULL);
        if (!__atomic_load_n(&L->parked, __ATOMIC_ACQUIRE) ||
            ex_now_ns() < __atomic_load_n(&L->backoff_until_ns, __ATOMIC_RELAXED))
            continue;
        for (size_t i = 0; i < n; i++) { /* the back-off passed: restart parked slots */
            if (__atomic_exchange_n(&slots[i].parked, 0, __ATOMIC_ACQ_REL)) {
                __atomic_fetch_sub(&L->parked, 1, __ATOMIC_RELEASE);
                issue(&slots[i]);
            }
        }
    }
    if (L->cfg->sync)
        for (size_t i = 0; i < n; i++)
            if (slots[i].thread)
                pthread_join(slots[i].thread, NULL);
    return 0;
}

static int cmd_load(struct vrpc_channel *ch, const char *uri, const struct load_cfg *cfg, unsigned threads)
{
    struct load *L = calloc(1, sizeof(*L));
    struct slot *slots = calloc(cfg->outstanding, sizeof(*slots));
    double secs, errors = 0;
    int64_t t0;
    int rc = 1;

    if (!L || !slots)
        goto out;
    L->ch = ch;
    L->cfg = cfg;
    L->value = malloc(cfg->value_size ? cfg->value_size : 1);
    if (!L->value)
        goto out;
    for (size_t i = 0; i < cfg->value_size; i++)
        L->value[i] = (uint8_t)('a' + i % 26);
    for (size_t i = 0; i < cfg->outstanding; i++) {
        slots[i].L = L;
        slots[i].rng = 0x9e3779b97f4a7c15ull * (i + 1);
        slots[i].get_a.done = on_get;
        slots[i].get_a.arg = &slots[i];
        slots[i].put_a.done = on_put;
        slots[i].put_a.arg = &slots[i];
    }
    printf("kvstore load on %s: %llu keys, %llu B values, %llu%% get, %llu outstanding (%s), %u threads, %llu s\n", uri,
           cfg->keys, cfg->value_size, cfg->get_pct, cfg->outstanding, cfg->sync ? "sync" : "async", threads,
           cfg->duration_s);
    fflush(stdout);

    L->prefill = true;
    t0 = ex_now_ns();
    run_phase(L, slots, cfg->outstanding);
    printf("  prefill: %llu puts in %.2f s", cfg->keys, (ex_now_ns() - t0) / 1e9);
    if (L->prefill_errors)
        printf(", %llu of them failed", (unsigned long long)L->prefill_errors);
    printf("\n");

    L->prefill = false;
    t0 = ex_now_ns();
    L->end_ns = t0 + (int64_t)cfg->duration_s * 1000000000;
    run_phase(L, slots, cfg->outstanding);
    secs = (ex_now_ns() - t0) / 1e9;

    for (int c = 1; c < VRPC_CODE_COUNT; c++)
        errors += (double)L->by_code[c];
    /* throughput counts OK calls only; failures are errors, by code */
    printf("  ok calls: %llu in %.2f s = %.0f calls/s (get %llu, put %llu)\n", (unsigned long long)L->calls, secs,
           L->calls / secs, (unsigned long long)L->gets, (unsigned long long)L->puts);
    printf("  errors: %.0f", errors);
    for (int c = 1; c < VRPC_CODE_COUNT; c++)
        if (L->by_code[c])
            printf(" %s:%llu", vrpc_code_name((enum vrpc_code)c), (unsigned long long)L->by_code[c]);
    if (L->failed_starts)
        printf(", %llu calls not started", (unsigned long long)L->failed_starts);
    if (L->backoffs)
        printf(", backed off %llu times while the server was unavailable (%u ms to %u ms)",
               (unsigned long long)L->backoffs, BACKOFF_MIN_MS, BACKOFF_MAX_MS);
    printf("\n  latency of ok calls (us): p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
           ex_hist_quantile(&L->hist, 0.50) / 1e3, ex_hist_quantile(&L->hist, 0.90) / 1e3,
           ex_hist_quantile(&L->hist, 0.99) / 1e3, ex_hist_quantile(&L->hist, 0.999) / 1e3,
           ex_hist_quantile(&L->hist, 1.0) / 1e3);
    if (cfg->json)
        printf("{\"name\":\"kvstore_load\",\"uri\":\"%s\",\"mode\":\"%s\",\"outstanding\":%llu,\"value_size\":%llu,"
               "\"get_pct\":%llu,\"calls\":%llu,\"errors\":%.0f,\"ops_per_s\":%.0f,\"p50_us\":%.1f,"
               "\"p90_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f}\n",
               uri, cfg->sync ? "sync" : "async", cfg->outstanding, cfg->value_size, cfg->get_pct,
               (unsigned long long)L->calls, errors, L->calls / secs, ex_hist_quantile(&L->hist, 0.50) / 1e3,
               ex_hist_quantile(&L->hist, 0.90) / 1e3, ex_hist_quantile(&L->hist, 0.99) / 1e3,
               ex_hist_quantile(&L->hist, 0.999) / 1e3, ex_hist_quantile(&L->hist, 1.0) / 1e3);
    rc = L->calls > 0 && errors == 0 && L->failed_starts == 0 && L->prefill_errors == 0 ? 0 : 1;
out:
    if (L)
        free(L->value);
    free(L);
    free(slots);
    return rc;
}

/* The numeric options' names and ranges. */
static const char *opt_name(int c)
{
    switch (c) {
    case 't':
        return "threads";
    case 'k':
        return "keys";
    case 'v':
        return "value-size";
    case 'o':
        return "outstanding";
    case 'd':
        return "duration";
    default:
        return "get-ratio";
    }
}
static unsigned long long opt_min(int c) { return c == 'v' || c == 'g' ? 0 : 1; }
static unsigned long long opt_max(int c) { return c == 'g' ? 100 : c == 't' || c == 'o' ? 4096 : 1ull << 32; }

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"connect", required_argument, NULL, 'c'},
        {"threads", required_argument, NULL, 't'},
        {"keys", required_argument, NULL, 'k'},
        {"value-size", required_argument, NULL, 'v'},
        {"outstanding", required_argument, NULL, 'o'},
        {"duration", required_argument, NULL, 'd'},
        {"get-ratio", required_argument, NULL, 'g'},
        {"sync", no_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct load_cfg cfg = {.keys = 10000, .value_size = 64, .outstanding = 16, .duration_s = 5, .get_pct = 80};
    const char *uri = "tcp://127.0.0.1:7071", *cmd;
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch = NULL;
    unsigned long long v;
    int c, rc, nargs;
    char **args;

    vrpc_channel_opts_init(&o);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            uri = optarg;
            break;
        case 's':
            cfg.sync = true;
            break;
        case 'j':
            cfg.json = true;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        case 't':
        case 'k':
        case 'v':
        case 'o':
        case 'd':
        case 'g':
            if (!ex_parse_uint(optarg, &v) || v < opt_min(c) || v > opt_max(c)) {
                fprintf(stderr, "%s: --%s wants %s from %llu to %llu, not '%s'\n", argv[0], opt_name(c),
                        c == 'd'   ? "seconds"
                        : c == 'v' ? "bytes"
                        : c == 'g' ? "a percentage"
                                   : "a number",
                        opt_min(c), opt_max(c), optarg);
                return 2;
            }
            if (c == 't')
                o.threads = (unsigned)v;
            else if (c == 'k')
                cfg.keys = v;
            else if (c == 'v')
                cfg.value_size = v;
            else if (c == 'o')
                cfg.outstanding = v;
            else if (c == 'd')
                cfg.duration_s = v;
            else
                cfg.get_pct = v;
            break;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind >= argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    cmd = argv[optind];
    args = argv + optind + 1;
    nargs = argc - optind - 1;
    if (cfg.outstanding > 256)
        o.max_outstanding = (uint32_t)cfg.outstanding;

    /* several servers: keys placed by consistent hashing (a plain URI ignores the policy) */
    g_sharded = strncmp(uri, "list://", 7) == 0 || strncmp(uri, "dns://", 6) == 0 || strncmp(uri, "file://", 7) == 0 ||
                strncmp(uri, "etcd://", 7) == 0;
    o.lb_policy = VRPC_LB_RING_HASH;
    rc = vrpc_channel_create(uri, &o, &ch);
    if (rc != 0) {
        fprintf(stderr, "kvstore_client: bad URI %s: %s\n", uri, strerror(-rc));
        return 2;
    }
    if (strcmp(cmd, "put") == 0 && nargs == 2) {
        rc = cmd_put(ch, args[0], args[1]);
    } else if (strcmp(cmd, "fill") == 0 && nargs == 2) {
        unsigned long long bytes = 0;

        if (!ex_parse_uint(args[1], &bytes) || bytes > (1ull << 30)) {
            fprintf(stderr, "kvstore_client: bad fill size '%s' (1 to 1073741824 bytes)\n", args[1]);
            rc = 2;
        } else {
            rc = cmd_fill(ch, args[0], (size_t)bytes);
        }
    } else if (strcmp(cmd, "get") == 0 && nargs == 1) {
        rc = cmd_get(ch, args[0]);
    } else if (strcmp(cmd, "delete") == 0 && nargs == 1) {
        rc = cmd_delete(ch, args[0]);
    } else if (strcmp(cmd, "scan") == 0 && nargs <= 3) {
        unsigned long long limit = 0;

        if (nargs == 3 && !ex_parse_uint(args[2], &limit)) {
            fprintf(stderr, "kvstore_client: bad scan limit '%s'\n", args[2]);
            rc = 2;
        } else {
            rc = cmd_scan(ch, nargs > 0 ? args[0] : "", nargs > 1 ? args[1] : "", (unsigned)limit);
        }
    } else if (strcmp(cmd, "watch") == 0 && nargs <= 2) {
        unsigned long long count = 0;

        if (nargs == 2 && !ex_parse_uint(args[1], &count)) {
            fprintf(stderr, "kvstore_client: bad watch count '%s'\n", args[1]);
            rc = 2;
        } else {
            rc = kv_cmd_watch(ch, nargs ? args[0] : "", count);
        }
    } else if (strcmp(cmd, "bulkput") == 0 && (nargs == 2 || nargs == 3)) {
        unsigned long long count = 0, bytes = 16;

        if (!ex_parse_uint(args[1], &count) ||
            (nargs == 3 && (!ex_parse_uint(args[2], &bytes) || bytes > (1u << 30)))) {
            fprintf(stderr, "kvstore_client: bad bulkput count or size '%s'\n", args[nargs - 1]);
            rc = 2;
        } else {
            rc = kv_cmd_bulkput(ch, args[0], count, (size_t)bytes);
        }
    } else if (strcmp(cmd, "health") == 0 && nargs <= 1) {
        rc = cmd_health(ch, nargs ? args[0] : "");
    } else if (strcmp(cmd, "stats") == 0 && nargs <= 1) {
        rc = cmd_stats(ch, nargs ? args[0] : "");
    } else if (strcmp(cmd, "load") == 0 && nargs == 0) {
        rc = cmd_load(ch, uri, &cfg, o.threads ? o.threads : 2);
    } else {
        usage(stderr, argv[0]);
        rc = 2;
    }
    vrpc_channel_destroy(ch);
    return rc;
}

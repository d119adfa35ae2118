/* lb_bench: a channel over several servers on this machine (issue 20).
 * Three servers in this process (TCP, loopback); K threads make
 * synchronous 32 B echo calls for --duration-ms each case:
 *   single      tcp:// to one server (the baseline)
 *   rr3         list:// of three, round robin
 *   lo3         list:// of three, least outstanding
 *   rr3-slow    three, one answering after --slow-us (round robin)
 *   lo3-slow    the same with least outstanding
 * Prints calls/s, p50 and p99 (us) per case and the ratio of each
 * throughput to the single server's, with --json one line per case.
 *   lb_bench [--threads K] [--duration-ms D] [--slow-us U] [--json] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <verbrpc/rpc.h>
#include "common/bench.h"
#include "rpc_test.pb-c.h"

static struct vrpc_method_desc m_echo = {
    "/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,
    VRPC_METHOD_UNARY};

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    unsigned us = (unsigned)(uintptr_t)user;
    if (us) {
        struct timespec ts = {0, (long)us * 1000};
        nanosleep(&ts, NULL);
    }
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload = r->payload;
    rep.seq = r->seq;
    vrpc_server_call_respond(call, &rep.base);
}

static struct vrpc_server *server(unsigned delay_us, char *uri, size_t cap)
{
    struct vrpc_server *s;
    if (vrpc_server_create(NULL, &s) || vrpc_server_register(s, &m_echo, h_echo, (void *)(uintptr_t)delay_us) ||
        vrpc_server_start(s, "tcp://127.0.0.1:0") || vrpc_server_uri(s, uri, cap)) {
        fprintf(stderr, "lb_bench: cannot start a server\n");
        exit(1);
    }
    return s;
}

struct worker {
    struct vrpc_channel *ch;
    int64_t end;
    struct vrpc_bench_samples lat;
    unsigned long done, failed;
};

static void *run(void *arg)
{
    struct worker *w = arg;
    static uint8_t payload[32];
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    r.payload.data = payload;
    r.payload.len = sizeof payload;
    while ((int64_t)vrpc_bench_now_ns() < w->end) {
        ProtobufCMessage *resp;
        uint64_t t0 = vrpc_bench_now_ns();
        if (vrpc_call(w->ch, &m_echo, &r.base, &resp, NULL, NULL) != VRPC_OK)
            w->failed++;
        else
            vrpc_bench_samples_add(&w->lat, vrpc_bench_now_ns() - t0);
        w->done++;
    }
    vrpc_thread_release();
    return NULL;
}

struct result {
    double calls_per_s, p50, p99;
    unsigned long failed;
};

static struct result run_case(const char *target, unsigned policy, unsigned threads, unsigned ms)
{
    struct vrpc_channel_opts o;
    struct vrpc_channel *ch;
    vrpc_channel_opts_init(&o);
    o.lb_policy = policy;
    if (vrpc_channel_create(target, &o, &ch) || vrpc_channel_connect(ch, 10000)) {
        fprintf(stderr, "lb_bench: cannot connect to %s\n", target);
        exit(1);
    }
    struct timespec settle = {0, 100000000}; /* every subchannel READY */
    nanosleep(&settle, NULL);
    struct worker w[64];
    pthread_t t[64];
    int64_t end = (int64_t)vrpc_bench_now_ns() + (int64_t)ms * 1000000;
    for (unsigned i = 0; i < threads; i++) {
        memset(&w[i], 0, sizeof w[i]);
        vrpc_bench_samples_init(&w[i].lat, 200000);
        w[i].ch = ch;
        w[i].end = end;
        pthread_create(&t[i], NULL, run, &w[i]);
    }
    struct vrpc_bench_samples all;
    struct result r = {0};
    unsigned long done = 0;
    vrpc_bench_samples_init(&all, (size_t)threads * 200000);
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        done += w[i].done;
        for (uint64_t k = 0; k < w[i].lat.n; k++)
            vrpc_bench_samples_add(&all, w[i].lat.v[k]);
        free(w[i].lat.v);
        r.failed += w[i].failed;
    }
    vrpc_channel_destroy(ch);
    r.calls_per_s = (double)(done - r.failed) / (ms / 1000.0);
    r.p50 = vrpc_bench_pct_us(&all, 50);
    r.p99 = vrpc_bench_pct_us(&all, 99);
    free(all.v);
    return r;
}

int main(int argc, char **argv)
{
    unsigned threads = 16, ms = 2000, slow_us = 2000;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--duration-ms") && i + 1 < argc)
            ms = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slow-us") && i + 1 < argc)
            slow_us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            fprintf(stderr, "usage: %s [--threads K] [--duration-ms D] [--slow-us U] [--json]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > 64)
        threads = 16;
    m_echo.id = vrpc_method_id(m_echo.full_name);
    char u[4][96];
    struct vrpc_server *s[4];
    for (int i = 0; i < 3; i++)
        s[i] = server(0, u[i], sizeof u[i]);
    s[3] = server(slow_us, u[3], sizeof u[3]);
    char fast3[400], slow3[400];
    snprintf(fast3, sizeof fast3, "list://%s,%s,%s", u[0], u[1], u[2]);
    snprintf(slow3, sizeof slow3, "list://%s,%s,%s", u[0], u[1], u[3]);
    const struct {
        const char *name, *target;
        unsigned policy;
    } cases[] = {
        {"single", u[0], 0},
        {"rr3", fast3, VRPC_LB_ROUND_ROBIN},
        {"lo3", fast3, VRPC_LB_LEAST_OUTSTANDING},
        {"rr3-slow", slow3, VRPC_LB_ROUND_ROBIN},
        {"lo3-slow", slow3, VRPC_LB_LEAST_OUTSTANDING},
    };
    double base = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct result r = run_case(cases[i].target, cases[i].policy, threads, ms);
        if (i == 0)
            base = r.calls_per_s;
        printf("%-9s %9.0f calls/s (x%.2f of single)  p50 %8.1f us  p99 %8.1f us  failed %lu\n", cases[i].name,
               r.calls_per_s, base > 0 ? r.calls_per_s / base : 0, r.p50, r.p99, r.failed);
        if (json)
            printf("{\"name\":\"lb:%s\",\"ops_per_s\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"threads\":%u}\n",
                   cases[i].name, r.calls_per_s, r.p50, r.p99, threads);
    }
    printf("(%u threads of synchronous 32 B calls, %u ms per case; the slow server answers after %u us)\n", threads, ms,
           slow_us);
    for (int i = 0; i < 4; i++)
        vrpc_server_destroy(s[i]);
    return 0;
}

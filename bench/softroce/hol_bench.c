/* hol_bench: head-of-line blocking of small calls behind large transfers on
 * one connection (issue 7). While N large calls (rendezvous: RDMA READ on
 * verbs) run back to back on a channel, a 1-byte call is made every
 * --interval-us on the same channel; its latency is reported as percentiles,
 * split at the server handler's timestamp into the request leg (call made ->
 * handler runs) and the response leg (handler -> caller has the reply), next
 * to the large transfers' bandwidth meanwhile. N = 0 is the idle baseline.
 * Several backends run in one process (--backend verbs,tcp), so TCP is the
 * comparison on the same addresses. On verbs the rxe hardware counters of
 * every RDMA device (retransmissions, duplicates, sequence errors) are read
 * before and after each case and their changes printed.
 *   tests/softroce/vm.sh --net single -- build/bench/softroce/hol_bench --backend verbs,tcp
 *   (--server-ip / --client-ip default to $VRPC_VERBS_IP; veth: the _A/_B
 *   addresses, see bench/softroce/hol-in-vm.sh) */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/transport.h>
#include "common/bench.h"
#include "rpc_test.pb-c.h"

#define MODE_SMALL 0
#define MODE_UP 1
#define MODE_DOWN 2
#define MAX_STREAMS 16
#define MAX_CTR 32

static struct vrpc_method_desc m_echo = {"/vrpctest.Test/Echo", 0, &vrpctest__echo_request__descriptor,
                                         &vrpctest__echo_reply__descriptor, NULL, VRPC_METHOD_UNARY};

static struct {
    struct vrpc_bench_opts bo;
    const char *backends, *server_ip, *client_ip, *streams, *dir;
    size_t large;
    unsigned duration_ms, interval_us;
    bool trace_calls; /* --trace-calls: each small call's timestamps on stderr */
} g = {.backends = "verbs,tcp",
       .streams = "0,1,4",
       .dir = "up",
       .large = 16u << 20,
       .duration_ms = 3000,
       .interval_us = 2000};

static uint8_t *g_src; /* large payloads: uploads send it, downloads answer with it */

/* ---- server ---------------------------------------------------------------- */

static void h_echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    if (r->mode == MODE_SMALL) {
        rep.seq = (uint64_t)vrpc_now_ns(); /* the split point: same clock, same process */
    } else if (r->mode == MODE_DOWN) {
        rep.payload.data = g_src;
        rep.payload.len = r->seq;
    }
    vrpc_server_call_respond(call, &rep.base);
}

/* ---- large calls, back to back ---------------------------------------------- */

struct stream {
    struct vrpc_channel *ch;
    bool down;
    atomic_int *stop, *active;
    atomic_ullong *bytes, *t_last; /* completed bytes; when the last completed */
};

static void large_start(struct stream *s);

static void large_done(const struct vrpc_status *st, const ProtobufCMessage *resp, void *arg)
{
    struct stream *s = arg;
    (void)resp;
    if (st->code != VRPC_OK) {
        fprintf(stderr, "hol_bench: large call failed: %s: %s\n", vrpc_code_name(st->code), st->message);
        exit(1);
    }
    atomic_fetch_add(s->bytes, g.large);
    atomic_store(s->t_last, vrpc_bench_now_ns());
    if (!atomic_load(s->stop))
        large_start(s);
    else
        atomic_fetch_sub(s->active, 1);
}

static void large_start(struct stream *s)
{
    Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
    if (s->down) {
        r.mode = MODE_DOWN;
        r.seq = g.large;
    } else {
        r.mode = MODE_UP;
        r.payload.data = g_src;
        r.payload.len = g.large;
    }
    if (vrpc_call_async(s->ch, &m_echo, &r.base, NULL, large_done, s)) {
        fprintf(stderr, "hol_bench: vrpc_call_async refused a large call\n");
        exit(1);
    }
}

/* ---- rxe counters ----------------------------------------------------------- */

struct ctrs {
    unsigned n;
    char name[MAX_CTR][48];
    unsigned long long v[MAX_CTR];
};

static void ctr_add(struct ctrs *c, const char *name, unsigned long long v)
{
    unsigned i;
    for (i = 0; i < c->n && strcmp(c->name[i], name); i++)
        ;
    if (i == c->n) {
        if (c->n == MAX_CTR)
            return;
        snprintf(c->name[c->n], sizeof(c->name[0]), "%.*s", (int)sizeof(c->name[0]) - 1, name);
        c->v[c->n++] = 0;
    }
    c->v[i] += v;
}

/* Packets the kernel dropped: the per-CPU input backlog (softnet_stat's
 * second column) and every netdev's rx/tx drops (veth's). */
static void net_drops(struct ctrs *c)
{
    FILE *f = fopen("/proc/net/softnet_stat", "r");
    char line[512];
    DIR *d;
    struct dirent *e;
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            unsigned a, b;
            if (sscanf(line, "%x %x", &a, &b) == 2)
                ctr_add(c, "net_backlog_dropped", b);
        }
        fclose(f);
    }
    if (!(d = opendir("/sys/class/net")))
        return;
    while ((e = readdir(d))) {
        static const char *const what[] = {"rx_dropped", "tx_dropped"};
        for (int k = 0; k < 2 && e->d_name[0] != '.'; k++) {
            char p[512];
            unsigned long long v;
            snprintf(p, sizeof(p), "/sys/class/net/%s/statistics/%s", e->d_name, what[k]);
            if ((f = fopen(p, "r"))) {
                if (fscanf(f, "%llu", &v) == 1)
                    ctr_add(c, "net_dev_dropped", v);
                fclose(f);
            }
        }
    }
    closedir(d);
}

/* Sums each hw counter over every RDMA device's port 1, plus net_drops. */
static void ctrs_read(struct ctrs *c)
{
    DIR *d = opendir("/sys/class/infiniband");
    struct dirent *e;
    c->n = 0;
    net_drops(c);
    if (!d)
        return;
    while ((e = readdir(d))) {
        char path[512];
        DIR *hd;
        struct dirent *he;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters", e->d_name);
        if (!(hd = opendir(path)))
            continue;
        while ((he = readdir(hd))) {
            char f[1024];
            unsigned long long v;
            FILE *fp;
            if (he->d_name[0] == '.' || strlen(he->d_name) + 4 >= sizeof(c->name[0]))
                continue;
            snprintf(f, sizeof(f), "%s/%s", path, he->d_name);
            if (!(fp = fopen(f, "r")))
                continue;
            if (fscanf(fp, "%llu", &v) == 1) {
                char nm[64];
                snprintf(nm, sizeof(nm), "rxe_%s", he->d_name);
                ctr_add(c, nm, v);
            }
            fclose(fp);
        }
        closedir(hd);
    }
    closedir(d);
}

/* The counters that moved, as JSON members ("<name>":delta,...). */
static void ctrs_delta(const struct ctrs *a, const struct ctrs *b, char *out, size_t len)
{
    size_t l = 0;
    out[0] = 0;
    for (unsigned i = 0; i < b->n; i++) {
        unsigned long long before = 0;
        for (unsigned k = 0; k < a->n; k++)
            if (!strcmp(a->name[k], b->name[i]))
                before = a->v[k];
        if (b->v[i] != before && l < len)
            l += (size_t)snprintf(out + l, len - l, ",\"%s\":%llu", b->name[i], b->v[i] - before);
    }
}

/* ---- one case --------------------------------------------------------------- */

static void one_case(const char *backend, struct vrpc_channel *ch, unsigned nstreams)
{
    struct stream s[MAX_STREAMS];
    atomic_int stop = 0, active = (int)nstreams;
    atomic_ullong bytes = 0, t_last = 0;
    struct vrpc_bench_samples tot, up, down;
    size_t cap = (size_t)g.duration_ms * 1000 / (g.interval_us ? g.interval_us : 1) + 16;
    struct ctrs c0, c1;
    char name[128], extra[2048], cd[1024];
    uint64_t t_start, t_end, max_ns = 0;
    vrpc_bench_samples_init(&tot, cap);
    vrpc_bench_samples_init(&up, cap);
    vrpc_bench_samples_init(&down, cap);
    ctrs_read(&c0);
    uint64_t t_first = vrpc_bench_now_ns();
    for (unsigned i = 0; i < nstreams; i++) {
        s[i] = (struct stream){.ch = ch, .stop = &stop, .active = &active, .bytes = &bytes, .t_last = &t_last};
        s[i].down = !strcmp(g.dir, "down") || (!strcmp(g.dir, "mix") && i % 2);
        large_start(&s[i]);
    }
    if (nstreams)
        usleep(100000); /* let the transfers get going */
    t_start = vrpc_bench_now_ns();
    while (vrpc_bench_now_ns() - t_start < (uint64_t)g.duration_ms * 1000000u) {
        Vrpctest__EchoRequest r = VRPCTEST__ECHO_REQUEST__INIT;
        Vrpctest__EchoReply *rep;
        struct vrpc_status st;
        uint8_t one = 1;
        r.payload.data = &one;
        r.payload.len = 1;
        r.mode = MODE_SMALL;
        int64_t t0 = vrpc_now_ns();
        int rc = vrpc_call(ch, &m_echo, &r.base, (ProtobufCMessage **)&rep, NULL, &st);
        int64_t t1 = vrpc_now_ns();
        if (rc != VRPC_OK) {
            fprintf(stderr, "hol_bench: small call failed: %s: %s\n", vrpc_code_name(st.code), st.message);
            exit(1);
        }
        vrpc_bench_samples_add(&tot, (uint64_t)(t1 - t0));
        vrpc_bench_samples_add(&up, (uint64_t)((int64_t)rep->seq - t0));
        vrpc_bench_samples_add(&down, (uint64_t)(t1 - (int64_t)rep->seq));
        if (g.trace_calls)
            fprintf(stderr, "hol: call %lld %lld %lld us (sent, handler, reply)\n", (long long)t0 / 1000,
                    (long long)rep->seq / 1000, (long long)t1 / 1000);
        if ((uint64_t)(t1 - t0) > max_ns)
            max_ns = (uint64_t)(t1 - t0);
        if (g.interval_us)
            usleep(g.interval_us);
    }
    t_end = vrpc_bench_now_ns();
    atomic_store(&stop, 1);
    while (atomic_load(&active))
        usleep(1000);
    ctrs_read(&c1);
    ctrs_delta(&c0, &c1, cd, sizeof(cd));
    if (nstreams)
        snprintf(name, sizeof(name), "hol:%s_small_during_%ux%zuMiB_%s", backend, nstreams, g.large >> 20, g.dir);
    else
        snprintf(name, sizeof(name), "baseline:%s_small_idle", backend);
    double secs = (double)(t_end - t_start) / 1e9;
    /* every large call started is waited for: bytes over first start to last completion */
    double large_bps = nstreams ? (double)atomic_load(&bytes) * 1e9 / (double)(atomic_load(&t_last) - t_first) : 0;
    snprintf(extra, sizeof(extra),
             "\"backend\":\"%s\",\"streams\":%u,\"large\":%zu,\"dir\":\"%s\",\"calls\":%zu,\"p90_us\":%.1f,"
             "\"p999_us\":%.1f,\"max_us\":%.1f,\"req_leg_p50_us\":%.1f,\"req_leg_p99_us\":%.1f,"
             "\"resp_leg_p50_us\":%.1f,\"resp_leg_p99_us\":%.1f,\"large_bytes_per_s\":%.0f%s",
             backend, nstreams, g.large, g.dir, tot.n, vrpc_bench_pct_us(&tot, 90), vrpc_bench_pct_us(&tot, 99.9),
             (double)max_ns / 1e3, vrpc_bench_pct_us(&up, 50), vrpc_bench_pct_us(&up, 99), vrpc_bench_pct_us(&down, 50),
             vrpc_bench_pct_us(&down, 99), large_bps, cd);
    vrpc_bench_report(&g.bo, name, (double)tot.n / secs, vrpc_bench_pct_us(&tot, 50), vrpc_bench_pct_us(&tot, 99),
                      extra);
    vrpc_bench_samples_free(&tot);
    vrpc_bench_samples_free(&up);
    vrpc_bench_samples_free(&down);
}

static int run_backend(const char *backend)
{
    uint32_t limit = (uint32_t)g.large + 4096;
    uint64_t pinned = (uint64_t)limit * (2 * MAX_STREAMS + 4) + (64u << 20);
    struct vrpc_server_opts so;
    struct vrpc_channel_opts co;
    struct vrpc_server *srv;
    struct vrpc_channel *ch;
    char listen[VRPC_URI_MAX], uri[VRPC_URI_MAX], list[64];
    int rc;
    vrpc_server_opts_init(&so);
    so.max_msg_size = limit;
    so.max_pinned = pinned;
    snprintf(listen, sizeof(listen), "%s://%s:0", backend, g.server_ip);
    if ((rc = vrpc_server_create(&so, &srv)) || (rc = vrpc_server_register(srv, &m_echo, h_echo, NULL)) ||
        (rc = vrpc_server_start(srv, listen)) || (rc = vrpc_server_uri(srv, uri, sizeof(uri)))) {
        fprintf(stderr, "hol_bench: server on %s: %s\n", listen, strerror(-rc));
        return 1;
    }
    vrpc_channel_opts_init(&co);
    co.max_msg_size = limit;
    co.max_pinned = pinned;
    co.src_addr = g.client_ip;
    if ((rc = vrpc_channel_create(uri, &co, &ch)) || (rc = vrpc_channel_connect(ch, 10000))) {
        fprintf(stderr, "hol_bench: channel to %s: %s\n", uri, strerror(-rc));
        return 1;
    }
    snprintf(list, sizeof(list), "%s", g.streams);
    for (char *save, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        unsigned n = (unsigned)atoi(t);
        one_case(backend, ch, n > MAX_STREAMS ? MAX_STREAMS : n);
    }
    vrpc_channel_destroy(ch);
    vrpc_server_destroy(srv);
    return 0;
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--backend verbs,tcp] [--server-ip IP] [--client-ip IP] [--large BYTES]\n"
            "          [--streams 0,1,4] [--dir up|down|mix] [--duration-ms MS] [--interval-us US]\n"
            "          [--trace-calls] [--json] [--quick]\n"
            "Latency of 1-byte calls made every --interval-us while N large calls (--streams, each\n"
            "restarted as it completes) run on the same channel; N = 0 is the idle baseline.\n"
            "--dir up: large requests (the server reads them), down: large responses (the client\n"
            "reads), mix: alternate. IPs default to $VRPC_VERBS_IP, else 127.0.0.1 (tcp only).\n"
            "Per case: small-call p50/p90/p99/p99.9/max, the request leg (call -> handler) and the\n"
            "response leg (handler -> reply) p50/p99, large bytes/s, and changed rxe counters.\n"
            "--trace-calls: each small call's CLOCK_MONOTONIC timestamps (us) on stderr, to line up\n"
            "with VRPC_VERBS_TRACE=1's stamped lines.\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *ip = getenv("VRPC_VERBS_IP");
    g.server_ip = g.client_ip = ip && *ip ? ip : "127.0.0.1";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            g.bo.json = true;
        } else if (!strcmp(a, "--trace-calls")) {
            g.trace_calls = true;
        } else if (!strcmp(a, "--quick")) {
            g.bo.quick = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, argv[0]);
            return 0;
        } else if (v && !strcmp(a, "--backend")) {
            g.backends = v, i++;
        } else if (v && !strcmp(a, "--server-ip")) {
            g.server_ip = v, i++;
        } else if (v && !strcmp(a, "--client-ip")) {
            g.client_ip = v, i++;
        } else if (v && !strcmp(a, "--large")) {
            g.large = strtoull(v, NULL, 0), i++;
        } else if (v && !strcmp(a, "--streams")) {
            g.streams = v, i++;
        } else if (v && !strcmp(a, "--dir") && (!strcmp(v, "up") || !strcmp(v, "down") || !strcmp(v, "mix"))) {
            g.dir = v, i++;
        } else if (v && !strcmp(a, "--duration-ms")) {
            g.duration_ms = (unsigned)atoi(v), i++;
        } else if (v && !strcmp(a, "--interval-us")) {
            g.interval_us = (unsigned)atoi(v), i++;
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (g.large < 65536 || g.large > VRPC_MSG_SIZE_MAX / 2) {
        fprintf(stderr, "hol_bench: --large must be 64 KiB .. 512 MiB\n");
        return 2;
    }
    if (g.bo.quick)
        g.duration_ms = g.duration_ms > 500 ? 500 : g.duration_ms;
    m_echo.id = vrpc_method_id(m_echo.full_name);
    g_src = malloc(g.large);
    if (!g_src)
        return 1;
    for (size_t i = 0; i < g.large; i++)
        g_src[i] = (uint8_t)(i * 131 + 7);
    char list[64];
    int rc = 0;
    snprintf(list, sizeof(list), "%s", g.backends);
    for (char *save, *t = strtok_r(list, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save))
        rc = run_backend(t);
    free(g_src);
    return rc;
}

/* Metrics end to end (--backend tcp|verbs): the server's Prometheus endpoint
 * scraped over HTTP on 127.0.0.1 and parsed by a small line-based parser of
 * the text format (test-only), the channel's text, and the Stats reply's.
 * Counters must move by exactly the calls made, histogram buckets be
 * cumulative and monotone with _count = +Inf = calls, and no percentile lie
 * above the max (also in the Stats service, and in the histogram itself). */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>
#include <verbrpc/verbrpc.h>
#include <verbrpc/stats.vrpc.h>
#include "rpc/metrics.h"
#include "rpc_test.pb-c.h"
#include "verbs_setup.h"

static struct {
    const char *backend, *setup, *server_ip, *client_ip;
} g_opt = {"tcp", "single", NULL, NULL};

#define M(name, in, out)                                                                                               \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__##in##__descriptor, &vrpctest__##out##__descriptor, NULL,                \
            VRPC_METHOD_UNARY                                                                                          \
    }
static struct vrpc_method_desc m_echo = M("Echo", echo_request, echo_reply);
static struct vrpc_method_desc m_other = M("Other", echo_request, echo_reply);

/* Echo the payload back; mode 4 fails with NOT_FOUND. */
static void echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    const Vrpctest__EchoRequest *req = (const Vrpctest__EchoRequest *)msg;
    Vrpctest__EchoReply r = VRPCTEST__ECHO_REPLY__INIT;
    if (req->mode == 4) {
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, "asked to fail");
        return;
    }
    r.payload = req->payload;
    r.seq = req->seq;
    vrpc_server_call_respond(call, &r.base);
}

/* ---- a Prometheus text-format parser, enough for this test ---------------- */

#define MAX_SAMPLES 4096
struct sample {
    char name[96];
    char labels[8][2][160]; /* key, value (unescaped) */
    int nlabels;
    double value;
};
struct scrape {
    struct sample *s;
    int n;
    char types[128][2][96]; /* # TYPE name type */
    int ntypes;
};

static void parse_text(const char *text, struct scrape *out)
{
    out->s = calloc(MAX_SAMPLES, sizeof *out->s);
    out->n = out->ntypes = 0;
    assert_non_null(out->s);
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        assert_non_null(end); /* every line ends with \n */
        if (line[0] == '#') {
            char name[96], type[96];
            if (sscanf(line, "# TYPE %95s %95s", name, type) == 2) {
                assert_true(out->ntypes < 128);
                for (int i = 0; i < out->ntypes; i++) /* one TYPE per family */
                    assert_string_not_equal(out->types[i][0], name);
                strcpy(out->types[out->ntypes][0], name);
                strcpy(out->types[out->ntypes++][1], type);
            }
        } else if (end > line) {
            struct sample *s = &out->s[out->n++];
            const char *p = line;
            size_t k = 0;
            assert_true(out->n < MAX_SAMPLES);
            while (p < end && *p != '{' && *p != ' ')
                s->name[k++] = *p++;
            if (*p == '{') {
                p++;
                while (*p != '}') {
                    char *key = s->labels[s->nlabels][0], *val = s->labels[s->nlabels][1];
                    k = 0;
                    while (*p != '=')
                        key[k++] = *p++;
                    assert_int_equal(p[1], '"');
                    p += 2;
                    k = 0;
                    while (*p != '"') {
                        if (*p == '\\') {
                            p++;
                            val[k++] = *p == 'n' ? '\n' : *p;
                            p++;
                        } else {
                            val[k++] = *p++;
                        }
                    }
                    p++;
                    s->nlabels++;
                    if (*p == ',')
                        p++;
                }
                p++;
            }
            assert_int_equal(*p, ' ');
            char *e;
            s->value = strtod(p + 1, &e);
            assert_ptr_equal(e, end);
        }
        line = end + 1;
    }
}

static const char *label(const struct sample *s, const char *key)
{
    for (int i = 0; i < s->nlabels; i++)
        if (!strcmp(s->labels[i][0], key))
            return s->labels[i][1];
    return NULL;
}

/* The value of the one sample named name whose labels include the pairs of
 * want ("k=v,k2=v2"); -1 if none. */
static double get(const struct scrape *sc, const char *name, const char *want)
{
    double v = -1;
    int found = 0;
    for (int i = 0; i < sc->n; i++) {
        const struct sample *s = &sc->s[i];
        if (strcmp(s->name, name))
            continue;
        char buf[256], *save, *tok;
        int ok = 1;
        snprintf(buf, sizeof buf, "%s", want ? want : "");
        for (tok = strtok_r(buf, ",", &save); tok && ok; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            *eq = 0;
            const char *l = label(s, tok);
            ok = l && !strcmp(l, eq + 1);
        }
        if (ok) {
            v = s->value;
            found++;
        }
    }
    assert_true(found <= 1);
    return v;
}

/* ---- HTTP over a plain socket ----------------------------------------------- */

/* GET path from the endpoint of uri "http://127.0.0.1:port/metrics"; returns the
 * whole response (malloc'd). */
static char *http_get(const char *uri, const char *path)
{
    unsigned port;
    struct sockaddr_in a = {.sin_family = AF_INET};
    assert_int_equal(sscanf(uri, "http://127.0.0.1:%u/", &port), 1);
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 1024)
            buf = realloc(buf, cap *= 2);
    }
    assert_true(r == 0);
    buf[len] = 0;
    close(fd);
    return buf;
}

static void scrape_http(const char *uri, struct scrape *sc)
{
    char *resp = http_get(uri, "/metrics");
    assert_true(!strncmp(resp, "HTTP/1.1 200", 12));
    assert_non_null(strcasestr(resp, "Content-Type: text/plain; version=0.0.4"));
    char *body = strstr(resp, "\r\n\r\n");
    assert_non_null(body);
    parse_text(body + 4, sc);
    free(resp);
}

static void scrape_channel(struct vrpc_channel *ch, struct scrape *sc)
{
    char *t;
    size_t len;
    assert_int_equal(vrpc_channel_metrics_text(ch, &t, &len), 0);
    assert_int_equal(strlen(t), len);
    parse_text(t, sc);
    free(t);
}

/* Histogram rules for one method: buckets cumulative, monotone in le,
 * ending at +Inf = _count; percentiles <= max. */
static void check_histogram(const struct scrape *sc, const char *prefix, const char *method, double count)
{
    char name[128], want[256];
    double prev = 0, le_prev = 0;
    int nb = 0;
    snprintf(name, sizeof name, "%sduration_seconds_bucket", prefix);
    for (int i = 0; i < sc->n; i++) {
        const struct sample *s = &sc->s[i];
        if (strcmp(s->name, name) || strcmp(label(s, "method"), method))
            continue;
        const char *le = label(s, "le");
        double lev = strcmp(le, "+Inf") ? strtod(le, NULL) : INFINITY;
        assert_true(lev > le_prev);
        assert_true(s->value >= prev);
        le_prev = lev;
        prev = s->value;
        nb++;
    }
    assert_int_equal(nb, VRPC_PROM_BUCKETS + 1);
    assert_true(isinf(le_prev));
    snprintf(want, sizeof want, "method=%s", method);
    snprintf(name, sizeof name, "%sduration_seconds_count", prefix);
    assert_true(get(sc, name, want) == prev);
    assert_true(prev == count);
    snprintf(name, sizeof name, "%slatency_max_seconds", prefix);
    double max = get(sc, name, want);
    snprintf(name, sizeof name, "%sduration_seconds_sum", prefix);
    double sum = get(sc, name, want);
    assert_true(count == 0 || (sum > 0 && sum <= max * count * 1.000001));
    snprintf(name, sizeof name, "%slatency_seconds", prefix);
    const char *qs[] = {"0.5", "0.9", "0.99"};
    double qprev = 0;
    for (int q = 0; q < 3; q++) {
        snprintf(want, sizeof want, "method=%s,quantile=%s", method, qs[q]);
        double v = get(sc, name, want);
        assert_true(v >= qprev);
        assert_true(v <= max);
        qprev = v;
    }
}

static double delta(const struct scrape *a, const struct scrape *b, const char *name, const char *want)
{
    double va = get(a, name, want), vb = get(b, name, want);
    return (vb < 0 ? 0 : vb) - (va < 0 ? 0 : va);
}

/* ---- the server and channel -------------------------------------------------- */

struct env {
    struct vrpc_server *s;
    struct vrpc_channel *ch;
    char uri[VRPC_URI_MAX], murl[128];
};

static void env_up(struct env *e)
{
    struct vrpc_server_opts so;
    struct vrpc_channel_opts co;
    char uri[VRPC_URI_MAX];
    vrpc_server_opts_init(&so);
    so.metrics_addr = "127.0.0.1:0";
    assert_int_equal(vrpc_server_create(&so, &e->s), 0);
    assert_int_equal(vrpc_server_register(e->s, &m_echo, echo, NULL), 0);
    assert_int_equal(vrpc_server_register(e->s, &m_other, echo, NULL), 0);
    assert_int_equal(vrpc_server_metrics_uri(e->s, e->murl, sizeof e->murl), -ENOTCONN);
    snprintf(uri, sizeof uri, "%s://%s:0", g_opt.backend, g_opt.server_ip);
    assert_int_equal(vrpc_server_start(e->s, uri), 0);
    assert_int_equal(vrpc_server_uri(e->s, e->uri, sizeof e->uri), 0);
    assert_int_equal(vrpc_server_metrics_uri(e->s, e->murl, sizeof e->murl), 0);
    vrpc_channel_opts_init(&co);
    co.src_addr = g_opt.client_ip;
    assert_int_equal(vrpc_channel_create(e->uri, &co, &e->ch), 0);
    assert_int_equal(vrpc_channel_connect(e->ch, 10000), 0);
}

static void env_down(struct env *e)
{
    vrpc_channel_destroy(e->ch);
    vrpc_server_destroy(e->s);
}

static int call(struct env *e, const struct vrpc_method_desc *m, uint32_t mode, size_t size)
{
    Vrpctest__EchoRequest req = VRPCTEST__ECHO_REQUEST__INIT;
    ProtobufCMessage *resp;
    struct vrpc_status st;
    uint8_t *p = calloc(1, size ? size : 1);
    req.payload.data = p;
    req.payload.len = size;
    req.mode = mode;
    int code = vrpc_call(e->ch, m, &req.base, &resp, NULL, &st);
    free(p);
    return code;
}

/* Wait until the server has answered every call made: an answer reaches the
 * client before the server records it. */
static void settle(struct env *e, double want_calls)
{
    for (int i = 0; i < 200; i++) {
        struct scrape sc;
        char *t;
        size_t len;
        assert_int_equal(vrpc_server_metrics_text(e->s, &t, &len), 0);
        parse_text(t, &sc);
        free(t);
        double v = get(&sc, "vrpc_server_calls_total", "method=/vrpctest.Test/Echo");
        free(sc.s);
        if (v >= want_calls)
            return;
        usleep(10000);
    }
}

/* Scrape the endpoint once every message the server received has been
 * answered (HELLO by HELLO_ACK, each request by its response): a send's
 * completion is counted when it arrives, which may be after the client saw
 * the message. At most 5 s. */
static void scrape_settled(struct env *e, struct scrape *sc)
{
    for (int i = 0; i < 500; i++) {
        scrape_http(e->murl, sc);
        if (get(sc, "vrpc_server_messages_sent_total", NULL) == get(sc, "vrpc_server_messages_received_total", NULL))
            return;
        free(sc->s);
        usleep(10000);
    }
    scrape_http(e->murl, sc);
}

static void test_scrape_counts_exactly(void **state)
{
    struct env e;
    struct scrape s0, s1, c0, c1;
    const char *be = g_opt.backend;
    char want[128];
    enum { OK_CALLS = 50, FAIL_CALLS = 7 };

    env_up(&e);
    call(&e, &m_echo, 0, 8); /* one call before the baseline: the series exist */
    settle(&e, 1);
    scrape_settled(&e, &s0);
    scrape_channel(e.ch, &c0);
    for (int i = 0; i < OK_CALLS; i++)
        assert_int_equal(call(&e, &m_echo, 0, 32), VRPC_OK);
    for (int i = 0; i < FAIL_CALLS; i++)
        assert_int_equal(call(&e, &m_echo, 4, 32), VRPC_NOT_FOUND);
    settle(&e, 1 + OK_CALLS + FAIL_CALLS);
    scrape_settled(&e, &s1);
    scrape_channel(e.ch, &c1);

    /* the server */
    snprintf(want, sizeof want, "backend=%s,method=/vrpctest.Test/Echo", be);
    assert_true(delta(&s0, &s1, "vrpc_server_calls_total", want) == OK_CALLS + FAIL_CALLS);
    assert_true(delta(&s0, &s1, "vrpc_server_duration_seconds_count", want) == OK_CALLS + FAIL_CALLS);
    snprintf(want, sizeof want, "backend=%s,method=/vrpctest.Test/Echo,code=NOT_FOUND", be);
    assert_true(delta(&s0, &s1, "vrpc_server_errors_total", want) == FAIL_CALLS);
    assert_true(get(&s1, "vrpc_server_calls_total", "method=/vrpctest.Test/Other") == 0);
    check_histogram(&s1, "vrpc_server_", "/vrpctest.Test/Echo", 1 + OK_CALLS + FAIL_CALLS);
    check_histogram(&s1, "vrpc_server_", "/vrpctest.Test/Other", 0);
    snprintf(want, sizeof want, "backend=%s", be);
    /* one message in (the request) and one out (the response) per call */
    assert_true(delta(&s0, &s1, "vrpc_server_messages_received_total", want) == OK_CALLS + FAIL_CALLS);
    assert_true(delta(&s0, &s1, "vrpc_server_messages_sent_total", want) == OK_CALLS + FAIL_CALLS);
    assert_true(delta(&s0, &s1, "vrpc_server_received_bytes_total", want) > 32.0 * (OK_CALLS + FAIL_CALLS));
    assert_true(delta(&s0, &s1, "vrpc_server_sent_bytes_total", want) > 32.0 * OK_CALLS);
    assert_true(get(&s1, "vrpc_server_connections", want) == 1);
    assert_true(get(&s1, "vrpc_server_connections_accepted_total", want) == 1);
    assert_true(get(&s1, "vrpc_server_connections_closed_total", want) == 0);
    assert_true(get(&s1, "vrpc_server_credit_waits_total", want) >= 0);

    /* the channel: the same calls, seen from the client */
    snprintf(want, sizeof want, "backend=%s,target=%s,method=/vrpctest.Test/Echo", be, e.uri);
    assert_true(delta(&c0, &c1, "vrpc_client_calls_total", want) == OK_CALLS + FAIL_CALLS);
    assert_true(delta(&c0, &c1, "vrpc_client_duration_seconds_count", want) == OK_CALLS + FAIL_CALLS);
    snprintf(want, sizeof want, "method=/vrpctest.Test/Echo,code=NOT_FOUND");
    assert_true(delta(&c0, &c1, "vrpc_client_errors_total", want) == FAIL_CALLS);
    check_histogram(&c1, "vrpc_client_", "/vrpctest.Test/Echo", 1 + OK_CALLS + FAIL_CALLS);
    assert_true(get(&c1, "vrpc_client_calls_total", "method=/vrpctest.Test/Other") == -1); /* never called */
    assert_true(delta(&c0, &c1, "vrpc_client_messages_sent_total", NULL) == OK_CALLS + FAIL_CALLS);
    assert_true(delta(&c0, &c1, "vrpc_client_messages_received_total", NULL) == OK_CALLS + FAIL_CALLS);
    assert_true(get(&c1, "vrpc_client_connections", NULL) == 1);
    assert_true(get(&c1, "vrpc_client_connections_opened_total", NULL) == 1);

    /* the Stats service's percentiles, too */
    struct vrpc_method_stats ms[8];
    size_t n;
    assert_int_equal(vrpc_server_stats(e.s, ms, 8, &n), 0);
    for (size_t i = 0; i < n && i < 8; i++) {
        assert_true(ms[i].latency_p50_us <= ms[i].latency_p90_us);
        assert_true(ms[i].latency_p90_us <= ms[i].latency_p99_us);
        assert_true(ms[i].latency_p99_us <= ms[i].latency_max_us);
    }
    free(s0.s);
    free(s1.s);
    free(c0.s);
    free(c1.s);
    env_down(&e);
}

/* A large request and response travel by rendezvous: the server pulls the
 * request (one read), the client the response (one read); each side granted
 * one offer; their buffers stay registered (pinned). */
static void test_rendezvous_counted(void **state)
{
    struct env e;
    struct scrape s0, s1, c0, c1;
    env_up(&e);
    call(&e, &m_echo, 0, 8);
    settle(&e, 1);
    scrape_settled(&e, &s0);
    scrape_channel(e.ch, &c0);
    assert_int_equal(call(&e, &m_echo, 0, 200000), VRPC_OK);
    settle(&e, 2);
    scrape_settled(&e, &s1);
    scrape_channel(e.ch, &c1);
    assert_true(delta(&s0, &s1, "vrpc_server_rndv_reads_total", NULL) == 1);
    assert_true(delta(&s0, &s1, "vrpc_server_rndv_read_bytes_total", NULL) >= 200000);
    assert_true(delta(&s0, &s1, "vrpc_server_rndv_grants_total", NULL) == 1);
    assert_true(delta(&c0, &c1, "vrpc_client_rndv_reads_total", NULL) == 1);
    assert_true(delta(&c0, &c1, "vrpc_client_rndv_grants_total", NULL) == 1);
    assert_true(get(&s1, "vrpc_server_pinned_bytes", NULL) >= 200000);
    free(s0.s);
    free(s1.s);
    free(c0.s);
    free(c1.s);
    env_down(&e);
}

static void test_endpoint_errors(void **state)
{
    struct vrpc_server_opts so;
    struct vrpc_server *s;
    struct env e;
    const char *bad[] = {"127.0.0.1", "127.0.0.1:99999", "localhost:9464", "[::1:9464", ":9464", "127.0.0.1:x"};
    vrpc_log_set_level(VRPC_LOG_OFF);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        vrpc_server_opts_init(&so);
        so.metrics_addr = bad[i];
        assert_int_equal(vrpc_server_create(&so, &s), -EINVAL);
    }
    vrpc_log_set_level(VRPC_LOG_WARN);
    env_up(&e);
    char *r = http_get(e.murl, "/nothing");
    assert_true(!strncmp(r, "HTTP/1.1 404", 12));
    free(r);
    /* a second server on the same metrics port fails at start */
    vrpc_server_opts_init(&so);
    char addr[64];
    unsigned port;
    assert_int_equal(sscanf(e.murl, "http://127.0.0.1:%u/", &port), 1);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    so.metrics_addr = addr;
    assert_int_equal(vrpc_server_create(&so, &s), 0);
    vrpc_log_set_level(VRPC_LOG_OFF);
    assert_true(vrpc_server_start(s, "tcp://127.0.0.1:0") < 0);
    vrpc_log_set_level(VRPC_LOG_WARN);
    vrpc_server_destroy(s);
    env_down(&e);
}

/* The log-linear histogram reports its bucket's middle: 26 us lies in
 * [26, 27], whose middle is 27. A percentile must never exceed the max. */
static void test_percentile_not_above_max(void **state)
{
    static struct vrpc_lathist h;
    const double q[3] = {0.5, 0.9, 0.99};
    uint64_t out[3], max;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 10; i++)
        vrpc_lathist_record(&h, 26);
    max = 26;
    vrpc_lathist_quantiles(&h, q, out, 3, max);
    for (int i = 0; i < 3; i++)
        assert_true(out[i] <= max);
    assert_int_equal(out[0], 26);
    /* the Prometheus buckets' percentiles (upper bounds) clamp too */
    static struct vrpc_call_metrics cm;
    memset(&cm, 0, sizeof cm);
    for (int i = 0; i < 10; i++)
        vrpc_call_metrics_record(&cm, VRPC_OK, 26000); /* bucket le=50us */
    struct vrpc_prom p;
    struct vrpc_prom_method v = {.method = "/m", .m = &cm, .lh = NULL};
    char *t;
    size_t len;
    struct scrape sc;
    assert_int_equal(vrpc_prom_open(&p), 0);
    vrpc_prom_calls(&p, "x_", "", &v, 1);
    assert_int_equal(vrpc_prom_close(&p, &t, &len), 0);
    parse_text(t, &sc);
    free(t);
    check_histogram(&sc, "x_", "/m", 10);
    assert_true(fabs(get(&sc, "x_latency_seconds", "quantile=0.5") - 26e-6) < 1e-12);
    free(sc.s);
}

/* Each latency lands in the first bucket whose bound is not below it:
 * a bound itself in its bucket, one nanosecond more in the next. */
static void test_bucket_bounds(void **state)
{
    static struct vrpc_call_metrics cm;
    for (unsigned b = 0; b < VRPC_PROM_BUCKETS; b++) {
        const uint64_t at[4] = {vrpc_prom_bounds_ns[b] - 1, vrpc_prom_bounds_ns[b], vrpc_prom_bounds_ns[b] + 1,
                                b ? vrpc_prom_bounds_ns[b - 1] + 1 : 0};
        const unsigned want[4] = {b, b, b + 1, b};
        for (int k = 0; k < 4; k++) {
            memset(&cm, 0, sizeof cm);
            vrpc_call_metrics_record(&cm, VRPC_OK, at[k]);
            for (unsigned i = 0; i <= VRPC_PROM_BUCKETS; i++)
                assert_int_equal(cm.bucket[i], i == want[k]);
        }
    }
    memset(&cm, 0, sizeof cm);
    vrpc_call_metrics_record(&cm, VRPC_OK, UINT64_MAX);
    assert_int_equal(cm.bucket[VRPC_PROM_BUCKETS], 1);
}

/* A Stats reply (here one from a server before the fix, p50 above the max)
 * as Prometheus text, for `verbrpc stats --prometheus`. */
static void test_stats_reply_text(void **state)
{
    Verbrpc__Stats__V1__MethodStats m = VERBRPC__STATS__V1__METHOD_STATS__INIT, *mp = &m;
    Verbrpc__Stats__V1__CodeCount cc = VERBRPC__STATS__V1__CODE_COUNT__INIT, *ccp = &cc;
    Verbrpc__Stats__V1__GetStatsResponse r = VERBRPC__STATS__V1__GET_STATS_RESPONSE__INIT;
    struct scrape sc;
    char *t;
    size_t len;
    m.method = "/a.B/C";
    m.calls = 100;
    m.errors = 3;
    cc.code = "NOT_FOUND";
    cc.count = 3;
    m.errors_by_code = &ccp;
    m.n_errors_by_code = 1;
    m.latency_p50_us = 27;
    m.latency_p90_us = 27;
    m.latency_p99_us = 40;
    m.latency_max_us = 26;
    r.methods = &mp;
    r.n_methods = 1;
    assert_int_equal(vrpc_stats_prometheus_text(&r, "server=\"h:1\"", &t, &len), 0);
    parse_text(t, &sc);
    free(t);
    assert_true(get(&sc, "vrpc_stats_calls_total", "server=h:1,method=/a.B/C") == 100);
    assert_true(get(&sc, "vrpc_stats_errors_total", "method=/a.B/C,code=NOT_FOUND") == 3);
    assert_true(fabs(get(&sc, "vrpc_stats_latency_seconds", "quantile=1") - 26e-6) < 1e-12);
    assert_true(fabs(get(&sc, "vrpc_stats_latency_seconds", "quantile=0.5") - 26e-6) < 1e-12);
    assert_true(fabs(get(&sc, "vrpc_stats_latency_seconds", "quantile=0.99") - 26e-6) < 1e-12);
    free(sc.s);
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend"))
            g_opt.backend = argv[i + 1];
        else if (!strcmp(argv[i], "--setup"))
            g_opt.setup = argv[i + 1];
    }
    int rc = vrpc_test_backend_addrs(g_opt.backend, g_opt.setup, &g_opt.server_ip, &g_opt.client_ip);
    if (rc)
        return rc;
    m_echo.id = vrpc_method_id(m_echo.full_name);
    m_other.id = vrpc_method_id(m_other.full_name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_not_above_max), cmocka_unit_test(test_bucket_bounds),
        cmocka_unit_test(test_stats_reply_text),         cmocka_unit_test(test_scrape_counts_exactly),
        cmocka_unit_test(test_rendezvous_counted),       cmocka_unit_test(test_endpoint_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

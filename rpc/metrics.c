/* Call metrics (counters by code, Prometheus latency buckets, the log-linear
 * histogram behind the Stats service's percentiles) and the Prometheus text
 * writer the server and the channel render with. */
#include "rpc/metrics.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/log.h>

const uint64_t vrpc_prom_bounds_ns[VRPC_PROM_BUCKETS] = {
    1000,           2000,      5000,      10000,      20000,      50000,
    100000,         200000,    500000,                                           /* 1 us .. 500 us */
    1000000,        2000000,   5000000,   10000000,   20000000,   50000000,      /* 1 ms .. 50 ms */
    100000000,      200000000, 500000000, 1000000000, 2000000000, 5000000000ull, /* .. 5 s */
    10000000000ull,
};

static inline void add(uint64_t *p, uint64_t v) { __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }
static inline uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static void raise_max(uint64_t *p, uint64_t v)
{
    uint64_t m = ld(p);
    while (v > m && !__atomic_compare_exchange_n(p, &m, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* first_bucket[k]: the first bucket whose bound is >= 2^k ns (from
 * vrpc_prom_bounds_ns; test_metrics checks it). Bounds grow by 2x or 2.5x,
 * so a value of [2^k, 2^(k+1)) is at most two buckets further. */
static const uint8_t first_bucket[64] = {
    0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  1,  2,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
    11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 20, 21, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22,
    22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22,
};

void vrpc_call_metrics_record(struct vrpc_call_metrics *m, enum vrpc_code code, uint64_t ns)
{
    unsigned b = first_bucket[63u - (unsigned)__builtin_clzll(ns | 1)];
    while (b < VRPC_PROM_BUCKETS && ns > vrpc_prom_bounds_ns[b])
        b++;
    add(&m->by_code[(unsigned)code < VRPC_CODE_COUNT ? code : VRPC_UNKNOWN], 1);
    add(&m->bucket[b], 1);
    add(&m->sum_ns, ns);
    raise_max(&m->max_ns, ns);
}

void vrpc_call_metrics_count(struct vrpc_call_metrics *m, enum vrpc_code code)
{
    add(&m->by_code[(unsigned)code < VRPC_CODE_COUNT ? code : VRPC_UNKNOWN], 1);
}

uint64_t vrpc_call_metrics_calls(const struct vrpc_call_metrics *m)
{
    uint64_t n = 0;
    for (unsigned c = 0; c < VRPC_CODE_COUNT; c++)
        n += ld(&m->by_code[c]);
    return n;
}

uint64_t vrpc_call_metrics_max_us(const struct vrpc_call_metrics *m) { return ld(&m->max_ns) / 1000; }

/* ---- log-linear histogram --------------------------------------------------- */

static unsigned hist_idx(uint64_t us)
{
    if (us < 8)
        return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);
    unsigned i = (e - 2) * 8 + (unsigned)((us >> (e - 3)) & 7);
    return i < VRPC_LATHIST_BUCKETS ? i : VRPC_LATHIST_BUCKETS - 1;
}

static uint64_t hist_mid(unsigned idx)
{
    if (idx < 8)
        return idx;
    unsigned e = idx / 8 + 2, sub = idx % 8;
    uint64_t w = 1ull << (e - 3);
    return ((8ull + sub) << (e - 3)) + w / 2;
}

void vrpc_lathist_record(struct vrpc_lathist *h, uint64_t us) { add(&h->h[hist_idx(us)], 1); }

void vrpc_lathist_quantiles(const struct vrpc_lathist *lh, const double *q, uint64_t *out, unsigned nq, uint64_t max)
{
    uint64_t h[VRPC_LATHIST_BUCKETS], total = 0;
    for (unsigned b = 0; b < VRPC_LATHIST_BUCKETS; b++)
        total += h[b] = ld(&lh->h[b]);
    for (unsigned i = 0; i < nq; i++) {
        uint64_t want = (uint64_t)(q[i] * (double)total), acc = 0;
        out[i] = 0;
        if (!total)
            continue;
        if (want == 0)
            want = 1;
        for (unsigned b = 0; b < VRPC_LATHIST_BUCKETS; b++) {
            acc += h[b];
            if (acc >= want) {
                out[i] = hist_mid(b);
                break;
            }
        }
        /* a bucket's middle can lie above every value in it */
        if (out[i] > max)
            out[i] = max;
    }
}

/* ---- Prometheus text ------------------------------------------------------------ */

int vrpc_prom_open(struct vrpc_prom *p)
{
    p->buf = NULL;
    p->len = 0;
    p->err = 0;
    p->f = open_memstream(&p->buf, &p->len);
    return p->f ? 0 : -ENOMEM;
}

int vrpc_prom_close(struct vrpc_prom *p, char **out, size_t *len)
{
    int bad = ferror(p->f) || p->err;
    if (fclose(p->f) || bad) {
        free(p->buf);
        return -ENOMEM;
    }
    *out = p->buf;
    *len = p->len;
    return 0;
}

void vrpc_prom_head(struct vrpc_prom *p, const char *name, const char *type, const char *help)
{
    fprintf(p->f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void vrpc_prom_label(struct vrpc_prom *p, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(p->f, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", p->f);
        else
            fputc(*v, p->f);
    }
}

static void series(struct vrpc_prom *p, const char *prefix, const char *suffix, const char *labels, const char *method)
{
    fprintf(p->f, "%s%s{%smethod=\"", prefix, suffix, labels);
    vrpc_prom_label(p, method);
    fputc('"', p->f);
}

/* le and quantile values the way Prometheus' own clients print them */
static void seconds(struct vrpc_prom *p, uint64_t ns) { fprintf(p->f, "%.9g", (double)ns / 1e9); }

struct snap {
    uint64_t calls, by_code[VRPC_CODE_COUNT], sum_ns, max_ns, bucket[VRPC_PROM_BUCKETS + 1], count;
};

static void take(struct snap *s, const struct vrpc_call_metrics *m)
{
    s->count = 0;
    for (unsigned b = 0; b <= VRPC_PROM_BUCKETS; b++)
        s->count += s->bucket[b] = ld(&m->bucket[b]);
    s->calls = 0;
    for (unsigned c = 0; c < VRPC_CODE_COUNT; c++)
        s->calls += s->by_code[c] = ld(&m->by_code[c]);
    s->sum_ns = ld(&m->sum_ns);
    /* after the buckets: every latency counted there is <= it */
    s->max_ns = ld(&m->max_ns);
}

/* Percentile from the Prometheus buckets, as Prometheus' histogram_quantile
 * estimates it (linear within the bucket that holds it), clamped to the max
 * (in the +Inf bucket: the max itself). */
static uint64_t bucket_quantile(const struct snap *s, double q)
{
    double want = q * (double)s->count;
    uint64_t acc = 0;
    if (!s->count)
        return 0;
    for (unsigned b = 0; b < VRPC_PROM_BUCKETS; b++) {
        if (s->bucket[b] && (double)(acc + s->bucket[b]) >= want) {
            uint64_t lo = b ? vrpc_prom_bounds_ns[b - 1] : 0, hi = vrpc_prom_bounds_ns[b];
            double f = (want - (double)acc) / (double)s->bucket[b];
            uint64_t v = lo + (uint64_t)(f * (double)(hi - lo));
            return v < s->max_ns ? v : s->max_ns;
        }
        acc += s->bucket[b];
    }
    return s->max_ns;
}

void vrpc_prom_calls(struct vrpc_prom *p, const char *prefix, const char *labels, const struct vrpc_prom_method *v,
                     size_t n)
{
    static const double qs[3] = {0.5, 0.9, 0.99};
    static const char *const qname[3] = {"0.5", "0.9", "0.99"};
    struct snap *s = calloc(n ? n : 1, sizeof *s);
    char name[128];
    size_t i;

    if (!s) {
        p->err = -ENOMEM;
        return;
    }
    for (i = 0; i < n; i++)
        take(&s[i], v[i].m);

    snprintf(name, sizeof name, "%scalls_total", prefix);
    vrpc_prom_head(p, name, "counter", "Calls answered (any status).");
    for (i = 0; i < n; i++) {
        series(p, prefix, "calls_total", labels, v[i].method);
        fprintf(p->f, "} %llu\n", (unsigned long long)s[i].calls);
    }
    snprintf(name, sizeof name, "%serrors_total", prefix);
    vrpc_prom_head(p, name, "counter", "Calls answered with a status other than OK, by code.");
    for (i = 0; i < n; i++)
        for (unsigned c = 1; c < VRPC_CODE_COUNT; c++) {
            if (!s[i].by_code[c])
                continue;
            series(p, prefix, "errors_total", labels, v[i].method);
            fprintf(p->f, ",code=\"%s\"} %llu\n", vrpc_code_name((enum vrpc_code)c),
                    (unsigned long long)s[i].by_code[c]);
        }
    snprintf(name, sizeof name, "%sduration_seconds", prefix);
    vrpc_prom_head(p, name, "histogram", "Call latency in seconds.");
    for (i = 0; i < n; i++) {
        uint64_t acc = 0;
        for (unsigned b = 0; b < VRPC_PROM_BUCKETS; b++) {
            acc += s[i].bucket[b];
            series(p, prefix, "duration_seconds_bucket", labels, v[i].method);
            fputs(",le=\"", p->f);
            seconds(p, vrpc_prom_bounds_ns[b]);
            fprintf(p->f, "\"} %llu\n", (unsigned long long)acc);
        }
        series(p, prefix, "duration_seconds_bucket", labels, v[i].method);
        fprintf(p->f, ",le=\"+Inf\"} %llu\n", (unsigned long long)s[i].count);
        series(p, prefix, "duration_seconds_sum", labels, v[i].method);
        fprintf(p->f, "} %.9f\n", (double)s[i].sum_ns / 1e9);
        series(p, prefix, "duration_seconds_count", labels, v[i].method);
        fprintf(p->f, "} %llu\n", (unsigned long long)s[i].count);
    }
    snprintf(name, sizeof name, "%slatency_seconds", prefix);
    vrpc_prom_head(p, name, "gauge", "Latency percentiles in seconds (never above the max).");
    for (i = 0; i < n; i++) {
        uint64_t lq[3];
        if (v[i].lh)
            vrpc_lathist_quantiles(v[i].lh, qs, lq, 3, s[i].max_ns / 1000);
        for (unsigned q = 0; q < 3; q++) {
            uint64_t ns = v[i].lh ? lq[q] * 1000 : bucket_quantile(&s[i], qs[q]);
            if (ns > s[i].max_ns)
                ns = s[i].max_ns;
            series(p, prefix, "latency_seconds", labels, v[i].method);
            fprintf(p->f, ",quantile=\"%s\"} ", qname[q]);
            seconds(p, ns);
            fputc('\n', p->f);
        }
    }
    snprintf(name, sizeof name, "%slatency_max_seconds", prefix);
    vrpc_prom_head(p, name, "gauge", "Largest latency seen, in seconds.");
    for (i = 0; i < n; i++) {
        series(p, prefix, "latency_max_seconds", labels, v[i].method);
        fputs("} ", p->f);
        seconds(p, s[i].max_ns);
        fputc('\n', p->f);
    }
    free(s);
}

void vrpc_prom_transport(struct vrpc_prom *p, const char *prefix, const char *labels,
                         const struct vrpc_transport_counters *c)
{
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } rows[] = {
        {"connections", "gauge", "Connections open now.", c->connections},
        {"connections_accepted_total", "counter", "Connections accepted.", c->accepted},
        {"connections_opened_total", "counter", "Connections this side opened.", c->connected},
        {"connections_closed_total", "counter", "Connections ended (closed or lost).", c->disconnected},
        {"messages_received_total", "counter", "Messages received.", c->msgs_in},
        {"received_bytes_total", "counter", "Bytes of messages received.", c->bytes_in},
        {"messages_sent_total", "counter", "Messages sent.", c->msgs_out},
        {"sent_bytes_total", "counter", "Bytes of messages sent.", c->bytes_out},
        {"credit_waits_total", "counter", "Sends queued for lack of credits.", c->credit_waits},
        {"rndv_reads_total", "counter", "Rendezvous transfers pulled by this side (reads completed).", c->reads},
        {"rndv_read_bytes_total", "counter", "Bytes pulled by rendezvous reads.", c->read_bytes},
        {"rndv_grants_total", "counter", "Large payloads offered to the peer to pull.", c->grants},
        {"pinned_bytes", "gauge", "Bytes of large-message buffers registered now.", c->pinned_bytes},
        {"large_in_use_bytes", "gauge", "Bytes of large-message buffers in use now.", c->large_in_use_bytes},
    };
    char name[128];
    /* labels end with ','; drop it inside these braces */
    size_t ll = strlen(labels);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, rows[i].name);
        vrpc_prom_head(p, name, rows[i].type, rows[i].help);
        fprintf(p->f, "%s{%.*s} %llu\n", name, (int)(ll && labels[ll - 1] == ',' ? ll - 1 : ll), labels,
                (unsigned long long)rows[i].v);
    }
}

/* ---- a channel's method table ------------------------------------------------ */

static inline struct vrpc_call_metrics *table_get(struct vrpc_method_table *t, const struct vrpc_method_desc *m)
{
    for (unsigned k = 0, i = m->id % VRPC_CHAN_METHODS; k < VRPC_CHAN_METHODS; k++, i = (i + 1) % VRPC_CHAN_METHODS) {
        const struct vrpc_method_desc *cur = __atomic_load_n(&t->e[i].m, __ATOMIC_ACQUIRE);
        if (!cur && __atomic_compare_exchange_n(&t->e[i].m, &cur, m, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return &t->e[i].cm;
        /* (a failed CAS loaded the winner into cur) */
        if (cur == m || (cur && cur->id == m->id))
            return &t->e[i].cm;
    }
    return &t->other;
}

struct vrpc_call_metrics *vrpc_method_table_get(struct vrpc_method_table *t, const struct vrpc_method_desc *m)
{
    return table_get(t, m);
}

void vrpc_method_table_done(struct vrpc_method_table *t, const struct vrpc_method_desc *m, enum vrpc_code code,
                            int64_t start_ns)
{
    struct vrpc_call_metrics *cm = table_get(t, m);
    if (start_ns) {
        int64_t d = vrpc_metrics_now_ns() - start_ns;
        vrpc_call_metrics_record(cm, code, d > 0 ? (uint64_t)d : 0);
    } else {
        vrpc_call_metrics_count(cm, code);
    }
}

/* ---- a side's whole text ------------------------------------------------------- */

/* `backend="tcp",` (+ `target="..."`, for a channel) */
static int base_labels(char *buf, size_t len, struct vrpc_transport *tp, const char *target)
{
    struct vrpc_prom p;
    char *t;
    size_t n;
    if (vrpc_prom_open(&p))
        return -ENOMEM;
    if (tp)
        fprintf(p.f, "backend=\"%s\",", vrpc_transport_name(tp));
    if (target) {
        fputs("target=\"", p.f);
        vrpc_prom_label(&p, target);
        fputs("\",", p.f);
    }
    if (vrpc_prom_close(&p, &t, &n))
        return -ENOMEM;
    snprintf(buf, len, "%s", t);
    free(t);
    return 0;
}

int vrpc_metrics_text(const char *prefix, struct vrpc_transport *tp, const char *target,
                      const struct vrpc_prom_method *v, size_t n, char **out, size_t *len)
{
    struct vrpc_prom p;
    char labels[VRPC_URI_MAX * 2 + 64];

    if (base_labels(labels, sizeof labels, tp, target) || vrpc_prom_open(&p))
        return -ENOMEM;
    vrpc_prom_calls(&p, prefix, labels, v, n);
    if (tp) {
        struct vrpc_transport_counters c;
        vrpc_transport_counters(tp, &c);
        vrpc_prom_transport(&p, prefix, labels, &c);
    }
    return vrpc_prom_close(&p, out, len);
}

int vrpc_method_table_text(const struct vrpc_method_table *t, const char *prefix, struct vrpc_transport *tp,
                           const char *target, char **out, size_t *len)
{
    struct vrpc_prom_method v[VRPC_CHAN_METHODS + 1];
    size_t n = 0;

    for (unsigned i = 0; i < VRPC_CHAN_METHODS; i++) {
        const struct vrpc_method_desc *m = __atomic_load_n(&t->e[i].m, __ATOMIC_ACQUIRE);
        if (m)
            v[n++] = (struct vrpc_prom_method){.method = m->full_name, .m = &t->e[i].cm};
    }
    if (vrpc_call_metrics_calls(&t->other))
        v[n++] = (struct vrpc_prom_method){.method = "other", .m = &t->other};
    return vrpc_metrics_text(prefix, tp, target, v, n, out, len);
}

#ifndef VRPC_HAVE_METRICS_HTTP
/* Built without libmicrohttpd: no endpoint. */
int vrpc_metrics_http_check(const char *addr, char *copy, size_t len)
{
    copy[0] = 0;
    if (!addr)
        return 0;
    vrpc_log(VRPC_LOG_ERROR, "rpc",
             "server: metrics_addr is set but this libverbrpc has no metrics endpoint (built without libmicrohttpd)");
    return -ENOTSUP;
}

int vrpc_metrics_http_start(const struct vrpc_server *s, const char *addr, vrpc_metrics_render_fn render,
                            struct vrpc_metrics_http **out)
{
    return -ENOTSUP;
}

const char *vrpc_metrics_http_uri(const struct vrpc_metrics_http *h) { return ""; }

void vrpc_metrics_http_stop(struct vrpc_metrics_http *h) {}
#endif

/* Per-method call metrics shared by the server and the channel
 * (rpc/metrics.c): counters by status code, a latency histogram with fixed
 * Prometheus buckets, and the server's finer log-linear histogram for the
 * Stats service's percentiles; plus the Prometheus text writer both sides
 * render with. Recording is relaxed atomics on the caller's thread, no
 * allocation; rendering allocates (never on the call path). */
#ifndef VRPC_RPC_METRICS_H
#define VRPC_RPC_METRICS_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <verbrpc/rpc.h>
#include <verbrpc/metrics.h>
#include <verbrpc/transport.h>
#include "common/clock.h"

/* Upper bounds of the Prometheus latency buckets, in ns: 1-2-5 steps from
 * 1 us to 10 s (then +Inf). */
#define VRPC_PROM_BUCKETS 22
extern const uint64_t vrpc_prom_bounds_ns[VRPC_PROM_BUCKETS];

/* calls = the sum of by_code (one atomic add fewer per call). */
struct vrpc_call_metrics {
    uint64_t by_code[VRPC_CODE_COUNT];
    uint64_t sum_ns, max_ns;
    uint64_t bucket[VRPC_PROM_BUCKETS + 1]; /* not cumulative; last: above every bound */
};

/* Record one answered call that took ns (any thread, relaxed atomics). */
void vrpc_call_metrics_record(struct vrpc_call_metrics *m, enum vrpc_code code, uint64_t ns);
/* Count one call without timing it (by_code only). */
void vrpc_call_metrics_count(struct vrpc_call_metrics *m, enum vrpc_code code);

/* Log-linear latency histogram in microseconds (bucket width < 1/8 of its
 * value, so a percentile read from it is within 7%). */
#define VRPC_LATHIST_BUCKETS 496
struct vrpc_lathist {
    uint64_t h[VRPC_LATHIST_BUCKETS];
};
void vrpc_lathist_record(struct vrpc_lathist *h, uint64_t us);
/* Percentiles q[i] (0 < q <= 1) into out[i]: each is its bucket's middle,
 * but never above max_us, the largest value recorded (kept by the caller,
 * vrpc_call_metrics_max_us). All 0 when nothing was
 * recorded. */
void vrpc_lathist_quantiles(const struct vrpc_lathist *h, const double *q, uint64_t *out, unsigned nq, uint64_t max_us);
/* Calls recorded (the sum of by_code) and the largest latency in us. */
uint64_t vrpc_call_metrics_calls(const struct vrpc_call_metrics *m);
uint64_t vrpc_call_metrics_max_us(const struct vrpc_call_metrics *m);

/* ---- Prometheus text (exposition format 0.0.4) ---------------------------- */

/* Writes into a growing memory buffer; a failed write leaves it in error. */
struct vrpc_prom {
    FILE *f;
    char *buf;
    size_t len;
    int err; /* a renderer ran out of memory */
};
int vrpc_prom_open(struct vrpc_prom *p);
/* Finish: *out (malloc'd, NUL-terminated, the caller frees) and *len. 0 or -ENOMEM. */
int vrpc_prom_close(struct vrpc_prom *p, char **out, size_t *len);
/* "# HELP name help\n# TYPE name type\n" */
void vrpc_prom_head(struct vrpc_prom *p, const char *name, const char *type, const char *help);
/* A label value escaped as the format wants (backslash, quote, newline). */
void vrpc_prom_label(struct vrpc_prom *p, const char *v);

/* One method's metrics to render. lh: the log-linear histogram for the
 * percentiles, or NULL (then they come from the buckets' upper bounds).
 * Either way a percentile is never above the max. */
struct vrpc_prom_method {
    const char *method;
    const struct vrpc_call_metrics *m;
    const struct vrpc_lathist *lh;
};
/* For each family, one line per method: prefix_calls_total{method},
 * prefix_errors_total{method,code} (non-zero non-OK codes),
 * prefix_duration_seconds histogram (_bucket{le}, _sum, _count; _count is the
 * buckets' total, read once), prefix_latency_seconds{quantile} (0.5, 0.9,
 * 0.99) and prefix_latency_max_seconds. labels: extra `k="v",` pairs put
 * before method (may be ""). */
void vrpc_prom_calls(struct vrpc_prom *p, const char *prefix, const char *labels, const struct vrpc_prom_method *v,
                     size_t n);

/* A transport's counters as prefix_* series labelled with labels (which
 * should name the backend). */
void vrpc_prom_transport(struct vrpc_prom *p, const char *prefix, const char *labels,
                         const struct vrpc_transport_counters *c);

/* ---- per-method table of a channel ---------------------------------------- */

/* A channel learns its methods as they are called: a fixed open-addressed
 * table filled lock-free (CAS on the method pointer); methods beyond its
 * size share `other`. */
#define VRPC_CHAN_METHODS 32
struct vrpc_method_table {
    struct {
        const struct vrpc_method_desc *m; /* atomic: NULL, then set once */
        struct vrpc_call_metrics cm;
    } e[VRPC_CHAN_METHODS];
    struct vrpc_call_metrics other;
};
/* m's metrics (any thread). */
struct vrpc_call_metrics *vrpc_method_table_get(struct vrpc_method_table *t, const struct vrpc_method_desc *m);
/* vrpc_now_ns's clock, inline (common/clock.h): a call's start and end are
 * read on the call path. */
static inline int64_t vrpc_metrics_now_ns(void) { return vrpc_clock_mono_ns(); }
/* A call of m ended with code: recorded with its latency from start_ns
 * (vrpc_metrics_now_ns) to now, or untimed if start_ns is 0. */
void vrpc_method_table_done(struct vrpc_method_table *t, const struct vrpc_method_desc *m, enum vrpc_code code,
                            int64_t start_ns);

/* ---- a side's whole text ------------------------------------------------- */

/* The text of vrpc_server_metrics_text / vrpc_channel_metrics_text: labels
 * backend="<tp's name>" (if tp) and target="<target>" (if target), then
 * vrpc_prom_calls over v[n] and vrpc_prom_transport over tp's counters (if
 * tp), every family named prefix*. The caller (server_stats.c, channel.c) passes
 * what it has: metrics.c never reads a server or a channel. *out as for
 * vrpc_prom_close. 0 or -ENOMEM. */
int vrpc_metrics_text(const char *prefix, struct vrpc_transport *tp, const char *target,
                      const struct vrpc_prom_method *v, size_t n, char **out, size_t *len);
/* The same for the methods a channel's table has seen (and `other`, if it
 * counted a call). */
int vrpc_method_table_text(const struct vrpc_method_table *t, const char *prefix, struct vrpc_transport *tp,
                           const char *target, char **out, size_t *len);

/* ---- the HTTP endpoint (rpc/metrics_http.c; stubs without libmicrohttpd) -- */

struct vrpc_metrics_http;
/* At server create: NULL addr is fine (no endpoint); else it must parse as
 * IP:port (-EINVAL, logged) and is copied into copy (len bytes); without the
 * endpoint built in: -ENOTSUP (logged). */
int vrpc_metrics_http_check(const char *addr, char *copy, size_t len);
/* What a scrape renders: render(s, ...) on the endpoint's own thread (for a
 * server, vrpc_server_metrics_text). s is passed back, never read here. */
struct vrpc_server;
typedef int (*vrpc_metrics_render_fn)(const struct vrpc_server *s, char **out, size_t *len);
/* Serve render(s)'s text on addr until stop. 0 or a negative errno (logged). */
int vrpc_metrics_http_start(const struct vrpc_server *s, const char *addr, vrpc_metrics_render_fn render,
                            struct vrpc_metrics_http **out);
/* "http://IP:port/metrics" with the port bound. */
const char *vrpc_metrics_http_uri(const struct vrpc_metrics_http *h);
/* Stop serving; when it returns no scrape runs. Safe on NULL. */
void vrpc_metrics_http_stop(struct vrpc_metrics_http *h);

#endif

/* Metrics as Prometheus text (exposition format 0.0.4), for a monitoring
 * system to scrape: the server's (also served over HTTP when
 * vrpc_server_opts.metrics_addr is set), a channel's, and a Stats reply's
 * (what `verbrpc stats --prometheus` prints).
 *
 * Series (prefix vrpc_server_ or vrpc_client_; every series carries
 * backend="tcp"|"verbs", a channel's also target="URI"):
 *   calls_total{method}                 calls answered (client: completed), any code
 *   errors_total{method,code}           those with a code other than OK
 *   duration_seconds{method} histogram  latency: _bucket{le} cumulative from 1 us
 *                                       in 1-2-5 steps to 10 s and +Inf, _sum, _count
 *   latency_seconds{method,quantile}    p50, p90, p99, never above the max (server:
 *                                       from a log-linear histogram, error < 7%;
 *                                       client: interpolated in the buckets above)
 *   latency_max_seconds{method}
 *   connections, connections_accepted_total, connections_opened_total,
 *   connections_closed_total, messages_received_total, received_bytes_total,
 *   messages_sent_total, sent_bytes_total, credit_waits_total,
 *   rndv_reads_total, rndv_read_bytes_total, rndv_grants_total,
 *   pinned_bytes, large_in_use_bytes    the transport's (vrpc_transport_counters)
 * Server latency runs from request arrival to the response handed to the
 * transport (as vrpc_server_stats). Client latency runs from the call taking
 * its slot to its completion; calls refused before that (no connection,
 * request too large) count in calls_total and errors_total only.
 * Counters are read with relaxed loads while calls run: a scrape is
 * approximate across series, but a histogram's _count equals its +Inf bucket.
 *
 * Each function writes a malloc'd NUL-terminated text into *out (the caller
 * frees it) and its length into *len. 0, -EINVAL or -ENOMEM. Any thread;
 * rendering allocates and takes the transport's CQ-list lock, so it belongs
 * on a scrape path, not a call path. */
#ifndef VERBRPC_METRICS_H
#define VERBRPC_METRICS_H

#include <stddef.h>
#include <verbrpc/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vrpc_server;
struct vrpc_channel;
struct Verbrpc__Stats__V1__GetStatsResponse;

/* The server's metrics, before or after start (transport series once
 * started); not concurrently with vrpc_server_register or destroy. */
VRPC_API int vrpc_server_metrics_text(const struct vrpc_server *s, char **out, size_t *len);

/* The URL the metrics endpoint serves, "http://127.0.0.1:9464/metrics" (with
 * the port bound when metrics_addr said 0). -ENOTCONN when the server has no
 * endpoint (not started, or no metrics_addr), -ENOSPC if len is too small. */
VRPC_API int vrpc_server_metrics_uri(const struct vrpc_server *s, char *buf, size_t len);

/* A channel's metrics: its calls per method (the first 32 methods called,
 * the rest as method="other") and its transport's series. */
VRPC_API int vrpc_channel_metrics_text(const struct vrpc_channel *ch, char **out, size_t *len);

/* A reply of the built-in Stats service (verbrpc.stats.v1.Stats/Get, from
 * <verbrpc/stats.vrpc.h>) as Prometheus text: vrpc_stats_calls_total{method},
 * vrpc_stats_errors_total{method,code} and vrpc_stats_latency_seconds{method,
 * quantile="0.5"|"0.9"|"0.99"|"1"} (1: the max), each percentile clamped to
 * the max. labels: extra `k="v"` pairs for every series, e.g.
 * `server="10.0.0.1:7500"` (NULL or "": none; used as given). */
VRPC_API int vrpc_stats_prometheus_text(const struct Verbrpc__Stats__V1__GetStatsResponse *r, const char *labels,
                                        char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif

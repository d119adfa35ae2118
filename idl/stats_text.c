/* A Stats reply (verbrpc.stats.v1.GetStatsResponse) as Prometheus text, for
 * tools that fetch it over RPC (`verbrpc stats --prometheus`). Contract in
 * <verbrpc/metrics.h>. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <verbrpc/metrics.h>
#include <verbrpc/stats.vrpc.h>
#include "rpc/metrics.h"

static void series(struct vrpc_prom *p, const char *name, const char *labels, const char *method)
{
    fprintf(p->f, "%s{%s%smethod=\"", name, labels, labels[0] ? "," : "");
    vrpc_prom_label(p, method ? method : "");
    fputc('"', p->f);
}

int vrpc_stats_prometheus_text(const Verbrpc__Stats__V1__GetStatsResponse *r, const char *labels, char **out,
                               size_t *len)
{
    struct vrpc_prom p;
    size_t i, k;

    if (!r || !out || !len)
        return -EINVAL;
    if (!labels)
        labels = "";
    if (vrpc_prom_open(&p))
        return -ENOMEM;
    vrpc_prom_head(&p, "vrpc_stats_calls_total", "counter", "Calls answered (any status), from the Stats service.");
    for (i = 0; i < r->n_methods; i++) {
        series(&p, "vrpc_stats_calls_total", labels, r->methods[i]->method);
        fprintf(p.f, "} %llu\n", (unsigned long long)r->methods[i]->calls);
    }
    vrpc_prom_head(&p, "vrpc_stats_errors_total", "counter", "Calls answered with a status other than OK, by code.");
    for (i = 0; i < r->n_methods; i++)
        for (k = 0; k < r->methods[i]->n_errors_by_code; k++) {
            const Verbrpc__Stats__V1__CodeCount *c = r->methods[i]->errors_by_code[k];
            series(&p, "vrpc_stats_errors_total", labels, r->methods[i]->method);
            fputs(",code=\"", p.f);
            vrpc_prom_label(&p, c->code ? c->code : "");
            fprintf(p.f, "\"} %llu\n", (unsigned long long)c->count);
        }
    vrpc_prom_head(&p, "vrpc_stats_latency_seconds", "gauge",
                   "Latency percentiles in seconds (quantile 1: the max; never above it).");
    for (i = 0; i < r->n_methods; i++) {
        const Verbrpc__Stats__V1__MethodStats *m = r->methods[i];
        const uint64_t max = m->latency_max_us;
        const struct {
            const char *q;
            uint64_t us;
        } row[] = {
            {"0.5", m->latency_p50_us},
            {"0.9", m->latency_p90_us},
            {"0.99", m->latency_p99_us},
            {"1", max},
        };
        for (k = 0; k < sizeof row / sizeof row[0]; k++) {
            /* a server from before the fix could report a percentile above the max */
            uint64_t us = row[k].us < max ? row[k].us : max;
            series(&p, "vrpc_stats_latency_seconds", labels, m->method);
            fprintf(p.f, ",quantile=\"%s\"} %.9g\n", row[k].q, (double)us / 1e6);
        }
    }
    return vrpc_prom_close(&p, out, len);
}

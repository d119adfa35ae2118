/* Shared helpers for verbrpc's benchmark programs (header-only): a monotonic
 * clock, latency samples with percentiles, the common command line
 * (--json, --quick) and one result line per measured case.
 *
 * Output contract (COMMON.md): with --json, print exactly one JSON object per
 * line per case, with at least "name", "ops_per_s", "p50_us", "p99_us" (null
 * when the case does not measure it); baseline cases have names starting with
 * "baseline:". Without --json, the same figures as an aligned table.
 *
 * Typical use:
 *     struct vrpc_bench_opts o;
 *     if (vrpc_bench_parse(argc, argv, &o, "what this program measures") != 0) return 2;
 *     struct vrpc_bench_samples s;
 *     vrpc_bench_samples_init(&s, n);              // the one allocation
 *     ... vrpc_bench_samples_add(&s, t1 - t0); ...  // nanoseconds
 *     vrpc_bench_report(&o, "sched:wake_parked", ops, vrpc_bench_pct_us(&s, 50),
 *                       vrpc_bench_pct_us(&s, 99), "\"workers\":2");
 *     vrpc_bench_samples_free(&s);
 */
#ifndef VRPC_BENCH_COMMON_H
#define VRPC_BENCH_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Not measured: printed as null (JSON) or "-" (table). */
#define VRPC_BENCH_NONE NAN

struct vrpc_bench_opts {
    bool json;  /* --json: one JSON object per line per case */
    bool quick; /* --quick: smaller runs (smoke tests, sanitizer builds) */
};

static inline uint64_t vrpc_bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Returns 0, 1 after printing --help (caller exits 0), or -1 on a bad option
 * (after printing usage to stderr; caller exits 2). */
static inline int vrpc_bench_parse(int argc, char **argv, struct vrpc_bench_opts *o, const char *what)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            o->quick = true;
        } else {
            bool help = strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
            fprintf(help ? stdout : stderr, "usage: %s [--json] [--quick]\n  %s\n", argv[0], what);
            return help ? 1 : -1;
        }
    }
    return 0;
}

struct vrpc_bench_samples {
    uint64_t *v; /* nanoseconds */
    size_t n, cap;
    bool sorted;
};

static inline void vrpc_bench_samples_init(struct vrpc_bench_samples *s, size_t cap)
{
    s->v = malloc((cap ? cap : 1) * sizeof(*s->v));
    if (!s->v) {
        fprintf(stderr, "bench: out of memory for %zu samples\n", cap);
        exit(1);
    }
    s->n = 0;
    s->cap = cap;
    s->sorted = false;
}

/* Samples beyond the capacity are dropped (no allocation while measuring). */
static inline void vrpc_bench_samples_add(struct vrpc_bench_samples *s, uint64_t ns)
{
    if (s->n < s->cap)
        s->v[s->n++] = ns;
    s->sorted = false;
}

static inline int vrpc_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Percentile p (0-100) in microseconds, nearest-rank; NONE without samples. */
static inline double vrpc_bench_pct_us(struct vrpc_bench_samples *s, double p)
{
    size_t k;
    if (s->n == 0)
        return VRPC_BENCH_NONE;
    if (!s->sorted) {
        qsort(s->v, s->n, sizeof(*s->v), vrpc_bench_cmp_u64);
        s->sorted = true;
    }
    k = (size_t)ceil(p / 100.0 * (double)s->n);
    k = k == 0 ? 0 : k - 1;
    if (k >= s->n)
        k = s->n - 1;
    return (double)s->v[k] / 1000.0;
}

static inline double vrpc_bench_mean_us(const struct vrpc_bench_samples *s)
{
    double sum = 0;
    if (s->n == 0)
        return VRPC_BENCH_NONE;
    for (size_t i = 0; i < s->n; i++)
        sum += (double)s->v[i];
    return sum / (double)s->n / 1000.0;
}

static inline void vrpc_bench_samples_free(struct vrpc_bench_samples *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static inline void vrpc_bench_json_num(const char *key, double v)
{
    if (isnan(v))
        printf(",\"%s\":null", key);
    else
        printf(",\"%s\":%.3f", key, v);
}

/* One result line. extra_json: NULL, or more members without braces or a
 * leading comma (e.g. "\"workers\":2"); shown as-is after the table columns. */
static inline void vrpc_bench_report(const struct vrpc_bench_opts *o, const char *name, double ops_per_s, double p50_us,
                                     double p99_us, const char *extra_json)
{
    if (o->json) {
        printf("{\"name\":\"%s\"", name);
        vrpc_bench_json_num("ops_per_s", ops_per_s);
        vrpc_bench_json_num("p50_us", p50_us);
        vrpc_bench_json_num("p99_us", p99_us);
        if (extra_json && *extra_json)
            printf(",%s", extra_json);
        printf("}\n");
    } else {
        printf("%-36s", name);
        if (isnan(ops_per_s))
            printf(" %14s ops/s", "-");
        else
            printf(" %14.0f ops/s", ops_per_s);
        if (isnan(p50_us))
            printf("  p50 %9s us  p99 %9s us", "-", "-");
        else
            printf("  p50 %9.2f us  p99 %9.2f us", p50_us, p99_us);
        if (extra_json && *extra_json)
            printf("  %s", extra_json);
        printf("\n");
    }
    fflush(stdout);
}

#endif

/* Small helpers shared by the example programs: time, a latency histogram
 * with percentiles, waiting for Ctrl-C, writing the bound URI to a file.
 * Not part of verbrpc's API. */
#ifndef VRPC_EXAMPLES_EX_UTIL_H
#define VRPC_EXAMPLES_EX_UTIL_H

#include <stdbool.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t ex_now_ns(void);

/* Log-linear latency histogram: 16 sub-buckets per power of two of
 * nanoseconds (error < 6.25%). ex_hist_add() may be called from any number
 * of threads at once (relaxed atomic increments). */
#define EX_HIST_SUB 16
#define EX_HIST_BUCKETS (64 * EX_HIST_SUB)
struct ex_hist {
    uint64_t count[EX_HIST_BUCKETS];
    uint64_t max_ns;
};
void ex_hist_add(struct ex_hist *h, int64_t ns);
uint64_t ex_hist_total(const struct ex_hist *h);
/* The value (ns) below which a fraction q (0..1) of the samples lie. */
uint64_t ex_hist_quantile(const struct ex_hist *h, double q);

/* Blocks SIGINT and SIGTERM in the calling thread (call it first in main,
 * before threads exist, so that every thread inherits the mask), and
 * ex_wait_for_signal() then waits for one of them and returns its number. */
void ex_block_signals(void);
int ex_wait_for_signal(void);

/* Writes text and a newline to path (replacing it): scripts read the URI a
 * server bound (port 0 picks a free one). 0 or a negative errno. */
int ex_write_file(const char *path, const char *text);

/* Parses a positive decimal number; false if s is not one. */
bool ex_parse_uint(const char *s, unsigned long long *out);

#endif

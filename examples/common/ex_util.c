/* Helpers shared by the example programs (see ex_util.h). */
#include "ex_util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int64_t ex_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static unsigned bucket_of(uint64_t v)
{
    unsigned msb, sub;

    if (v < EX_HIST_SUB)
        return (unsigned)v;
    msb = 63u - (unsigned)__builtin_clzll(v);
    sub = (unsigned)(v >> (msb - 4)) & (EX_HIST_SUB - 1); /* the 4 bits after the leading 1 */
    return (msb - 3) * EX_HIST_SUB + sub;
}

/* Lower bound of bucket b's values. */
static uint64_t bucket_low(unsigned b)
{
    unsigned msb;

    if (b < EX_HIST_SUB)
        return b;
    msb = b / EX_HIST_SUB + 3;
    return ((uint64_t)(EX_HIST_SUB + b % EX_HIST_SUB)) << (msb - 4);
}

void ex_hist_add(struct ex_hist *h, int64_t ns)
{
    uint64_t v = ns > 0 ? (uint64_t)ns : 0, max;

    __atomic_fetch_add(&h->count[bucket_of(v)], 1, __ATOMIC_RELAXED);
    max = __atomic_load_n(&h->max_ns, __ATOMIC_RELAXED);
    while (v > max && !__atomic_compare_exchange_n(&h->max_ns, &max, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

uint64_t ex_hist_total(const struct ex_hist *h)
{
    uint64_t n = 0;

    for (unsigned b = 0; b < EX_HIST_BUCKETS; b++)
        n += __atomic_load_n(&h->count[b], __ATOMIC_RELAXED);
    return n;
}

uint64_t ex_hist_quantile(const struct ex_hist *h, double q)
{
    uint64_t total = ex_hist_total(h), seen = 0, rank;

    if (total == 0)
        return 0;
    rank = (uint64_t)(q * (double)total);
    if (rank >= total)
        rank = total - 1;
    for (unsigned b = 0; b < EX_HIST_BUCKETS; b++) {
        seen += __atomic_load_n(&h->count[b], __ATOMIC_RELAXED);
        if (seen > rank) {
            uint64_t mid = b + 1 < EX_HIST_BUCKETS ? (bucket_low(b) + bucket_low(b + 1)) / 2 : bucket_low(b);
            uint64_t max = __atomic_load_n(&h->max_ns, __ATOMIC_RELAXED);
            return mid < max ? mid : max;
        }
    }
    return __atomic_load_n(&h->max_ns, __ATOMIC_RELAXED);
}

void ex_block_signals(void)
{
    sigset_t set;

    /* A shell starts background jobs with SIGINT ignored, and an ignored
     * signal is discarded instead of waiting for sigwait(). */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

int ex_wait_for_signal(void)
{
    sigset_t set;
    int sig = 0;

    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    while (sigwait(&set, &sig) != 0)
        ;
    return sig;
}

int ex_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rc = 0;

    if (!f)
        return -errno;
    if (fprintf(f, "%s\n", text) < 0)
        rc = -EIO;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

bool ex_parse_uint(const char *s, unsigned long long *out)
{
    char *end;
    unsigned long long v;

    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

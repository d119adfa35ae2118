/* The table of every environment knob (common/env.h, docs/ENV.md) and its
 * one reading: parsed and range-checked once, reported when first read. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/log.h>
#include "common/env.h"

enum kind { K_LONG, K_FLAG, K_SET, K_LEVEL, K_STR };

struct knob {
    const char *name;
    enum kind kind;
    long dflt, lo, hi;  /* K_LONG: default and range */
    const char *subsys; /* the logger's subsystem for a report */
    const char *layer;  /* the report's prefix */
};

#define L(n, d, lo, hi, s, l) [VRPC_ENV_##n] = {"VRPC_" #n, K_LONG, d, lo, hi, s, l}
#define F(n, s, l) [VRPC_ENV_##n] = {"VRPC_" #n, K_FLAG, 0, 0, 1, s, l}

static const struct knob knobs[VRPC_ENV_COUNT] = {
    [VRPC_ENV_LOG] = {"VRPC_LOG", K_LEVEL, VRPC_LOG_WARN, 0, 0, "app", "log"},
    [VRPC_ENV_FAULT] = {"VRPC_FAULT", K_STR, 0, 0, 0, "transport", "fault"},
    F(NO_GATHER, "rpc", "rpc"),
    F(SCHED_MEMBARRIER, "sched", "sched"),
    L(TCP_TEST_EP_GRANTS, 0, 0, UINT32_MAX, "transport", "tcp"),
    F(TCP_NO_FLOW_BUSY, "transport", "tcp"),
    L(VERBS_RNR_RETRY, 7, 0, 7, "transport", "verbs"),
    L(VERBS_ACK_TIMEOUT, 0, 14, 31, "transport", "verbs"), /* 0: rdma_cm's */
    L(VERBS_GID_INDEX, -1, -1, 255, "transport", "verbs"),
    L(VERBS_PROTO_VERSION, -1, 0, 65535, "transport", "verbs"), /* -1: the backend's */
    L(VERBS_SRQ_LIMIT, 0, 0, 1 << 20, "transport", "verbs"),
    L(VERBS_READ_CHUNK, 0, 4096, 1 << 30, "transport", "verbs"), /* 0: the attr's */
    L(VERBS_READ_WINDOW, 0, 1, 256, "transport", "verbs"),
    L(VERBS_READ_CHUNK_BULK, 0, 4096, 1 << 30, "transport", "verbs"),
    [VRPC_ENV_VERBS_TRACE] = {"VRPC_VERBS_TRACE", K_SET, 0, 0, 1, "transport", "verbs"},
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static long vals[VRPC_ENV_COUNT];  /* atomic: reload writes them */
static char *strs[VRPC_ENV_COUNT]; /* K_STR copies */
static char *bad[VRPC_ENV_COUNT];  /* atomic: an ignored value not yet reported */

/* 0 and *out, or -EINVAL: a whole decimal/0x/0 integer within lo..hi. */
static int parse_long(const char *v, long lo, long hi, long *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 0);
    if (errno || end == v || *end || x < lo || x > hi)
        return -EINVAL;
    *out = x;
    return 0;
}

/* k's value from v (set); -EINVAL leaves the default. */
static int parse(const struct knob *k, const char *v, long *out)
{
    enum vrpc_log_level l;
    long x;
    switch (k->kind) {
    case K_LONG:
        return *v ? parse_long(v, k->lo, k->hi, out) : 0; /* empty: unset */
    case K_FLAG: /* a positive integer (the documented 1): on; 0 or empty: off */
        if (!*v)
            return 0;
        if (parse_long(v, 0, LONG_MAX, &x))
            return -EINVAL;
        *out = x > 0;
        return 0;
    case K_SET:
        *out = 1;
        return 0;
    case K_LEVEL: /* unknown (e.g. the old "1"): the default, silently */
        if (vrpc_log_level_parse(v, &l) == 0)
            *out = (long)l;
        return 0;
    case K_STR:
        return 0;
    }
    return 0;
}

static void load_one(enum vrpc_env_knob i)
{
    const struct knob *k = &knobs[i];
    const char *v = getenv(k->name);
    long x = k->dflt;
    free(strs[i]);
    strs[i] = v && k->kind == K_STR ? strdup(v) : NULL;
    free(__atomic_exchange_n(&bad[i], NULL, __ATOMIC_RELAXED));
    if (v && parse(k, v, &x))
        __atomic_store_n(&bad[i], strdup(v), __ATOMIC_RELAXED);
    __atomic_store_n(&vals[i], x, __ATOMIC_RELAXED);
}

static void load(void)
{
    /* no logging here: the logger's own threshold is read through this once */
    for (int i = 0; i < VRPC_ENV_COUNT; i++)
        load_one((enum vrpc_env_knob)i);
}

static void report(enum vrpc_env_knob i)
{
    const struct knob *k = &knobs[i];
    char *v = __atomic_exchange_n(&bad[i], NULL, __ATOMIC_RELAXED);
    if (!v)
        return;
    if (k->kind == K_LONG)
        vrpc_log(VRPC_LOG_WARN, k->subsys, "%s: ignoring %s=%s (want %ld..%ld)", k->layer, k->name, v, k->lo, k->hi);
    else
        vrpc_log(VRPC_LOG_WARN, k->subsys, "%s: ignoring %s=%s (want 0 or 1)", k->layer, k->name, v);
    free(v);
}

long vrpc_env_long(enum vrpc_env_knob k)
{
    pthread_once(&once, load);
    if (__atomic_load_n(&bad[k], __ATOMIC_RELAXED))
        report(k);
    return __atomic_load_n(&vals[k], __ATOMIC_RELAXED);
}

const char *vrpc_env_str(enum vrpc_env_knob k)
{
    pthread_once(&once, load);
    return strs[k];
}

void vrpc_env_reload(void)
{
    pthread_once(&once, load);
    load();
}

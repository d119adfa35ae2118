/* The fault layer's configuration: the spec grammar (documented in fault.h),
 * where the spec comes from, and the seeded PRNG streams decisions draw from. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "transport/fault/fault.h"

static pthread_mutex_t spec_mu = PTHREAD_MUTEX_INITIALIZER;
static char *configured; /* vrpc_fault_configure's copy, or NULL */

static int parse_prob(const char *v, double *out)
{
    char *end;
    double p = strtod(v, &end);
    if (end == v || *end || !(p >= 0.0 && p <= 1.0))
        return -EINVAL;
    *out = p;
    return 0;
}

static int parse_u64(const char *v, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long x;
    if (!*v || *v == '-' || *v == '+')
        return -EINVAL;
    errno = 0;
    x = strtoull(v, &end, 0);
    if (errno || *end || x > max)
        return -EINVAL;
    *out = x;
    return 0;
}

/* KEY=VALUE with the key's length klen */
static int parse_pair(struct fault_spec *s, const char *k, size_t klen, const char *v)
{
    static const struct {
        const char *key;
        size_t off;
    } probs[] = {
        {"loss", offsetof(struct fault_spec, loss)},
        {"connect", offsetof(struct fault_spec, connect)},
        {"accept", offsetof(struct fault_spec, accept)},
        {"delay", offsetof(struct fault_spec, delay)},
        {"send_delay", offsetof(struct fault_spec, send_delay)},
        {"eagain", offsetof(struct fault_spec, eagain)},
        {"send_err", offsetof(struct fault_spec, send_err)},
        {"read_err", offsetof(struct fault_spec, read_err)},
        {"grant_refuse", offsetof(struct fault_spec, grant_refuse)},
        {"starve", offsetof(struct fault_spec, starve)},
        {"cpl_delay", offsetof(struct fault_spec, cpl_delay)},
    };
    static const struct {
        const char *key;
        size_t off;
    } durs[] = {
        {"delay_us", offsetof(struct fault_spec, delay_us)},
        {"send_delay_us", offsetof(struct fault_spec, send_delay_us)},
        {"starve_us", offsetof(struct fault_spec, starve_us)},
        {"cpl_delay_us", offsetof(struct fault_spec, cpl_delay_us)},
    };
    uint64_t x;
    double p;
    size_t i;

    if (klen == 4 && !strncmp(k, "seed", 4))
        return parse_u64(v, UINT64_MAX, &s->seed);
    if (klen == 3 && !strncmp(k, "all", 3)) {
        if (parse_prob(v, &p))
            return -EINVAL;
        for (i = 0; i < sizeof probs / sizeof probs[0]; i++)
            *(double *)((char *)s + probs[i].off) = p;
        return 0;
    }
    for (i = 0; i < sizeof probs / sizeof probs[0]; i++)
        if (strlen(probs[i].key) == klen && !strncmp(k, probs[i].key, klen))
            return parse_prob(v, (double *)((char *)s + probs[i].off));
    for (i = 0; i < sizeof durs / sizeof durs[0]; i++)
        if (strlen(durs[i].key) == klen && !strncmp(k, durs[i].key, klen)) {
            if (parse_u64(v, 10000000, &x) || x == 0)
                return -EINVAL;
            *(uint32_t *)((char *)s + durs[i].off) = (uint32_t)x;
            return 0;
        }
    return -EINVAL;
}

int fault_spec_parse(const char *str, struct fault_spec *out)
{
    struct fault_spec s = {.seed = 1, .delay_us = 500, .send_delay_us = 100, .starve_us = 2000, .cpl_delay_us = 2000};
    char item[128];

    while (str && *str) {
        const char *comma = strchr(str, ','), *eq;
        size_t n = comma ? (size_t)(comma - str) : strlen(str);
        if (n >= sizeof item)
            return -EINVAL;
        memcpy(item, str, n);
        item[n] = 0;
        str = comma ? comma + 1 : NULL;
        if (!n)
            continue;
        eq = strchr(item, '=');
        if (!eq || parse_pair(&s, item, (size_t)(eq - item), eq + 1)) {
            vrpc_tp_log("fault: bad spec item '%s' (see transport/fault/fault.h)", item);
            return -EINVAL;
        }
    }
    *out = s;
    return 0;
}

int vrpc_fault_configure(const char *spec)
{
    struct fault_spec s;
    char *copy = NULL;
    if (spec && fault_spec_parse(spec, &s))
        return -EINVAL;
    if (spec && !(copy = strdup(spec)))
        return -ENOMEM;
    pthread_mutex_lock(&spec_mu);
    free(configured);
    configured = copy;
    fault_tp_count_reset(); /* a replay of one seed sees the same streams */
    pthread_mutex_unlock(&spec_mu);
    return 0;
}

int fault_spec_current(struct fault_spec *out)
{
    int rc;
    pthread_mutex_lock(&spec_mu);
    rc = fault_spec_parse(configured ? configured : vrpc_env_str(VRPC_ENV_FAULT), out);
    pthread_mutex_unlock(&spec_mu);
    return rc;
}

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, full period, and a
 * good mix of nearby seeds, so (seed, a, b) streams are independent. */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fault_rng_seed(struct fault_rng *r, uint64_t seed, uint64_t a, uint64_t b)
{
    r->s = mix(mix(seed) ^ mix(a + 0x9e3779b97f4a7c15ull) ^ mix(b * 0x9e3779b97f4a7c15ull + 1));
}

uint64_t fault_rng_next(struct fault_rng *r) { return mix(r->s += 0x9e3779b97f4a7c15ull); }

bool fault_rng_hit(struct fault_rng *r, double p)
{
    if (p <= 0.0)
        return false;
    return (double)(fault_rng_next(r) >> 11) * (1.0 / 9007199254740992.0) < p;
}

uint32_t fault_rng_upto(struct fault_rng *r, uint32_t max) { return 1 + (uint32_t)(fault_rng_next(r) % max); }

/* What a channel over many servers shows: its subchannels
 * (vrpc_channel_subchannels) and their families in the channel's metrics
 * text (Prometheus), labelled with the target and the server's address. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rpc/channel_internal.h"
#include "rpc/lb.h"

static void sub_info(const struct vrpc_subch *s, struct vrpc_subchannel_info *o, int64_t now)
{
    snprintf(o->uri, sizeof o->uri, "%s", s->uri);
    o->state = vrpc_lb_sub_state(s);
    o->healthy = __atomic_load_n(&s->health, __ATOMIC_RELAXED) != LB_HEALTH_NOT_SERVING;
    o->ejected = now < __atomic_load_n(&s->ejected_until, __ATOMIC_RELAXED);
    o->outstanding = __atomic_load_n(&s->outstanding, __ATOMIC_RELAXED);
    o->calls = __atomic_load_n(&s->calls, __ATOMIC_RELAXED);
    o->failures = __atomic_load_n(&s->failures, __ATOMIC_RELAXED);
    o->ejections = __atomic_load_n(&s->ejections, __ATOMIC_RELAXED);
}

size_t vrpc_channel_subchannels(const struct vrpc_channel *ch, struct vrpc_subchannel_info *out, size_t cap)
{
    if (!ch || !ch->lb)
        return 0;
    struct vrpc_lb *lb = ch->lb;
    int64_t now = vrpc_now_ns();
    struct lb_set *set = lb_read_begin(lb);
    size_t n = set ? set->n : 0;
    for (size_t i = 0; i < n && i < cap && out; i++)
        sub_info(set->subs[i], &out[i], now);
    lb_read_end(lb);
    return n;
}

struct text {
    char *p;
    size_t len, cap;
    int err;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->err = -EINVAL;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        char *np = realloc(t->p, t->cap * 2 + (size_t)n);
        if (!np) {
            t->err = -ENOMEM;
            return;
        }
        t->p = np;
        t->cap = t->cap * 2 + (size_t)n;
    }
}

static const struct family {
    const char *name, *type, *help;
} fams[] = {
    {"vrpc_client_subchannel_state", "gauge", "connectivity state (0 idle .. 4 shutdown)"},
    {"vrpc_client_subchannel_healthy", "gauge", "1 unless Health.Check said NOT_SERVING"},
    {"vrpc_client_subchannel_ejected", "gauge", "1 while out of rotation after consecutive failures"},
    {"vrpc_client_subchannel_outstanding", "gauge", "attempts in flight"},
    {"vrpc_client_subchannel_calls_total", "counter", "attempts ended"},
    {"vrpc_client_subchannel_failures_total", "counter", "attempts failed (UNAVAILABLE, INTERNAL, UNKNOWN, deadline)"},
    {"vrpc_client_subchannel_ejections_total", "counter", "times ejected"},
};

static uint64_t value(const struct vrpc_subchannel_info *i, size_t f)
{
    switch (f) {
    case 0:
        return (uint64_t)i->state;
    case 1:
        return i->healthy;
    case 2:
        return i->ejected;
    case 3:
        return i->outstanding;
    case 4:
        return i->calls;
    case 5:
        return i->failures;
    default:
        return i->ejections;
    }
}

int vrpc_lb_metrics_text(const struct vrpc_lb *lb, char **out, size_t *len)
{
    size_t n = vrpc_channel_subchannels(lb->parent, NULL, 0);
    struct vrpc_subchannel_info *v = calloc(n ? n : 1, sizeof(*v));
    struct text t = {.p = malloc(1024), .cap = 1024};
    if (!v || !t.p) {
        free(v);
        free(t.p);
        return -ENOMEM;
    }
    size_t now_n = vrpc_channel_subchannels(lb->parent, v, n); /* the set may have changed */
    if (now_n < n)
        n = now_n;
    t.p[0] = 0;
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        put(&t, "# HELP %s %s\n# TYPE %s %s\n", fams[f].name, fams[f].help, fams[f].name, fams[f].type);
        for (size_t i = 0; i < n; i++)
            put(&t, "%s{target=\"%s\",addr=\"%s\"} %llu\n", fams[f].name, lb->target, v[i].uri,
                (unsigned long long)value(&v[i], f));
    }
    free(v);
    if (t.err) {
        free(t.p);
        return t.err;
    }
    *out = t.p;
    *len = t.len;
    return 0;
}

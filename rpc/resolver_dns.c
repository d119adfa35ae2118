/* dns:// targets: every A and AAAA record of a name, looked up with
 * getaddrinfo on the resolver's thread, again every interval_ms and soon
 * after a refresh (after failures; at most once a second), each address
 * becoming "[scheme://]address:port".
 *   dns://name:port[?interval_ms=N]      addresses as bare host:port (auto)
 *   dns://tcp/name:port                  one scheme for every address
 *   dns:///name:port                     gRPC's spelling (empty authority): the same
 * interval_ms: 0 (never periodically) or 100..86400000; default 30000. A
 * failed look-up (or one with no address) keeps the last set and is tried
 * again after 1 s, 2 s, ... up to the interval. getaddrinfo cannot be
 * interrupted: destroy waits for a look-up in progress (the system
 * resolver's timeout, a few seconds at most). */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <verbrpc/transport.h>
#include "common/container_of.h"
#include "common/log_internal.h"
#include "rpc/resolver_internal.h"

#define DNS_DEFAULT_INTERVAL_MS 30000
#define DNS_REFRESH_GAP_MS 1000

static vrpc_dns_lookup_fn g_lookup = getaddrinfo; /* tests replace it */
static vrpc_dns_free_fn g_free = freeaddrinfo;

void vrpc_resolver_dns_set_lookup(vrpc_dns_lookup_fn lookup, vrpc_dns_free_fn release)
{
    g_lookup = lookup ? lookup : getaddrinfo;
    g_free = release ? release : freeaddrinfo;
}

struct dns_resolver {
    struct vrpc_resolver base; /* first: the core's view */
    struct vrpc_rslv_loop loop;
    struct vrpc_rslv_out out;
    char scheme[32];
    char host[256];
    char port[8];
    uint32_t interval_ms;
};

static int dns_opt(void *ctx, const char *key, const char *val)
{
    struct dns_resolver *r = ctx;
    if (strcmp(key, "interval_ms") || vrpc_rslv_parse_u32(val, 0, 86400000, &r->interval_ms))
        return -EINVAL;
    return r->interval_ms && r->interval_ms < 100 ? -EINVAL : 0;
}

/* host and port of "name:port" or "[v6]:port" (already checked). */
static int split_hostport(struct dns_resolver *r, const char *hp)
{
    const char *colon = strrchr(hp, ':');
    const char *h = hp, *he = colon;

    if (*hp == '[') {
        h = hp + 1;
        he = strchr(hp, ']');
    }
    if (!colon || !he || (size_t)(he - h) >= sizeof r->host || strlen(colon + 1) >= sizeof r->port)
        return -EINVAL;
    memcpy(r->host, h, (size_t)(he - h));
    r->host[he - h] = '\0';
    snprintf(r->port, sizeof r->port, "%s", colon + 1);
    return 0;
}

/* Add each address of ai to s; 0, or -ENOMEM/-E2BIG. */
static int add_addrs(struct dns_resolver *r, const struct addrinfo *ai, struct vrpc_uri_set *s)
{
    char ip[INET6_ADDRSTRLEN + 32], uri[VRPC_RESOLVER_MAX_URI];
    const char *sep = *r->scheme ? "://" : "";
    int rc;

    for (; ai; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
            continue;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof ip, NULL, 0, NI_NUMERICHOST))
            continue;
        if (ai->ai_family == AF_INET6)
            snprintf(uri, sizeof uri, "%s%s[%s]:%s", r->scheme, sep, ip, r->port);
        else
            snprintf(uri, sizeof uri, "%s%s%s:%s", r->scheme, sep, ip, r->port);
        if ((rc = vrpc_uri_set_add(s, uri, NULL, 0)) == -ENOMEM || rc == -E2BIG)
            return rc;
    }
    return 0;
}

/* One look-up: 0 (delivered if changed) or a negative errno (last set kept). */
static int dns_round(struct dns_resolver *r, int *last_err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    struct vrpc_uri_set s = {0};
    int rc = g_lookup(r->host, r->port, &hints, &res);

    if (rc) {
        if (rc != *last_err) /* once per kind of failure, not every retry */
            vrpc_rpc_log("resolver: dns '%s': %s; keeping the last set", r->host, gai_strerror(rc));
        *last_err = rc;
        return -EAGAIN;
    }
    rc = add_addrs(r, res, &s);
    g_free(res);
    if (!rc && s.n == 0)
        rc = -ENOENT;
    if (rc) {
        if (rc != *last_err)
            vrpc_rpc_log("resolver: dns '%s': %s; keeping the last set", r->host,
                         rc == -ENOENT ? "no IPv4/IPv6 address" : strerror(-rc));
        *last_err = rc;
        vrpc_uri_set_clear(&s);
        return rc;
    }
    *last_err = 0;
    vrpc_rslv_deliver(&r->out, &s);
    return 0;
}

static void dns_main(void *arg)
{
    struct dns_resolver *r = arg;
    uint64_t backoff_ms = 1000;
    uint64_t wait_ms;
    int last_err = 0;

    do {
        wait_ms = r->interval_ms ? r->interval_ms : UINT64_MAX / 4;
        if (dns_round(r, &last_err)) {
            if (backoff_ms < wait_ms)
                wait_ms = backoff_ms;
            backoff_ms = backoff_ms * 2 > 60000 ? 60000 : backoff_ms * 2;
        } else {
            backoff_ms = 1000;
        }
    } while (!vrpc_rslv_loop_wait(&r->loop, wait_ms));
}

static void dns_destroy(struct vrpc_resolver *base)
{
    struct dns_resolver *r = container_of(base, struct dns_resolver, base);
    vrpc_rslv_loop_stop(&r->loop);
    vrpc_rslv_out_fini(&r->out);
    free(r);
}

/* Check and split the target into r; -EINVAL logged. */
static int dns_parse(struct dns_resolver *r, const char *rest)
{
    char *body = NULL, why[160] = "", uri[VRPC_RESOLVER_MAX_URI];
    const char *hp;
    int rc;

    if ((rc = vrpc_rslv_split_opts("dns", rest, &body, dns_opt, r)))
        return rc;
    hp = vrpc_rslv_prefix_scheme(body[0] == '/' ? body + 1 : body, r->scheme, sizeof r->scheme);
    snprintf(uri, sizeof uri, "%s%s%s", r->scheme, *r->scheme ? "://" : "", hp);
    if ((rc = vrpc_uri_check(uri, why, sizeof why)) || (rc = split_hostport(r, hp))) {
        vrpc_rpc_log("resolver: bad target 'dns://%s': %s", rest, why[0] ? why : "bad host:port");
        rc = -EINVAL;
    }
    free(body);
    return rc;
}

static int dns_create(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    struct dns_resolver *r = calloc(1, sizeof *r);
    int rc;

    if (!r)
        return -ENOMEM;
    r->base.ops = &vrpc_resolver_dns;
    r->interval_ms = DNS_DEFAULT_INTERVAL_MS;
    r->out.fn = fn;
    r->out.arg = arg;
    if ((rc = dns_parse(r, rest)) || (rc = vrpc_rslv_loop_start(&r->loop, dns_main, r, DNS_REFRESH_GAP_MS))) {
        free(r);
        return rc;
    }
    *out = &r->base;
    return 0;
}

static void dns_refresh(struct vrpc_resolver *base)
{
    vrpc_rslv_loop_refresh(&container_of(base, struct dns_resolver, base)->loop);
}

const struct vrpc_resolver_ops vrpc_resolver_dns = {
    .scheme = "dns",
    .create = dns_create,
    .refresh = dns_refresh,
    .destroy = dns_destroy,
};

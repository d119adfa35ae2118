/* Transport URIs: "scheme://host:port" with host an IPv4 literal, a bracketed
 * IPv6 literal or a name (getaddrinfo), parsed into socket addresses, and
 * formatted back for vrpc_listener_uri() and vrpc_ep_peer_uri(). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport_ops.h"

static int parse_port(const char *s, unsigned *port)
{
    char *end;
    unsigned long v;
    if (!*s)
        return -EINVAL;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno || *end || v > 65535 || s[0] == '-' || s[0] == '+')
        return -EINVAL;
    *port = (unsigned)v;
    return 0;
}

/* host (no brackets) + port -> out->ss. */
static int resolve(const char *host, unsigned port, struct vrpc_addr *out)
{
    struct sockaddr_in *in4 = (struct sockaddr_in *)&out->ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&out->ss;
    struct addrinfo hints, *res;

    memset(&out->ss, 0, sizeof out->ss);
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        out->len = sizeof *in4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        out->len = sizeof *in6;
        return 0;
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) || !res)
        return -EHOSTUNREACH;
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    freeaddrinfo(res);
    if (out->ss.ss_family == AF_INET)
        in4->sin_port = htons((uint16_t)port);
    else
        in6->sin6_port = htons((uint16_t)port);
    return 0;
}

int vrpc_addr_parse(const char *uri, struct vrpc_addr *out)
{
    const char *sep = strstr(uri, "://"), *hp, *colon;
    char host[256];
    size_t hlen;
    unsigned port;
    struct vrpc_addr a;
    int rc;

    if (!sep || sep == uri || (size_t)(sep - uri) >= sizeof a.scheme)
        return -EINVAL;
    memset(&a, 0, sizeof a);
    memcpy(a.scheme, uri, (size_t)(sep - uri));
    hp = sep + 3;
    if (*hp == '[') {
        const char *rb = strchr(hp, ']');
        if (!rb || rb[1] != ':')
            return -EINVAL;
        hlen = (size_t)(rb - hp - 1);
        if (!hlen || hlen >= sizeof host)
            return -EINVAL;
        memcpy(host, hp + 1, hlen);
        host[hlen] = 0;
        colon = rb + 1;
        if (!strchr(host, ':'))
            return -EINVAL;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || colon == hp)
            return -EINVAL;
        hlen = (size_t)(colon - hp);
        if (hlen >= sizeof host)
            return -EINVAL;
        memcpy(host, hp, hlen);
        host[hlen] = 0;
        if (strchr(host, ':'))
            return -EINVAL; /* IPv6 needs brackets */
    }
    if ((rc = parse_port(colon + 1, &port)) || (rc = resolve(host, port, &a)))
        return rc;
    *out = a;
    return 0;
}

int vrpc_addr_parse_ip(const char *ip, struct vrpc_addr *out)
{
    char host[64];
    size_t n = strlen(ip);
    struct vrpc_addr a;
    struct in6_addr tmp;

    if (n >= sizeof host)
        return -EINVAL;
    if (n >= 2 && ip[0] == '[' && ip[n - 1] == ']') {
        memcpy(host, ip + 1, n - 2);
        host[n - 2] = 0;
    } else {
        memcpy(host, ip, n + 1);
    }
    if (inet_pton(AF_INET, host, &tmp) != 1 && inet_pton(AF_INET6, host, &tmp) != 1)
        return -EINVAL;
    memset(&a, 0, sizeof a);
    if (resolve(host, 0, &a))
        return -EINVAL;
    *out = a;
    return 0;
}

int vrpc_addr_format(const char *scheme, const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];
    unsigned port;
    int n;

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in4 = (const void *)sa;
        inet_ntop(AF_INET, &in4->sin_addr, host, sizeof host);
        port = ntohs(in4->sin_port);
        n = snprintf(buf, len, "%s://%s:%u", scheme, host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        n = snprintf(buf, len, "%s://[%s]:%u", scheme, host, port);
    } else {
        return -EAFNOSUPPORT;
    }
    return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

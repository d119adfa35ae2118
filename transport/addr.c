/* Transport URIs: "scheme://host:port" with host an IPv4 literal, a bracketed
 * IPv6 literal or a name (getaddrinfo), parsed into socket addresses, and
 * formatted back for vrpc_listener_uri() and vrpc_ep_peer_uri(). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "transport/transport_ops.h"

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
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai || !res) {
        vrpc_tp_log("cannot resolve host '%s': %s", host, gai ? gai_strerror(gai) : "no address");
        return -ENXIO;
    }
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    freeaddrinfo(res);
    if (out->ss.ss_family == AF_INET)
        in4->sin_port = htons((uint16_t)port);
    else
        in6->sin6_port = htons((uint16_t)port);
    return 0;
}

/* A URI's parts, checked for syntax only (nothing resolved). */
struct uri_parts {
    char scheme[16]; /* "" for a bare host:port */
    char host[256];  /* without brackets */
    unsigned port;
};

static int bad(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t len, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static bool host_char(int c) { return isalnum(c) || c == '.' || c == '-' || c == '_'; }

/* The one URI syntax of verbrpc: [scheme://]host:port, scheme [a-z]+ or
 * name+backend ([a-z]+\+[a-z]+), host an IPv4 literal, a name or a
 * bracketed IPv6 literal (an optional %zone), port 0..65535, nothing after. */
static int split_uri(const char *uri, struct uri_parts *p, char *why, size_t wl)
{
    const char *hp = uri, *colon, *q;
    size_t i = 0, hlen;

    memset(p, 0, sizeof *p);
    if (!uri || !*uri)
        return bad(why, wl, "empty URI");
    while (islower((unsigned char)uri[i]))
        i++;
    if (i && uri[i] == '+' && islower((unsigned char)uri[i + 1]))
        for (i++; islower((unsigned char)uri[i]);)
            i++;
    if (i && !strncmp(uri + i, "://", 3)) {
        if (i >= sizeof p->scheme)
            return bad(why, wl, "scheme '%.*s' is too long", (int)i, uri);
        memcpy(p->scheme, uri, i);
        hp = uri + i + 3;
    } else if (i && uri[i] == ':' && !isdigit((unsigned char)uri[i + 1])) {
        return bad(why, wl, "'%.*s:' must be followed by '//' (scheme://host:port)", (int)i, uri);
    } else if (strstr(uri, "://")) {
        return bad(why, wl, "the scheme must be lowercase letters, or name+backend (e.g. tcp://host:port)");
    }
    if (*hp == '[') {
        const char *rb = strchr(hp, ']');
        char a[INET6_ADDRSTRLEN];
        struct in6_addr tmp;
        if (!rb)
            return bad(why, wl, "'[' without ']': an IPv6 host goes in brackets, [::1]:port");
        hlen = (size_t)(rb - hp - 1);
        if (!hlen)
            return bad(why, wl, "empty host '[]'");
        if (hlen >= sizeof p->host)
            return bad(why, wl, "host too long");
        memcpy(p->host, hp + 1, hlen);
        size_t alen = strcspn(p->host, "%"); /* without the zone */
        if (alen >= sizeof a)
            return bad(why, wl, "'%s' is not an IPv6 address", p->host);
        memcpy(a, p->host, alen);
        a[alen] = 0;
        if (inet_pton(AF_INET6, a, &tmp) != 1)
            return bad(why, wl, "'%s' is not an IPv6 address", p->host);
        if (rb[1] != ':')
            return bad(why, wl, rb[1] ? "'%s' after ']': want ':port'" : "no port after ']' (want [host]:port)",
                       rb + 1);
        colon = rb + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon)
            return bad(why, wl, "no port: want host:port");
        hlen = (size_t)(colon - hp);
        if (!hlen)
            return bad(why, wl, "empty host: want host:port");
        if (hlen >= sizeof p->host)
            return bad(why, wl, "host too long");
        memcpy(p->host, hp, hlen);
        if (strchr(p->host, ':'))
            return bad(why, wl, "'%s' has ':' in the host: an IPv6 host goes in brackets, [::1]:port", p->host);
        for (q = p->host; *q; q++)
            if (!host_char((unsigned char)*q))
                return bad(why, wl, "'%s' is not a host name or address (character '%c')", p->host, *q);
    }
    q = colon + 1;
    if (!*q)
        return bad(why, wl, "no port after ':'");
    unsigned long v = 0;
    for (i = 0; isdigit((unsigned char)q[i]); i++)
        if ((v = v * 10 + (unsigned long)(q[i] - '0')) > 65535)
            return bad(why, wl, "port %s is out of range (0-65535)", q);
    if (!i)
        return bad(why, wl, "port '%s' is not a number", q);
    if (q[i])
        return bad(why, wl, "'%s' after the port", q + i);
    p->port = (unsigned)v;
    return 0;
}

int vrpc_uri_check(const char *uri, char *why, size_t why_len)
{
    struct uri_parts p;
    int rc = split_uri(uri, &p, why, why_len);
    if (rc == 0 && why && why_len)
        why[0] = 0;
    return rc;
}

int vrpc_addr_parse(const char *uri, struct vrpc_addr *out)
{
    struct uri_parts p;
    struct vrpc_addr a;
    int rc;

    if ((rc = split_uri(uri, &p, NULL, 0)))
        return rc;
    if (!p.scheme[0] || strlen(p.scheme) >= sizeof a.scheme)
        return -EINVAL;
    memset(&a, 0, sizeof a);
    memcpy(a.scheme, p.scheme, strlen(p.scheme));
    if ((rc = resolve(p.host, p.port, &a)))
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

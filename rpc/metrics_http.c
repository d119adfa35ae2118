/* The server's opt-in metrics endpoint (vrpc_server_opts.metrics_addr):
 * libmicrohttpd serves GET /metrics as Prometheus text from its own thread.
 * Built only when the library is found (VRPC_WITH_METRICS). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <verbrpc/log.h>
#include "rpc/metrics.h"

struct vrpc_metrics_http {
    struct MHD_Daemon *d;
    const struct vrpc_server *s; /* render's argument */
    vrpc_metrics_render_fn render;
    char uri[VRPC_URI_MAX];
};

/* "127.0.0.1:9464", "[::1]:9464", port 0 picks one. Numeric only: it is
 * an address to bind. */
static int parse(const char *a, struct sockaddr_storage *ss)
{
    char host[64];
    const char *colon;
    size_t hl;
    char *end;
    unsigned long port;

    if (a[0] == '[') {
        const char *rb = strchr(a, ']');
        if (!rb || rb[1] != ':')
            return -EINVAL;
        hl = (size_t)(rb - a - 1);
        memcpy(host, a + 1, hl < sizeof host ? hl : 0);
        colon = rb + 1;
    } else {
        colon = strrchr(a, ':');
        if (!colon)
            return -EINVAL;
        hl = (size_t)(colon - a);
        memcpy(host, a, hl < sizeof host ? hl : 0);
    }
    if (hl == 0 || hl >= sizeof host)
        return -EINVAL;
    host[hl] = 0;
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port > 65535)
        return -EINVAL;
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
    } else {
        return -EINVAL;
    }
    return 0;
}

int vrpc_metrics_http_check(const char *addr, char *copy, size_t len)
{
    struct sockaddr_storage ss;
    copy[0] = 0;
    if (!addr)
        return 0;
    if (strlen(addr) >= len || parse(addr, &ss)) {
        vrpc_log(VRPC_LOG_ERROR, "rpc", "server: metrics_addr '%s' is not IP:port (e.g. 127.0.0.1:9464)", addr);
        return -EINVAL;
    }
    memcpy(copy, addr, strlen(addr) + 1);
    return 0;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **con_cls)
{
    struct vrpc_metrics_http *h = cls;
    struct MHD_Response *r;
    enum MHD_Result ret;
    unsigned code = MHD_HTTP_OK;
    char *text = NULL;
    size_t len = 0;

    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        static const char msg[] = "only GET /metrics\n";
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") && strcmp(url, "/")) {
        static const char msg[] = "not found: the metrics are at /metrics\n";
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_NOT_FOUND;
    } else if (h->render(h->s, &text, &len) == 0) {
        r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        if (!r)
            free(text);
        else
            MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    } else {
        static const char msg[] = "out of memory rendering the metrics\n";
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    if (!r)
        return MHD_NO;
    ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

int vrpc_metrics_http_start(const struct vrpc_server *s, const char *addr, vrpc_metrics_render_fn render,
                            struct vrpc_metrics_http **out)
{
    struct sockaddr_storage ss;
    struct vrpc_metrics_http *h;
    const union MHD_DaemonInfo *info;
    char host[INET6_ADDRSTRLEN];
    int rc = parse(addr, &ss);
    if (rc)
        return rc;
    h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    h->s = s;
    h->render = render;
    /* One internal thread polls; a scrape renders on it. Connections are
     * few (a scraper or two), bounded, and time out. */
    h->d =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
                         0, NULL, NULL, answer, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                         MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!h->d) {
        rc = errno ? -errno : -EADDRINUSE;
        vrpc_log(VRPC_LOG_ERROR, "rpc", "server: cannot serve metrics on %s: %s", addr, strerror(-rc));
        free(h);
        return rc;
    }
    info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
    snprintf(h->uri, sizeof h->uri, ss.ss_family == AF_INET ? "http://%s:%u/metrics" : "http://[%s]:%u/metrics", host,
             info ? (unsigned)info->port : 0u);
    *out = h;
    return 0;
}

const char *vrpc_metrics_http_uri(const struct vrpc_metrics_http *h) { return h->uri; }

void vrpc_metrics_http_stop(struct vrpc_metrics_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}

/* etcd v3 JSON-gateway client (rpc/etcd_client.h): HTTP by libcurl, JSON by
 * jansson, every request on one curl multi handle so that a stop from
 * another thread (curl_multi_wakeup) ends it at once. */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/transport.h>
#include "common/log_internal.h"
#include "rpc/etcd_client.h"

#define ETCD_MAX_BODY (16u << 20) /* a larger response or message: -EPROTO */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int vrpc_etcd_client_init(struct vrpc_etcd_client *c, const char *endpoints, char *why, size_t why_len)
{
    char *list = strdup(endpoints), *save = NULL, uri[300];

    *c = (struct vrpc_etcd_client){0};
    if (!list)
        return -ENOMEM;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (c->n_eps == VRPC_ETCD_MAX_ENDPOINTS) {
            snprintf(why, why_len, "more than %d endpoints", VRPC_ETCD_MAX_ENDPOINTS);
            goto bad;
        }
        if (strstr(t, "://") || vrpc_uri_check(t, why, why_len)) {
            if (strstr(t, "://"))
                snprintf(why, why_len, "endpoint '%.64s': want host:port", t);
            goto bad;
        }
        snprintf(uri, sizeof uri, "http://%s", t);
        if (!(c->eps[c->n_eps++] = strdup(uri)))
            goto nomem;
    }
    if (!c->n_eps || endpoints[0] == ',' || endpoints[strlen(endpoints) - 1] == ',' || strstr(endpoints, ",,")) {
        snprintf(why, why_len, "empty endpoint");
        goto bad;
    }
    free(list);
    pthread_once(&curl_once, curl_init_once);
    if (!(c->multi = curl_multi_init())) {
        vrpc_etcd_client_fini(c);
        return -ENOMEM;
    }
    return 0;
bad:
    free(list);
    vrpc_etcd_client_fini(c);
    return -EINVAL;
nomem:
    free(list);
    vrpc_etcd_client_fini(c);
    return -ENOMEM;
}

void vrpc_etcd_client_fini(struct vrpc_etcd_client *c)
{
    for (size_t i = 0; i < c->n_eps; i++)
        free(c->eps[i]);
    if (c->multi)
        curl_multi_cleanup(c->multi);
    *c = (struct vrpc_etcd_client){0};
}

void vrpc_etcd_client_stop(struct vrpc_etcd_client *c)
{
    __atomic_store_n(&c->stop, true, __ATOMIC_RELEASE);
    curl_multi_wakeup(c->multi); /* thread-safe: ends the poll in run() */
}

bool vrpc_etcd_client_stopping(struct vrpc_etcd_client *c) { return __atomic_load_n(&c->stop, __ATOMIC_ACQUIRE); }

void vrpc_etcd_client_resume(struct vrpc_etcd_client *c) { __atomic_store_n(&c->stop, false, __ATOMIC_RELEASE); }

/* One request's receive side: the body so far, and for streams the callback
 * that takes each complete line. */
struct rx {
    char *buf;
    size_t len, cap;
    int (*on_msg)(void *ctx, json_t *msg);
    void *ctx;
    int cb_rc;   /* on_msg's non-zero return */
    bool badmsg; /* a streamed line that is not JSON */
};

/* Hand each complete line of a stream to on_msg; keep the rest. */
static int rx_lines(struct rx *x)
{
    char *nl;
    while ((nl = memchr(x->buf, '\n', x->len))) {
        size_t n = (size_t)(nl - x->buf);
        json_t *m = n ? json_loadb(x->buf, n, 0, NULL) : NULL;
        if (n && !m)
            x->badmsg = true;
        else if (m) {
            x->cb_rc = x->on_msg(x->ctx, m);
            json_decref(m);
        }
        memmove(x->buf, nl + 1, x->len - n - 1);
        x->len -= n + 1;
        if (x->badmsg || x->cb_rc)
            return -1;
    }
    return 0;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct rx *x = arg;
    size_t n = size * nmemb;
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < x->len + n + 1)
            cap *= 2;
        char *nb = cap > ETCD_MAX_BODY ? NULL : realloc(x->buf, cap);
        if (!nb)
            return 0; /* curl: CURLE_WRITE_ERROR */
        x->buf = nb;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, p, n);
    x->len += n;
    if (x->on_msg && rx_lines(x))
        return 0;
    return n;
}

/* Run easy on c's multi handle until done or stopped. CURLcode, or -1 stopped. */
static int run(struct vrpc_etcd_client *c, CURL *easy)
{
    int running = 1, rc = CURLE_OK;
    CURLMsg *m;
    int left;

    curl_multi_add_handle(c->multi, easy);
    while (running && !vrpc_etcd_client_stopping(c)) {
        if (curl_multi_perform(c->multi, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(c->multi, NULL, 0, 1000, NULL);
    }
    if (vrpc_etcd_client_stopping(c))
        rc = -1;
    else
        while ((m = curl_multi_info_read(c->multi, &left)))
            if (m->msg == CURLMSG_DONE && m->easy_handle == easy)
                rc = (int)m->data.result;
    curl_multi_remove_handle(c->multi, easy);
    return rc;
}

/* etcd's error text from a JSON error body ({"error": ..., "message": ...}). */
static void error_text(const char *body, size_t len, long http, char *msg, size_t msg_len)
{
    json_t *j = body ? json_loadb(body, len, 0, NULL) : NULL;
    const char *m = j ? json_string_value(json_object_get(j, "message")) : NULL;
    if (!m && j)
        m = json_string_value(json_object_get(j, "error"));
    snprintf(msg, msg_len, "HTTP %ld%s%s", http, m ? ": " : "", m ? m : "");
    json_decref(j);
}

/* POST req to path on the current endpoint, the body into x. 0 or an errno. */
static int request(struct vrpc_etcd_client *c, const char *path, json_t *req, uint32_t timeout_ms, struct rx *x,
                   char *msg, size_t msg_len)
{
    char url[512], *body = json_dumps(req, JSON_COMPACT);
    struct curl_slist *hdr = NULL;
    CURL *easy = body ? curl_easy_init() : NULL;
    long http = 0;
    int rc;

    if (!easy || !(hdr = curl_slist_append(NULL, "Content-Type: application/json"))) {
        free(body);
        if (easy)
            curl_easy_cleanup(easy);
        return -ENOMEM;
    }
    snprintf(url, sizeof url, "%s%s", c->eps[c->cur], path);
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_NOPROXY, "*"); /* etcd is reached directly, whatever http_proxy says */
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms); /* 0: none (streams) */
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 2L);
    rc = run(c, easy);
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
    if (rc == -1)
        rc = -ECANCELED;
    else if (x->cb_rc)
        rc = x->cb_rc;
    else if (x->badmsg) {
        snprintf(msg, msg_len, "a streamed message is not JSON");
        rc = -EPROTO;
    } else if (rc == CURLE_WRITE_ERROR) {
        snprintf(msg, msg_len, "a response or message larger than %u bytes", ETCD_MAX_BODY);
        rc = -EPROTO;
    } else if (rc == CURLE_OK && http != 200) {
        error_text(x->buf, x->len, http, msg, msg_len);
        rc = -EPROTO;
    } else if (rc != CURLE_OK) {
        snprintf(msg, msg_len, "%s: %s", c->eps[c->cur], curl_easy_strerror((CURLcode)rc));
        rc = rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED;
        c->cur = (c->cur + 1) % c->n_eps; /* the next call tries the next endpoint */
    }
    curl_easy_cleanup(easy);
    curl_slist_free_all(hdr);
    free(body);
    return rc;
}

int vrpc_etcd_call(struct vrpc_etcd_client *c, const char *path, json_t *req, uint32_t timeout_ms, json_t **resp,
                   char *msg, size_t msg_len)
{
    struct rx x = {0};
    json_t *j = NULL;
    int rc = request(c, path, req, timeout_ms, &x, msg, msg_len);

    if (!rc && !(j = x.buf ? json_loadb(x.buf, x.len, 0, NULL) : NULL)) {
        snprintf(msg, msg_len, "the response to %s is not JSON", path);
        rc = -EPROTO;
    }
    free(x.buf);
    if (!rc)
        *resp = j;
    return rc;
}

int vrpc_etcd_stream(struct vrpc_etcd_client *c, const char *path, json_t *req, int (*on_msg)(void *ctx, json_t *msg),
                     void *ctx, char *msg, size_t msg_len)
{
    struct rx x = {.on_msg = on_msg, .ctx = ctx};
    int rc = request(c, path, req, 0, &x, msg, msg_len);
    free(x.buf);
    return rc;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *vrpc_b64_encode(const void *p, size_t n)
{
    const unsigned char *b = p;
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_val(char ch)
{
    const char *p = ch ? strchr(b64, ch) : NULL;
    return p ? (int)(p - b64) : -1;
}

int vrpc_b64_decode(const char *s, char **out, size_t *out_len)
{
    size_t n = strlen(s), k = 0;
    char *o;

    if (n % 4)
        return -EINVAL;
    if (!(o = malloc(n / 4 * 3 + 1)))
        return -ENOMEM;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++)
            v[j] = s[i + j] == '=' && i + 4 == n && j >= 2 ? 0 : b64_val(s[i + j]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || (s[i + 2] == '=' && s[i + 3] != '=')) {
            free(o);
            return -EINVAL;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        o[k++] = (char)(x >> 16);
        if (s[i + 2] != '=')
            o[k++] = (char)(x >> 8 & 0xff);
        if (s[i + 3] != '=')
            o[k++] = (char)(x & 0xff);
    }
    o[k] = '\0';
    *out = o;
    *out_len = k;
    return 0;
}

size_t vrpc_etcd_prefix_end(const char *p, size_t len, char *out)
{
    for (size_t i = len; i-- > 0;) {
        if ((unsigned char)p[i] != 0xff) {
            memcpy(out, p, i);
            out[i] = (char)((unsigned char)p[i] + 1);
            return i + 1;
        }
    }
    out[0] = '\0'; /* every key from p on */
    return 1;
}

int64_t vrpc_etcd_json_i64(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : 0;
}

/* A small client of etcd v3's JSON gateway (grpc-gateway: POST /v3/... with
 * a JSON body, keys and values base64), on libcurl and jansson: unary calls
 * and the watch's stream of newline-separated JSON messages, over one or
 * more endpoints tried in turn. Used by the etcd resolver and by
 * vrpc_etcd_register. Private to rpc/; only built with libcurl and jansson.
 *
 * Threads: one thread makes the calls of one client; vrpc_etcd_client_stop
 * may come from any thread and makes the current and every later call return
 * -ECANCELED at once. */
#ifndef VRPC_RPC_ETCD_CLIENT_H
#define VRPC_RPC_ETCD_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VRPC_ETCD_MAX_ENDPOINTS 16

struct vrpc_etcd_client {
    void *multi;                        /* CURLM: curl_multi_wakeup ends a call at once */
    char *eps[VRPC_ETCD_MAX_ENDPOINTS]; /* "http://host:port" */
    size_t n_eps, cur;                  /* cur: the endpoint in use */
    bool stop;                          /* atomic */
};

/* endpoints "host:port[,host:port...]" (IPv6 in brackets), each checked with
 * vrpc_uri_check. 0, -EINVAL (why says why), -ENOMEM. */
int vrpc_etcd_client_init(struct vrpc_etcd_client *c, const char *endpoints, char *why, size_t why_len);
void vrpc_etcd_client_fini(struct vrpc_etcd_client *c); /* safe on a zeroed or half-built client */
void vrpc_etcd_client_stop(struct vrpc_etcd_client *c);
bool vrpc_etcd_client_stopping(struct vrpc_etcd_client *c);
/* Make calls again after a stop, once no thread is inside a call. */
void vrpc_etcd_client_resume(struct vrpc_etcd_client *c);

/* POST req (borrowed) to path on the current endpoint; *resp (owned by the
 * caller: json_decref) on 0. Errors: -ECANCELED (stopped), -ETIMEDOUT,
 * -ECONNREFUSED (no endpoint answered: the next call tries the next one),
 * -EPROTO (not JSON, or an HTTP error; msg says what etcd said). */
int vrpc_etcd_call(struct vrpc_etcd_client *c, const char *path, json_t *req, uint32_t timeout_ms, json_t **resp,
                   char *msg, size_t msg_len);

/* POST req to path and hand each streamed message to on_msg (borrowed)
 * until the stream ends, the client stops, or on_msg returns non-zero (that
 * value is returned). Returns when the stream ends: 0 if etcd closed it,
 * or an error as vrpc_etcd_call's. No total timeout: TCP keep-alive finds a
 * dead peer. */
int vrpc_etcd_stream(struct vrpc_etcd_client *c, const char *path, json_t *req, int (*on_msg)(void *ctx, json_t *msg),
                     void *ctx, char *msg, size_t msg_len);

/* base64 (RFC 4648, padded) of b[0..n) as a new string (free), NULL on ENOMEM. */
char *vrpc_b64_encode(const void *b, size_t n);
/* Decode s into a new NUL-terminated buffer (*out, free; *out_len without the
 * NUL). 0, -EINVAL (not base64), -ENOMEM. */
int vrpc_b64_decode(const char *s, char **out, size_t *out_len);

/* The end of the key range with prefix p (etcd's "range_end"): p with its
 * last byte below 0xff incremented and what follows cut; "\0" (all keys)
 * if p is empty or all 0xff. Writes at most len bytes into out; returns its
 * length. */
size_t vrpc_etcd_prefix_end(const char *p, size_t len, char *out);

/* An int64 that grpc-gateway spells as a JSON string (or a number). */
int64_t vrpc_etcd_json_i64(json_t *o, const char *key);

#endif

/* kv_stream_cmds: watch (server streaming, synchronous reads) and bulkput
 * (client streaming, writes that block on the stream's window) of
 * kvstore_client. */
#include "kv_stream_cmds.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ex_util.h"
#include "kvstore/kvstore.vrpc.h"

static void print_end(const char *what, const struct vrpc_status *st)
{
    fprintf(stderr, "kvstore_client: %s: %s%s%s\n", what, vrpc_code_name(st->code), st->message[0] ? ": " : "",
            st->message);
}

static void print_value(const ProtobufCBinaryData *v)
{
    bool text = v->len <= 80;

    for (size_t i = 0; i < v->len && text; i++)
        text = isprint(v->data[i]) || v->data[i] == ' ';
    if (text)
        printf("\"%.*s\"", (int)v->len, (const char *)v->data);
    else
        printf("(%zu bytes)", v->len);
}

int kv_cmd_watch(struct vrpc_channel *ch, const char *prefix, unsigned long long count)
{
    Examples__Kvstore__V1__WatchRequest req = EXAMPLES__KVSTORE__V1__WATCH_REQUEST__INIT;
    Examples__Kvstore__V1__WatchEvent *ev;
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;
    unsigned long long seen = 0;
    int rc;

    req.prefix = (char *)prefix;
    rc = examples__kvstore__v1__kv_store__watch__start(ch, &req, NULL, &s);
    if (rc != 0) {
        fprintf(stderr, "kvstore_client: watch: %s\n", strerror(-rc));
        return 1;
    }
    while ((count == 0 || seen < count) && (rc = examples__kvstore__v1__kv_store__watch__read(s, &ev)) == 0) {
        if (ev->created) {
            printf("watching '%s'\n", prefix);
        } else if (ev->kind == EXAMPLES__KVSTORE__V1__WATCH_EVENT__KIND__DELETE) {
            printf("delete %s\n", ev->key);
            seen++;
        } else {
            printf("put %s ", ev->key);
            print_value(&ev->value);
            printf("\n");
            seen++;
        }
        fflush(stdout);
    }
    if (count != 0 && seen == count) {
        vrpc_stream_cancel(s); /* done watching: the server sees CANCELLED */
        vrpc_stream_destroy(s);
        printf("watch: %llu changes\n", seen);
        return 0;
    }
    examples__kvstore__v1__kv_store__watch__finish(s, &st);
    print_end("watch ended", &st);
    vrpc_stream_destroy(s);
    return 1;
}

int kv_cmd_bulkput(struct vrpc_channel *ch, const char *prefix, unsigned long long count, size_t bytes)
{
    Examples__Kvstore__V1__PutRequest req = EXAMPLES__KVSTORE__V1__PUT_REQUEST__INIT;
    Examples__Kvstore__V1__BulkPutReply *reply = NULL;
    size_t klen = strlen(prefix) + 21;
    char *key = malloc(klen);
    uint8_t *value = malloc(bytes ? bytes : 1);
    struct vrpc_stream *s = NULL;
    struct vrpc_status st;
    int64_t t0 = ex_now_ns();
    int rc = 0;

    if (!key || !value) {
        fprintf(stderr, "kvstore_client: bulkput: out of memory\n");
        free(key);
        free(value);
        return 1;
    }
    rc = examples__kvstore__v1__kv_store__bulk_put__start(ch, NULL, &s);
    for (unsigned long long i = 0; rc == 0 && i < count; i++) {
        snprintf(key, klen, "%s%08llu", prefix, i);
        for (size_t j = 0; j < bytes; j++)
            value[j] = (uint8_t)('a' + (i + j) % 26);
        req.key = key;
        req.value.data = value;
        req.value.len = bytes;
        rc = examples__kvstore__v1__kv_store__bulk_put__write(s, &req);
    }
    free(key);
    free(value);
    if (!s) {
        fprintf(stderr, "kvstore_client: bulkput: %s\n", strerror(-rc));
        return 1;
    }
    /* -EPIPE: the stream has ended, finish says why; anything else (a
     * pair above the server's message limit: -EINVAL) is ours to end. */
    if (rc != 0 && rc != -EPIPE) {
        fprintf(stderr, "kvstore_client: bulkput: cannot send a pair: %s\n", strerror(-rc));
        vrpc_stream_cancel(s);
    }
    if (examples__kvstore__v1__kv_store__bulk_put__finish(s, &reply, &st) != VRPC_OK) {
        print_end("bulkput", &st);
        vrpc_stream_destroy(s);
        return 1;
    }
    double secs = (ex_now_ns() - t0) / 1e9;
    printf("bulkput: %llu pairs stored, %llu new, %.0f pairs/s\n", (unsigned long long)reply->stored,
           (unsigned long long)reply->created, secs > 0 ? reply->stored / secs : 0.0);
    vrpc_stream_destroy(s);
    return 0;
}

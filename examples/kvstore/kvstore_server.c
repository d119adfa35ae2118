/* kvstore_server: serves examples.kvstore.v1.KvStore (Put/Get/Delete/Scan on
 * a concurrent in-memory table) plus verbrpc's Health and Stats, until
 * Ctrl-C. Handlers answer at once; they build replies in the call's arena
 * (vrpc_server_call_alloc), so serving allocates only for stored data.
 *   kvstore_server [--listen URI] [--threads N] [--pollers N] [--shards N]
 *                  [--max-msg-size B] [--uri-file PATH] [--metrics IP:PORT]
 *                  [--register ETCD/PREFIX] */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/verbrpc.h>

#include "ex_util.h"
#include "kv_table.h"
#include "kvstore/kvstore.vrpc.h"

#define SCAN_DEFAULT_LIMIT 100
#define SCAN_MAX_LIMIT 1000

struct kv_server {
    struct kv_table *table;
    size_t scan_max_bytes; /* keeps Scan replies under the message size limit */
};

static void *call_alloc(void *call, size_t size) { return vrpc_server_call_alloc(call, size); }

static void put(struct vrpc_server_call *call, const Examples__Kvstore__V1__PutRequest *req, void *user)
{
    struct kv_server *kv = user;
    Examples__Kvstore__V1__PutReply reply = EXAMPLES__KVSTORE__V1__PUT_REPLY__INIT;
    int rc;

    if (!req->key || !req->key[0]) {
        vrpc_server_call_fail(call, VRPC_INVALID_ARGUMENT, "empty key");
        return;
    }
    rc = kv_table_put(kv->table, req->key, req->value.data, req->value.len);
    if (rc < 0) {
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    reply.created = rc == 1;
    examples__kvstore__v1__kv_store__put__respond(call, &reply);
}

static void get(struct vrpc_server_call *call, const Examples__Kvstore__V1__GetRequest *req, void *user)
{
    struct kv_server *kv = user;
    Examples__Kvstore__V1__GetReply reply = EXAMPLES__KVSTORE__V1__GET_REPLY__INIT;
    int rc =
        kv_table_get_copy(kv->table, req->key ? req->key : "", call_alloc, call, &reply.value.data, &reply.value.len);

    if (rc == -ENOENT)
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, "no such key");
    else if (rc != 0)
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "out of memory");
    else
        examples__kvstore__v1__kv_store__get__respond(call, &reply);
}

static void delete_(struct vrpc_server_call *call, const Examples__Kvstore__V1__DeleteRequest *req, void *user)
{
    struct kv_server *kv = user;
    Examples__Kvstore__V1__DeleteReply reply = EXAMPLES__KVSTORE__V1__DELETE_REPLY__INIT;

    reply.existed = kv_table_delete(kv->table, req->key ? req->key : "") == 1;
    examples__kvstore__v1__kv_store__delete__respond(call, &reply);
}

static void scan(struct vrpc_server_call *call, const Examples__Kvstore__V1__ScanRequest *req, void *user)
{
    struct kv_server *kv = user;
    Examples__Kvstore__V1__ScanReply reply = EXAMPLES__KVSTORE__V1__SCAN_REPLY__INIT;
    size_t limit = req->limit ? req->limit : SCAN_DEFAULT_LIMIT;
    Examples__Kvstore__V1__KeyValue *items, **ptrs;
    struct kv_pair *pairs;
    bool more = false;
    long n;

    if (limit > SCAN_MAX_LIMIT)
        limit = SCAN_MAX_LIMIT;
    pairs = vrpc_server_call_alloc(call, limit * sizeof(*pairs));
    items = vrpc_server_call_alloc(call, limit * sizeof(*items));
    ptrs = vrpc_server_call_alloc(call, limit * sizeof(*ptrs));
    if (!pairs || !items || !ptrs)
        goto oom;
    n = kv_table_scan(kv->table, req->start_key, req->end_key, limit, kv->scan_max_bytes, call_alloc, call, pairs,
                      &more);
    if (n < 0)
        goto oom;
    for (long i = 0; i < n; i++) {
        examples__kvstore__v1__key_value__init(&items[i]);
        items[i].key = pairs[i].key;
        items[i].value.data = pairs[i].value;
        items[i].value.len = pairs[i].value_len;
        ptrs[i] = &items[i];
    }
    reply.n_items = (size_t)n;
    reply.items = ptrs;
    reply.more = more;
    examples__kvstore__v1__kv_store__scan__respond(call, &reply);
    return;
oom:
    vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "scan: out of memory (lower the limit)");
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--listen URI] [--threads N] [--pollers N] [--shards N]\n"
            "          [--max-msg-size B] [--uri-file PATH] [--metrics IP:PORT]\n"
            "          [--register HOST:PORT[,HOST:PORT]/PREFIX]\n"
            "  --listen URI       where to listen: tcp://HOST:PORT, verbs://IP:PORT (IP of an RDMA\n"
            "                     device), auto://HOST:PORT or HOST:PORT (default tcp://127.0.0.1:7071;\n"
            "                     port 0 picks a free one)\n"
            "  --threads N        scheduler workers running handlers (default 2)\n"
            "  --pollers N        transport poller threads (default 1)\n"
            "  --shards N         table shards, each with its own lock (default 64)\n"
            "  --max-msg-size B   largest request accepted, and the most a Scan reply holds\n"
            "                     (default 16 MiB; values above the eager size travel by\n"
            "                     rendezvous, RDMA READ on verbs)\n"
            "  --uri-file PATH    write the bound URI to PATH once listening\n"
            "  --metrics IP:PORT  serve Prometheus metrics at http://IP:PORT/metrics (plain HTTP,\n"
            "                     no authentication: use 127.0.0.1 or a private address)\n"
            "  --register E/P     register the bound URI in etcd (client URLs E, key prefix P, e.g.\n"
            "                     127.0.0.1:2379/services/kv/) under a 10 s lease kept alive, removed\n"
            "                     on Ctrl-C; clients connect to etcd://E/P (listen on an address\n"
            "                     they can reach, not 0.0.0.0)\n"
            "Serves examples.kvstore.v1.KvStore plus verbrpc's Health and Stats; Ctrl-C stops it.\n",
            argv0);
}

/* --register "endpoints/prefix": the bound URI into etcd; NULL on failure (logged). */
static struct vrpc_etcd_reg *etcd_register(const char *spec, const char *bound)
{
    const char *slash = strchr(spec, '/');
    struct vrpc_etcd_reg *reg = NULL;
    char eps[256];
    int rc = -EINVAL;

    if (slash && slash > spec && (size_t)(slash - spec) < sizeof(eps)) {
        memcpy(eps, spec, (size_t)(slash - spec));
        eps[slash - spec] = '\0';
        rc = vrpc_etcd_register(eps, slash, bound, 10, &reg);
    }
    if (rc) {
        fprintf(stderr, "kvstore_server: cannot register in etcd (%s): %s\n", spec, strerror(-rc));
        return NULL;
    }
    printf("kvstore_server: registered %s under etcd://%s\n", bound, spec);
    return reg;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"threads", required_argument, NULL, 't'},
        {"pollers", required_argument, NULL, 'p'},
        {"shards", required_argument, NULL, 's'},
        {"max-msg-size", required_argument, NULL, 'm'},
        {"uri-file", required_argument, NULL, 'u'},
        {"metrics", required_argument, NULL, 'M'},
        {"register", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *listen_uri = "tcp://127.0.0.1:7071", *uri_file = NULL, *etcd = NULL;
    struct vrpc_etcd_reg *reg = NULL;
    struct kv_server kv = {.table = NULL};
    Examples__Kvstore__V1__KvStore_VrpcImpl impl = {
        .user = &kv,
        .put = put,
        .get = get,
        .delete_ = delete_,
        .scan = scan,
    };
    struct vrpc_server_opts o;
    struct vrpc_server *s = NULL;
    unsigned long long v, shards = 64;
    char bound[256];
    int c, rc;

    ex_block_signals();
    vrpc_server_opts_init(&o);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'l':
            listen_uri = optarg;
            break;
        case 'u':
            uri_file = optarg;
            break;
        case 'M':
            o.metrics_addr = optarg;
            break;
        case 'r':
            etcd = optarg;
            break;
        case 't':
        case 'p':
        case 's':
        case 'm':
            if (!ex_parse_uint(optarg, &v) || v == 0 || (c != 'm' && v > 4096) || v > (1u << 30)) {
                fprintf(stderr, "%s: bad number '%s'\n", argv[0], optarg);
                return 2;
            }
            if (c == 't')
                o.threads = (unsigned)v;
            else if (c == 'p')
                o.pollers = (unsigned)v;
            else if (c == 's')
                shards = v;
            else
                o.max_msg_size = (uint32_t)v;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    /* Scan replies stay under what a client with default options accepts
     * (and under our own limit), with room for the reply's own framing. */
    kv.scan_max_bytes =
        (o.max_msg_size && o.max_msg_size < VRPC_MSG_SIZE_DEFAULT ? o.max_msg_size : VRPC_MSG_SIZE_DEFAULT) - 1024;

    rc = kv_table_create((unsigned)shards, &kv.table);
    if (rc == 0)
        rc = vrpc_server_create(&o, &s);
    if (rc == 0)
        rc = examples__kvstore__v1__kv_store__vrpc_register(s, &impl);
    if (rc == 0)
        rc = vrpc_server_start(s, listen_uri);
    if (rc == 0)
        rc = vrpc_server_uri(s, bound, sizeof(bound));
    if (rc != 0) {
        fprintf(stderr, "kvstore_server: cannot serve on %s: %s\n", listen_uri, strerror(-rc));
        vrpc_server_destroy(s);
        kv_table_destroy(kv.table);
        return 1;
    }
    printf("kvstore_server: listening on %s\n", bound);
    char murl[256];
    if (o.metrics_addr && vrpc_server_metrics_uri(s, murl, sizeof(murl)) == 0)
        printf("kvstore_server: metrics at %s\n", murl);
    fflush(stdout);
    if (uri_file && (rc = ex_write_file(uri_file, bound)) != 0)
        fprintf(stderr, "kvstore_server: cannot write %s: %s\n", uri_file, strerror(-rc));
    if (etcd && !(reg = etcd_register(etcd, bound))) {
        vrpc_server_destroy(s);
        kv_table_destroy(kv.table);
        return 1;
    }
    fflush(stdout);

    ex_wait_for_signal();
    vrpc_etcd_deregister(reg); /* first: clients stop choosing this server */
    rc = vrpc_server_shutdown(s, 2000);
    printf("kvstore_server: shut down with %zu keys stored%s\n", kv_table_count(kv.table),
           rc == 0 ? "" : " (calls still in flight were dropped)");
    vrpc_server_destroy(s);
    kv_table_destroy(kv.table);
    return 0;
}

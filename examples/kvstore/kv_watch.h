/* kv_watch: the kvstore server's streaming methods. Watch (server streaming)
 * keeps a list of watchers, each a key prefix and its stream; every change
 * made through kv_watch_put/kv_watch_delete is sent to the watchers whose
 * prefix it matches, with asynchronous writes (a Put never waits for a
 * watcher), at most VRPC_STREAM_ASYNC_WRITES_MAX outstanding per watcher: one
 * further behind is ended RESOURCE_EXHAUSTED, so nothing queues without bound.
 * BulkPut (client streaming) stores each pair it reads through kv_watch_put.
 * Any thread may call any function, except kv_watch_init/destroy. */
#ifndef VRPC_EXAMPLES_KV_WATCH_H
#define VRPC_EXAMPLES_KV_WATCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_table.h"
#include "kvstore/kvstore.vrpc.h"

struct kv_watcher;

struct kv_watch {
    struct kv_table *table;
    pthread_mutex_t lock;    /* the list, and changes while anyone watches */
    struct kv_watcher *list; /* open watches */
    unsigned n;              /* atomic: how many; 0 lets changes skip the lock */
    bool closed;             /* kv_watch_end_all ran: new watches are refused */
};

void kv_watch_init(struct kv_watch *w, struct kv_table *t);
/* After the server is destroyed (no stream left). */
void kv_watch_destroy(struct kv_watch *w);

/* kv_table_put / kv_table_delete, then the change to the watchers. Same
 * returns as those. */
int kv_watch_put(struct kv_watch *w, const char *key, const uint8_t *value, size_t len);
int kv_watch_delete(struct kv_watch *w, const char *key);

/* Ends every watch with UNAVAILABLE and refuses new ones (before
 * vrpc_server_shutdown, so that open watches do not hold the drain up). */
void kv_watch_end_all(struct kv_watch *w);

/* Fills the streaming members of impl (Watch, BulkPut). impl->user must
 * point to the struct kv_watch (kvstore_server makes it the first member of
 * its user struct). */
void kv_watch_set_ops(Examples__Kvstore__V1__KvStore_VrpcImpl *impl);

#endif

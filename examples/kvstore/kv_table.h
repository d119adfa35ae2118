/* kv_table: the kvstore example's concurrent in-memory table. A hash table
 * split into shards, each behind its own reader-writer lock, so operations on
 * different shards never wait for each other and readers of one shard share
 * it. Any thread may call any function at any time (except destroy). */
#ifndef VRPC_EXAMPLES_KV_TABLE_H
#define VRPC_EXAMPLES_KV_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_table;

/* One pair as returned by kv_table_get_copy/kv_table_scan: key and value are
 * copies owned by whoever allocated them through the alloc callback. */
struct kv_pair {
    char *key;
    uint8_t *value;
    size_t value_len;
};

/* Allocator for copies handed out (e.g. a server call's arena). */
typedef void *(*kv_alloc_fn)(void *ctx, size_t size);

int kv_table_create(unsigned nshards, struct kv_table **out);
void kv_table_destroy(struct kv_table *t);

/* Copies key and value in. Returns 1 if the key was new, 0 if replaced,
 * -ENOMEM. */
int kv_table_put(struct kv_table *t, const char *key, const uint8_t *value, size_t len);
/* Copies the value out with alloc(ctx, len). 0, -ENOENT, -ENOMEM. */
int kv_table_get_copy(struct kv_table *t, const char *key, kv_alloc_fn alloc, void *ctx, uint8_t **value, size_t *len);
/* 1 if the key existed and was removed, 0 if it was absent. */
int kv_table_delete(struct kv_table *t, const char *key);
/* Up to limit pairs with start <= key < end (end NULL or "": no bound), in
 * bytewise key order, copied out with alloc(ctx, ...) and at most max_bytes of
 * keys and values in total. *more says whether pairs in range were left out.
 * Returns the number of pairs, or -ENOMEM. A scan sees each shard at one
 * moment, not the whole table at one moment. */
long kv_table_scan(struct kv_table *t, const char *start, const char *end, size_t limit, size_t max_bytes,
                   kv_alloc_fn alloc, void *ctx, struct kv_pair *out, bool *more);
size_t kv_table_count(struct kv_table *t);

#endif

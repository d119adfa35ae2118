/* kv_table: sharded hash table with per-shard reader-writer locks (see
 * kv_table.h). Chained buckets; each shard grows on its own. */
#include "kv_table.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kv_entry {
    struct kv_entry *next;
    uint64_t hash;
    uint8_t *value;
    size_t value_len;
    char key[]; /* NUL-terminated */
};

struct kv_shard {
    pthread_rwlock_t lock;
    struct kv_entry **buckets;
    size_t nbuckets; /* power of two */
    size_t count;
} __attribute__((aligned(64))); /* no false sharing between shard locks */

struct kv_table {
    unsigned nshards; /* power of two */
    struct kv_shard *shards;
};

static uint64_t hash_key(const char *k)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */

    for (const unsigned char *p = (const unsigned char *)k; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}

int kv_table_create(unsigned nshards, struct kv_table **out)
{
    struct kv_table *t;
    unsigned n = 1, i;

    while (n < nshards && n < 4096)
        n <<= 1;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->shards = aligned_alloc(64, n * sizeof(*t->shards));
    if (!t->shards)
        goto fail_table;
    memset(t->shards, 0, n * sizeof(*t->shards));
    for (i = 0; i < n; i++) {
        t->shards[i].nbuckets = 64;
        t->shards[i].buckets = calloc(64, sizeof(struct kv_entry *));
        if (!t->shards[i].buckets || pthread_rwlock_init(&t->shards[i].lock, NULL) != 0) {
            free(t->shards[i].buckets);
            goto fail_shards;
        }
    }
    t->nshards = n;
    *out = t;
    return 0;
fail_shards:
    while (i-- > 0) {
        pthread_rwlock_destroy(&t->shards[i].lock);
        free(t->shards[i].buckets);
    }
    free(t->shards);
fail_table:
    free(t);
    return -ENOMEM;
}

void kv_table_destroy(struct kv_table *t)
{
    if (!t)
        return;
    for (unsigned i = 0; i < t->nshards; i++) {
        struct kv_shard *s = &t->shards[i];

        for (size_t b = 0; b < s->nbuckets; b++) {
            struct kv_entry *e = s->buckets[b], *next;
            for (; e; e = next) {
                next = e->next;
                free(e->value);
                free(e);
            }
        }
        free(s->buckets);
        pthread_rwlock_destroy(&s->lock);
    }
    free(t->shards);
    free(t);
}

static struct kv_shard *shard_of(struct kv_table *t, uint64_t h) { return &t->shards[(h >> 48) & (t->nshards - 1)]; }

static struct kv_entry **find_slot(struct kv_shard *s, const char *key, uint64_t h)
{
    struct kv_entry **pp = &s->buckets[h & (s->nbuckets - 1)];

    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && strcmp((*pp)->key, key) == 0)
            break;
    return pp;
}

/* Doubles the bucket array when the load factor passes 1; a failed
 * allocation just leaves chains longer. Caller holds the write lock. */
static void maybe_grow(struct kv_shard *s)
{
    size_t n = s->nbuckets * 2;
    struct kv_entry **nb;

    if (s->count <= s->nbuckets)
        return;
    nb = calloc(n, sizeof(*nb));
    if (!nb)
        return;
    for (size_t b = 0; b < s->nbuckets; b++) {
        struct kv_entry *e = s->buckets[b], *next;
        for (; e; e = next) {
            next = e->next;
            e->next = nb[e->hash & (n - 1)];
            nb[e->hash & (n - 1)] = e;
        }
    }
    free(s->buckets);
    s->buckets = nb;
    s->nbuckets = n;
}

int kv_table_put(struct kv_table *t, const char *key, const uint8_t *value, size_t len)
{
    uint64_t h = hash_key(key);
    struct kv_shard *s = shard_of(t, h);
    uint8_t *copy = malloc(len ? len : 1);
    struct kv_entry **pp, *e;
    int created;

    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, value, len);
    pthread_rwlock_wrlock(&s->lock);
    pp = find_slot(s, key, h);
    if (*pp) {
        free((*pp)->value);
        (*pp)->value = copy;
        (*pp)->value_len = len;
        created = 0;
    } else {
        size_t klen = strlen(key) + 1;

        e = malloc(sizeof(*e) + klen);
        if (!e) {
            pthread_rwlock_unlock(&s->lock);
            free(copy);
            return -ENOMEM;
        }
        memcpy(e->key, key, klen);
        e->hash = h;
        e->value = copy;
        e->value_len = len;
        e->next = NULL;
        *pp = e;
        s->count++;
        maybe_grow(s);
        created = 1;
    }
    pthread_rwlock_unlock(&s->lock);
    return created;
}

int kv_table_get_copy(struct kv_table *t, const char *key, kv_alloc_fn alloc, void *ctx, uint8_t **value, size_t *len)
{
    uint64_t h = hash_key(key);
    struct kv_shard *s = shard_of(t, h);
    struct kv_entry *e;
    int rc = 0;

    pthread_rwlock_rdlock(&s->lock);
    e = *find_slot(s, key, h);
    if (!e) {
        rc = -ENOENT;
    } else {
        uint8_t *copy = alloc(ctx, e->value_len ? e->value_len : 1);

        if (!copy) {
            rc = -ENOMEM;
        } else {
            memcpy(copy, e->value, e->value_len);
            *value = copy;
            *len = e->value_len;
        }
    }
    pthread_rwlock_unlock(&s->lock);
    return rc;
}

int kv_table_delete(struct kv_table *t, const char *key)
{
    uint64_t h = hash_key(key);
    struct kv_shard *s = shard_of(t, h);
    struct kv_entry **pp, *e;

    pthread_rwlock_wrlock(&s->lock);
    pp = find_slot(s, key, h);
    e = *pp;
    if (e) {
        *pp = e->next;
        s->count--;
    }
    pthread_rwlock_unlock(&s->lock);
    if (!e)
        return 0;
    free(e->value);
    free(e);
    return 1;
}

size_t kv_table_count(struct kv_table *t)
{
    size_t n = 0;

    for (unsigned i = 0; i < t->nshards; i++) {
        pthread_rwlock_rdlock(&t->shards[i].lock);
        n += t->shards[i].count;
        pthread_rwlock_unlock(&t->shards[i].lock);
    }
    return n;
}

static bool in_range(const char *k, const char *start, const char *end)
{
    return strcmp(k, start) >= 0 && (!end || !*end || strcmp(k, end) < 0);
}

static int cmp_entries(const void *a, const void *b)
{
    return strcmp((*(struct kv_entry *const *)a)->key, (*(struct kv_entry *const *)b)->key);
}

/* Index of the largest key among sel[0..n), n > 0. */
static size_t largest(struct kv_entry *const *sel, size_t n)
{
    size_t m = 0;

    for (size_t i = 1; i < n; i++)
        if (strcmp(sel[i]->key, sel[m]->key) > 0)
            m = i;
    return m;
}

/* Read-locks every shard (in shard order; writers take one shard at a time,
 * so this cannot deadlock), keeps the `limit` smallest keys in range by
 * pointer, sorts and copies them out, unlocks. The scan thus sees one moment
 * of the whole table; it costs O(table size): this is an example, not an
 * ordered index. */
long kv_table_scan(struct kv_table *t, const char *start, const char *end, size_t limit, size_t max_bytes,
                   kv_alloc_fn alloc, void *ctx, struct kv_pair *out, bool *more)
{
    struct kv_entry **sel = malloc((limit ? limit : 1) * sizeof(*sel));
    size_t n = 0, bytes = 0, i;
    long rc;

    if (!sel)
        return -ENOMEM;
    if (!start)
        start = "";
    *more = false;
    for (i = 0; i < t->nshards; i++)
        pthread_rwlock_rdlock(&t->shards[i].lock);
    for (i = 0; i < t->nshards; i++) {
        struct kv_shard *s = &t->shards[i];

        for (size_t b = 0; b < s->nbuckets; b++) {
            for (struct kv_entry *e = s->buckets[b]; e; e = e->next) {
                size_t m;

                if (!in_range(e->key, start, end))
                    continue;
                if (n < limit) {
                    sel[n++] = e;
                    continue;
                }
                *more = true;
                if (limit && strcmp(e->key, sel[m = largest(sel, n)]->key) < 0)
                    sel[m] = e;
            }
        }
    }
    qsort(sel, n, sizeof(*sel), cmp_entries);
    rc = (long)n;
    for (i = 0; i < n; i++) {
        size_t klen = strlen(sel[i]->key) + 1;

        /* Stop at the byte budget, so the reply fits the message size limit. */
        bytes += klen + sel[i]->value_len + 16;
        if (bytes > max_bytes) {
            rc = (long)i;
            *more = true;
            break;
        }
        out[i].key = alloc(ctx, klen);
        out[i].value = alloc(ctx, sel[i]->value_len ? sel[i]->value_len : 1);
        if (!out[i].key || !out[i].value) {
            rc = -ENOMEM;
            break;
        }
        memcpy(out[i].key, sel[i]->key, klen);
        memcpy(out[i].value, sel[i]->value, sel[i]->value_len);
        out[i].value_len = sel[i]->value_len;
    }
    for (i = t->nshards; i-- > 0;)
        pthread_rwlock_unlock(&t->shards[i].lock);
    free(sel);
    return rc;
}

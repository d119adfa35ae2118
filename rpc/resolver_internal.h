/* What the resolvers (rpc/resolver_*.c) share: a set of URIs with the
 * delivery that reports only changes, a thread that sleeps until its period
 * ends or someone asks for a refresh, the "[scheme/]" prefix and "?k=v"
 * options of a target, and the test hooks. Private to rpc/. */
#ifndef VRPC_RPC_RESOLVER_INTERNAL_H
#define VRPC_RPC_RESOLVER_INTERNAL_H

#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "rpc/resolver.h"

#define VRPC_RESOLVER_MAX_ADDRS 4096 /* more URIs in one set: -E2BIG */
#define VRPC_RESOLVER_MAX_URI 512    /* longer URI: -EINVAL */

/* A set of distinct URIs in the order first added. Owns its strings. */
struct vrpc_uri_set {
    char **v;
    size_t n, cap;
};

/* Check uri with vrpc_uri_check and add a copy unless already there. 0,
 * -EINVAL (why holds the reason), -E2BIG, -ENOMEM. */
int vrpc_uri_set_add(struct vrpc_uri_set *s, const char *uri, char *why, size_t why_len);
void vrpc_uri_set_clear(struct vrpc_uri_set *s);
bool vrpc_uri_set_equal(const struct vrpc_uri_set *a, const struct vrpc_uri_set *b);

/* Delivery: remembers the last set handed to fn and calls fn only when the
 * new one differs (in order-insensitive content) or nothing was delivered yet.
 * Takes over next's strings (next is left empty). Called from one thread at a
 * time for one deliverer. */
struct vrpc_rslv_out {
    vrpc_resolver_update_fn fn;
    void *arg;
    struct vrpc_uri_set last;
    bool delivered;
};
void vrpc_rslv_deliver(struct vrpc_rslv_out *o, struct vrpc_uri_set *next);
void vrpc_rslv_out_fini(struct vrpc_rslv_out *o);

/* A resolver's own thread. vrpc_rslv_loop_start runs body(arg) on a new
 * thread; body calls vrpc_rslv_loop_wait between rounds; stop makes every
 * wait return true at once and joins. refresh makes the current or next wait
 * return false early, but not sooner than min_gap_ms after the last early
 * return (deferred, not lost), so that a storm of failures does not turn into
 * a storm of look-ups. refresh and stop: any thread. */
struct vrpc_rslv_loop {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    pthread_t th;
    bool started, stop, kick;
    int efd; /* eventfd: refresh and stop wake vrpc_rslv_loop_wait_fd's poll */
    int64_t last_kick_ns, min_gap_ns;
    void (*body)(void *arg);
    void *arg;
};
int vrpc_rslv_loop_start(struct vrpc_rslv_loop *l, void (*body)(void *), void *arg, uint32_t min_gap_ms);
/* true: stop now; false: the period ended or a refresh came. */
bool vrpc_rslv_loop_wait(struct vrpc_rslv_loop *l, uint64_t timeout_ms);
/* The same, but also returns (false, *ready true) as soon as fd is readable
 * (the caller drains it). Loop thread only. */
bool vrpc_rslv_loop_wait_fd(struct vrpc_rslv_loop *l, int fd, uint64_t timeout_ms, bool *ready);
bool vrpc_rslv_loop_stopping(struct vrpc_rslv_loop *l);
void vrpc_rslv_loop_refresh(struct vrpc_rslv_loop *l);
void vrpc_rslv_loop_stop(struct vrpc_rslv_loop *l); /* safe if never started */

/* A target's optional leading "scheme/" (e.g. "tcp/h:p,..."): a scheme of
 * [a-z] and '+' followed by one '/' that is not "://". Writes the scheme
 * (NUL-terminated, empty if none) and returns the rest after the '/'. */
const char *vrpc_rslv_prefix_scheme(const char *rest, char *scheme, size_t cap);

/* Split rest = "body?k=v&k=v": copies body into a new string *body_out (free
 * it) and calls opt for each option; -EINVAL (logged with scheme://rest) for
 * an option without '=', or whatever opt returns that is not 0 (logged). */
int vrpc_rslv_split_opts(const char *scheme, const char *rest, char **body_out,
                         int (*opt)(void *ctx, const char *key, const char *val), void *ctx);
/* The file:// format: one URI per line of text[0..len) ('#' to the end of
 * the line a comment, spaces and a trailing CR ignored, blank lines
 * skipped), added to s. 0, or -EINVAL/-E2BIG/-ENOMEM with why saying
 * which line and why (rpc/resolver_file.c). */
int vrpc_rslv_parse_lines(const char *text, size_t len, struct vrpc_uri_set *s, char *why, size_t why_len);

/* A whole decimal in lo..hi, or -EINVAL. */
int vrpc_rslv_parse_u32(const char *val, uint32_t lo, uint32_t hi, uint32_t *out);

/* Tests only: the DNS resolver's look-up (getaddrinfo's shape; NULL restores
 * getaddrinfo/freeaddrinfo). Set while no dns resolver exists. */
typedef int (*vrpc_dns_lookup_fn)(const char *node, const char *service, const struct addrinfo *hints,
                                  struct addrinfo **res);
typedef void (*vrpc_dns_free_fn)(struct addrinfo *res);
void vrpc_resolver_dns_set_lookup(vrpc_dns_lookup_fn lookup, vrpc_dns_free_fn release);

#endif

/* The resolver core (rpc/resolver.c, rpc/resolver_util.c) and the list://
 * resolver: which targets are resolver targets, the sets list:// yields and
 * the malformed ones it refuses with -EINVAL, change-only delivery, the
 * resolver thread's refresh and stop. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/clock.h"
#include "rpc/resolver.h"
#include "rpc/resolver_internal.h"

/* What the update callback saw: the last set and how many updates came. */
struct seen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int updates;
    size_t n;
    char uris[64][VRPC_RESOLVER_MAX_URI];
};

static void seen_init(struct seen *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

static void on_update(void *arg, const char *const *uris, size_t n)
{
    struct seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->updates++;
    s->n = n < 64 ? n : 64;
    for (size_t i = 0; i < s->n; i++)
        snprintf(s->uris[i], sizeof s->uris[i], "%s", uris[i]);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Whether the last set is exactly want (in any order), "a,b,c" ("" for none). */
static bool seen_is_locked(struct seen *s, const char *want)
{
    char buf[1024];
    size_t k = 0;
    snprintf(buf, sizeof buf, "%s", want);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
        bool found = false;
        for (size_t i = 0; i < s->n; i++)
            found |= !strcmp(s->uris[i], t);
        if (!found)
            return false;
    }
    return k == s->n && s->updates > 0;
}

/* Wait (at most timeout_ms) until the last set is want. */
__attribute__((unused)) static bool seen_wait(struct seen *s, const char *want, int timeout_ms)
{
    int64_t end = vrpc_clock_mono_ns() + (int64_t)timeout_ms * 1000000;
    bool ok;
    pthread_mutex_lock(&s->mu);
    while (!(ok = seen_is_locked(s, want)) && vrpc_clock_mono_ns() < end) {
        pthread_mutex_unlock(&s->mu);
        usleep(10000);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static void t_is_target(void **state)
{
    (void)state;
    assert_true(vrpc_resolver_is_target("list://a:1"));
    assert_false(vrpc_resolver_is_target("tcp://a:1"));
    assert_false(vrpc_resolver_is_target("a:1"));
    assert_false(vrpc_resolver_is_target("list:a:1"));
    assert_false(vrpc_resolver_is_target("lists://a:1"));
    assert_false(vrpc_resolver_is_target(NULL));
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    assert_int_equal(vrpc_resolver_create("tcp://127.0.0.1:1", on_update, &s, &r), -EINVAL);
    assert_null(r);
    vrpc_resolver_destroy(NULL);
    vrpc_resolver_refresh(NULL);
}

/* target resolves (inside create) to exactly want. */
static void expect_list(const char *target, const char *want)
{
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    assert_non_null(r);
    assert_int_equal(s.updates, 1);
    if (!seen_is_locked(&s, want))
        fail_msg("%s: got %zu entries, first '%s'; want %s", target, s.n, s.n ? s.uris[0] : "", want);
    vrpc_resolver_refresh(r); /* no-op for a static list */
    vrpc_resolver_destroy(r);
    assert_int_equal(s.updates, 1);
}

static void t_list_good(void **state)
{
    (void)state;
    expect_list("list://127.0.0.1:5000", "127.0.0.1:5000");
    expect_list("list://h1:1,h2:2", "h1:1,h2:2");
    expect_list("list://tcp://h1:1,verbs://10.0.0.2:2,auto://h3:3", "tcp://h1:1,verbs://10.0.0.2:2,auto://h3:3");
    expect_list("list://tcp/h1:1,h2:2", "tcp://h1:1,tcp://h2:2");
    expect_list("list://verbs/h1:1,tcp://h2:2", "verbs://h1:1,tcp://h2:2"); /* an entry's own scheme wins */
    expect_list("list://fault+tcp/h1:1", "fault+tcp://h1:1");
    expect_list("list://[::1]:5000,[fe80::1%eth0]:6", "[::1]:5000,[fe80::1%eth0]:6");
    expect_list("list://tcp/[::1]:5000", "tcp://[::1]:5000");
    expect_list("list:// h1:1 , h2:2 ", "h1:1,h2:2");
    expect_list("list://h1:1,h1:1,h2:2", "h1:1,h2:2"); /* duplicates once */
}

static void expect_bad(const char *target)
{
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    if (vrpc_resolver_create(target, on_update, &s, &r) != -EINVAL)
        fail_msg("'%s' was not refused with -EINVAL", target);
    assert_null(r);
    assert_int_equal(s.updates, 0);
}

static void t_list_bad(void **state)
{
    (void)state;
    expect_bad("list://");
    expect_bad("list://tcp/");
    expect_bad("list://h1:1,");
    expect_bad("list://,h1:1");
    expect_bad("list://h1:1,,h2:2");
    expect_bad("list://h1");
    expect_bad("list://h1:99999");
    expect_bad("list://h1:1x");
    expect_bad("list://::1:5000");   /* IPv6 without brackets */
    expect_bad("list://[::1:5000");  /* unclosed bracket */
    expect_bad("list://TCP://h1:1"); /* scheme must be lower case */
    expect_bad("list://h1:1/path");  /* nothing after the port */
    expect_bad("list://tcp//h1:1");  /* empty host after the scheme prefix */
}

static void t_list_too_many(void **state)
{
    (void)state;
    size_t cap = (size_t)(VRPC_RESOLVER_MAX_ADDRS + 1) * 20 + 16;
    char *t = malloc(cap);
    size_t off = (size_t)snprintf(t, cap, "list://tcp/");
    for (int i = 0; i <= VRPC_RESOLVER_MAX_ADDRS; i++)
        off += (size_t)snprintf(t + off, cap - off, "%sh%d:%d", i ? "," : "", i, i % 60000);
    expect_bad(t);
    free(t);
}

static void t_deliver_changes_only(void **state)
{
    (void)state;
    struct seen s;
    struct vrpc_rslv_out o = {0};
    struct vrpc_uri_set set = {0};
    seen_init(&s);
    o.fn = on_update;
    o.arg = &s;

    vrpc_rslv_deliver(&o, &set); /* the first, empty set is delivered */
    assert_int_equal(s.updates, 1);
    assert_int_equal(s.n, 0);
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://a:1", NULL, 0), 0);
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://b:2", NULL, 0), 0);
    vrpc_rslv_deliver(&o, &set);
    assert_int_equal(s.updates, 2);
    assert_int_equal(set.n, 0);
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://b:2", NULL, 0), 0); /* same set, other order */
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://a:1", NULL, 0), 0);
    vrpc_rslv_deliver(&o, &set);
    assert_int_equal(s.updates, 2);
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://a:1", NULL, 0), 0);
    vrpc_rslv_deliver(&o, &set);
    assert_int_equal(s.updates, 3);
    assert_true(seen_is_locked(&s, "tcp://a:1"));
    char why[64] = "";
    assert_int_equal(vrpc_uri_set_add(&set, "tcp://a", why, sizeof why), -EINVAL);
    assert_true(why[0] != '\0');
    vrpc_uri_set_clear(&set);
    vrpc_rslv_out_fini(&o);
}

struct loop_ctx {
    struct vrpc_rslv_loop loop;
    int rounds; /* atomic */
};

static void loop_body(void *arg)
{
    struct loop_ctx *c = arg;
    do
        __atomic_fetch_add(&c->rounds, 1, __ATOMIC_RELAXED);
    while (!vrpc_rslv_loop_wait(&c->loop, 60000));
}

static void t_loop_refresh_and_stop(void **state)
{
    (void)state;
    struct loop_ctx c = {0};
    int64_t t0;
    assert_int_equal(vrpc_rslv_loop_start(&c.loop, loop_body, &c, 0), 0);
    for (int i = 0; i < 500 && __atomic_load_n(&c.rounds, __ATOMIC_RELAXED) < 1; i++)
        usleep(10000);
    vrpc_rslv_loop_refresh(&c.loop); /* ends the 60 s wait */
    for (int i = 0; i < 500 && __atomic_load_n(&c.rounds, __ATOMIC_RELAXED) < 2; i++)
        usleep(10000);
    assert_true(__atomic_load_n(&c.rounds, __ATOMIC_RELAXED) >= 2);
    t0 = vrpc_clock_mono_ns();
    vrpc_rslv_loop_stop(&c.loop); /* ends the next 60 s wait at once */
    assert_true(vrpc_clock_mono_ns() - t0 < 30LL * 1000000000);
    vrpc_rslv_loop_stop(&c.loop); /* twice: no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_is_target),
        cmocka_unit_test(t_list_good),
        cmocka_unit_test(t_list_bad),
        cmocka_unit_test(t_list_too_many),
        cmocka_unit_test(t_deliver_changes_only),
        cmocka_unit_test(t_loop_refresh_and_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The resolver core (rpc/resolver.c, rpc/resolver_util.c) and the list://,
 * dns:// and file:// resolvers: which targets are resolver targets, the sets
 * they yield and the malformed ones refused with -EINVAL, change-only
 * delivery, the resolver thread's refresh and stop; DNS through a replaced
 * look-up (and a real one of "localhost"), files in a temporary directory. */
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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <verbrpc/discovery.h>
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
static bool seen_wait(struct seen *s, const char *want, int timeout_ms)
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
    assert_true(vrpc_resolver_is_target("dns://a:1"));
    assert_true(vrpc_resolver_is_target("file:///a"));
    assert_true(vrpc_resolver_is_target("etcd://a:1/p/"));
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

/* A build without libcurl/jansson names what it lacks. */
static void t_etcd_not_built(void **state)
{
    (void)state;
#ifdef VRPC_TEST_HAVE_ETCD
    skip(); /* built with etcd: tests/resolver/test_etcd covers it */
#else
    struct vrpc_resolver *r = NULL;
    struct vrpc_etcd_reg *g = NULL;
    struct seen s;
    seen_init(&s);
    assert_int_equal(vrpc_resolver_create("etcd://127.0.0.1:2379/svc/", on_update, &s, &r), -ENOTSUP);
    assert_null(r);
    assert_int_equal(vrpc_etcd_register("127.0.0.1:2379", "/svc/", "tcp://127.0.0.1:1", 5, &g), -ENOTSUP);
    assert_null(g);
#endif
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

/* ---- dns:// through a fake look-up ---- */

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static char fake_addrs[256]; /* "a,b,c" or "!" (the look-up fails: EAI_AGAIN) */
static int fake_calls;

static void fake_set(const char *addrs)
{
    pthread_mutex_lock(&fake_mu);
    snprintf(fake_addrs, sizeof fake_addrs, "%s", addrs);
    pthread_mutex_unlock(&fake_mu);
}

static void fake_free(struct addrinfo *res)
{
    while (res) {
        struct addrinfo *next = res->ai_next;
        free(res->ai_addr);
        free(res);
        res = next;
    }
}

/* One addrinfo for the IP literal ip and port. */
static struct addrinfo *fake_one(const char *ip, int port)
{
    struct addrinfo *ai = calloc(1, sizeof *ai);
    struct sockaddr_in6 *a6 = calloc(1, sizeof *a6); /* big enough for either */
    struct sockaddr_in *a4 = (struct sockaddr_in *)a6;
    ai->ai_addr = (struct sockaddr *)a6;
    ai->ai_socktype = SOCK_STREAM;
    if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        ai->ai_family = AF_INET;
        ai->ai_addrlen = sizeof *a4;
    } else {
        assert_int_equal(inet_pton(AF_INET6, ip, &a6->sin6_addr), 1);
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        ai->ai_family = AF_INET6;
        ai->ai_addrlen = sizeof *a6;
    }
    return ai;
}

static int fake_lookup(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
    char buf[256];
    struct addrinfo *head = NULL, **tail = &head;
    (void)hints;
    assert_string_equal(node, "svc.example");
    pthread_mutex_lock(&fake_mu);
    fake_calls++;
    snprintf(buf, sizeof buf, "%s", fake_addrs);
    pthread_mutex_unlock(&fake_mu);
    if (!strcmp(buf, "!"))
        return EAI_AGAIN;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        *tail = fake_one(t, atoi(service));
        tail = &(*tail)->ai_next;
    }
    *res = head;
    return head ? 0 : EAI_NONAME;
}

static int fake_calls_now(void)
{
    pthread_mutex_lock(&fake_mu);
    int n = fake_calls;
    pthread_mutex_unlock(&fake_mu);
    return n;
}

static int seen_updates(struct seen *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->updates;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void t_dns_bad(void **state)
{
    (void)state;
    expect_bad("dns://");
    expect_bad("dns://svc.example");
    expect_bad("dns://svc.example:99999");
    expect_bad("dns://svc.example:1?interval_ms=5");
    expect_bad("dns://svc.example:1?interval_ms");
    expect_bad("dns://svc.example:1?interval_ms=1x");
    expect_bad("dns://svc.example:1?colour=red");
    expect_bad("dns://tcp/");
    expect_bad("dns:////svc.example:1");
}

static void t_dns_fake_periodic(void **state)
{
    (void)state;
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    fake_set("10.0.0.1,10.0.0.2,fd00::1,10.0.0.1");
    vrpc_resolver_dns_set_lookup(fake_lookup, fake_free);
    assert_int_equal(vrpc_resolver_create("dns://tcp/svc.example:5000?interval_ms=100", on_update, &s, &r), 0);
    assert_true(seen_wait(&s, "tcp://10.0.0.1:5000,tcp://10.0.0.2:5000,tcp://[fd00::1]:5000", 10000));
    int before = fake_calls_now();
    fake_set("10.0.0.3");
    assert_true(seen_wait(&s, "tcp://10.0.0.3:5000", 10000)); /* the next period's look-up */
    assert_true(fake_calls_now() > before);

    /* failures keep the last set; the look-up is tried again */
    int updates = seen_updates(&s);
    fake_set("!");
    before = fake_calls_now();
    usleep(1500 * 1000);
    assert_true(fake_calls_now() > before);
    fake_set(""); /* no address at all: also kept */
    usleep(1500 * 1000);
    assert_int_equal(seen_updates(&s), updates);
    assert_true(seen_wait(&s, "tcp://10.0.0.3:5000", 0));
    fake_set("10.0.0.4");
    assert_true(seen_wait(&s, "tcp://10.0.0.4:5000", 10000)); /* within the back-off */
    vrpc_resolver_destroy(r);
    vrpc_resolver_dns_set_lookup(NULL, NULL);
}

static void t_dns_refresh(void **state)
{
    (void)state;
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    fake_set("10.0.0.1");
    vrpc_resolver_dns_set_lookup(fake_lookup, fake_free);
    assert_int_equal(vrpc_resolver_create("dns:///svc.example:6000?interval_ms=0", on_update, &s, &r), 0);
    assert_true(seen_wait(&s, "10.0.0.1:6000", 10000));
    fake_set("10.0.0.2,10.0.0.1");
    usleep(300 * 1000); /* no period: nothing looks again by itself */
    assert_true(seen_wait(&s, "10.0.0.1:6000", 0));
    vrpc_resolver_refresh(r);
    assert_true(seen_wait(&s, "10.0.0.1:6000,10.0.0.2:6000", 10000));
    fake_set("10.0.0.2");
    vrpc_resolver_refresh(r); /* within a second of the last: deferred, not lost */
    assert_true(seen_wait(&s, "10.0.0.2:6000", 10000));
    vrpc_resolver_destroy(r);
    vrpc_resolver_dns_set_lookup(NULL, NULL);
}

/* A real getaddrinfo of "localhost": 127.0.0.1 and/or ::1. */
static void t_dns_localhost(void **state)
{
    (void)state;
    struct vrpc_resolver *r = NULL;
    struct seen s;
    bool ok = false;
    seen_init(&s);
    assert_int_equal(vrpc_resolver_create("dns://tcp/localhost:7000", on_update, &s, &r), 0);
    for (int i = 0; i < 1000 && !ok; i++) {
        pthread_mutex_lock(&s.mu);
        for (size_t k = 0; k < s.n; k++)
            ok |= !strcmp(s.uris[k], "tcp://127.0.0.1:7000") || !strcmp(s.uris[k], "tcp://[::1]:7000");
        pthread_mutex_unlock(&s.mu);
        if (!ok)
            usleep(10000);
    }
    vrpc_resolver_destroy(r);
    assert_true(ok);
}

/* ---- file:// in a temporary directory ---- */

static char g_dir[64];

/* Replace path's content by rename (what the guide recommends). */
static void write_file(const char *path, const char *text)
{
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, path), 0);
}

static void make_dir(void)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/vrpc-resolver-XXXXXX");
        assert_non_null(mkdtemp(g_dir));
    }
}

static void t_file_bad(void **state)
{
    (void)state;
    expect_bad("file://");
    expect_bad("file:///");
    expect_bad("file://relative/path");
    expect_bad("file:///x?poll_ms=1");
    expect_bad("file:///x?interval_ms=100");
}

/* The file format itself (vrpc_rslv_parse_lines). */
static void t_file_lines(void **state)
{
    (void)state;
    struct vrpc_uri_set set = {0};
    char why[160], big[VRPC_RESOLVER_MAX_URI + 40];
    const char ok[] = "#c\r\n  tcp://a:1\t# x\r\n\n\t\nb:2"; /* CRLF, tabs, no final newline */
    assert_int_equal(vrpc_rslv_parse_lines(ok, sizeof ok - 1, &set, why, sizeof why), 0);
    assert_int_equal(set.n, 2);
    assert_string_equal(set.v[0], "tcp://a:1");
    assert_string_equal(set.v[1], "b:2");
    vrpc_uri_set_clear(&set);
    assert_int_equal(vrpc_rslv_parse_lines("", 0, &set, why, sizeof why), 0);
    assert_int_equal(set.n, 0);

    const char nul[] = "a:1\nb:\0002\n";
    assert_int_equal(vrpc_rslv_parse_lines(nul, sizeof nul - 1, &set, why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "line 2"));
    vrpc_uri_set_clear(&set);
    memset(big, 'a', sizeof big - 3);
    memcpy(big + sizeof big - 3, ":1", 3);
    assert_int_equal(vrpc_rslv_parse_lines(big, strlen(big), &set, why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "longer"));
    vrpc_uri_set_clear(&set);
    assert_int_equal(vrpc_rslv_parse_lines("a:1\nb c:2\n", 11, &set, why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "line 2"));
    vrpc_uri_set_clear(&set);
}

static void t_file_follows(void **state)
{
    (void)state;
    char path[128], target[192];
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    make_dir();
    snprintf(path, sizeof path, "%s/servers", g_dir);
    snprintf(target, sizeof target, "file://%s?poll_ms=20", path);
    write_file(path, "# kv servers\ntcp://10.0.0.1:5000\n\n  verbs://[fd00::2]:7000   # the RDMA one\r\n10.0.0.3:1\n");
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    assert_true(seen_wait(&s, "tcp://10.0.0.1:5000,verbs://[fd00::2]:7000,10.0.0.3:1", 10000));

    write_file(path, "tcp://10.0.0.1:5000\ntcp://10.0.0.4:5000\n");
    assert_true(seen_wait(&s, "tcp://10.0.0.1:5000,tcp://10.0.0.4:5000", 10000));

    int updates = seen_updates(&s);
    write_file(path, "tcp://10.0.0.1:5000\nnot a uri\n"); /* malformed: the last set stays */
    usleep(300 * 1000);
    assert_int_equal(unlink(path), 0); /* gone: the last set stays */
    usleep(300 * 1000);
    assert_int_equal(seen_updates(&s), updates);
    assert_true(seen_wait(&s, "tcp://10.0.0.1:5000,tcp://10.0.0.4:5000", 0));

    write_file(path, "# nobody now\n");
    assert_true(seen_wait(&s, "", 10000)); /* a valid empty file: the empty set */
    write_file(path, "tcp://127.0.0.1:9\n");
    vrpc_resolver_refresh(r);
    assert_true(seen_wait(&s, "tcp://127.0.0.1:9", 10000));
    vrpc_resolver_destroy(r);
    unlink(path);
}

/* With a poll period of a minute, a change is still seen at once (inotify). */
static void t_file_inotify(void **state)
{
    (void)state;
    char path[128], target[192];
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    make_dir();
    snprintf(path, sizeof path, "%s/watched", g_dir);
    snprintf(target, sizeof target, "file://%s?poll_ms=60000", path);
    write_file(path, "tcp://10.0.0.1:1\n");
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    assert_true(seen_wait(&s, "tcp://10.0.0.1:1", 10000));
    write_file(path, "tcp://10.0.0.2:1\n"); /* by rename */
    assert_true(seen_wait(&s, "tcp://10.0.0.2:1", 10000));
    FILE *f = fopen(path, "a"); /* in place: seen at close */
    assert_non_null(f);
    fputs("tcp://10.0.0.3:1\n", f);
    assert_int_equal(fclose(f), 0);
    assert_true(seen_wait(&s, "tcp://10.0.0.2:1,tcp://10.0.0.3:1", 10000));
    int64_t t0 = vrpc_clock_mono_ns();
    vrpc_resolver_destroy(r); /* not a minute: stop wakes the poll */
    assert_true(vrpc_clock_mono_ns() - t0 < 10LL * 1000000000);
    unlink(path);
}

static void t_file_missing_at_start(void **state)
{
    (void)state;
    char path[128], target[192];
    struct vrpc_resolver *r = NULL;
    struct seen s;
    seen_init(&s);
    make_dir();
    snprintf(path, sizeof path, "%s/later", g_dir);
    snprintf(target, sizeof target, "file://%s?poll_ms=20", path);
    assert_int_equal(vrpc_resolver_create(target, on_update, &s, &r), 0);
    usleep(200 * 1000);
    assert_int_equal(seen_updates(&s), 0); /* nothing known: nothing delivered */
    write_file(path, "tcp://10.0.0.9:1\n");
    assert_true(seen_wait(&s, "tcp://10.0.0.9:1", 10000));
    vrpc_resolver_destroy(r);
    unlink(path);
    rmdir(g_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_is_target),
        cmocka_unit_test(t_etcd_not_built),
        cmocka_unit_test(t_list_good),
        cmocka_unit_test(t_list_bad),
        cmocka_unit_test(t_list_too_many),
        cmocka_unit_test(t_deliver_changes_only),
        cmocka_unit_test(t_loop_refresh_and_stop),
        cmocka_unit_test(t_dns_bad),
        cmocka_unit_test(t_dns_fake_periodic),
        cmocka_unit_test(t_dns_refresh),
        cmocka_unit_test(t_dns_localhost),
        cmocka_unit_test(t_file_bad),
        cmocka_unit_test(t_file_lines),
        cmocka_unit_test(t_file_follows),
        cmocka_unit_test(t_file_inotify),
        cmocka_unit_test(t_file_missing_at_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* list:// targets: a fixed set of servers named in the target itself,
 * delivered once, inside create.
 *   list://h1:p1,h2:p2            entries as given (a bare host:port means what
 *                                 it means as a channel's URI: auto)
 *   list://tcp://h1:p1,verbs://h2:p2   a scheme per entry
 *   list://tcp/h1:p1,h2:p2        one scheme for every entry that names none
 * IPv6 literals in brackets ([::1]:5000); spaces around entries are ignored;
 * every entry is checked with vrpc_uri_check. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/log_internal.h"
#include "rpc/resolver_internal.h"

struct list_resolver {
    struct vrpc_resolver base; /* first: the core's view */
};

/* Whether [b, e) contains "://". */
static bool has_scheme(const char *b, const char *e)
{
    for (; b + 3 <= e; b++)
        if (!memcmp(b, "://", 3))
            return true;
    return false;
}

/* Add entry [b, e) (spaces trimmed) to s, prefixed with scheme if it has none. */
static int add_entry(struct vrpc_uri_set *s, const char *scheme, const char *b, const char *e, char *why,
                     size_t why_len)
{
    char uri[VRPC_RESOLVER_MAX_URI + 1];
    int len;

    while (b < e && (*b == ' ' || *b == '\t'))
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    if (b == e) {
        snprintf(why, why_len, "empty entry");
        return -EINVAL;
    }
    if (*scheme && !has_scheme(b, e))
        len = snprintf(uri, sizeof uri, "%s://%.*s", scheme, (int)(e - b), b);
    else
        len = snprintf(uri, sizeof uri, "%.*s", (int)(e - b), b);
    if (len < 0 || (size_t)len >= sizeof uri) {
        snprintf(why, why_len, "entry longer than %d bytes", VRPC_RESOLVER_MAX_URI - 1);
        return -EINVAL;
    }
    char inner[128] = "";
    int rc = vrpc_uri_set_add(s, uri, inner, sizeof inner);
    if (rc)
        snprintf(why, why_len, "entry '%.64s': %.120s", uri, inner);
    return rc;
}

/* Parse rest (after "list://") into s. -EINVAL/-E2BIG with why. */
static int parse_list(const char *rest, struct vrpc_uri_set *s, char *why, size_t why_len)
{
    char scheme[32];
    const char *p = vrpc_rslv_prefix_scheme(rest, scheme, sizeof scheme);
    int rc;

    if (!*p) {
        snprintf(why, why_len, "no addresses");
        return -EINVAL;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *e = comma ? comma : p + strlen(p);
        if ((rc = add_entry(s, scheme, p, e, why, why_len)))
            return rc;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

static int list_create(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    struct vrpc_uri_set s = {0};
    struct list_resolver *r;
    char why[256] = "";
    int rc;

    if ((rc = parse_list(rest, &s, why, sizeof why))) {
        vrpc_rpc_log("resolver: bad target 'list://%s': %s", rest, why);
        vrpc_uri_set_clear(&s);
        return rc == -ENOMEM ? rc : -EINVAL;
    }
    if (!(r = calloc(1, sizeof *r))) {
        vrpc_uri_set_clear(&s);
        return -ENOMEM;
    }
    r->base.ops = &vrpc_resolver_list;
    fn(arg, (const char *const *)s.v, s.n);
    vrpc_uri_set_clear(&s);
    *out = &r->base;
    return 0;
}

static void list_destroy(struct vrpc_resolver *r) { free(r); }

const struct vrpc_resolver_ops vrpc_resolver_list = {
    .scheme = "list",
    .create = list_create,
    .refresh = NULL, /* nothing to re-resolve */
    .destroy = list_destroy,
};

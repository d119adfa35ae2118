/* What the resolvers parse (rpc/resolver_list.c, rpc/resolver_file.c,
 * rpc/etcd_client.c): the first byte picks a list:// target (the rest after
 * "list://"), a file:// file's text, or base64 as etcd's gateway sends it.
 * Beyond "no crash, no sanitizer report": an accepted list or file yields
 * distinct URIs that each pass vrpc_uri_check, no more than its entries or
 * lines; a refusal is -EINVAL/-E2BIG with a reason; base64 decodes what it
 * encoded, and an accepted string has the length its padding says. */
#include <string.h>
#include <verbrpc/log.h>
#include <verbrpc/transport.h>
#include "fuzz_common.h"
#include "rpc/resolver.h"
#include "rpc/resolver_internal.h"
#ifdef VRPC_HAVE_ETCD
#include "rpc/etcd_client.h"
#endif

static size_t count(const char *s, size_t len, char c)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += s[i] == c;
    return n;
}

static void check_set(const char *const *uris, size_t n, size_t max)
{
    FUZZ_CHECK(n <= max, "%zu URIs from at most %zu entries", n, max);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(vrpc_uri_check(uris[i], NULL, 0) == 0, "delivered '%s' fails vrpc_uri_check", uris[i]);
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(uris[i], uris[j]), "'%s' delivered twice", uris[i]);
    }
}

static size_t g_max;
static int g_updates;

static void on_update(void *arg, const char *const *uris, size_t n)
{
    (void)arg;
    g_updates++;
    FUZZ_CHECK(n >= 1, "an accepted list:// target delivered no address");
    check_set(uris, n, g_max);
}

static void fuzz_list(const char *text, size_t len)
{
    char target[4096];
    struct vrpc_resolver *r = NULL;
    int rc;

    if (len > sizeof target - 8 || memchr(text, '\0', len))
        return;
    memcpy(target, "list://", 7);
    memcpy(target + 7, text, len);
    target[7 + len] = '\0';
    g_max = count(text, len, ',') + 1;
    g_updates = 0;
    rc = vrpc_resolver_create(target, on_update, NULL, &r);
    FUZZ_CHECK(rc == 0 || rc == -EINVAL, "list:// returned %d", rc);
    FUZZ_CHECK(rc ? g_updates == 0 : g_updates == 1, "%d updates for rc %d", g_updates, rc);
    vrpc_resolver_destroy(r);
}

static void fuzz_lines(const char *text, size_t len)
{
    struct vrpc_uri_set s = {0};
    char why[256] = "";
    int rc = vrpc_rslv_parse_lines(text, len, &s, why, sizeof why);

    FUZZ_CHECK(rc == 0 || ((rc == -EINVAL || rc == -E2BIG) && why[0]), "parse_lines: %d, '%s'", rc, why);
    if (!rc)
        check_set((const char *const *)s.v, s.n, count(text, len, '\n') + 1);
    vrpc_uri_set_clear(&s);
}

#ifdef VRPC_HAVE_ETCD
static void fuzz_b64(const char *data, size_t len)
{
    char *enc = vrpc_b64_encode(data, len), *dec = NULL, str[4096];
    size_t n;

    FUZZ_CHECK(enc && strlen(enc) == (len + 2) / 3 * 4, "encoded length");
    FUZZ_CHECK(vrpc_b64_decode(enc, &dec, &n) == 0 && n == len && !memcmp(dec, data, len), "round trip");
    free(enc);
    free(dec);
    if (len >= sizeof str || memchr(data, '\0', len))
        return;
    memcpy(str, data, len);
    str[len] = '\0';
    if (vrpc_b64_decode(str, &dec, &n) == 0) {
        size_t pad = len && str[len - 1] == '=' ? (len > 1 && str[len - 2] == '=' ? 2 : 1) : 0;
        FUZZ_CHECK(len % 4 == 0 && n == len / 4 * 3 - pad, "decoded %zu bytes from %zu chars", n, len);
        free(dec);
    }
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++)
        vrpc_log_set_level(VRPC_LOG_OFF); /* every refusal logs a line */
    if (size < 1)
        return 0;
    const char *text = (const char *)data + 1;
    switch (data[0] % 3) {
    case 0:
        fuzz_list(text, size - 1);
        break;
    case 1:
        fuzz_lines(text, size - 1);
        break;
    default:
#ifdef VRPC_HAVE_ETCD
        fuzz_b64(text, size - 1);
#endif
        break;
    }
    return 0;
}
